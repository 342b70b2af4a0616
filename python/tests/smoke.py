"""Smoke test of the installed wheel: the `memsnap` command and the Python module, on a bundled
snapshot whose peak PyTorch printed (`max_memory_allocated=3090155008` in its log.txt).

Run from the repository root with the venv's interpreter: `python python/tests/smoke.py`.
"""

import json
import lzma
import os
import pickle
import subprocess
import sys
import tempfile
import warnings

import memsnap

SNAPSHOT = "testdata/snapshots/single-gpu/memory_snapshot_rank0_step1.pickle.xz"
PRINTED_PEAK = 3090155008
OOM_SNAPSHOT = "testdata/snapshots/allocator/cap_mid.pickle.xz"


def check(condition, what):
    if not condition:
        sys.exit(f"smoke test failed: {what}")
    print(f"ok: {what}")


def main():
    version = subprocess.run([memsnap.binary(), "--version"], capture_output=True, text=True)
    check(version.returncode == 0 and version.stdout.startswith("memsnap "), "memsnap --version")

    from_path = memsnap.report(SNAPSHOT)
    check(from_path["devices"][0]["peak_allocated_bytes"] == PRINTED_PEAK, "report(path) peak")
    one = memsnap.report(SNAPSHOT, device=0)
    check([d["device"] for d in one["devices"]] == [0], "report(path, device=0) is --device 0")

    with lzma.open(SNAPSHOT) as f:
        snapshot = pickle.load(f)
    from_dict = memsnap.report(snapshot)
    check(from_dict["devices"][0]["peak_allocated_bytes"] == PRINTED_PEAK, "report(dict) peak")
    check(from_dict["devices"][0]["steps"] == from_path["devices"][0]["steps"], "same steps from a dict")

    explained = memsnap.oom(OOM_SNAPSHOT)
    check(explained["devices"][0]["oom"]["verdict"] == "fragmentation", "oom(path) verdict")

    fits = memsnap.whatif(OOM_SNAPSHOT, alloc_conf="expandable_segments:True")
    check(isinstance(fits, dict) and fits.get("devices"), "whatif(path, alloc_conf=...)")

    with tempfile.TemporaryDirectory() as tmp:
        written = memsnap.timeline(snapshot, os.path.join(tmp, "timeline.png"), by="step")
        with open(written[0], "rb") as f:
            check(f.read(8) == b"\x89PNG\r\n\x1a\n", "timeline(dict) wrote a PNG")

    with tempfile.TemporaryDirectory() as tmp:
        page = memsnap.view(snapshot, os.path.join(tmp, "page.html"))
        with open(page, encoding="utf-8") as f:
            html = f.read()
        check(html.startswith("<!doctype html>") and '"peak_allocated_bytes":%d' % PRINTED_PEAK in html,
              "view(dict) wrote a page carrying the report's peak")
        two = memsnap.view([SNAPSHOT, OOM_SNAPSHOT], os.path.join(tmp, "two.html"))
        check(os.path.getsize(two) > 0, "view([two paths]) wrote one page of both")

    fits_tried = memsnap.whatif(OOM_SNAPSHOT, try_=["expandable_segments:True"])
    check(isinstance(fits_tried, dict) and fits_tried.get("devices"), "whatif(path, try_=[...]) is --try")

    with tempfile.TemporaryDirectory() as tmp:
        here = os.getcwd()
        with open(SNAPSHOT, "rb") as f:
            data = f.read()
        os.chdir(tmp)
        try:
            # A file whose name starts with a dash is a file, not an option.
            with open("-x.pickle.xz", "wb") as f:
                f.write(data)
            dashed = memsnap.report("-x.pickle.xz")
            check(dashed["devices"][0]["peak_allocated_bytes"] == PRINTED_PEAK, "report('-x.pickle.xz')")
            # An image an earlier run left is not returned as written by this one.
            with open("t-device7.png", "wb") as f:
                f.write(b"old")
            written = memsnap.timeline("-x.pickle.xz", "t.png")
            check(written == ["t.png"], f"timeline() returns only what it wrote ({written})")
        finally:
            os.chdir(here)

    check_output_names()

    try:
        memsnap.report("no-such-file.pickle")
        check(False, "a missing file raises")
    except memsnap.MemsnapError as e:
        check(e.exit_code == 1 and "no-such-file.pickle" in str(e), "a missing file raises MemsnapError")

    sweep = "testdata/snapshots/sweeps/cnn/memory_snapshot_cnn_{}.pickle.xz"
    predicted = memsnap.predict({sweep.format(16): 16, sweep.format(32): 32}, to=[64, 128])
    check([s["size"] for s in predicted["sizes"]] == [64, 128], "predict(files, to=[...]) is whatif --scale")
    capped = memsnap.predict({sweep.format(64): 64}, to=128, cap="1GiB")
    check(capped["method"] == "categories" and capped["sizes"][0]["simulated"][0]["oom"], "predict(one file, cap=...)")

    # capture costs nothing where it does not record: torch is never imported there
    cap = memsnap.Capture(tempfile.mkdtemp(), ranks={3}, rank=0)
    check(not cap.active and cap.probe("after init") is None, "Capture on another rank does nothing")
    with cap.step(0):
        pass
    check("torch" not in sys.modules and cap.written == [], "Capture.step imports no torch there")
    memsnap.capture.configure(tempfile.mkdtemp(), ranks={3}, rank=0)
    with memsnap.capture.step(0):
        check(memsnap.capture.probe("x") is None, "memsnap.capture.probe on the default capture")
    check_missing_frameworks()
    check_capture_tensors()
    check_capture_summary()
    check_diff()

    try:
        memsnap.report(42)
        check(False, "a wrong type raises")
    except TypeError:
        check(True, "a wrong type raises TypeError")


