#!/bin/bash
# Records what memsnap's generic and pipeline attribution is tested on, on a machine with 2 CUDA
# GPUs, torch and transformers:
#   hf/        transformers programs (real_world.py): Llama plain, with gradient checkpointing,
#              under torch.compile, with memory metadata; a Qwen3-MoE; GPT-2 under DDP.
#   pipeline/  the pithtrain-like DualPipeV program with 4 and 8 pipeline ranks on 2 GPUs
#              (SNAPGEN_P2P_VIA_CPU=1), N = 2P and N = 3P micro-batches, and a 2-rank run with
#              expandable segments cut short by an out-of-memory error.
# Usage: bash testdata/record/real_world.sh SNAPGEN_DIR OUT_DIR
set -u
SNAPGEN=$(cd "$1" && pwd); OUT=$(mkdir -p "$2" && cd "$2" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/hf" "$OUT/pipeline"

# transformers programs: two lanes, one per GPU, then DDP on both
(for m in llama llama_ckpt llama_meta; do
   CUDA_VISIBLE_DEVICES=0 timeout 300 python3 "$HERE/real_world.py" "$OUT/hf" $m > "$OUT/hf/$m.log" 2>&1
 done) &
(for m in moe llama_compile; do
   CUDA_VISIBLE_DEVICES=1 timeout 300 python3 "$HERE/real_world.py" "$OUT/hf" $m > "$OUT/hf/$m.log" 2>&1
 done) &
wait
timeout 300 torchrun --standalone --nproc_per_node=2 "$HERE/real_world.py" "$OUT/hf" gpt2_ddp > "$OUT/hf/gpt2_ddp.log" 2>&1

# pipelines, installed where the shared recordings were made, printing PyTorch's peak
P=/home/user/pithtrain; rm -rf $P; mkdir -p $P; cp -r "$SNAPGEN/pithtrain" $P/
python3 "$HERE/patch_peak.py" $P/pithtrain/tasks/pretrain_lm.py
pipe() {  # tag nproc args...
  local tag=$1 n=$2; shift 2
  mkdir -p "$OUT/pipeline/$tag"
  (cd $P && PYTHONPATH=. timeout 300 torchrun --standalone --nproc_per_node=$n -m pithtrain.tasks.pretrain_lm \
     "$@" --steps 1 --stacks python --tag "_$tag" --snapshot-dir "$OUT/pipeline/$tag" \
     > "$OUT/pipeline/$tag/train.log" 2>&1)
}
SMALL="--ep 1 --hidden 1024 --experts 16 --topk 4 --moe-inter 512 --vocab 32000 --seq 2048"
SNAPGEN_P2P_VIA_CPU=1 pipe pp4n8 4 --pp 4 --layers 8 $SMALL --num-chunks 8
SNAPGEN_P2P_VIA_CPU=1 pipe pp4n12 4 --pp 4 --layers 8 $SMALL --num-chunks 12
SNAPGEN_P2P_VIA_CPU=1 pipe pp8n16 8 --pp 8 --layers 16 $SMALL --num-chunks 16
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True pipe pp2oom 2 --pp 2 --ep 1 --layers 8 --hidden 2048 \
  --experts 32 --topk 4 --moe-inter 1024 --vocab 64000 --seq 4096 --num-chunks 8 --mem-cap-gb 9.6
find "$OUT" -name '*.pickle' -print0 | xargs -0 -r -n 1 -P 8 xz -6
ls -laR "$OUT" | head -80
