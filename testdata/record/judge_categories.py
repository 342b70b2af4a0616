"""Judges memsnap's categories, train steps and phase ends against what the recorded programs
printed about themselves (testdata/snapshots/corpus and testdata/snapshots/programs).

For each program it runs `MEMSNAP report --json` and `MEMSNAP export --format jsonl` on the
snapshot, replays the exported events (a block lives from its `alloc` to the free that lowers
`allocated_after_bytes`; blocks alive before the trace come from the `blocks` table and from
frees with no `alloc`), and reads the snapshot's own stacks with `pickle` (no torch). Then:

1. Marks. Each `MARK step=S name=N memory_allocated=A` of the log is matched, in order, to its
   empty `record_function("memsnap.mark/S/N")` in the snapshot's annotations: the last event at
   or before that time, moved to the nearest event after which allocated bytes equal A when
   they do not (a lone log without annotations is matched by bytes alone). The blocks live
   there must add up to A.
2. Categories. At every matched MARK with PTRS lines, a live block whose address is in the
   PTRS list of kind K should have memsnap's category for K (param: parameter, grad:
   gradient, optimizer_state: optimizer state, input: input; saved_activation: activation is
   shown apart). Bytes are counted mark by mark ("byte-marks": a block live at five marks
   counts five times): agree, disagree (by memsnap's category) and false positives (memsnap
   says K for a block the truth does not list as K, by what the truth lists it as; `none`:
   listed under no kind). The distinct wrong allocations are then grouped by truth kind,
   memsnap's category, the marks they were allocated and freed after, and their stacks.
   A kind the program prints but never lists a storage under (the batches a Trainer or
   Lightning moves itself) is not tracked: memsnap's category for it is shown, not judged.
3. Train steps: the distinct `train_step`s of the report's step table rows labelled
   `train step N` (and those with an optimizer row) against `STEPS n=N` (programs/ logs have
   none: the distinct MARK steps). Phase ends: a MARK is an end when a step-table row's
   `last_event` lies in the stretch of events around the mark where allocated bytes stay at
   the MARK's value (also counted: rows whose `end_allocated_bytes` merely equals the value);
   a mark that ends no row is told apart by what follows it in its row: frees only
   ("trailing frees") or allocations too ("no boundary").
4. The peak: memsnap's categories at `peak_event_index` (the report's `peak_breakdown`) against
   the truth kind of each block live then, taken from the nearest MARK before the peak at which
   the same allocation was live, else the nearest after; blocks born and dead between the two
   marks are `between marks`.

With --table it prints instead, for the corpus alone, one Markdown table row per program that
sets memsnap and PyTorch's profiler side by side on the same measure: the byte-marks of the
blocks the program listed as param, grad or optimizer_state (PTRS), by whether memsnap's
category agrees, differs or is `unknown`, and whether the profiler's category (the
`profiler_NAME.jsonl.xz` of corpus.py, each allocation matched to the snapshot's `alloc` by
address and order as record/corpus_check.py does, its category the version alive at the mark's
time) is PARAMETER, GRADIENT or OPTIMIZER_STATE as the truth says, another category or unknown;
the byte-marks of other blocks each calls param, grad or optimizer state; and the train steps.
Both count a block with the size memsnap replays for it, so their columns add up alike. Below
the table: the totals in shares, how many allocations each leaves unknown, and the rest of the
memory at the marks (input, saved_activation and blocks listed under no kind) by each one's
category, program by program.

Standard library only:
    python3 testdata/record/judge_categories.py [MEMSNAP] [--only NAME,NAME] [--groups N] [--table]
MEMSNAP defaults to target/release/memsnap. Output goes to standard output.
"""

import collections
import json
import lzma
import os
import pickle
import re
import subprocess
import sys
import tempfile

# the profiler's category of an allocation at a snapshot time, as corpus_check.py reads it
from corpus_check import category as profiler_category

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
FOLDERS = ("testdata/snapshots/corpus", "testdata/snapshots/programs")

KINDS = ("param", "grad", "optimizer_state", "input")
ALL_KINDS = KINDS + ("saved_activation",)
RIGHT = {"param": "parameter", "grad": "gradient", "optimizer_state": "optimizer state",
         "input": "input", "saved_activation": "activation"}
SHORT = {"param": "param", "grad": "grad", "optimizer_state": "opt", "input": "input",
         "saved_activation": "saved"}
FIELD = re.compile(r"(\w+)=(\S*)")
FREES = ("free_requested", "free_completed")


def mib(n):
    return f"{n / 1048576:.2f}"


def pct(a, b):
    return f"{100.0 * a / b:.1f}%" if b else "-"


# --- the program's own account -----------------------------------------------------------------


class Mark:
    def __init__(self, step, name, allocated):
        self.step, self.name, self.allocated = step, name, allocated
        self.truth = {}
        self.ptrs = {}  # kind -> set of addresses (only when PTRS lines were printed)
        self.cut = None  # index of the last event before the mark (-1: before the first)
        self.time = None  # the mark's time (µs): its annotation, else the event at `cut`
        self.kind_of = {}  # block address -> the truth kinds naming it (marks with PTRS)
        self.how = None
        self.live = None

    @property
    def label(self):
        return f"{self.step}/{self.name}"


class Log:
    def __init__(self, path):
        self.marks = []
        self.fields = {}
        self.what = ""
        current = None
        with open(path, errors="replace") as f:
            for line in f:
                line = line.rstrip("\n")
                head = line.split(" ", 1)[0]
                if not head.isupper():
                    continue
                values = dict(FIELD.findall(line))
                if head == "MARK":
                    current = Mark(int(values["step"]), values["name"],
                                   int(values["memory_allocated"]))
                    self.marks.append(current)
                elif head == "TRUTH" and current:
                    current.truth = {k: int(v) for k, v in values.items()
                                     if k not in ("step", "name")}
                elif head == "PTRS" and current:
                    text = line.rsplit(" ", 1)[-1]
                    text = "" if "=" in text else text
                    current.ptrs[values["kind"]] = {int(p, 16) for p in text.split(",") if p}
                elif head == "PROGRAM":
                    self.what = line.partition(" what=")[2]
                    self.fields[head] = values
                elif head in ("STEPS", "OPTIMIZERS", "PEAK", "FATAL", "CAUGHT"):
                    self.fields.setdefault(head, values)

    def truth_steps(self):
        if "STEPS" in self.fields:
            return int(self.fields["STEPS"]["n"]), "STEPS"
        return len({m.step for m in self.marks}), "distinct MARK steps"