def check_output_names():
    """Output names holding a newline, a terminal escape or bytes that are no UTF-8 come back as
    the paths written, as given (str or bytes), not as the escaped text memsnap's notes show."""
    with tempfile.TemporaryDirectory() as tmp:
        for name in ["line\nbreak.png", "esc\x1b[31m.png", "bidi\u202e.png"]:
            odd = os.path.join(tmp, name)
            written = memsnap.timeline(SNAPSHOT, odd)
            check(written == [odd] and os.path.isfile(odd), f"timeline() returns {name!r} itself")
        raw = os.path.join(os.fsencode(tmp), b"caf\xe9\n.png")
        written = memsnap.timeline(SNAPSHOT, raw)
        check(written == [raw] and os.path.isfile(raw), "timeline() returns a bytes name as given")
        # several devices: each image's own name, beside the one given
        several = os.path.join(os.fsencode(tmp), b"t\xff\n.png")
        written = memsnap.timeline("testdata/snapshots/constructed/host_pinned.pickle.xz", several)
        expected = [os.path.join(os.fsencode(tmp), b"t\xff\n-device0.png"),
                    os.path.join(os.fsencode(tmp), b"t\xff\n-host.png")]
        check(written == expected and all(os.path.isfile(w) for w in written),
              f"timeline() returns each device's image as written ({written})")
        page = os.path.join(tmp, "page\n\x1b.html")
        check(memsnap.view(SNAPSHOT, page) == page and os.path.isfile(page), "view() returns the page's name itself")
        raw_page = os.path.join(os.fsencode(tmp), b"p\xe9.html")
        check(memsnap.view(SNAPSHOT, raw_page) == raw_page and os.path.isfile(raw_page),
              "view() returns a bytes name as given")


class _Storage:
    def __init__(self, addr, nbytes):
        self._addr, self._nbytes = addr, nbytes

    def data_ptr(self):
        return self._addr

    def nbytes(self):
        return self._nbytes


class _Device:
    def __init__(self, index):
        self.type = "cpu" if index is None else "cuda"
        self.index = index


class _Tensor:
    """Just what Capture reads of a tensor."""

    def __init__(self, addr, nbytes, device=0):
        self.is_cuda = device is not None
        self.device = _Device(device)
        self._storage = _Storage(addr, nbytes)
        self.grad = None

    def untyped_storage(self):
        return self._storage


class _Module:
    def __init__(self, params, buffers):
        self._params, self._buffers = params, buffers

    def named_parameters(self):
        return list(self._params)

    def named_buffers(self):
        return list(self._buffers)


class _Optimizer:
    def __init__(self, params):
        self.param_groups = [{"params": params, "lr": 0.1}]
        self.state = {}


