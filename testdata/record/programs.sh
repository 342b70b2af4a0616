#!/bin/bash
# Records the programs of programs.py, all at once on one CUDA GPU (each in its own process,
# so each has its own allocator and counters), then packs snapshots and logs into one tar.
# Usage: bash testdata/record/programs.sh OUT_DIR [PROGRAM...]
set -u
OUT=$(mkdir -p "$1" && cd "$1" && pwd); shift
HERE=$(cd "$(dirname "$0")" && pwd)
PROGRAMS=${*:-lightning_auto lightning_manual hf_trainer accelerate peft_lora resnet_amp compile_fused}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
mkdir -p "$OUT/programs"
python3 -c 'import torch, transformers, lightning, peft, accelerate, timm, torchvision as tv; print("torch", torch.__version__, "transformers", transformers.__version__, "lightning", lightning.__version__, "peft", peft.__version__, "accelerate", accelerate.__version__, "timm", timm.__version__, "torchvision", tv.__version__)' > "$OUT/programs/versions.txt" 2>&1
for p in $PROGRAMS; do
  timeout 400 python3 "$HERE/programs.py" "$OUT/programs" "$p" > "$OUT/programs/$p.log" 2>&1 &
done
wait
tar -C "$OUT" -cf "$OUT/programs.tar" programs && rm -rf "$OUT/programs"
ls -la "$OUT"
