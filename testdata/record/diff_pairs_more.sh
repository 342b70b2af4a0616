#!/bin/bash
# Records the planted pairs of diff_pairs_more.py for `memsnap diff BASE NEW`, all at once on one
# CUDA GPU, in the manner of diff_pairs.sh: each pair twice (`base`, `new`), each run its own
# process (its own allocator and counters), PYTORCH_CUDA_ALLOC_CONF unset. A pair whose run
# fails is reported at the end and the others go on. Snapshots are compressed with xz -6 and
# packed with the logs into diff_more.tar (a folder diff/PAIR/ per pair, as in diff.tar).
# Usage: bash testdata/record/diff_pairs_more.sh OUT_DIR [PAIR...]
set -u
OUT=$(mkdir -p "$1" && cd "$1" && pwd); shift
HERE=$(cd "$(dirname "$0")" && pwd)
PAIRS=${*:-loss_graph_kept peft_full accelerate_bf16 no_grad_eval two_changes gnn_batch}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 OMP_NUM_THREADS=2
D=$OUT/diff; mkdir -p "$D"
python3 -c 'import torch, transformers, timm, accelerate, peft, torch_geometric as pyg; print("torch", torch.__version__, "transformers", transformers.__version__, "timm", timm.__version__, "accelerate", accelerate.__version__, "peft", peft.__version__, "torch_geometric", pyg.__version__, "device", torch.cuda.get_device_name(0))' 2>&1
declare -A PIDS
for p in $PAIRS; do
  mkdir -p "$D/$p"
  for v in base new; do
    env -u PYTORCH_CUDA_ALLOC_CONF timeout 300 python3 "$HERE/diff_pairs_more.py" "$D" "$p" "$v" > "$D/$p/$v.log" 2>&1 &
    PIDS[$p/$v]=$!
  done
done
FAILED=""
for k in "${!PIDS[@]}"; do
  wait "${PIDS[$k]}" || FAILED="$FAILED $k(rc=$?)"
done
for p in $PAIRS; do
  for v in base new; do
    [ -s "$D/$p/$v.pickle" ] || case "$FAILED" in *"$p/$v("*) ;; *) FAILED="$FAILED $p/$v(no-pickle)";; esac
  done
done
find "$D" -name '*.pickle' -print0 | xargs -0 -r -n 1 -P 8 xz -6
grep -H -E '^(PEAK|PLANT)' "$D"/*/*.log
for k in $FAILED; do
  f="$D/${k%%(*}.log"; echo "=== FAILED $k: tail of $f"; tail -n 25 "$f"
done
tar -C "$OUT" -cf "$OUT/diff_more.tar" diff && rm -rf "$D"
ls -la "$OUT"
if [ -n "$FAILED" ]; then echo "FAILED:$FAILED"; exit 1; fi
echo "ALL OK"