# --- memsnap's account -------------------------------------------------------------------------


def run_memsnap(binary, snapshot, out_dir):
    report = subprocess.run([binary, "report", "--json", snapshot], capture_output=True,
                            text=True, check=True).stdout
    report = json.loads(report.splitlines()[0])
    subprocess.run([binary, "export", snapshot, "--format", "jsonl", "-o", out_dir, "-q",
                    "--force"], capture_output=True, text=True, check=True)

    def table(name):
        path = os.path.join(out_dir, f"{name}.jsonl")
        if not os.path.exists(path):
            return []
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]

    return report, table("events"), table("blocks"), table("steps")


class Block:
    __slots__ = ("addr", "size", "alloc", "free", "cat", "phase_alloc", "site", "kinds",
                 "wrong", "id")

    def __init__(self, addr, size, alloc, cat, site):
        self.addr, self.size, self.alloc, self.free, self.cat = addr, size, alloc, None, cat
        self.site = site
        self.kinds = collections.Counter()  # truth kind at the marks where it is live
        self.wrong = collections.Counter()  # (kind, 'disagree'|'fp') -> marks
        self.id = None

    def live_after(self, i):
        return self.alloc <= i and (self.free is None or self.free > i)


def replay(events, blocks_table, start_allocated):
    """Every allocation of the trace, with the event index of its allocation and its free."""
    blocks, live = [], {}
    for row in blocks_table:
        if row.get("alloc_event") is None:
            b = Block(row["address"], row["size_bytes"], -1, row.get("category"), row.get("site"))
            blocks.append(b)
            live[b.addr] = b
    allocated = [0] * len(events)
    prev = start_allocated
    for k, e in enumerate(events):
        now = e["allocated_after_bytes"]
        delta = now - prev
        prev = now
        allocated[k] = now
        action, addr = e["action"], e["addr"]
        if action == "alloc":
            b = Block(addr, delta, k, e.get("category"), e.get("site"))
            blocks.append(b)
            live[addr] = b
        elif action in FREES and delta < 0:
            b = live.pop(addr, None)
            if b is None:  # alive before the trace and freed in it
                b = Block(addr, -delta, -1, e.get("category"), e.get("site"))
                blocks.append(b)
            b.free = k
    for n, b in enumerate(blocks):
        b.id = n
    return blocks, allocated


# --- stacks ------------------------------------------------------------------------------------


def load_snapshot(path, device):
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rb") as f:
        snap = pickle.load(f)
    traces = snap.get("device_traces") or []
    trace = traces[device] if device < len(traces) else []
    marks = [(a["name"].split("/", 1)[1], a["time_us"])
             for a in snap.get("external_annotations", []) or []
             if a.get("stage", "START") == "START"
             and str(a.get("name", "")).startswith("memsnap.mark/")
             and a.get("device", device) == device]
    return trace, marks


def short_file(filename):
    f = filename.replace("\\", "/")
    if "site-packages/" in f:
        return f.split("site-packages/", 1)[1]
    if "/lib/python3" in f:
        return "python/" + f.rsplit("/", 1)[1]
    return f.rsplit("/", 1)[-1]


PROGRAM_FILES = ("corpus.py", "programs.py")


def stack_text(frames, depth=5):
    """Innermost frames first: library frames by file and function, the recording program's
    frames with their lines; the innermost frame of the program itself always shown."""
    if not frames:
        return "<no Python frames>"
    parts, seen_prog = [], False
    for f in frames:
        name = short_file(f.get("filename", "?"))
        if name.startswith("python/") or name.startswith("<frozen"):
            continue
        if name in PROGRAM_FILES:
            parts.append(f"{name}:{f.get('name')}:{f.get('line')}")
            seen_prog = True
            break
        text = f"{name}:{f.get('name')}"
        if not parts or parts[-1] != text:
            parts.append(text)
    if len(parts) > depth:
        keep = parts[: depth - 1] + ["…"] + ([parts[-1]] if seen_prog else [])
        parts = keep
    return " < ".join(parts)


TAGS = (
    ("Module._apply/.to", re.compile(r"torch/nn/modules/module\.py:(_apply|to|cuda|convert)$")),
    ("module init",
     re.compile(r"torch/nn/modules/.*:(__init__|reset_parameters)$|torch/nn/init\.py")),
    ("load_state_dict", re.compile(r"load_state_dict|_load_from_state_dict")),
    ("module call", re.compile(r"torch/nn/modules/module\.py:(_call_impl|_wrapped_call_impl)$")),
    ("torch/optim", re.compile(r"torch/optim/")),
    ("zero_grad", re.compile(r":zero_grad$")),
    ("autograd.backward",
     re.compile(r"torch/autograd/(__init__\.py:backward|graph\.py:_engine_run_backward)"
                r"|torch/_tensor\.py:backward")),
    ("autograd.Function", re.compile(r"torch/autograd/function\.py")),
    ("checkpoint", re.compile(r"torch/utils/checkpoint\.py")),
    ("GradScaler", re.compile(r"amp/grad_scaler\.py")),
    ("DDP", re.compile(r"nn/parallel/distributed\.py")),
    ("FSDP2", re.compile(r"torch/distributed/(fsdp|_composable/fsdp)")),
    ("torch.distributed", re.compile(r"torch/distributed/(?!fsdp|_composable/fsdp)")),
    ("dynamo/inductor", re.compile(r"torch/_(dynamo|inductor|functorch)")),
    ("cudagraph trees", re.compile(r"cudagraph_trees")),
    ("DataLoader", re.compile(r"torch/utils/data/")),
    ("lightning", re.compile(r"^(lightning|pytorch_lightning|lightning_fabric)/")),
    ("transformers", re.compile(r"^transformers/")),
    ("accelerate", re.compile(r"^accelerate/")),
    ("peft", re.compile(r"^peft/")),
    ("torch_geometric", re.compile(r"^torch_geometric/")),
    ("torchdiffeq", re.compile(r"^torchdiffeq/")),
    ("gpytorch", re.compile(r"^(gpytorch|linear_operator)/")),
    ("no torch frame", None),
)


