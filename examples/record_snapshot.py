"""Record a CUDA memory snapshot that memsnap can explain, from a small training loop.

Single GPU:
    python3 record_snapshot.py --out snapshots/
Data parallel with FSDP2 (one snapshot per rank):
    torchrun --nproc_per_node=2 record_snapshot.py --fsdp --out snapshots/

Then:
    memsnap report snapshots/memory_snapshot_rank0_step1.pickle.xz

What recording well looks like, as done below:
- start history *before* the step you care about, and dump it right after, so the trace holds
  the whole step (memsnap can still read a trace whose ring buffer wrapped, but then it only
  reconstructs the memory that was alive before the first recorded event);
- `stacks="python"` is cheap and enough for memsnap's attribution; `stacks="all"` (the
  default) adds C++ frames, which name backward ops (`MmBackward0`) but can make dumping slow on
  big traces;
- name phases with `torch.profiler.record_function(...)`: the snapshot keeps them as
  `external_annotations` and memsnap uses them as labels;
- also dump on out-of-memory, so the failing step is never lost;
- put the rank (and step) in the file name: `memory_snapshot_rank{R}_step{S}.pickle`;
- compress large files (`.xz`, `.gz`, `.zst`): memsnap reads them directly.
"""

import argparse
import lzma
import os
import pickle

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=".", help="folder for the snapshots")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=3, help="training steps to run")
    p.add_argument("--record-step", type=int, default=1, help="the step whose memory to record")
    p.add_argument("--stacks", default="python", choices=["python", "all"])
    p.add_argument("--max-entries", type=int, default=1_000_000, help="history ring buffer size")
    p.add_argument("--fsdp", action="store_true", help="shard with FSDP2 (run under torchrun)")
    p.add_argument("--checkpoint", action="store_true", help="activation checkpointing per block")
    p.add_argument("--no-compress", action="store_true", help="write a plain .pickle")
    return p.parse_args()


class Block(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden)
        self.attn = nn.MultiheadAttention(hidden, num_heads=8, batch_first=True)
        self.norm2 = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self, args, vocab=32000):
        super().__init__()
        self.embed = nn.Embedding(vocab, args.hidden)
        self.blocks = nn.ModuleList(Block(args.hidden) for _ in range(args.layers))
        self.head = nn.Linear(args.hidden, vocab, bias=False)
        self.use_checkpoint = args.checkpoint

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.use_checkpoint else block(x)
        return self.head(x)


def dump(path, compress):
    """Writes the snapshot; memsnap reads plain, .xz, .gz and .zst files alike."""
    snapshot = torch.cuda.memory._snapshot()
    if compress:
        path += ".xz"
        with lzma.open(path, "wb", preset=6) as f:
            pickle.dump(snapshot, f)
    else:
        with open(path, "wb") as f:
            pickle.dump(snapshot, f)
    print(f"memory snapshot saved to {path}", flush=True)


def main():
    args = parse_args()
    rank = 0
    if args.fsdp:
        torch.distributed.init_process_group("nccl")
        rank = torch.distributed.get_rank()
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    device = torch.device("cuda", torch.cuda.current_device())
    torch.manual_seed(0)
    model = TinyLM(args).to(device)
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    os.makedirs(args.out, exist_ok=True)
    name = os.path.join(args.out, f"memory_snapshot_rank{rank}_step{args.record_step}.pickle")

    def on_oom(device, alloc, device_alloc, device_free):
        dump(name.replace(".pickle", "_oom.pickle"), not args.no_compress)

    torch._C._cuda_attach_out_of_memory_observer(on_oom)

    for step in range(args.steps):
        recording = step == args.record_step
        if recording:
            torch.cuda.memory._record_memory_history(max_entries=args.max_entries, stacks=args.stacks)
            torch.cuda.reset_peak_memory_stats()
        tokens = torch.randint(0, 32000, (args.batch, args.seq + 1), device=device)
        with torch.profiler.record_function(f"step_{step}"):
            with torch.profiler.record_function("forward"):
                logits = model(tokens[:, :-1])
                loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
            with torch.profiler.record_function("backward"):
                loss.backward()
            with torch.profiler.record_function("optimizer"):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        if recording:
            torch.cuda.synchronize()
            # What PyTorch itself counted for this step, to compare with `memsnap report`.
            print(
                f"[rank={rank}] step {step}: max_memory_allocated={torch.cuda.max_memory_allocated()} "
                f"memory_allocated={torch.cuda.memory_allocated()} "
                f"max_memory_reserved={torch.cuda.max_memory_reserved()}",
                flush=True,
            )
            dump(name, not args.no_compress)
            torch.cuda.memory._record_memory_history(enabled=None)
    if args.fsdp:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
