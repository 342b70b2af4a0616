"""Eight ranks of one small job, for memsnap's fleet table (`memsnap compare DIR`): each rank
its own process under torchrun, all on the one GPU (cuda:0), a gloo process group (NCCL cannot
put several ranks on one GPU). The same MLP (hidden 2048) on every rank, AdamW, three steps;
rank 5 also allocates a 64 MiB tensor at the start of step 1 and keeps it alive (the outlier).

Each step runs inside `memsnap.Capture(OUT_DIR, steps=range(1, 2), summary=True, model=model,
optimizer=opt)`'s `with cap.step(step):`, so every rank records step 1 (history and peak
statistics from its start) and writes `memory_snapshot_rank<R>_step1.pickle` with its
`.tensors.json`, and a child process writes `.summary.json` with the memsnap binary
($MEMSNAP_BINARY). memsnap is imported from the repository's python/ folder. Prints, exact bytes:

    [rank=R] STEP step=S memory_allocated=N max_memory_allocated=N
    [rank=R] EXTRA bytes=N                               (rank 5: the outlier's bytes)
    [rank=R] PEAK max_memory_allocated=N max_memory_reserved=N   (step 1, at its end)
    [rank=R] WROTE path

Usage: torchrun --standalone --nproc-per-node 8 fleet.py OUT_DIR
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import memsnap  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

HIDDEN = 2048
OUTLIER_RANK = 5
OUTLIER_BYTES = 64 << 20


def main():
    out = os.path.abspath(sys.argv[1])
    os.makedirs(out, exist_ok=True)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    torch.manual_seed(0)
    tag = f"[rank={rank}]"

    model = torch.nn.Sequential(
        torch.nn.Linear(1024, HIDDEN), torch.nn.GELU(),
        torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.GELU(),
        torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.GELU(),
        torch.nn.Linear(HIDDEN, 1024),
    ).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    cap = memsnap.Capture(out, steps=range(1, 2), summary=True, model=model, optimizer=opt)
    kept = []
    for step in range(3):
        with cap.step(step):
            if rank == OUTLIER_RANK and step == 1:
                kept.append(torch.empty(OUTLIER_BYTES, dtype=torch.uint8, device=dev))
                print(f"{tag} EXTRA bytes={kept[-1].untyped_storage().nbytes()}", flush=True)
            g = torch.Generator(device=dev).manual_seed(100 * rank + step)
            x = torch.randn(256, 1024, device=dev, generator=g)
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            value = loss.detach().cpu()
            del loss, x
            torch.cuda.synchronize()
            if step == 1:
                peak = (torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved())
        print(
            f"{tag} STEP step={step} memory_allocated={torch.cuda.memory_allocated()} "
            f"max_memory_allocated={torch.cuda.max_memory_allocated()}",
            flush=True,
        )
        dist.all_reduce(value)  # a collective on the CPU tensor through gloo
    print(f"{tag} PEAK max_memory_allocated={peak[0]} max_memory_reserved={peak[1]}", flush=True)
    for path in cap.written:
        print(f"{tag} WROTE {path}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
