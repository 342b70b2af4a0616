"""Judges PyTorch's own memory profiler on the corpus recorded by corpus.py.

For each program of the corpus folder (default: testdata/snapshots/corpus) it matches the
profiler's allocations (profiler_NAME.jsonl.xz) to the snapshot's `alloc` events by address,
size and order (the n-th allocation of an address in the one is the n-th in the other), replays
the snapshot's trace (a block is allocated from its `alloc` to its `free_requested`, with the
block's size as the profiler saw it, or the requested size rounded up to 512 bytes; blocks alive
before the trace come from its frees and from the segments) and prints:

- how many bytes the profiler put in each category, over all allocations, and how many it left
  unknown;
- at the replayed peak: the live bytes by the profiler's category, and the program's printed
  TRUTH at the MARK nearest the peak;
- at that MARK: the live blocks the program named (PTRS: param, grad, optimizer_state, input,
  saved_activation; `other` for the rest) against the category the profiler gave each, in bytes.

A summary at the end adds these up over the programs, at the marks nearest the peaks and over
all marks.

A named storage that is no live block at its mark is counted, not placed: FSDP2 frees an
unsharded parameter that autograd saved by resizing its storage to nothing, so its saved
address names no block. Memory no tensor owns (the cuBLAS workspaces, collectives' buffers)
is `other` and, to the profiler, unknown.

Standard library only (no torch): python3 testdata/record/corpus_check.py [DIR]
"""

import collections
import json
import lzma
import os
import pickle
import re
import sys

KINDS = ("param", "grad", "optimizer_state", "input", "saved_activation")
CATEGORIES = ("PARAMETER", "GRADIENT", "OPTIMIZER_STATE", "INPUT", "ACTIVATION", "TEMPORARY",
              "AUTOGRAD_DETAIL", "unknown", "not profiled")
RIGHT = {"param": "PARAMETER", "grad": "GRADIENT", "optimizer_state": "OPTIMIZER_STATE",
         "input": "INPUT", "saved_activation": "ACTIVATION"}
FIELD = re.compile(r"(\w+)=(\S+)")


def mib(n):
    return f"{n / 1048576:.2f}"