def stack_tags(frames):
    """Which PyTorch and library machinery the stack passes through."""
    if not frames:
        return ["no Python frames (autograd thread)"]
    texts = [f"{short_file(f.get('filename', '?'))}:{f.get('name')}" for f in frames]
    found = [tag for tag, rx in TAGS if rx is not None and any(rx.search(t) for t in texts)]
    if texts and not found and not any(t.startswith("torch/") for t in texts):
        found.append("no torch frame")
    return found


# --- matching marks to events ------------------------------------------------------------------


def match_marks(log, events, allocated, start_allocated, annotations):
    """Sets each mark's `cut` (the last event before it) and `how`."""
    times = [e["time_us"] for e in events]
    value_at = lambda i: start_allocated if i < 0 else allocated[i]  # noqa: E731
    queue = collections.defaultdict(list)
    for label, t in annotations:
        queue[label].append(t)
    used = collections.Counter()
    floor = -1
    for n, m in enumerate(log.marks):
        ts = queue.get(m.label, [])
        k = used[m.label]
        used[m.label] += 1
        if k < len(ts):
            t = ts[k]
            lo, hi = 0, len(times)
            while lo < hi:  # last index with time <= t
                mid = (lo + hi) // 2
                if times[mid] <= t:
                    lo = mid + 1
                else:
                    hi = mid
            cut = lo - 1
            m.time = t
            if value_at(cut) == m.allocated:
                m.cut, m.how = cut, "time"
            else:
                best = None
                for d in range(1, 400):
                    for c in (cut - d, cut + d):
                        if floor <= c < len(events) and value_at(c) == m.allocated:
                            best = c
                            break
                    if best is not None:
                        break
                if best is not None:
                    m.cut, m.how = best, f"time{best - cut:+d}"
                else:
                    m.cut, m.how = cut, "time≠"
        else:  # by bytes alone, after the previous mark
            c = next((c for c in range(max(floor, -1), len(events))
                      if value_at(c) == m.allocated), None)
            if c is None:
                m.cut, m.how = None, "unmatched"
                continue
            m.cut, m.how = c, "bytes"
        floor = max(floor, m.cut)
        if m.time is None:
            m.time = events[m.cut]["time_us"] if 0 <= m.cut < len(events) else (
                events[0]["time_us"] if events else 0)


def flat_stretch(cut, allocated, start_allocated):
    """The event indices around `cut` after which allocated bytes equal those after `cut`."""
    value = start_allocated if cut < 0 else allocated[cut]
    lo = cut
    while lo - 1 >= -1 and (start_allocated if lo - 1 < 0 else allocated[lo - 1]) == value:
        lo -= 1
    hi = cut
    while hi + 1 < len(allocated) and allocated[hi + 1] == value:
        hi += 1
    return lo, hi


def program_frame(frames):
    """The innermost frame that is not the standard library's, with its line."""
    for f in frames or []:
        name = short_file(f.get("filename", "?"))
        if not name.startswith(("python/", "<frozen")):
            return f"{name}:{f.get('name')}:{f.get('line')}"
    return "<no Python frames>"


def end_failure(m, steps, events, allocated, frames_of):
    """Why no step row ends at mark m: (kind, text)."""
    row = next((s for s in steps if s["first_event"] <= max(m.cut, 0) <= s["last_event"]), None)
    if row is None:
        return "no row", "no step row holds the mark"
    tail = range(m.cut + 1, row["last_event"] + 1)
    allocs = [k for k in tail if events[k]["action"] == "alloc"]
    frees = [k for k in tail if events[k]["action"] in FREES
             and allocated[k] < (allocated[k - 1] if k > 0 else allocated[k])]
    freed = sum(allocated[k - 1] - allocated[k] for k in frees)
    where = collections.Counter(program_frame(frames_of(k)) for k in frees or allocs)
    sites = "; ".join(f"{w} ×{n}" for w, n in where.most_common(2))
    if not allocs and frees:
        return ("trailing frees", f"row '{row['label']}' runs on over {len(frees)} frees "
                f"({mib(freed)} MiB) to #{row['last_event']}, freed at {sites}")
    if allocs:
        nxt = next((s for s in steps if s["first_event"] > m.cut), None)
        return ("no boundary", f"row '{row['label']}' runs on over {len(allocs)} allocations "
                f"and {len(frees)} frees to #{row['last_event']} (next row "
                + (f"'{nxt['label']}'" if nxt else "none") + f"), first at {sites}")
    return "other", f"row '{row['label']}' #{row['first_event']}..#{row['last_event']}"


# --- judging one program -----------------------------------------------------------------------