class _Wrapped:  # as Lightning's LightningOptimizer holds the torch optimizer
    def __init__(self, optimizer):
        self._optimizer = optimizer


def _fake_program():
    embed = _Tensor(0x7F0000000000, 4096)
    tied = _Tensor(0x7F0000000000, 4096)  # another tensor on the same storage
    weight = _Tensor(0x7F0000001000, 1024)
    weight.grad = _Tensor(0x7F0000009000, 1024)
    on_cpu = _Tensor(0, 64, device=None)
    other_gpu = _Tensor(0x7F1000000000, 512, device=1)
    empty = _Tensor(0, 0)
    extra = _Tensor(0x7F0000004000, 512)  # held by the optimizer only
    model = _Module(
        [("embed.weight", embed), ("head.weight", tied), ("layer.weight", weight),
         ("layer.bias", on_cpu), ("remote.weight", other_gpu), ("empty.weight", empty)],
        [("bn.running_mean", _Tensor(0x7F0000003000, 512))],
    )
    optimizer = _Optimizer([embed, weight, extra])
    optimizer.state[weight] = {
        "step": _Tensor(0, 8, device=None),  # a CPU step counter is no CUDA storage
        "exp_avg": _Tensor(0x7F0000005000, 1024),
        "exp_avg_sq": _Tensor(0x7F0000006000, 1024),
    }
    optimizer.state[embed] = {"step": _Tensor(0x7F0000007000, 4), "momentum": 0.9}
    return model, optimizer


EXPECTED_TENSORS_JSON = (
    '{"format": "memsnap-tensors/1", "rank": 0, "device": 0, "device_total_bytes": 150000000000, '
    '"allowed_bytes": 8589934591, '  # size_t(8 GiB / total * total): one byte under
    '"steps": [{"step": 3, "start_us": 1700000000000000, "end_us": 1700000000500000}, '
    '{"step": 4, "start_us": 1700000000600000, "end_us": null}], '
    '"inventories": [{"at": "step_end", "step": 3, "time_us": 1700000000500001, "tensors": ['
    '{"addr": 139637976727552, "bytes": 4096, "kind": "parameter", "name": "embed.weight"}, '
    '{"addr": 139637976731648, "bytes": 1024, "kind": "parameter", "name": "layer.weight"}, '
    '{"addr": 139637976743936, "bytes": 512, "kind": "parameter", "name": "param_groups.0.2"}, '
    '{"addr": 139637976739840, "bytes": 512, "kind": "buffer", "name": "bn.running_mean"}, '
    '{"addr": 139637976764416, "bytes": 1024, "kind": "gradient", "name": "layer.weight"}, '
    '{"addr": 139637976748032, "bytes": 1024, "kind": "optimizer_state", "name": "layer.weight", "state": "exp_avg"}, '
    '{"addr": 139637976752128, "bytes": 1024, "kind": "optimizer_state", "name": "layer.weight", "state": "exp_avg_sq"}, '
    '{"addr": 139637976756224, "bytes": 4, "kind": "optimizer_state", "name": "embed.weight", "state": "step"}'
    ']}]}'
)


def _fake_torch(total):
    """A stand-in torch with just what Capture calls, to run its steps without a GPU."""
    import types

    torch = types.ModuleType("torch")

    class OutOfMemoryError(RuntimeError):
        pass

    state = {"fraction": 1.0, "history": []}

    def set_fraction(fraction, device=None):
        allowed = int(fraction * float(total))  # as the caching allocator keeps it
        state["fraction"] = 1.0 if fraction >= 1.0 else allowed / float(total)

    memory = types.SimpleNamespace(
        _record_memory_history=lambda enabled="all", **kw: state["history"].append(enabled),
        _snapshot=lambda: {"segments": [], "device_traces": [[]]},
    )
    torch.OutOfMemoryError = OutOfMemoryError
    torch.device = lambda spec: _Device(int(spec.split(":")[1]) if ":" in spec else None)
    torch._C = types.SimpleNamespace()
    torch.cuda = types.SimpleNamespace(
        memory=memory,
        reset_peak_memory_stats=lambda *a: None,
        current_device=lambda: 0,
        get_device_properties=lambda d: types.SimpleNamespace(total_memory=total),
        get_per_process_memory_fraction=lambda device=None: state["fraction"],
        set_per_process_memory_fraction=set_fraction,
    )
    return torch, state


