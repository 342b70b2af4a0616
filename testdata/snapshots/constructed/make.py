"""Builds the snapshots of newer PyTorch versions that no machine here can record.

Each output is a real torch 2.11 recording (`../pools/`) with the fields a newer
version writes added, as that version's serialization writes them (see `README.md` beside this
file for the source each follows). Nothing else of the recording changes.

- `pools_*_pool_ids.pickle.xz`: every trace entry gets `pool_id`, a `(int, int)` tuple, the
  same shape as a segment's `segment_pool_id` (pytorch/pytorch#177717). An entry's pool is the
  pool of the segment that holds its address in the recording's marks (`MARK` lines of the
  `.log`: `torch.cuda.memory_snapshot()` taken at that point, which also wrote a `snapshot`
  trace entry): the first mark after the entry where the address is in a segment (the last
  mark before it for entries that free), else the nearest mark the other way. Entries with no
  address (`snapshot`, `oom`) get `(0, 0)`, as the allocator's `TraceEntry` defaults.
- `host_pinned.pickle.xz`: the default-pool recording with `host_segments` and `host_traces`
  (torch 2.14, `record_pinned_host_memory=True`, pytorch/pytorch#182407) for the program's two
  8 MiB pinned buffers. Its segments and entries are dicts with the keys of the device ones
  (the 2.14 and 2.15 binaries hold no other key names for them), `host_traces` one list of
  entries (memsnap also reads one list per device); each buffer is its own `cudaHostAlloc`
  of the request rounded to a power of two, as the pinned allocator hands them out.
- `annotated.pickle.xz`: the default-pool recording with `annotate` trace entries
  (`torch.cuda.memory._annotate_tensor`, torch 2.14: `addr` the allocation's base address,
  `user_metadata` the text, the annotation site's frames) right after the first two
  allocations (the first Linear's weight and bias: `parameter`) and after the MemPool's 30 MiB
  buffer (`activation`, which inference does not say), and the MemPool's 12 MiB buffer
  allocated under dict metadata (`_set_memory_metadata({"component": "gradient"})`, written
  as compact JSON since torch 2.15).

- `skip_free_requested.pickle.xz`, `skip_free_completed.pickle.xz`: the default-pool
  recording with pool ids, without the entries of one action, as
  `_record_memory_history(skip_actions=[...])` (torch 2.10+) leaves them out.

Usage: python3 make.py      (writes beside itself; needs only the standard library)
"""

import bisect
import json
import lzma
import os
import pickle

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "..", "pools")
FREEING = {"free_requested", "free_completed", "segment_free", "segment_unmap"}


def marks_of(log_path):
    marks = []
    for line in open(log_path):
        if line.startswith("MARK "):
            marks.append(json.loads(line[5:]))
    return marks


def pool_at(mark, addr):
    for base, size, pool in mark["segments"]:
        if base <= addr < base + size:
            return tuple(pool)
    return None


def add_pool_ids(snap, marks):
    trace = snap["device_traces"][0]
    # the k-th `snapshot` entry is the k-th mark's memory_snapshot() call
    mark_at = [i for i, e in enumerate(trace) if e["action"] == "snapshot"][: len(marks)]
    unplaced = 0
    for i, e in enumerate(trace):
        if e["action"] in ("snapshot", "oom") or "addr" not in e:
            e["pool_id"] = (0, 0)
            continue
        k = bisect.bisect_left(mark_at, i)
        after = list(range(k, len(mark_at)))
        before = list(range(k - 1, -1, -1))
        order = before + after if e["action"] in FREEING else after + before
        pool = None
        for m in order:
            pool = pool_at(marks[m], e["addr"])
            if pool is not None:
                break
        if pool is None:
            unplaced += 1
            pool = (0, 0)
        e["pool_id"] = pool
    return unplaced


def load(name):
    with lzma.open(os.path.join(SOURCE, name + ".pickle.xz"), "rb") as f:
        return pickle.load(f)