def rounded(size):
    return max(512, -(-size // 512) * 512)


class Log:
    """What the program printed."""

    def __init__(self, path):
        self.marks = []  # [(step/name, {field: value}, {kind: total}, {kind: set of ptrs})]
        self.fields = {}
        self.lines = []
        self.what = ""
        current = None
        with open(path, errors="replace") as f:
            for line in f:
                line = line.rstrip("\n")
                head = line.split(" ", 1)[0]
                values = dict(FIELD.findall(line)) if head.isupper() else {}
                if head == "MARK":
                    current = (f"{values['step']}/{values['name']}", values, {}, {})
                    self.marks.append(current)
                elif head == "TRUTH" and current:
                    current[2].update({k: int(v) for k, v in values.items()
                                       if k not in ("step", "name")})
                elif head == "PTRS" and current:
                    text = line.rstrip().rsplit(" ", 1)[-1]
                    text = "" if "=" in text else text
                    current[3][values["kind"]] = {int(p, 16) for p in text.split(",") if p}
                if head == "PROGRAM":
                    self.what = line.partition(" what=")[2]
                if head in ("PROGRAM", "PEAK", "STEPS", "OPTIMIZERS", "PROFILER", "FATAL",
                              "RERUN"):
                    self.fields[head] = values
                    self.lines.append(line)


class Trace:
    """The snapshot's device 0: its events in order and the blocks alive before them."""

    def __init__(self, path):
        with lzma.open(path) as f:
            snap = pickle.load(f)
        self.events = [e for e in snap["device_traces"][0]
                       if e["action"] in ("alloc", "free_requested", "free_completed")]
        self.marks = [(a["name"].split("/", 1)[1], a["time_us"])
                      for a in snap.get("external_annotations", [])
                      if a.get("stage") == "START" and a["name"].startswith("memsnap.mark/")
                      and a.get("device", 0) == 0]
        allocated = {e["addr"] for e in self.events if e["action"] == "alloc"}
        self.before = {}  # address -> bytes, alive when the trace starts
        seen = set()
        for e in self.events:
            if e["action"] == "alloc":
                seen.add(e["addr"])
            elif e["addr"] not in seen and e["addr"] not in self.before:
                self.before[e["addr"]] = rounded(e["size"])
        for seg in snap["segments"]:
            if seg.get("device", 0) != 0:
                continue
            addr = seg["address"]
            for block in seg["blocks"]:
                if block["state"] == "active_allocated" and addr not in allocated:
                    self.before.setdefault(addr, block["size"])
                addr += block["size"]


def match(trace, rows):
    """The profiler row of each `alloc` event (by index in trace.events), by address and order."""
    by_ptr = collections.defaultdict(list)
    for row in sorted(rows, key=lambda r: r["t_ns"]):
        by_ptr[row["ptr"]].append(row)
    found, bad_size = {}, 0
    taken = collections.Counter()
    for i, e in enumerate(trace.events):
        if e["action"] != "alloc":
            continue
        queue = by_ptr.get(e["addr"], [])
        n = taken[e["addr"]]
        if n < len(queue):
            row = queue[n]
            taken[e["addr"]] += 1
            found[i] = row
            if not rounded(e["size"]) <= row["bytes"] <= rounded(e["size"]) + (1 << 20):
                bad_size += 1
    offsets = sorted(row["t_ns"] / 1000 - trace.events[i]["time_us"] for i, row in found.items())
    offset = offsets[len(offsets) // 2] if offsets else 0.0
    return found, bad_size, offset


def category(row, t_us, offset):
    """The profiler's category of a row at a snapshot time (the version alive then)."""
    if row is None:
        return "not profiled"
    cat = row["category"]
    for t_ns, c in row.get("categories_by_version", ()):
        if t_ns / 1000 - offset <= t_us:
            cat = c
    return cat or "unknown"


def replay(trace, found, offset, mark_times):
    """Allocated bytes over the trace; the live blocks at the peak and at each mark time."""
    live = {addr: (size, None) for addr, size in trace.before.items()}
    total = sum(trace.before.values())
    peak, peak_at, peak_live = total, None, dict(live)
    at_marks, m = [], 0
    marks = sorted(mark_times)
    for i, e in enumerate(trace.events):
        while m < len(marks) and marks[m] < e["time_us"]:
            at_marks.append(dict(live))
            m += 1
        if e["action"] == "alloc":
            row = found.get(i)
            size = row["bytes"] if row else rounded(e["size"])
            live[e["addr"]] = (size, row)
            total += size
            if total > peak:
                peak, peak_at, peak_live = total, e["time_us"], None
        elif e["addr"] in live:  # free_requested; free_completed only where none came first
            if peak_live is None:
                peak_live = dict(live)
            total -= live.pop(e["addr"])[0]
    if peak_live is None:
        peak_live = dict(live)
    while m < len(marks):
        at_marks.append(dict(live))
        m += 1
    return peak, peak_at, peak_live, at_marks


def by_category(live, t_us, offset):
    out = collections.Counter()
    for size, row in live.values():
        out[category(row, t_us, offset)] += size
    return out


def confusion(live, ptrs, t_us, offset):
    """Bytes of live blocks by (truth kind, profiler category); PTRS found in no block."""
    kind_of = {}
    for kind in KINDS:
        for p in ptrs.get(kind, ()):
            kind_of.setdefault(p, kind)
    table = collections.Counter()
    for addr, (size, row) in live.items():
        table[(kind_of.get(addr, "other"), category(row, t_us, offset))] += size
    missing = sum(1 for p in kind_of if p not in live)
    return table, missing


def show_counter(counter, order=CATEGORIES):
    keys = [k for k in order if counter.get(k)] + sorted(k for k in counter if k not in order)
    return " · ".join(f"{k} {mib(counter[k])}" for k in keys) or "nothing"


def show_confusion(table, indent="     "):
    lines = []
    for kind in (*KINDS, "other"):
        row = {c: n for (k, c), n in table.items() if k == kind and n}
        if row:
            lines.append(f"{indent}{kind:<16} " + show_counter(collections.Counter(row)))
    return lines


def check(folder, name, totals):
    log = Log(os.path.join(folder, f"{name}.log"))
    snap_path = os.path.join(folder, f"memory_snapshot_{name}.pickle.xz")
    prof_path = os.path.join(folder, f"profiler_{name}.jsonl.xz")
    program = log.fields.get("PROGRAM", {})
    out = [f"== {name} ({program.get('library', '?')}: {log.what}) · steps "
           f"{log.fields.get('STEPS', {}).get('n', '?')} · optimizers "
           f"{log.fields.get('OPTIMIZERS', {}).get('n', '?')}"]
    if not os.path.exists(snap_path):
        return out + ["   no snapshot"]
    trace = Trace(snap_path)
    rows = []
    if os.path.exists(prof_path):
        with lzma.open(prof_path, "rt") as f:
            rows = [json.loads(line) for line in f]
    found, bad_size, offset = match(trace, rows)
    n_alloc = sum(1 for e in trace.events if e["action"] == "alloc")
    names = [n for n, _ in trace.marks]
    mark_names = [n for n, *_ in log.marks]
    marks_ok = names == mark_names
    peak, peak_at, peak_live, at_marks = replay(trace, found, offset, [t for _, t in trace.marks])
    printed = int(log.fields.get("PEAK", {}).get("max_memory_allocated", -1))
    verdict = "= PEAK max_memory_allocated" if peak == printed else f"PEAK printed {printed}"
    if not rows and peak != printed:
        verdict += " (sizes not from a profile are requested sizes rounded up: approximate)"
    out.append(f"   trace {n_alloc} allocs · profiler {len(rows)} rows, {len(found)} matched, "
               f"{bad_size} of another size · {len(trace.before)} blocks before the trace · "
               f"replayed peak {peak} {verdict}"
               + ("" if marks_ok else f" · MARKS DIFFER ({len(names)} vs {len(mark_names)})"))
    if not rows:
        totals["unprofiled"].append(name)
        reason = next((line for line in log.lines if line.startswith(("PROFILER", "RERUN"))), "")
        out.append(f"   no profiler output: {reason[:160]}")
    else:
        created, unknown_n = collections.Counter(), 0
        for row in rows:
            created[row["category"] or "unknown"] += row["bytes"]
            unknown_n += row["category"] is None
        out.append(f"   profiler, all {len(rows)} allocations (MiB): {show_counter(created)}"
                   f" · unknown {unknown_n} of {len(rows)}")
        totals["created"].update(created)
        totals["rows"] += len(rows)
        totals["unknown_rows"] += unknown_n
    out.append(f"   live at the peak (MiB): {show_counter(by_category(peak_live, peak_at, offset))}")
    if not trace.marks or not marks_ok:
        return out
    pick = min(range(len(trace.marks)),
               key=lambda k: abs(trace.marks[k][1] - (peak_at or 0)))
    label, values, truth, ptrs = log.marks[pick]
    delta_ms = (trace.marks[pick][1] - (peak_at or 0)) / 1000
    out.append(f"   nearest mark {label} ({delta_ms:+.2f} ms from the peak) TRUTH "
               + " ".join(f"{k}={mib(truth.get(k, 0))}" for k in KINDS) + " MiB")
    table, missing = confusion(at_marks[pick], ptrs, trace.marks[pick][1], offset)
    out.append("   at that mark, the program's kinds by the profiler's category (MiB):"
               + (f" ({missing} named storages not found as blocks)" if missing else ""))
    out.extend(show_confusion(table))
    if rows:
        totals["peak"].update(table)
        for k, (_, _, _, p) in enumerate(log.marks):
            t, _ = confusion(at_marks[k], p, trace.marks[k][1], offset)
            totals["all"].update(t)
        totals["programs"] += 1
    return out


def summary(totals):
    out = ["", "== all programs with a profile: "
           f"{totals['programs']} programs, {totals['rows']} allocations, "
           f"{totals['unknown_rows']} of them unknown to the profiler; without a profile: "
           + (", ".join(totals["unprofiled"]) or "none"),
           f"   bytes created, by the profiler's category (MiB): {show_counter(totals['created'])}"]
    for key, title in (("peak", "at the marks nearest the peaks"),
                       ("all", "over all marks (bytes summed mark by mark)")):
        table = totals[key]
        out.append(f"   {title}: the program's kinds by the profiler's category (MiB):")
        out.extend(show_confusion(table))
        for kind in KINDS:
            whole = sum(n for (k, _), n in table.items() if k == kind)
            if whole:
                right = table[(kind, RIGHT[kind])]
                out.append(f"     {kind}: the profiler says {RIGHT[kind]} for "
                           f"{100 * right / whole:.1f}% of {mib(whole)} MiB")
        other = sum(n for (k, _), n in table.items() if k == "other")
        for cat in ("PARAMETER", "GRADIENT", "OPTIMIZER_STATE", "INPUT"):
            if table[("other", cat)]:
                out.append(f"     other memory the profiler calls {cat}: "
                           f"{mib(table[('other', cat)])} MiB of {mib(other)} MiB")
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    folder = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "snapshots", "corpus")
    names = sorted(f[:-4] for f in os.listdir(folder)
                   if f.endswith(".log") and not f.endswith(".first.log"))
    totals = {"created": collections.Counter(), "peak": collections.Counter(),
              "all": collections.Counter(), "rows": 0, "unknown_rows": 0, "programs": 0,
              "unprofiled": []}
    print("PyTorch's memory profiler (torch/profiler/_memory_profiler.py) against the snapshot "
          "and the programs' own truth; sizes in MiB of blocks (2^20 bytes)")
    for name in names:
        print("\n".join(check(folder, name, totals)))
    print("\n".join(summary(totals)))


if __name__ == "__main__":
    main()