def judge(binary, log_path, snap_path, name, groups_shown):
    log = Log(log_path)
    out = []
    res = {"name": name}
    with tempfile.TemporaryDirectory(prefix="judge_") as tmp:
        report, events, blocks_table, steps = run_memsnap(binary, snap_path, tmp)
    dev = report["devices"][0]
    device = dev["device"]
    events = [e for e in events if e["device"] == device]
    events.sort(key=lambda e: e["index"])
    blocks_table = [b for b in blocks_table if b["device"] == device]
    steps = [s for s in steps if s["device"] == device]
    trace, annotations = load_snapshot(snap_path, device)
    aligned = len(trace) == len(events) and all(
        t.get("action") == e["action"] and t.get("addr", e["addr"]) == e["addr"]
        for t, e in zip(trace, events))
    start_alloc = dev["start_allocated_bytes"]
    blocks, allocated = replay(events, blocks_table, start_alloc)
    match_marks(log, events, allocated, start_alloc, annotations)

    def frames_of(k):
        return trace[k].get("frames", []) if aligned and 0 <= k < len(trace) else []

    def row_of(k):
        for s in steps:
            if s["first_event"] <= k <= s["last_event"]:
                return s["label"]
        return "?"

    marks = [m for m in log.marks if m.cut is not None]
    cuts = sorted((m.cut, i) for i, m in enumerate(marks))

    def after_mark(k):
        """The name of the last mark before event k (the phase the truth says k is in)."""
        best = None
        for c, i in cuts:
            if c < k:
                best = marks[i]
            else:
                break
        return best.name if best else "(before the first mark)"

    head = (f"== {name} ({log.fields.get('PROGRAM', {}).get('library', 'programs')}: "
            f"{log.what or '-'}) · {len(events)} events · {len(blocks)} allocations"
            + ("" if aligned else " · STACKS NOT ALIGNED"))
    out.append(head)
    hows = collections.Counter(m.how for m in log.marks)
    sums_ok = 0
    for m in marks:
        m.live = [b for b in blocks if b.live_after(m.cut)]
        sums_ok += sum(b.size for b in m.live) == m.allocated
    out.append(f"   marks: {len(log.marks)} in the log, matched "
               + ", ".join(f"{k} {v}" for k, v in sorted(hows.items(), key=str))
               + f"; live blocks add up to memory_allocated at {sums_ok} of {len(marks)}")

    # 2. categories at the marks
    agree = collections.Counter()
    disagree = {k: collections.Counter() for k in ALL_KINDS}
    fp = {k: collections.Counter() for k in KINDS}
    total = collections.Counter()
    missing = collections.Counter()
    judged = 0
    kinds_known = set()
    for m in marks:
        if not m.ptrs:
            continue
        judged += 1
        kinds_known.update(m.ptrs)
        live_addr = {b.addr: b for b in m.live}
        kind_of = collections.defaultdict(set)
        for k in ALL_KINDS:
            for p in m.ptrs.get(k, ()):
                if p in live_addr:
                    kind_of[p].add(k)
                else:
                    inside = next((b for b in m.live if b.addr < p < b.addr + b.size), None)
                    if inside is not None:
                        kind_of[inside.addr].add(k)
                    else:
                        missing[k] += 1
        m.kind_of = kind_of
        for b in m.live:
            ks = kind_of.get(b.addr, set())
            for k in ks:
                b.kinds[k] += 1
            if not ks:
                b.kinds["none"] += 1
            for k in ALL_KINDS:
                if k not in m.ptrs:
                    continue
                if k in ks:
                    total[k] += b.size
                    if b.cat == RIGHT[k]:
                        agree[k] += b.size
                    else:
                        disagree[k][b.cat] += b.size
                        b.wrong[(k, b.cat, "disagree")] += 1
                elif k in KINDS and b.cat == RIGHT[k]:
                    truth = "/".join(sorted(ks)) or "none"
                    fp[k][truth] += b.size
                    b.wrong[(truth, b.cat, "fp")] += 1
    # a kind the program printed but never listed a storage under is not tracked by it (the
    # batches a Trainer or Lightning moves itself): memsnap's category for it is not judged
    tracked = {k for k in kinds_known if any(m.ptrs.get(k) for m in marks)}
    untracked_fp = {k: fp.pop(k) for k in list(fp) if k not in tracked and fp[k]}
    for k in untracked_fp:
        fp[k] = collections.Counter()
    res.update(agree=agree, total=total, disagree=disagree, fp=fp, judged=judged,
               kinds_known=kinds_known, tracked=tracked, untracked_fp=untracked_fp)
    out.append(f"   categories at {judged} marks with PTRS (MiB, byte-marks)"
               + (f"; named storages in no live block: "
                  + ", ".join(f"{k} {v}" for k, v in missing.items()) if missing else ""))
    for k in ALL_KINDS:
        if k not in kinds_known:
            continue
        line = f"     {k:<16} right {mib(agree[k])} of {mib(total[k])} ({pct(agree[k], total[k])})"
        if disagree[k]:
            line += "; memsnap says " + ", ".join(
                f"{c} {mib(v)}" for c, v in disagree[k].most_common())
        if k in fp and fp[k]:
            line += f"; {RIGHT[k]} that is not {k}: " + ", ".join(
                f"{t} {mib(v)}" for t, v in fp[k].most_common())
        if k in untracked_fp:
            line += (f"; the program lists no {k} at any mark (not tracked): memsnap's {RIGHT[k]} "
                     "there, not judged: " + ", ".join(
                         f"{t} {mib(v)}" for t, v in untracked_fp[k].most_common()))
        out.append(line)

    # the distinct wrong allocations, grouped
    group = collections.defaultdict(lambda: [0, 0, 0, set()])
    for b in blocks:
        if not b.wrong:
            continue
        k_alloc = frames_of(b.alloc) if b.alloc >= 0 else None
        k_free = frames_of(b.free) if b.free is not None else None
        for (truth, cat, why), n in b.wrong.items():
            if why == "fp" and not any(cat == RIGHT[k] for k in tracked):
                continue
            key = (
                why, truth, cat,
                "before the trace" if b.alloc < 0 else after_mark(b.alloc),
                "never" if b.free is None else after_mark(b.free),
                "<allocated before the trace>" if k_alloc is None else stack_text(k_alloc),
                "-" if k_free is None else stack_text(k_free, 3),
                ", ".join(stack_tags(k_alloc)) if k_alloc is not None else "",
                row_of(b.alloc).split(" · ")[-1] if b.alloc >= 0 else "-",
                events[b.alloc].get("op", "-") if b.alloc >= 0 else "-",
            )
            g = group[key]
            g[0] += b.size
            g[1] += 1
            g[2] += n * b.size
            g[3].add(b.id)
    res["groups"] = {k: (v[0], v[1], v[2]) for k, v in group.items()}
    if group:
        out.append("   wrong allocations (distinct; bytes once each · byte-marks), largest first:")
        ranked = sorted(group.items(), key=lambda kv: -kv[1][2])
        for key, (size, count, bm, _) in ranked[:groups_shown]:
            why, truth, cat, a_after, f_after, a_stack, f_stack, tags, row, op = key
            what = (f"{truth} called {cat}" if why == "disagree"
                    else f"{cat} but truth {truth}")
            out.append(f"     [{what}] {mib(size)} MiB in {count} · {mib(bm)} byte-marks · "
                       f"allocated after mark '{a_after}' (memsnap: {row}, op {op}), freed "
                       f"after '{f_after}'")
            out.append(f"        alloc: {a_stack}" + (f"   [{tags}]" if tags else ""))
            out.append(f"        free:  {f_stack}")
        if len(ranked) > groups_shown:
            rest = ranked[groups_shown:]
            out.append(f"     … {len(rest)} more groups, {mib(sum(v[2] for _, v in rest))} "
                       "byte-marks")

    # 3. train steps and phase ends
    train_steps = sorted({s["train_step"] for s in steps if s["label"].startswith("train step")})
    with_opt = sorted({s["train_step"] for s in steps if "optimizer" in s["label"]})
    truth_n, truth_from = log.truth_steps()
    res.update(steps_memsnap=len(train_steps), steps_opt=len(with_opt), steps_truth=truth_n)
    out.append(f"   train steps: memsnap {len(train_steps)} (rows with an optimizer phase in "
               f"{len(with_opt)}), the program {truth_n} ({truth_from})"
               + ("" if len(train_steps) == truth_n else "  ← MISMATCH"))
    ends_ok, ends_value, ends_total, missing_ends = 0, 0, 0, []
    ends_by_name = collections.Counter()
    ends_ok_by_name = collections.Counter()
    end_kinds = collections.Counter()
    for m in marks:
        base = re.sub(r"_mb\d+$", "", m.name)
        ends_total += 1
        ends_by_name[base] += 1
        lo, hi = flat_stretch(m.cut, allocated, start_alloc)
        rows = [s for s in steps if lo <= s["last_event"] <= hi
                or (m.cut < 0 and s["first_event"] == 0 and lo < 0 and s["last_event"] < 0)]
        by_value = [s for s in steps if s["end_allocated_bytes"] == m.allocated]
        ends_value += bool(by_value)
        if rows:
            ends_ok += 1
            ends_ok_by_name[base] += 1
        elif m.cut < 0 or (m.cut == len(events) - 1 and m.name == "end"):
            ends_ok += 1  # before the first event or after the last: the trace's own ends
            ends_ok_by_name[base] += 1
        else:
            why, detail = end_failure(m, steps, events, allocated, frames_of)
            end_kinds[why] += 1
            missing_ends.append(f"{m.label} (#{m.cut}, {mib(m.allocated)} MiB): {detail}")
    res.update(ends_ok=ends_ok, ends_total=ends_total, ends_value=ends_value, end_kinds=end_kinds,
               ends_by_name=ends_by_name, ends_ok_by_name=ends_ok_by_name)
    out.append(f"   phase ends: {ends_ok} of {ends_total} marks end a step row "
               f"({ends_value} have a row with that end value); by name: "
               + ", ".join(f"{n} {ends_ok_by_name[n]}/{t}" for n, t in ends_by_name.items()))
    for text in missing_ends[:12]:
        out.append(f"     missing: {text}")
    if len(missing_ends) > 12:
        out.append(f"     … {len(missing_ends) - 12} more")

    # 4. the peak
    peak = dev.get("peak_event_index")
    breakdown = {r["label"]: r["bytes"]
                 for r in (dev.get("peak_breakdown") or {}).get("category", [])}
    out.append(f"   peak {mib(dev['peak_allocated_bytes'])} MiB after #{peak} "
               f"({(dev.get('peak') or {}).get('step')}); memsnap: "
               + ", ".join(f"{c} {mib(v)}" for c, v in breakdown.items()))
    matrix = collections.Counter()
    if peak is not None and marks:
        live = [b for b in blocks if b.live_after(peak)]
        before = [m for m in marks if m.cut <= peak and m.ptrs]
        after = [m for m in marks if m.cut >= peak and m.ptrs]
        prev = max(before, key=lambda m: m.cut) if before else None
        nxt = min(after, key=lambda m: m.cut) if after else None

        def kind_at(m, b):
            ks = [k for k in ALL_KINDS if b.addr in m.ptrs.get(k, ())]
            return ks[0] if ks else "none"

        truth = collections.Counter()
        for b in live:
            if prev is not None and b.live_after(prev.cut):
                k = kind_at(prev, b)
            elif nxt is not None and b.live_after(nxt.cut):
                k = kind_at(nxt, b)
            else:
                k = "between marks"
            if k == "none" and any(b.cat == RIGHT[t] for t in KINDS if t not in tracked):
                k = "none (kind untracked)"
            truth[k] += b.size
            matrix[(k, b.cat)] += b.size
        out.append("     truth (kind at "
                   + (f"'{prev.label}' #{prev.cut}" if prev else "-") + " / "
                   + (f"'{nxt.label}' #{nxt.cut}" if nxt else "-") + "): "
                   + ", ".join(f"{k} {mib(v)}" for k, v in truth.most_common()))
        wrong = [(k, c, v) for (k, c), v in matrix.items()
                 if k in RIGHT and c != RIGHT[k]]
        wrong += [(k, c, v) for (k, c), v in matrix.items()
                  if k == "none" and any(c == RIGHT[t] for t in tracked if t in KINDS)]
        if wrong:
            out.append("     wrong at the peak: " + ", ".join(
                f"{k} called {c} {mib(v)}" for k, c, v in sorted(wrong, key=lambda x: -x[2])))
    res["peak_matrix"] = matrix
    res["library"] = log.fields.get("PROGRAM", {}).get("library", "-")
    res["table"] = side_by_side(marks, blocks, events, os.path.join(
        os.path.dirname(log_path), f"profiler_{os.path.basename(log_path)[:-4]}.jsonl.xz"))
    return out, res