def check_capture_tensors():
    """The side file `<snapshot>.tensors.json`, from stand-in tensors: no torch needed."""
    from memsnap import capture

    model, optimizer = _fake_program()
    tensors = capture._inventory([model], [capture._unwrap_optimizer(_Wrapped(optimizer))], 0)
    total = 150_000_000_000
    fraction = 8 * 2**30 / total
    allocator_cap = int(fraction * float(total))  # size_t(fraction * totalGlobalMem)
    reported = allocator_cap / float(total)  # what get_per_process_memory_fraction answers
    doc = capture._tensors_document(
        0, 0, total, capture._allowed_from_fraction(reported, total),
        [{"step": 3, "start_us": 1700000000000000, "end_us": 1700000000500000},
         {"step": 4, "start_us": 1700000000600000, "end_us": None}],
        [{"at": "step_end", "step": 3, "time_us": 1700000000500001, "tensors": tensors}],
    )
    text = json.dumps(doc)
    check(text == EXPECTED_TENSORS_JSON, "the tensors side file: one entry per CUDA storage, exact JSON")

    exact = True
    for t in (150_000_000_000, 143_771_000_000, 85_899_345_920, 25_769_803_776, 17_179_869_184):
        for cap_bytes in (1, 2**30, 3 * 2**30 + 12345, 8 * 2**30, t // 3, t - 1):
            f = cap_bytes / t
            allowed = int(f * float(t))
            exact &= capture._allowed_from_fraction(allowed / float(t), t) == allowed
    check(exact and capture._allowed_from_fraction(1.0, total) is None,
          "allowed_bytes: the allocator's integer back from the fraction torch reports")

    # the steps and inventories of a whole recording, through a stand-in torch
    fake, history = _fake_torch(total)
    saved = sys.modules.get("torch")
    sys.modules["torch"] = fake
    try:
        fake.cuda.set_per_process_memory_fraction(fraction)
        with tempfile.TemporaryDirectory() as tmp:
            model, optimizer = _fake_program()
            cap = memsnap.Capture(tmp, steps=range(2, 4), rank=0, model=model)
            cap.watch(optimizer=_Wrapped(optimizer))
            cap.watch(model=model)  # already watched: once
            for step in range(5):
                with cap.step(step):
                    pass
            check([os.path.basename(p) for p in cap.written] == ["memory_snapshot_rank0_step3.pickle"],
                  "Capture with a model writes the snapshot of its last step")
            with open(cap.written[0] + ".tensors.json") as f:
                side = json.load(f)
            check(side["format"] == "memsnap-tensors/1" and side["allowed_bytes"] == allocator_cap
                  and side["device_total_bytes"] == total and side["device"] == 0,
                  "the side file's header: device, total and the allocator's cap")
            check([s["step"] for s in side["steps"]] == [2, 3]
                  and all(s["start_us"] <= s["end_us"] for s in side["steps"]),
                  "the side file's steps are the program's, closed")
            check([(i["at"], i["step"]) for i in side["inventories"]]
                  == [("start", 2), ("step_end", 2), ("step_end", 3)]
                  and side["inventories"][0]["tensors"] == tensors,
                  "inventories at recording start and at each step's end")

            cap = memsnap.Capture(tmp, steps=range(1, 3), rank=0, model=model, optimizer=optimizer)
            try:
                for step in range(3):
                    with cap.step(step):
                        if step == 2:
                            raise fake.OutOfMemoryError("CUDA out of memory")
                check(False, "the out-of-memory error is raised again")
            except fake.OutOfMemoryError:
                pass
            with open(os.path.join(tmp, "memory_snapshot_rank0_step2_oom.pickle.tensors.json")) as f:
                side = json.load(f)
            check([(s["step"], s["end_us"] is None) for s in side["steps"]] == [(1, False), (2, True)]
                  and [(i["at"], i["step"]) for i in side["inventories"]]
                  == [("start", 1), ("step_end", 1), ("oom", 2)],
                  "at an out-of-memory error: the step stays open, an oom inventory")

            class Broken:
                def named_parameters(self):
                    raise RuntimeError("no parameters here")

            cap = memsnap.Capture(tmp, steps=range(0, 1), rank=0, model=Broken())
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                with cap.step(0):
                    pass
            check(len(cap.written) == 1 and len(caught) == 1 and "memsnap" in str(caught[0].message),
                  "a model that cannot be listed warns once and the step goes on")
    finally:
        if saved is None:
            del sys.modules["torch"]
        else:
            sys.modules["torch"] = saved


def check_capture_summary():
    """`Capture(summary=True)`: the report summary written beside the snapshot by a child
    process, here of the bundled snapshot handed out by a stand-in torch."""
    fake, _ = _fake_torch(150_000_000_000)
    with lzma.open(SNAPSHOT) as f:
        recorded = pickle.load(f)
    fake.cuda.memory._snapshot = lambda: recorded
    saved = sys.modules.get("torch")
    sys.modules["torch"] = fake
    try:
        with tempfile.TemporaryDirectory() as tmp:
            cap = memsnap.Capture(tmp, steps=range(1, 2), rank=3, summary=True)
            for step in range(3):
                with cap.step(step):
                    pass
            written = cap.wait_summaries(timeout=120)
            path = os.path.join(tmp, "memory_snapshot_rank3_step1.pickle.summary.json")
            check(written == [path], "Capture(summary=True) writes <snapshot>.summary.json")
            with open(path) as f:
                summary = json.loads(f.read())
            check(summary["devices"][0]["peak_allocated_bytes"] == PRINTED_PEAK,
                  "the summary is report --json's object, with the printed peak")
            compared = memsnap.compare(tmp)
            check(compared["rows"][0]["peak_allocated_bytes"] == PRINTED_PEAK,
                  "compare of the folder reads the summary")

            cap = memsnap.Capture(tmp, steps=range(0, 1), rank=4, summary=True)
            fake.cuda.memory._snapshot = lambda: {"segments": [], "device_traces": [[]]}
            with cap.step(0):
                pass
            check(cap.wait_summaries(timeout=120) == []
                  and os.path.exists(cap.written[0] + ".summary.err"),
                  "a snapshot that cannot be summarised leaves <snapshot>.summary.err")
    finally:
        if saved is None:
            del sys.modules["torch"]
        else:
            sys.modules["torch"] = saved


def check_diff():
    """`memsnap.diff`: the causes add up to the change of the peak; a broken budget raises."""
    base = "testdata/snapshots/sweeps/cnn/memory_snapshot_cnn_32.pickle.xz"
    new = "testdata/snapshots/sweeps/cnn/memory_snapshot_cnn_64.pickle.xz"
    d = memsnap.diff(base, new)
    check(sum(c["peak_effect_bytes"] for c in d["causes"]) == d["peak_allocated_delta_bytes"] == 5854787584 - 3077896704,
          "diff: the effects add up to the printed change of the peak")
    try:
        memsnap.diff(base, new, max_increase="5%")
        check(False, "diff over budget raises")
    except memsnap.BudgetError as e:
        check("--max-increase 5%" in str(e) and len(e.diffs) == 1, "diff over budget raises BudgetError")
    check(memsnap.diff(base, base)["verdict"] == "no change", "diff of a run with itself: no change")


def check_missing_frameworks():
    """Without torch, Lightning or transformers, the error says what to install."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        cap = memsnap.Capture(tempfile.mkdtemp(), rank=0)
        try:
            with cap.step(0):
                pass
            check(False, "Capture.step without torch raises")
        except ImportError as e:
            check("pip install torch" in str(e), "Capture.step without torch says pip install torch")
    if importlib.util.find_spec("lightning") is None and importlib.util.find_spec("pytorch_lightning") is None:
        try:
            memsnap.lightning_callback(memsnap.Capture(rank=0))
            check(False, "lightning_callback without Lightning raises")
        except ImportError as e:
            check("pip install lightning" in str(e), "lightning_callback without Lightning says pip install lightning")
    if importlib.util.find_spec("transformers") is None:
        try:
            memsnap.transformers_callback(memsnap.Capture(rank=0))
            check(False, "transformers_callback without transformers raises")
        except ImportError as e:
            check("pip install transformers" in str(e), "transformers_callback without it says pip install transformers")


if __name__ == "__main__":
    main()
