#!/bin/bash
# Records testdata/snapshots on a machine with 2 CUDA GPUs and PyTorch.
# Usage: bash testdata/record/record.sh SNAPGEN_DIR OUT_DIR
#   SNAPGEN_DIR: the snapgen folder that holds the small pithtrain-like program (pithtrain/)
set -eu
SNAPGEN=$(cd "$1" && pwd); OUT=$(mkdir -p "$2" && cd "$2" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"/single-gpu "$OUT"/fsdp "$OUT"/pithtrain-peak "$OUT"/pithtrain-fork

# The example recorder: one GPU, then FSDP2 with activation checkpointing on two.
python3 "$ROOT/examples/record_snapshot.py" --out "$OUT/single-gpu" > "$OUT/single-gpu/log.txt" 2>&1
torchrun --standalone --nproc_per_node=2 "$ROOT/examples/record_snapshot.py" --fsdp --checkpoint \
    --stacks all --out "$OUT/fsdp" > "$OUT/fsdp/log.txt" 2>&1

# pithtrain, pp=2, printing torch.cuda.max_memory_allocated() for the recorded step.
run_pithtrain() {  # install_dir tag chunks stacks out
    (cd "$1" && PYTHONPATH=. torchrun --standalone --nproc_per_node=2 -m pithtrain.tasks.pretrain_lm \
        --pp 2 --ep 1 --layers 8 --hidden 1024 --experts 16 --topk 4 --moe-inter 768 --vocab 32000 \
        --seq 2048 --num-chunks "$3" --steps 2 --stacks "$4" --tag "$2" --snapshot-dir "$5" \
        > "$5/train.log" 2>&1)
}
P=/home/user/pithtrain; rm -rf $P; mkdir -p $P; cp -r "$SNAPGEN/pithtrain" $P/
python3 "$HERE/patch_peak.py" $P/pithtrain/tasks/pretrain_lm.py
run_pithtrain $P _peak 8 python "$OUT/pithtrain-peak"

# A fork installed elsewhere, with shifted line numbers and 6 micro-batches.
F=/opt/forks/pt2; rm -rf $F; mkdir -p $F; cp -r "$SNAPGEN/pithtrain" $F/
python3 "$HERE/patch_peak.py" $F/pithtrain/tasks/pretrain_lm.py
python3 "$HERE/shift_lines.py" $F/pithtrain/pipeline/dualpipev.py 7
python3 "$HERE/shift_lines.py" $F/pithtrain/pipeline/execution.py 3
python3 "$HERE/shift_lines.py" $F/pithtrain/models/qwen3_moe.py 11
run_pithtrain $F _fork 6 all "$OUT/pithtrain-fork"
cp -r $F/pithtrain "$OUT/pithtrain-fork/source"

find "$OUT" -name '*.pickle' -print0 | xargs -0 -n 1 xz -6