def write(snap, name):
    with lzma.open(os.path.join(HERE, name + ".pickle.xz"), "wb") as f:
        pickle.dump(snap, f, protocol=4)


def pool_ids():
    for name in ("pools_default", "pools_expandable"):
        snap = load(name)
        unplaced = add_pool_ids(snap, marks_of(os.path.join(SOURCE, name + ".log")))
        counts = {}
        for e in snap["device_traces"][0]:
            counts[e["pool_id"]] = counts.get(e["pool_id"], 0) + 1
        print(name, "entries per pool:", dict(sorted(counts.items())), "unplaced:", unplaced)
        write(snap, name + "_pool_ids")


def host_entry(action, addr, size, time_us):
    return {
        "action": action,
        "addr": addr,
        "size": size,
        "stream": 0,
        "time_us": time_us,
        "compile_context": "N/A",
        "user_metadata": "",
        "frames": [{"filename": "pools.py", "line": 111, "name": "workload"}],
        "pool_id": (0, 0),
    }


def host_pinned():
    snap = load("pools_default")
    trace = snap["device_traces"][0]
    t0 = trace[0]["time_us"]
    mib8 = 8 << 20
    a, b = 0x7F3A00000000, 0x7F3A01000000
    # two pinned buffers of 8 MiB (a power of two, so the block is the request), each its own
    # cudaHostAlloc; the first is freed at the end, the second stays
    snap["host_traces"] = [
        host_entry("segment_alloc", a, mib8, t0 + 100),
        host_entry("alloc", a, mib8, t0 + 100),
        host_entry("segment_alloc", b, mib8, t0 + 200),
        host_entry("alloc", b, mib8, t0 + 200),
        host_entry("free_requested", a, mib8, t0 + 300),
        host_entry("free_completed", a, mib8, t0 + 300),
    ]
    snap["host_segments"] = [
        {
            "device": 0,
            "address": base,
            "total_size": mib8,
            "allocated_size": mib8 if live else 0,
            "active_size": mib8 if live else 0,
            "requested_size": mib8 if live else 0,
            "stream": 0,
            "segment_type": "large",
            "segment_pool_id": (0, 0),
            "is_expandable": False,
            "frames": [],
            "blocks": [
                {
                    "address": base,
                    "size": mib8,
                    "requested_size": mib8 if live else 0,
                    "state": "active_allocated" if live else "inactive",
                    "frames": [],
                }
            ],
        }
        for base, live in ((a, False), (b, True))
    ]
    write(snap, "host_pinned")


def annotated():
    snap = load("pools_default")
    trace = snap["device_traces"][0]
    # the first two allocations are the first Linear's weight and bias (model built first)
    allocs = [e for e in trace if e["action"] == "alloc"]
    buffer_a = next(e for e in allocs if e["size"] == 30 << 20)
    buffer_e = next(e for e in allocs if e["size"] == 12 << 20)
    buffer_e["user_metadata"] = json.dumps({"component": "gradient"}, separators=(",", ":"))
    notes = [(allocs[0], "parameter"), (allocs[1], "parameter"), (buffer_a, "activation")]
    out = []
    done = set()
    for e in trace:
        out.append(e)
        for target, text in notes:
            if e is target and id(target) not in done:
                done.add(id(target))
                note = dict(target)
                note["action"] = "annotate"
                note["user_metadata"] = text
                out.append(note)
    snap["device_traces"][0] = out
    write(snap, "annotated")


def skipped():
    for action in ("free_requested", "free_completed"):
        with lzma.open(os.path.join(HERE, "pools_default_pool_ids.pickle.xz"), "rb") as f:
            snap = pickle.load(f)
        snap["device_traces"][0] = [e for e in snap["device_traces"][0] if e["action"] != action]
        write(snap, "skip_" + action)


if __name__ == "__main__":
    pool_ids()
    host_pinned()
    annotated()
    skipped()