# --- memsnap and PyTorch's profiler side by side (--table) ----------------------------------------

TABLE_KINDS = ("param", "grad", "optimizer_state")
PROFILER = {"param": "PARAMETER", "grad": "GRADIENT", "optimizer_state": "OPTIMIZER_STATE"}


def load_profile(path):
    """The profiler's allocations (corpus.py's profiler_NAME.jsonl.xz), or None."""
    if not os.path.exists(path):
        return None
    with lzma.open(path, "rt") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return rows or None


def match_profile(rows, events):
    """The profiler row of each `alloc` event (by event index): the n-th allocation of an address
    in the one is the n-th in the other; and the median offset of the profiler's clock (µs)."""
    by_ptr = collections.defaultdict(list)
    for row in sorted(rows, key=lambda r: r["t_ns"]):
        by_ptr[row["ptr"]].append(row)
    found, taken = {}, collections.Counter()
    for k, e in enumerate(events):
        if e["action"] != "alloc":
            continue
        queue = by_ptr.get(e["addr"], [])
        if taken[e["addr"]] < len(queue):
            found[k] = queue[taken[e["addr"]]]
            taken[e["addr"]] += 1
    offsets = sorted(row["t_ns"] / 1000 - events[k]["time_us"] for k, row in found.items())
    return found, (offsets[len(offsets) // 2] if offsets else 0.0)


def side_by_side(marks, blocks, events, profile_path):
    """Byte-marks of the param, grad and optimizer_state blocks by memsnap's and the profiler's
    verdict, and of other blocks each of them gives one of those categories."""
    rows = load_profile(profile_path)
    found, offset = match_profile(rows, events) if rows else ({}, 0.0)
    t = {"total": 0, "profiled": rows is not None, "allocations": 0, "memsnap_unknown_n": 0,
         "profiler_unknown_n": 0,
         "memsnap": collections.Counter(), "memsnap_wrong": collections.Counter(),
         "profiler": collections.Counter(), "profiler_wrong": collections.Counter(),
         "memsnap_other": collections.Counter(), "profiler_other": collections.Counter(),
         "profiler_unknown": collections.Counter(), "rest": collections.Counter()}
    for b in blocks:  # every allocation of the trace, once: how many each leaves unknown
        if b.alloc < 0:
            continue
        t["allocations"] += 1
        t["memsnap_unknown_n"] += b.cat == "unknown"
        if rows:
            row = found.get(b.alloc)
            t["profiler_unknown_n"] += row is None or row["category"] is None
    for m in marks:
        if not m.ptrs:
            continue
        for b in m.live:
            ks = m.kind_of.get(b.addr, set())
            pc = profiler_category(found.get(b.alloc), m.time, offset) if rows else None
            if not ks & set(TABLE_KINDS):
                # the rest of the memory: what memsnap and the profiler call it, by truth kind
                rest = next((k for k in ("input", "saved_activation") if k in ks), "none")
                t["rest"][(rest, "memsnap", b.cat)] += b.size
                if rows:
                    t["rest"][(rest, "profiler", pc)] += b.size
            for k in TABLE_KINDS:
                if k not in m.ptrs:
                    continue
                if k in ks:
                    t["total"] += b.size
                    if b.cat == RIGHT[k]:
                        t["memsnap"]["agree"] += b.size
                    elif b.cat == "unknown":
                        t["memsnap"]["unknown"] += b.size
                    else:
                        t["memsnap"]["wrong"] += b.size
                        t["memsnap_wrong"][(k, b.cat)] += b.size
                    if pc is None:
                        continue
                    if pc == PROFILER[k]:
                        t["profiler"]["agree"] += b.size
                    elif pc == "unknown":
                        t["profiler"]["unknown"] += b.size
                        t["profiler_unknown"][k] += b.size
                    else:
                        t["profiler"]["wrong"] += b.size
                        t["profiler_wrong"][(k, pc)] += b.size
                elif not ks & set(TABLE_KINDS):  # a block of another of these kinds: above
                    truth = "/".join(sorted(ks)) or "none"
                    if b.cat == RIGHT[k]:
                        t["memsnap_other"][(truth, b.cat)] += b.size
                    if pc == PROFILER[k]:
                        t["profiler_other"][(truth, pc)] += b.size
    return t


def small(n):
    """MiB for the table: 0 for nothing, < 0.01 for a few KiB."""
    return "0" if not n else "< 0.01" if n < 0.005 * 1048576 else mib(n)


def cell(n, detail=None, arrow=True):
    """MiB, with the largest (kind, category) parts where there are any."""
    if not n:
        return "0"
    text = small(n)
    if detail:
        parts = [f"{SHORT.get(k, k)}{' → ' if arrow else ' as '}{c} {small(v)}"
                 for (k, c), v in detail.most_common(4) if v]
        text += " (" + ", ".join(parts) + (", …" if len(detail) > 4 else "") + ")"
    return text


def markdown_row(r):
    t = r["table"]
    name = r["name"].split("/", 1)[-1]
    steps = f"{r['steps_memsnap']}/{r['steps_truth']}"
    cells = [f"`{name}`", r["library"], small(t["memsnap"]["agree"]),
             cell(t["memsnap"]["wrong"], t["memsnap_wrong"]),
             cell(t["memsnap"]["unknown"])]
    if t["profiled"]:
        cells += [small(t["profiler"]["agree"]),
                  cell(t["profiler"]["wrong"], t["profiler_wrong"]),
                  cell(t["profiler"]["unknown"])]
    else:
        cells += ["no profile", "", ""]
    other_m = sum(t["memsnap_other"].values())
    other_p = sum(t["profiler_other"].values())
    cells += [cell(other_m, t["memsnap_other"], arrow=False),
              cell(other_p, t["profiler_other"], arrow=False) if t["profiled"] else "",
              steps]
    return "| " + " | ".join(cells) + " |"


def markdown_table(results):
    print("| program | library | memsnap agrees | memsnap differs | memsnap unknown "
          "| profiler agrees | profiler wrong | profiler unknown "
          "| other memory memsnap calls param, grad, opt "
          "| other memory the profiler calls PARAMETER, GRADIENT, OPTIMIZER_STATE "
          "| train steps memsnap/program |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        print(markdown_row(r))
    whole = collections.Counter()
    profiled = collections.Counter()
    for r in results:
        t = r["table"]
        whole["total"] += t["total"]
        whole.update({f"m_{k}": v for k, v in t["memsnap"].items()})
        whole["m_other"] += sum(t["memsnap_other"].values())
        if t["profiled"]:
            profiled["total"] += t["total"]
            profiled["programs"] += 1
            profiled.update({f"m_{k}": v for k, v in t["memsnap"].items()})
            profiled.update({f"p_{k}": v for k, v in t["profiler"].items()})
            profiled["m_other"] += sum(t["memsnap_other"].values())
            profiled["p_other"] += sum(t["profiler_other"].values())
    same = sum(r["steps_memsnap"] == r["steps_truth"] for r in results)
    print(f"| all {len(results)} | | {small(whole['m_agree'])} | {small(whole['m_wrong'])} "
          f"| {small(whole['m_unknown'])} | | | | {small(whole['m_other'])} | "
          f"| equal in {same} |")
    print(f"| the {profiled['programs']} with a profile | | {small(profiled['m_agree'])} "
          f"| {small(profiled['m_wrong'])} | {small(profiled['m_unknown'])} "
          f"| {small(profiled['p_agree'])} | {small(profiled['p_wrong'])} "
          f"| {small(profiled['p_unknown'])} | {small(profiled['m_other'])} "
          f"| {small(profiled['p_other'])} | |")
    print()
    print(f"byte-marks of param, grad and optimizer_state blocks: {mib(whole['total'])} MiB in all "
          f"{len(results)} programs, {mib(profiled['total'])} MiB in the "
          f"{profiled['programs']} profiled: memsnap agrees on "
          f"{pct(profiled['m_agree'], profiled['total'])}, the profiler on "
          f"{pct(profiled['p_agree'], profiled['total'])} (wrong "
          f"{pct(profiled['p_wrong'], profiled['total'])}, unknown "
          f"{pct(profiled['p_unknown'], profiled['total'])})")
    n = sum(r["table"]["allocations"] for r in results)
    mu = sum(r["table"]["memsnap_unknown_n"] for r in results)
    prof = [r for r in results if r["table"]["profiled"]]
    pn = sum(r["table"]["allocations"] for r in prof)
    pu = sum(r["table"]["profiler_unknown_n"] for r in prof)
    print(f"allocations of the traces: memsnap calls {mu} of {n} unknown; in the "
          f"{len(prof)} profiled programs the profiler leaves {pu} of {pn} unknown; by program "
          "(memsnap, profiler): " + ", ".join(
              f"{r['name'].split('/', 1)[-1]} {r['table']['memsnap_unknown_n']}/"
              f"{r['table']['profiler_unknown_n'] if r['table']['profiled'] else '-'} of "
              f"{r['table']['allocations']}" for r in results))
    print()
    print("the rest of the memory at the marks (byte-marks, MiB): blocks the program listed as "
          "input or saved_activation, and those it listed under no kind (none), by memsnap's and "
          "the profiler's category")
    totals = collections.Counter()
    for r in results:
        rest = r["table"]["rest"]
        totals.update(rest)
        for kind in ("input", "saved_activation", "none"):
            for who in ("memsnap", "profiler"):
                row = collections.Counter({c: v for (k, w, c), v in rest.items()
                                           if k == kind and w == who and v})
                if row:
                    print(f"   {r['name'].split('/', 1)[-1]:<28} {kind:<16} {who:<8} "
                          + ", ".join(f"{c} {mib(v)}" for c, v in row.most_common()))
    for kind in ("input", "saved_activation", "none"):
        for who in ("memsnap", "profiler"):
            row = collections.Counter({c: v for (k, w, c), v in totals.items()
                                       if k == kind and w == who and v})
            print(f"   {'all':<28} {kind:<16} {who:<8} "
                  + ", ".join(f"{c} {mib(v)}" for c, v in row.most_common()))


def table_line(r):
    cells = [r["name"][:34].ljust(34)]
    for k in KINDS:
        if k not in r.get("kinds_known", ()):
            cells.append("n/a".rjust(14))
            continue
        t, a = r["total"][k], r["agree"][k]
        cells.append((f"{pct(a, t)} {mib(t)}" if t else "  -   0").rjust(14))
    fp = sum(sum(r["fp"][k].values()) for k in KINDS)
    cells.append(mib(fp).rjust(9))
    s = f"{r['steps_memsnap']}/{r['steps_truth']}"
    cells.append((s + ("" if r["steps_memsnap"] == r["steps_truth"] else " ✗")).rjust(7))
    cells.append(f"{r['ends_ok']}/{r['ends_total']}".rjust(7))
    return " ".join(cells)


def main():
    args = sys.argv[1:]
    binary = os.path.join(ROOT, "target", "release", "memsnap")
    only, groups_shown, as_table = None, 8, False
    folders = FOLDERS
    while args:
        a = args.pop(0)
        if a == "--table":
            as_table, folders = True, FOLDERS[:1]
        elif a == "--only":
            only = set(args.pop(0).split(","))
        elif a == "--groups":
            groups_shown = int(args.pop(0))
        else:
            binary = a
    programs = []
    for folder in folders:
        path = os.path.join(ROOT, folder)
        for f in sorted(os.listdir(path)):
            if not f.endswith(".log") or f.endswith(".first.log"):
                continue
            name = f[:-4]
            snap = os.path.join(path, f"memory_snapshot_{name}.pickle.xz")
            label = f"{os.path.basename(folder)}/{name}"
            if os.path.exists(snap) and (only is None or name in only or label in only):
                programs.append((label, os.path.join(path, f), snap))
    if not as_table:
        print(f"memsnap ({binary}) categories, train steps and phase ends against the programs' "
              "own truth; sizes in MiB (2^20 bytes); byte-marks: a block's bytes at every MARK "
              "it is live at")
    results = []
    for label, log_path, snap in programs:
        try:
            lines, res = judge(binary, log_path, snap, label, groups_shown)
        except subprocess.CalledProcessError as e:
            print(f"== {label}: memsnap failed: {e.stderr.strip()[:300]}")
            continue
        if not as_table:
            print("\n".join(lines))
            print()
        results.append(res)
    if as_table:
        markdown_table(results)
        return

    print("== per program (right share of byte-marks and the byte-marks judged per kind; FP: "
          "byte-marks memsnap gives a kind's category that the truth does not list as that "
          "kind; steps memsnap/program; phase ends found/marks)")
    print(" ".join(["program".ljust(34)] + [SHORT[k].rjust(14) for k in KINDS]
                   + ["FP".rjust(9), "steps".rjust(7), "ends".rjust(7)]))
    for r in results:
        print(table_line(r))

    print("\n== totals over all programs (MiB, byte-marks)")
    for k in KINDS:
        t = sum(r["total"][k] for r in results)
        a = sum(r["agree"][k] for r in results)
        dis = collections.Counter()
        fp = collections.Counter()
        for r in results:
            dis.update(r["disagree"][k])
            fp.update(r["fp"][k])
        print(f"   {k:<16} right {mib(a)} of {mib(t)} ({pct(a, t)}); wrong: "
              + (", ".join(f"{c} {mib(v)}" for c, v in dis.most_common()) or "none")
              + f"; {RIGHT[k]} that is not {k}: "
              + (", ".join(f"{c} {mib(v)}" for c, v in fp.most_common()) or "none"))
    k = "saved_activation"
    t = sum(r["total"][k] for r in results)
    a = sum(r["agree"][k] for r in results)
    dis = collections.Counter()
    for r in results:
        dis.update(r["disagree"][k])
    print(f"   {k:<16} right {mib(a)} of {mib(t)} ({pct(a, t)}); wrong: "
          + ", ".join(f"{c} {mib(v)}" for c, v in dis.most_common()))
    mism = [f"{r['name']} {r['steps_memsnap']}/{r['steps_truth']}" for r in results
            if r["steps_memsnap"] != r["steps_truth"]]
    print(f"   train steps equal in {len(results) - len(mism)} of {len(results)} programs; "
          f"differ (memsnap/program): " + (", ".join(mism) or "none"))
    ok = sum(r["ends_ok"] for r in results)
    tot = sum(r["ends_total"] for r in results)
    val = sum(r["ends_value"] for r in results)
    names_ok, names_all = collections.Counter(), collections.Counter()
    for r in results:
        names_ok.update(r["ends_ok_by_name"])
        names_all.update(r["ends_by_name"])
    print(f"   phase ends: {ok} of {tot} marks end a step row ({val} by value alone); by name: "
          + ", ".join(f"{n} {names_ok[n]}/{t}" for n, t in names_all.most_common()))
    kinds = collections.Counter()
    for r in results:
        kinds.update(r["end_kinds"])
    print("   marks ending no row, why: " + ", ".join(f"{k} {v}" for k, v in kinds.most_common())
          + " (trailing frees: the row holding the mark runs on over frees only, so it ends "
          "below the mark's bytes; no boundary: it runs on over allocations too)")
    matrix = collections.Counter()
    for r in results:
        matrix.update(r["peak_matrix"])
    whole = sum(matrix.values())
    right = sum(v for (k, c), v in matrix.items() if k in RIGHT and c == RIGHT[k])
    judged = sum(v for (k, c), v in matrix.items() if k in RIGHT)
    print(f"   at the peaks: {mib(whole)} MiB live; truth-listed {mib(judged)}, of which memsnap "
          f"right {mib(right)} ({pct(right, judged)}); by truth kind → memsnap category:")
    for kind in (*ALL_KINDS, "none", "none (kind untracked)", "between marks"):
        row = {c: v for (k, c), v in matrix.items() if k == kind}
        if row:
            print(f"     {kind:<16} " + ", ".join(
                f"{c} {mib(v)}" for c, v in sorted(row.items(), key=lambda x: -x[1])))
    groups = collections.Counter()
    progs = collections.defaultdict(set)
    for r in results:
        for key, (size, count, bm) in r["groups"].items():
            why, truth, cat, a_after, f_after, a_stack, f_stack, tags, row, op = key
            if why == "fp" and any(t in ALL_KINDS for t in truth.split("/")):
                continue  # the same bytes as that kind's disagreement
            g = (why, truth, cat, tags or "-")
            groups[g] += bm
            progs[g].add(r["name"].split("/", 1)[1] if "/" in r["name"] else r["name"])
    print("\n== wrong byte-marks by (truth kind, memsnap category, tags of the allocating stack), "
          "largest first (a block memsnap gives one kind's category that the truth lists under "
          "another kind is counted once, as that kind's disagreement)")
    for g, bm in groups.most_common(40):
        why, truth, cat, tags = g
        what = f"{truth} called {cat}" if why == "disagree" else f"{cat} but truth {truth}"
        print(f"   {mib(bm):>10}  {what:<44} [{tags}]  in {len(progs[g])}: "
              + ", ".join(sorted(progs[g]))[:200])


if __name__ == "__main__":
    main()
