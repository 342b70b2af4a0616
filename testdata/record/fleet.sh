#!/bin/bash
# Records fleet.py: 8 ranks under torchrun on one CUDA GPU, each writing its step-1 snapshot
# through memsnap.Capture(summary=True), whose child processes write the .summary.json files
# with $MEMSNAP_BINARY. Waits up to 60 s for the 8 summaries (or .summary.err) after the job,
# lists the folder into log.txt, compresses the pickles with xz -6 and packs everything into
# fleet.tar. Usage: MEMSNAP_BINARY=... bash testdata/record/fleet.sh OUT_DIR
set -u
OUT=$(mkdir -p "$1" && cd "$1" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
: "${MEMSNAP_BINARY:?set MEMSNAP_BINARY to the memsnap executable}"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
F=$OUT/fleet; mkdir -p "$F"
timeout 400 torchrun --standalone --nproc-per-node 8 "$HERE/fleet.py" "$F" > "$F/log.txt" 2>&1
echo "TORCHRUN rc=$?" >> "$F/log.txt"
for i in $(seq 60); do
  n=$(ls "$F"/*.summary.json "$F"/*.summary.err 2>/dev/null | wc -l)
  [ "$n" -ge 8 ] && break
  sleep 1
done
sleep 1
echo "SUMMARIES after ${i}s: $(ls "$F"/*.summary.json 2>/dev/null | wc -l) json, $(ls "$F"/*.summary.err 2>/dev/null | wc -l) err" >> "$F/log.txt"
ls -la "$F" >> "$F/log.txt"
find "$F" -name '*.pickle' -print0 | xargs -0 -r -n 1 -P 8 xz -6
tar -C "$OUT" -cf "$OUT/fleet.tar" fleet && rm -rf "$F"
ls -la "$OUT"
