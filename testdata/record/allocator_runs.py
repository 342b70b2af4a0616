"""Runs one dense training workload under several caching-allocator settings and caps.

Each run is its own process (the allocator reads PYTORCH_CUDA_ALLOC_CONF once), records its
whole history from before the first allocation, and prints one `RESULT {...}` JSON line with
what PyTorch itself counted: max_memory_allocated(), max_memory_reserved(), memory_allocated()
and memory_reserved() at the end, the cap in bytes when a memory fraction was set, and the
OutOfMemoryError text when the run failed. The snapshot goes beside it as
`<name>.pickle.xz`. memsnap simulates the `default` run's trace under the other settings and
compares with these figures (tests in `tests/simulate.rs`).

Usage (on a machine with a CUDA GPU and PyTorch):
    python3 allocator_runs.py OUT_DIR            # every run, then OUT_DIR/results.jsonl
    python3 allocator_runs.py OUT_DIR --one NAME --conf CONF --cap-bytes N
"""

import argparse
import json
import lzma
import os
import pickle
import subprocess
import sys


def workload(args):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.cuda.init()
    device = torch.device("cuda", 0)
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
    torch.cuda.reset_peak_memory_stats()
    cap = None
    if args.cap_bytes:
        fraction = args.cap_bytes / total
        torch.cuda.set_per_process_memory_fraction(fraction, 0)
        cap = int(fraction * total)
    torch.manual_seed(0)
    hidden, vocab, layers = 1024, 32000, 4

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(hidden)
            self.up = nn.Linear(hidden, 4 * hidden)
            self.down = nn.Linear(4 * hidden, hidden)

        def forward(self, x):
            return x + self.down(F.gelu(self.up(self.norm(x))))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.head = nn.Linear(hidden, vocab, bias=False)

        def forward(self, tokens):
            x = self.embed(tokens)
            for b in self.blocks:
                x = b(x)
            return self.head(x)

    oom = None
    phases = []
    try:
        model = Model().to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        # Three steps of different lengths, so that blocks of one step do not fit the next
        # exactly; empty_cache() after the first one returns its whole free segments.
        for step, seq in enumerate([512, 448, 320]):
            tokens = (torch.arange(4 * (seq + 1), device=device) * 7919 % vocab).view(4, seq + 1)
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
            phases.append([step, "forward", torch.cuda.memory_allocated()])
            loss.backward()
            phases.append([step, "backward", torch.cuda.memory_allocated()])
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del logits, loss
            phases.append([step, "optimizer", torch.cuda.memory_allocated()])
            if step == 0:
                torch.cuda.empty_cache()
    except torch.OutOfMemoryError as e:
        oom = str(e)
    torch.cuda.synchronize()
    result = {
        "name": args.one,
        "conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "cap_bytes": cap,
        "device_total_bytes": total,
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "memory_allocated": torch.cuda.memory_allocated(),
        "memory_reserved": torch.cuda.memory_reserved(),
        "num_alloc_retries": torch.cuda.memory_stats().get("num_alloc_retries", 0),
        "num_ooms": torch.cuda.memory_stats().get("num_ooms", 0),
        "phases": phases,
        "oom": oom,
    }
    snapshot = torch.cuda.memory._snapshot()
    with lzma.open(os.path.join(args.out, args.one + ".pickle.xz"), "wb", preset=9) as f:
        pickle.dump(snapshot, f)
    print("RESULT " + json.dumps(result), flush=True)


def run_one(out, name, conf, cap_bytes=0):
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    cmd = [sys.executable, __file__, out, "--one", name, "--cap-bytes", str(cap_bytes)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    lines = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
    if not lines:
        print(p.stdout, p.stderr, file=sys.stderr)
        raise SystemExit(f"{name} printed no result")
    r = json.loads(lines[-1][len("RESULT "):])
    print(f"{name}: conf={conf!r} cap={cap_bytes} peak_alloc={r['max_memory_allocated']} "
          f"peak_reserved={r['max_memory_reserved']} oom={'yes' if r['oom'] else 'no'}", flush=True)
    return r


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--one")
    p.add_argument("--cap-bytes", type=int, default=0)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.one:
        workload(args)
        return
    results = [run_one(args.out, "default", "")]
    base = results[0]
    alloc, reserved = base["max_memory_allocated"], base["max_memory_reserved"]
    mib = 1 << 20
    results.append(run_one(args.out, "expandable", "expandable_segments:True"))
    results.append(run_one(args.out, "split64", "max_split_size_mb:64"))
    results.append(run_one(args.out, "split256", "max_split_size_mb:256"))
    results.append(run_one(args.out, "roundup4", "roundup_power2_divisions:4"))
    results.append(run_one(args.out, "roundup_map", "roundup_power2_divisions:[64:8,256:4,>:1]"))
    # Caps: far below the peak, just above it, between allocated and reserved, at reserved.
    results.append(run_one(args.out, "cap_low", "", int(alloc * 0.7) // mib * mib))
    results.append(run_one(args.out, "cap_tight", "", (alloc + 24 * mib) // mib * mib))
    results.append(run_one(args.out, "cap_mid", "", (alloc + reserved) // 2 // mib * mib))
    results.append(run_one(args.out, "cap_reserved", "", reserved))
    results.append(run_one(args.out, "gc_cap", "garbage_collection_threshold:0.6",
                           (alloc + reserved) // 2 // mib * mib))
    results.append(run_one(args.out, "expandable_cap_tight", "expandable_segments:True",
                           (alloc + 24 * mib) // mib * mib))
    results.append(run_one(args.out, "expandable_cap_low", "expandable_segments:True",
                           int(alloc * 0.8) // mib * mib))
    results.append(run_one(args.out, "split64_cap_tight", "max_split_size_mb:64",
                           (alloc + 24 * mib) // mib * mib))
    with open(os.path.join(args.out, "results.jsonl"), "w") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
