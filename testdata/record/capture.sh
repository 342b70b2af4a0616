#!/bin/bash
# Records the memsnap.Capture snapshots of testdata/snapshots/capture on one CUDA GPU, each
# program in its own process (capture.py says what each prints).
# The pithtrain-like DualPipeV program records too, with Capture patched in
# (patch_capture.py): 2 pipeline ranks on the one GPU (SNAPGEN_P2P_VIA_CPU=1), step 0 of each.
# Usage: bash testdata/record/capture.sh SNAPGEN_DIR OUT_DIR  (KINDS="loop ... pipeline" picks)
set -u
SNAPGEN=$(cd "$1" && pwd); OUT=$(mkdir -p "$2" && cd "$2" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
C=$OUT/capture; mkdir -p $C
KINDS=${KINDS:-loop oom lightning hf lightning_oom hf_oom ranks pipeline pipeline_oom}
has() { [[ " $KINDS " == *" $1 "* ]]; }
for kind in loop oom lightning hf lightning_oom hf_oom; do
  has $kind || continue
  mkdir -p $C/$kind
  timeout 300 python3 "$HERE/capture.py" $C/$kind $kind > $C/$kind/log.txt 2>&1
done
has ranks && mkdir -p $C/ranks && (cd $C && timeout 300 torchrun --standalone --nproc_per_node=2 "$HERE/capture.py" $C/ranks ranks > $C/ranks/log.txt 2>&1)
P=/home/user/pithtrain
if has pipeline || has pipeline_oom; then
  rm -rf $P && mkdir -p $P && cp -r "$SNAPGEN/pithtrain" $P/ &&
  python3 "$HERE/patch_capture.py" $P/pithtrain/tasks/pretrain_lm.py "$HERE/../../python"
fi
has pipeline && mkdir -p $C/pipeline &&
(cd $P && SNAPGEN_P2P_VIA_CPU=1 PYTHONPATH=. timeout 300 torchrun --standalone --nproc_per_node=2 \
   -m pithtrain.tasks.pretrain_lm --pp 2 --ep 1 --layers 4 --hidden 1024 --experts 16 --topk 4 \
   --moe-inter 512 --vocab 32000 --seq 2048 --num-chunks 8 --steps 2 --stacks python \
   --snapshot-dir $C/pipeline > $C/pipeline/log.txt 2>&1)
# the same pipeline under a 1.5 GiB cap that rank 0's step 0 passes
has pipeline_oom && mkdir -p $C/pipeline_oom &&
(cd $P && SNAPGEN_P2P_VIA_CPU=1 PYTHONPATH=. timeout 300 torchrun --standalone --nproc_per_node=2 \
   -m pithtrain.tasks.pretrain_lm --pp 2 --ep 1 --layers 4 --hidden 1024 --experts 16 --topk 4 \
   --moe-inter 512 --vocab 32000 --seq 2048 --num-chunks 8 --steps 2 --stacks python \
   --mem-cap-gb 1.5 --snapshot-dir $C/pipeline_oom > $C/pipeline_oom/log.txt 2>&1)
find $C -name '*.pickle' -print0 | xargs -0 -r -n 1 -P 8 xz -6
tar -C $OUT -cf $OUT/capture.tar capture && rm -rf $C
ls -la $OUT
