#!/bin/bash
# Records testdata/snapshots/capture_evidence on one CUDA GPU: the three programs of
# capture_evidence.py at once, each in its own process; snapshots compressed with xz -9, the
# `.tensors.json` side files left as they are.
# Usage: bash testdata/record/capture_evidence.sh OUT_DIR   (writes OUT_DIR/capture_evidence.tar)
set -u
OUT=$(mkdir -p "$1" && cd "$1" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
cd "$OUT"
for kind in loop hf lightning_oom; do
  mkdir -p capture_evidence/$kind
  timeout 200 python3 "$HERE/capture_evidence.py" capture_evidence/$kind $kind \
    > capture_evidence/$kind/log.txt 2>&1 &
done
wait
find capture_evidence -name '*.pickle' -print0 | xargs -0 -r -n 1 -P 4 xz -9
tar -cf capture_evidence.tar capture_evidence && rm -rf capture_evidence
ls -la
