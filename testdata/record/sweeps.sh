#!/bin/bash
# Records the size sweeps that `memsnap whatif --scale` is tested on, on one CUDA GPU:
#   cnn/     resnet50 at batch 16, 32, 64, 128; the largest again under a cap 3% below and 3%
#            above its peak allocated bytes
#   sdpa/    a Llama at sequence length 256, 512, 1024, 2048 with fused attention; capped alike
#   eager/   the same with eager attention (scores grow with the square of the length)
#   pipe/    the pithtrain-like DualPipeV program, 2 ranks at 4, 6, 8, 16 micro-batches and
#            4 ranks at 8, 12, 16, 24, all ranks on the one GPU (SNAPGEN_P2P_VIA_CPU=1)
# Each run is its own process, printing its own truth (sweeps.py, patch_peak.py).
# Usage: bash testdata/record/sweeps.sh SNAPGEN_DIR OUT_DIR
set -u
SNAPGEN=$(cd "$1" && pwd); OUT=$(mkdir -p "$2" && cd "$2" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
S=$OUT/sweeps; mkdir -p $S/cnn $S/sdpa $S/eager $S/pipe
lane() {  # folder kind sizes... -- extra args
  local dir=$1 kind=$2; shift 2
  local sizes=() extra=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do sizes+=("$1"); shift; done
  [ $# -gt 0 ] && shift; extra=("$@")
  local last
  for n in "${sizes[@]}"; do
    timeout 170 python3 "$HERE/sweeps.py" $S/$dir ${dir}_$n $kind $n "${extra[@]}" > $S/$dir/${dir}_$n.log 2>&1
    last=$n
  done
  local peak; peak=$(sed -n 's/^PEAK max_memory_allocated=\([0-9]*\).*/\1/p' $S/$dir/${dir}_$last.log)
  [ -n "$peak" ] || return
  for pct in 97 103; do
    timeout 170 python3 "$HERE/sweeps.py" $S/$dir ${dir}_${last}_cap$pct $kind $last "${extra[@]}" \
      --cap $((peak * pct / 100)) > $S/$dir/${dir}_${last}_cap$pct.log 2>&1
  done
}
P=/home/user/pithtrain; rm -rf $P; mkdir -p $P; cp -r "$SNAPGEN/pithtrain" $P/
python3 "$HERE/patch_peak.py" $P/pithtrain/tasks/pretrain_lm.py
pipe() {  # ranks layers chunks...
  local pp=$1 layers=$2; shift 2
  for n in "$@"; do
    local tag=pp${pp}n$n
    (cd $P && SNAPGEN_P2P_VIA_CPU=1 PYTHONPATH=. timeout 170 torchrun --standalone --nproc_per_node=$pp \
       -m pithtrain.tasks.pretrain_lm --pp $pp --ep 1 --layers $layers --hidden 1024 --experts 16 \
       --topk 4 --moe-inter 512 --vocab 32000 --seq 2048 --num-chunks $n --steps 1 --stacks python \
       --tag "_$tag" --snapshot-dir $S/pipe > $S/pipe/$tag.log 2>&1)
  done
}
lane cnn cnn 16 32 64 128 &
lane sdpa llama 256 512 1024 2048 -- sdpa &
lane eager llama 256 512 1024 2048 -- eager &
pipe 2 8 4 6 8 16 &
pipe 4 8 8 12 16 24 &
wait
find $S -name '*.pickle' -print0 | xargs -0 -r -n 1 -P 8 xz -6
python3 -c 'import torch, transformers, torchvision as tv; print("torch", torch.__version__, "transformers", transformers.__version__, "torchvision", tv.__version__)' > $S/versions.txt 2>&1
tar -C $OUT -cf - sweeps | split -b 15M - $OUT/sweeps.tar. && rm -rf $S
ls -la $OUT
