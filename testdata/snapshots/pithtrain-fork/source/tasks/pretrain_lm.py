"""Language-model pretraining loop that records CUDA memory snapshots.

Run with torchrun; see ../../run_all.sh for the configurations.
"""

import argparse
import json
import os
import pickle
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from pithtrain.models.qwen3_moe import Qwen3MoeConfig
from pithtrain.modules.distributed import distributed, setup_default_process_group, setup_device_mesh
from pithtrain.modules.training import setup_model
from pithtrain.pipeline.comm import set_p2p_tensor_meta


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--ep", type=int, default=1)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--topk", type=int, default=4)
    p.add_argument("--moe-inter", type=int, default=768)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--mbs", type=int, default=1)
    p.add_argument("--num-chunks", type=int, default=8)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--snapshot-dir", default="/tmp")
    p.add_argument("--stacks", default="all", choices=["all", "python"])
    p.add_argument("--max-entries", type=int, default=1048576)
    p.add_argument("--record-steps", default="", help="a-b: record history across steps a..b incl. optimizer")
    p.add_argument("--mem-cap-gb", type=float, default=0.0, help="cap the allocator to force an OOM")
    p.add_argument("--tag", default="")
    return p.parse_args()


def objective(logits, labels):
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


def dump_snapshot(path):
    snapshot = torch.cuda.memory._snapshot()
    with open(path, "wb") as f:
        pickle.dump(snapshot, f)
    print(f"[rank={dist.get_rank()}] Memory snapshot saved to {path}", flush=True)


def train_step(step, model, optimizer, batch, args, record_range):
    model.train()
    rank = dist.get_rank()
    microbatches, labels = batch
    cuda = torch.cuda.is_available()
    _mem_profile = step == 0 and not record_range
    _mem_snapshot = cuda and _mem_profile
    if _mem_profile:
        model.memory_profiling = True
    if _mem_snapshot:
        torch.cuda.memory._record_memory_history(max_entries=args.max_entries, stacks=args.stacks)
        torch.cuda.reset_peak_memory_stats()
    if cuda and record_range and step == record_range[0]:
        torch.cuda.memory._record_memory_history(max_entries=args.max_entries, stacks=args.stacks)
    try:
        loss = model.step(microbatches, objective, labels, args.num_chunks)
    except torch.OutOfMemoryError:
        if _mem_snapshot or record_range:
            dump_snapshot(os.path.join(args.snapshot_dir, f"memory_snapshot_rank{rank}{args.tag}.pickle"))
            torch.cuda.memory._record_memory_history(enabled=None)
        raise
    if _mem_snapshot:
        torch.cuda.synchronize()
        print(f"[rank={rank}] PEAK max_memory_allocated={torch.cuda.max_memory_allocated()} memory_allocated={torch.cuda.memory_allocated()} max_memory_reserved={torch.cuda.max_memory_reserved()} memory_reserved={torch.cuda.memory_reserved()}", flush=True)
        dump_snapshot(os.path.join(args.snapshot_dir, f"memory_snapshot_rank{rank}{args.tag}_step0.pickle"))
        torch.cuda.memory._record_memory_history(enabled=None)
    if _mem_profile:
        model.memory_profiling = False
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if cuda and record_range and step == record_range[1]:
        a, b = record_range
        dump_snapshot(os.path.join(args.snapshot_dir, f"memory_snapshot_rank{rank}{args.tag}_steps{a}-{b}.pickle"))
        torch.cuda.memory._record_memory_history(enabled=None)
    return loss


def main():
    args = parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    setup_default_process_group(local_rank)
    setup_device_mesh(args.pp, args.ep)
    if torch.cuda.is_available() and args.mem_cap_gb > 0:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(args.mem_cap_gb * 1024**3 / total)
    cfg = Qwen3MoeConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_experts=args.experts,
        num_experts_per_tok=args.topk,
        moe_intermediate_size=args.moe_inter,
    )
    torch.manual_seed(1234 + distributed.pp_rank)
    model = setup_model(cfg, distributed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    set_p2p_tensor_meta([(args.mbs, args.seq, args.hidden)], torch.bfloat16)
    record_range = tuple(int(x) for x in args.record_steps.split("-")) if args.record_steps else None
    dev = distributed.device
    t0 = time.time()
    for step in range(args.steps):
        g = torch.Generator().manual_seed(step * 100 + distributed.ep_rank)
        if distributed.pp_rank == 0:
            toks = torch.randint(0, args.vocab, (args.num_chunks, args.mbs, args.seq + 1), generator=g).to(dev)
            microbatches = [toks[i, :, :-1] for i in range(args.num_chunks)]
            labels = [toks[i, :, 1:] for i in range(args.num_chunks)]
        else:
            microbatches, labels = None, None
        loss = train_step(step, model, optimizer, (microbatches, labels), args, record_range)
        if loss is not None:
            print(f"[rank={dist.get_rank()}] step {step} loss {loss.mean().item():.4f}", flush=True)
    if torch.cuda.is_available():
        summary = {
            "rank": dist.get_rank(),
            "pp_rank": distributed.pp_rank,
            "ep_rank": distributed.ep_rank,
            "max_memory_allocated": torch.cuda.max_memory_allocated(),
            "max_memory_reserved": torch.cuda.max_memory_reserved(),
            "seconds": round(time.time() - t0, 2),
        }
        print("SUMMARY " + json.dumps(summary), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
