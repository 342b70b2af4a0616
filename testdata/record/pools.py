"""Records private memory pools: CUDA graphs (one with its own pool, one sharing it, one more
with its own), a `torch.cuda.MemPool`, pinned host copies, and their release.

Each run is its own process (the allocator reads PYTORCH_CUDA_ALLOC_CONF once) and records its
whole history from before the first allocation. At each mark it prints one `MARK {...}` JSON
line with what PyTorch itself counted: `memory_allocated()`, `memory_reserved()`, and the
reserved bytes of each pool summed from `torch.cuda.memory_snapshot()`'s segments
(`segment_pool_id`), with every segment's address, size and pool. The end prints `PEAK {...}`
with `max_memory_allocated()` and `max_memory_reserved()`. The snapshot goes beside it as
`<name>.pickle.xz`, the lines as `<name>.log`.

torch 2.11 writes no `pool_id` on trace entries; `../snapshots/constructed/make.py` adds them, taking
each entry's pool from the segment that holds its address in the nearest mark.

Usage (on a machine with a CUDA GPU and PyTorch):
    python3 pools.py OUT_DIR                       # every run
    python3 pools.py OUT_DIR --one NAME --conf CONF
"""

import argparse
import json
import lzma
import os
import pickle
import subprocess
import sys

RUNS = [
    ("pools_default", ""),
    ("pools_expandable", "expandable_segments:True"),
]


def workload(args):
    import torch
    import torch.nn as nn

    torch.cuda.init()
    dev = torch.device("cuda", 0)
    torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
    torch.cuda.reset_peak_memory_stats()
    log = open(os.path.join(args.out, args.one + ".log"), "w")

    def mark(label):
        torch.cuda.synchronize()
        segments = torch.cuda.memory_snapshot()
        pools = {}
        for s in segments:
            key = "%d,%d" % tuple(s["segment_pool_id"])
            pools[key] = pools.get(key, 0) + s["total_size"]
        line = {
            "label": label,
            "allocated": torch.cuda.memory_allocated(),
            "reserved": torch.cuda.memory_reserved(),
            "reserved_by_pool": pools,
            "segments": [
                [s["address"], s["total_size"], list(s["segment_pool_id"])] for s in segments
            ],
        }
        print("MARK " + json.dumps(line), file=log, flush=True)
        with torch.profiler.record_function("memsnap.mark/" + label):
            pass

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).to(dev)
    head = nn.Sequential(nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 16)).to(dev)
    static_in = torch.randn(512, 1024, device=dev)
    mark("built")

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(3):
            head(model(static_in))
    torch.cuda.current_stream().wait_stream(side)
    mark("warmed")

    with torch.no_grad():
        g1 = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g1):
            out1 = model(static_in)
        g2 = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g2, pool=g1.pool()):
            out2 = head(out1)
        g3 = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g3):
            out3 = torch.relu(static_in @ static_in.t()).sum(dim=1)
    for _ in range(4):
        static_in.copy_(torch.randn(512, 1024, device=dev))
        g1.replay()
        g2.replay()
        g3.replay()
    mark("captured")

    # the default pool, between and after the graphs
    scratch = [torch.randn(256 * (k + 1), 1024, device=dev) for k in range(6)]
    del scratch[::2]
    mark("scratch")

    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        a = torch.empty(30 << 20, dtype=torch.uint8, device=dev)
        b = torch.empty(1000, device=dev)
        c = torch.empty(5 << 20, dtype=torch.uint8, device=dev)
    del b
    with torch.cuda.use_mem_pool(pool):
        d = torch.empty(700, device=dev)
        e = torch.empty(12 << 20, dtype=torch.uint8, device=dev)
    mark("mempool")

    host = torch.empty(8 << 20, dtype=torch.uint8, pin_memory=True)
    on_device = host.to(dev, non_blocking=True)
    back = torch.empty(8 << 20, dtype=torch.uint8, pin_memory=True)
    back.copy_(on_device, non_blocking=True)
    torch.cuda.synchronize()
    mark("pinned")

    del g1, g2, g3, out1, out2, out3
    del a, c, d, e
    del pool
    mark("released")
    torch.cuda.empty_cache()
    mark("emptied")

    more = [torch.randn(384, 1024, device=dev) for _ in range(4)]
    total = sum(t.sum() for t in more)
    del more, total, on_device
    mark("end")
    print(
        "PEAK "
        + json.dumps(
            {
                "max_memory_allocated": torch.cuda.max_memory_allocated(),
                "max_memory_reserved": torch.cuda.max_memory_reserved(),
                "memory_allocated": torch.cuda.memory_allocated(),
                "memory_reserved": torch.cuda.memory_reserved(),
                "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
                "torch": torch.__version__,
            }
        ),
        file=log,
        flush=True,
    )
    snap = torch.cuda.memory._snapshot()
    with lzma.open(os.path.join(args.out, args.one + ".pickle.xz"), "wb") as f:
        pickle.dump(snap, f)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--one")
    p.add_argument("--conf", default="")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.one:
        workload(args)
        return
    for name, conf in RUNS:
        env = dict(os.environ)
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        if conf:
            env["PYTORCH_CUDA_ALLOC_CONF"] = conf
        cmd = [sys.executable, __file__, args.out, "--one", name, "--conf", conf]
        subprocess.run(cmd, env=env, check=True)


if __name__ == "__main__":
    main()
