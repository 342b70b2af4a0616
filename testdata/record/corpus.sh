#!/bin/bash
# Records the programs of corpus.py on one CUDA GPU, JOBS at a time, each in its own process
# (its own allocator and counters), with the snapshot and the profiler together. A program
# that writes no snapshot is run again without the profiler (its log says so, and the first
# run's log is kept as NAME.first.log). Everything ends by DEADLINE_S seconds after the start;
# snapshots, profiles and logs are packed into OUT_DIR/corpus.tar.
# Usage: bash testdata/record/corpus.sh OUT_DIR [PROGRAM...]
set -u
if [ "${1:-}" = "--one" ]; then
  name=$2
  t0=$(date +%s)
  left=$(( END - t0 - 5 ))
  limit=$(( left < ${LIMIT:-240} ? left : ${LIMIT:-240} ))
  if [ "$limit" -lt 20 ]; then echo "SKIPPED $name (no time left)"; exit 0; fi
  timeout -k 5 "$limit" python3 "$HERE/corpus.py" "$DIR" "$name" > "$DIR/$name.log" 2>&1
  rc=$?
  again=""
  if [ ! -s "$DIR/memory_snapshot_$name.pickle.xz" ]; then
    mv "$DIR/$name.log" "$DIR/$name.first.log"
    left=$(( END - $(date +%s) - 5 ))
    limit=$(( left < 150 ? left : 150 ))
    why=$(grep -E "Error|error|Killed" "$DIR/$name.first.log" | tail -n 1 | cut -c1-300)
    echo "RERUN without the profiler: the first run (rc=$rc) wrote no snapshot: $why" > "$DIR/$name.log"
    if [ "$limit" -ge 20 ]; then
      CORPUS_NO_PROFILER=1 timeout -k 5 "$limit" python3 "$HERE/corpus.py" "$DIR" "$name" >> "$DIR/$name.log" 2>&1
      again=" rerun_rc=$?"
    fi
  fi
  echo "DONE $name rc=$rc$again seconds=$(( $(date +%s) - t0 ))"
  exit 0
fi
OUT=$(mkdir -p "$1" && cd "$1" && pwd); shift
HERE=$(cd "$(dirname "$0")" && pwd)
DIR=$OUT/corpus
END=$(( $(date +%s) + ${DEADLINE_S:-540} ))
export HERE DIR END
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export OMP_NUM_THREADS=2 TORCHINDUCTOR_COMPILE_THREADS=1
mkdir -p "$DIR"
# the slowest first
FIRST="compile_cudagraphs compile_default accelerate_accum llama_generate_kv fsdp2_accum lightning_auto lightning_manual lightning_late_zero_grad
hf_trainer hf_trainer_accum sentence_transformers_mnrl accelerate_accum peft_lora fsdp2_accum
ddp_accum ddp_oom llama_generate_kv timm_vit_lamb torchaudio_conformer pyg_gcn gpytorch_exact_gp"
ALL=$(python3 "$HERE/corpus.py" --list)
if [ $# -gt 0 ]; then PROGRAMS="$*"; else
  PROGRAMS=$( (for p in $FIRST; do echo "$p"; done; for p in $ALL; do echo "$p"; done) | awk '!seen[$0]++')
fi
python3 - > "$DIR/versions.txt" 2>&1 <<'PY'
import importlib
names = ["torch", "lightning", "transformers", "accelerate", "sentence_transformers", "peft",
         "timm", "torchvision", "torchaudio", "torch_geometric", "torchdiffeq", "gpytorch"]
found = []
for n in names:
    try:
        found.append(f"{n} {importlib.import_module(n).__version__}")
    except Exception as e:
        found.append(f"{n} missing ({type(e).__name__})")
print(" ".join(found))
PY
printf '%s\n' $PROGRAMS | xargs -P "${JOBS:-12}" -I{} bash "$0" --one {}
tar -C "$OUT" -cf "$OUT/corpus.tar" corpus && rm -rf "$DIR"
ls -la "$OUT"
