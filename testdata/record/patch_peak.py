"""Make pretrain_lm.py print PyTorch's own peak for the recorded step."""
import sys
p = sys.argv[1]
s = open(p).read()
a = """    if _mem_snapshot:
        torch.cuda.memory._record_memory_history(max_entries=args.max_entries, stacks=args.stacks)
"""
assert a in s
s = s.replace(a, a + "        torch.cuda.reset_peak_memory_stats()\n")
b = """    if _mem_snapshot:
        dump_snapshot(os.path.join(args.snapshot_dir, f"memory_snapshot_rank{rank}{args.tag}_step0.pickle"))"""
assert b in s
s = s.replace(b, """    if _mem_snapshot:
        torch.cuda.synchronize()
        print(f"[rank={rank}] PEAK max_memory_allocated={torch.cuda.max_memory_allocated()} memory_allocated={torch.cuda.memory_allocated()} max_memory_reserved={torch.cuda.max_memory_reserved()} memory_reserved={torch.cuda.memory_reserved()}", flush=True)
""" + b.split("\n", 1)[1])
open(p, "w").write(s)
