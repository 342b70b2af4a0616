"""Make pretrain_lm.py record with memsnap.Capture instead of its own snapshot code: step 0 of
every rank, probes of the device's memory at set-up points, and the truth printed beside each
(`PROBE` with mem_get_info right after the probe, `PEAK` after the recorded step).
Usage: python3 patch_capture.py pithtrain/tasks/pretrain_lm.py MEMSNAP_PYTHON_DIR"""
import sys

p, memsnap_dir = sys.argv[1], sys.argv[2]
s = open(p).read()


def swap(a, b):
    global s
    assert a in s, a
    s = s.replace(a, b, 1)


swap("def parse_args", f"""import sys as _sys
_sys.path.insert(0, {memsnap_dir!r})
import memsnap


def _truth(cap, name):
    cap.probe(name)
    free, total = torch.cuda.mem_get_info()
    print(f"[rank={{cap.rank}}] PROBE name={{name!r}} used={{total - free}} reserved={{torch.cuda.memory_reserved()}}", flush=True)


def parse_args""")
swap("    _mem_snapshot = cuda and _mem_profile\n", "    _mem_snapshot = False\n")
swap("""    setup_default_process_group(local_rank)
    setup_device_mesh(args.pp, args.ep)
""", """    cap = memsnap.Capture(args.snapshot_dir, steps=range(0, 1), stacks=args.stacks, max_entries=args.max_entries)
    torch.cuda.init()
    _truth(cap, "before init_process_group")
    setup_default_process_group(local_rank)
    _truth(cap, "after init_process_group")
    setup_device_mesh(args.pp, args.ep)
    _truth(cap, "after the device mesh")
""")
swap("""    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
""", """    _truth(cap, "after the model")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
""")
swap("""        loss = train_step(step, model, optimizer, (microbatches, labels), args, record_range)
""", """        with cap.step(step):
            loss = train_step(step, model, optimizer, (microbatches, labels), args, record_range)
        if step == 0:
            torch.cuda.synchronize()
            print(f"[rank={cap.rank}] PEAK max_memory_allocated={torch.cuda.max_memory_allocated()} max_memory_reserved={torch.cuda.max_memory_reserved()}", flush=True)
            print(f"[rank={cap.rank}] WROTE {cap.written}", flush=True)
""")
open(p, "w").write(s)
