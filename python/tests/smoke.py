"""Smoke test of the installed wheel: the `memsnap` command and the Python module, on a bundled
snapshot whose peak PyTorch printed (`max_memory_allocated=3090155008` in its log.txt).

Run from the repository root with the venv's interpreter: `python python/tests/smoke.py`.
"""

import lzma
import os
import pickle
import subprocess
import sys
import tempfile

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

    try:
        memsnap.report(42)
        check(False, "a wrong type raises")
    except TypeError:
        check(True, "a wrong type raises TypeError")


if __name__ == "__main__":
    main()
