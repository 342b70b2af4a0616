#!/bin/bash
# Records DualPipeV pipelines cut short by an out-of-memory error at different points of the
# schedule, on one CUDA GPU (SNAPGEN_P2P_VIA_CPU=1 runs the point-to-point traffic through the
# CPU, so every rank shares the GPU): 2 ranks of the MoE model and 4 ranks of a small one, each
# under several per-process caps, with and without expandable segments. The step-boundary
# prints carry memory_allocated() in exact bytes (`bytes=`), and PEAK lines PyTorch's peaks.
# Usage: bash testdata/record/cut_short.sh SNAPGEN_DIR OUT_DIR
set -u
SNAPGEN=$(cd "$1" && pwd); OUT=$(mkdir -p "$2" && cd "$2" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
export PYTHONUNBUFFERED=1
P=/home/user/pithtrain; rm -rf $P; mkdir -p $P; cp -r "$SNAPGEN/pithtrain" $P/
python3 "$HERE/patch_peak.py" $P/pithtrain/tasks/pretrain_lm.py
python3 "$HERE/patch_bytes.py" $P/pithtrain/pipeline/dualpipev.py
MOE="--pp 2 --layers 8 --hidden 2048 --experts 32 --topk 4 --moe-inter 1024 --vocab 64000 --seq 4096 --num-chunks 8"
SMALL="--pp 4 --layers 8 --hidden 1024 --experts 16 --topk 4 --moe-inter 512 --vocab 32000 --seq 2048 --num-chunks 8"
pipe() {  # tag nproc conf cap args...
  local tag=$1 n=$2 conf=$3 cap=$4; shift 4
  mkdir -p "$OUT/$tag"
  (cd $P && SNAPGEN_P2P_VIA_CPU=1 PYTORCH_CUDA_ALLOC_CONF=$conf PYTHONPATH=. timeout 160 \
     torchrun --standalone --nproc_per_node=$n -m pithtrain.tasks.pretrain_lm --ep 1 "$@" \
     --mem-cap-gb $cap --steps 1 --tag "_$tag" --snapshot-dir "$OUT/$tag" \
     > "$OUT/$tag/train.log" 2>&1; echo "$tag rc=$?")
}
D=expandable_segments:False; E=expandable_segments:True
# wave 1: the MoE model, 2 ranks
pipe d30 2 $D 3.0 $MOE --stacks python & pipe d50 2 $D 5.0 $MOE --stacks python &
pipe d65 2 $D 6.5 $MOE --stacks all & pipe d80 2 $D 8.0 $MOE --stacks python &
pipe e30 2 $E 3.0 $MOE --stacks python & pipe e50 2 $E 5.0 $MOE --stacks python &
wait
# wave 2: more caps with expandable segments, and 4 small ranks
pipe e65 2 $E 6.5 $MOE --stacks python & pipe e75 2 $E 7.5 $MOE --stacks all &
pipe e85 2 $E 8.5 $MOE --stacks python &
pipe s06 4 $D 0.6 $SMALL --stacks python & pipe s13 4 $E 1.3 $SMALL --stacks python &
wait
# wave 3: 4 small ranks
pipe s10 4 $D 1.0 $SMALL --stacks python & pipe s16 4 $E 1.6 $SMALL --stacks python &
pipe s19 4 $D 1.9 $SMALL --stacks all & pipe e10 4 $E 1.0 $SMALL --stacks python &
wait
find "$OUT" -name '*.pickle' -print0 | xargs -0 -r -n 1 -P 12 xz -6
ls -laR "$OUT" | head -120
