#!/bin/bash
# Records the memsnap.Capture snapshots of testdata/snapshots/capture on one CUDA GPU, each
# program in its own process (capture.py says what each prints).
# Usage: bash testdata/record/capture.sh OUT_DIR
set -u
OUT=$(mkdir -p "$1" && cd "$1" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
C=$OUT/capture; mkdir -p $C
for kind in loop oom lightning hf; do
  mkdir -p $C/$kind
  timeout 300 python3 "$HERE/capture.py" $C/$kind $kind > $C/$kind/log.txt 2>&1
done
mkdir -p $C/ranks
(cd $C && timeout 300 torchrun --standalone --nproc_per_node=2 "$HERE/capture.py" $C/ranks ranks > $C/ranks/log.txt 2>&1)
find $C -name '*.pickle' -print0 | xargs -0 -r -n 1 -P 8 xz -6
tar -C $OUT -cf $OUT/capture.tar capture && rm -rf $C
ls -la $OUT
