#!/bin/bash
# Records the planted pairs of diff_pairs.py for `memsnap diff BASE NEW`, all at once on one
# CUDA GPU: each pair twice (`base`, `new`), each run its own process (its own allocator and
# counters). The `new` run of `expandable` gets PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True;
# every other run has it unset. Snapshots are compressed with xz -6 and packed with the logs
# and versions.txt into diff.tar (split into 15 MB pieces if it is larger).
# Usage: bash testdata/record/diff_pairs.sh OUT_DIR [PAIR...]
set -u
OUT=$(mkdir -p "$1" && cd "$1" && pwd); shift
HERE=$(cd "$(dirname "$0")" && pwd)
PAIRS=${*:-logits_kept ckpt_off sdpa_eager fp32_head larger_batch expandable same zero_grad_keep mlp_batch}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 OMP_NUM_THREADS=2
D=$OUT/diff; mkdir -p "$D"
python3 -c 'import torch, transformers, lightning, timm, torchvision as tv; print("torch", torch.__version__, "transformers", transformers.__version__, "lightning", lightning.__version__, "timm", timm.__version__, "torchvision", tv.__version__, "device", torch.cuda.get_device_name(0))' > "$D/versions.txt" 2>&1
for p in $PAIRS; do
  mkdir -p "$D/$p"
  for v in base new; do
    if [ "$p" = expandable ] && [ "$v" = new ]; then
      set -- env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    else
      set -- env -u PYTORCH_CUDA_ALLOC_CONF
    fi
    "$@" timeout 400 python3 "$HERE/diff_pairs.py" "$D" "$p" "$v" > "$D/$p/$v.log" 2>&1 &
  done
done
wait
find "$D" -name '*.pickle' -print0 | xargs -0 -r -n 1 -P 8 xz -6
tar -C "$OUT" -cf "$OUT/diff.tar" diff && rm -rf "$D"
[ "$(stat -c %s "$OUT/diff.tar")" -gt 15000000 ] && split -b 15M "$OUT/diff.tar" "$OUT/diff.tar." && rm "$OUT/diff.tar"
ls -la "$OUT"
