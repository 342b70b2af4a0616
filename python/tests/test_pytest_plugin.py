"""Tests of the pytest plugin (python/memsnap/pytest_plugin.py), without a GPU or torch.

pytester runs the plugin on small test projects whose conftest.py overrides the
``memsnap_recorder`` fixture with a ``ReplayRecorder`` of a snapshot recorded before: the
resnet50 sweep's batch 32 is the baseline, batch 64 (peak +90%) the "new" run. The
recording side is checked with a stand-in ``torch`` package that logs the calls made to it.

Run from the repository root: ``python -m pytest python/tests/test_pytest_plugin.py`` (with the
wheel installed, or with ``PYTHONPATH=python MEMSNAP_BINARY=$PWD/target/release/memsnap``).
"""

import json
import lzma
import os
import pickle
from pathlib import Path

import pytest

import memsnap
from memsnap import pytest_plugin

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]
CNN = ROOT / "testdata" / "snapshots" / "sweeps" / "cnn"
BASE = CNN / "memory_snapshot_cnn_32.pickle.xz"  # peak allocated 2.87 GiB
GROWN = CNN / "memory_snapshot_cnn_64.pickle.xz"  # peak allocated 5.45 GiB (+90.2%)

BROKEN_5 = "memsnap: budget broken: peak allocated grew by 2.59 GiB (+90.2%), over --max-increase 5%"


def _entry_point_loads() -> bool:
    """Whether pytest loads the plugin by itself (the wheel installed, autoload on)."""
    if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        return False
    try:
        from importlib.metadata import entry_points

        found = entry_points()
        group = found.select(group="pytest11") if hasattr(found, "select") else found.get("pytest11", [])
    except Exception:
        return False
    return any(ep.name == "memsnap" and ep.value == "memsnap.pytest_plugin" for ep in group)


# from a source tree (PYTHONPATH=python) the plugin is named on the command line
PLUGIN = [] if _entry_point_loads() else ["-p", "memsnap.pytest_plugin"]

TEST_STEP = """
def test_step(memsnap_budget):
    pass
"""


def _replay(pytester, snapshot):
    pytester.makeconftest(
        f"""
import pytest
from memsnap.pytest_plugin import ReplayRecorder

@pytest.fixture
def memsnap_recorder():
    return ReplayRecorder({str(snapshot)!r})
"""
    )


def _baseline(pytester, snapshot, name="test_step__test_step", folder="memsnap_baselines"):
    target = pytester.path / folder / (name + ".pickle.xz")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(Path(snapshot).read_bytes())
    return target


# the plugin is imported already (here, and by the entry point): nothing to rewrite
QUIET = ["-W", "ignore::pytest.PytestAssertRewriteWarning"]


def _run(pytester, *args):
    return pytester.runpytest(*PLUGIN, *QUIET, *args)


def _run_subprocess(pytester, monkeypatch, *args):
    # the child finds this memsnap package wherever it came from (source tree or wheel)
    here = str(Path(memsnap.__file__).resolve().parents[1])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))
    return pytester.runpytest_subprocess(*PLUGIN, *QUIET, *args)


# ---------------------------------------------------------------------------------------------
# the comparison alone


def test_check_against_baseline_breaks_and_passes():
    result = pytest_plugin.check_against_baseline(GROWN, BASE, {"max_increase": "5%"})
    assert not result.passed
    assert len(result.broken) == 1 and result.broken[0].startswith(BROKEN_5)
    assert "Why the peak changed" in result.report and "activation" in result.report
    assert result.message.startswith(BROKEN_5)

    same = pytest_plugin.check_against_baseline(BASE, BASE, {"max_increase": "5%"})
    assert same.passed and same.broken == []
    assert "No change" in same.report

    roomy = pytest_plugin.check_against_baseline(GROWN, BASE, {"max_increase": "100%", "max_peak": "40GiB"})
    assert roomy.passed


def test_check_against_baseline_budget_file(tmp_path):
    budget = tmp_path / "memory-budget.json"
    budget.write_text('{"max_peak": "5GiB"}')
    result = pytest_plugin.check_against_baseline(GROWN, BASE, budget_file=budget)
    assert len(result.broken) == 1
    assert result.broken[0].startswith("memsnap: budget broken: peak allocated 5.45 GiB is over --max-peak 5.00 GiB by ")
    # the options win over the file
    assert pytest_plugin.check_against_baseline(GROWN, BASE, {"max_peak": "6GiB"}, budget_file=budget).passed


def test_check_against_baseline_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown budget limit 'max_growth'"):
        pytest_plugin.check_against_baseline(GROWN, BASE, {"max_growth": "5%"})
    with pytest.raises(memsnap.MemsnapError) as missing:
        pytest_plugin.check_against_baseline(GROWN, tmp_path / "none.pickle.xz", {"max_increase": "5%"})
    assert missing.value.exit_code == 1 and "none.pickle.xz" in str(missing.value)
    with pytest.raises(memsnap.MemsnapError) as bad:
        pytest_plugin.check_against_baseline(GROWN, BASE, {"max_increase": "lots"})
    assert bad.value.exit_code == 2


def test_baseline_names():
    name = pytest_plugin.baseline_name
    assert name("test_step.py::test_step", with_folder=False) == "test_step__test_step"
    assert name("tests/test_x.py::TestA::test_step[bs=32]") == "tests__test_x__TestA__test_step_bs=32"
    assert name("tests/test_x.py::TestA::test_step[bs=32]", with_folder=False) == "test_x__TestA__test_step_bs=32"
    assert name("t.py::test[a/b c]", with_folder=False) == "t__test_a_b_c"
    long = name("t.py::test[" + "x" * 300 + "]", with_folder=False)
    assert len(long) <= 120 and long != name("t.py::test[" + "x" * 301 + "]", with_folder=False)


# ---------------------------------------------------------------------------------------------
# the plugin, run by pytester on recorded snapshots


def test_grown_peak_fails_a_five_percent_budget(pytester):
    _replay(pytester, GROWN)
    _baseline(pytester, BASE)
    pytester.makeini("[pytest]\nmemsnap_max_increase = 5%\n")
    pytester.makepyfile(test_step=TEST_STEP)
    result = _run(pytester)
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert BROKEN_5 in out
    # the ranked causes, as `memsnap diff` prints them
    result.stdout.fnmatch_lines(
        [
            "*Why the peak changed: * causes; their effects add up to +2.59 GiB.*",
            "* +*MiB   size *activation*",
            "*if the new use is intended: pytest --memsnap-update test_step.py::test_step*",
        ]
    )
    # the short summary leads with the verdict
    result.stdout.fnmatch_lines(["FAILED test_step.py::test_step - *memsnap: budget broken: peak*"])
    record = json.loads((pytester.path / ".memsnap" / "test_step__test_step.json").read_text())
    assert record["passed"] is False and record["broken"][0].startswith(BROKEN_5)
    assert record["budget"] == {"max_increase": "5%"}
    assert Path(record["snapshot"]).name == "test_step__test_step.pickle.xz"
    assert Path(record["baseline"]) == pytester.path / "memsnap_baselines" / "test_step__test_step.pickle.xz"


def test_marker_alone_records_and_fails(pytester):
    _replay(pytester, GROWN)
    _baseline(pytester, BASE)
    pytester.makepyfile(
        test_step="""
import pytest

@pytest.mark.memsnap(max_increase="5%", max_peak="40GiB")
def test_step():
    pass
"""
    )
    result = _run(pytester, "--strict-markers")
    result.assert_outcomes(failed=1)
    assert BROKEN_5 in result.stdout.str()


def test_same_snapshot_passes(pytester):
    _replay(pytester, BASE)
    _baseline(pytester, BASE)
    pytester.makeini("[pytest]\nmemsnap_max_increase = 5%\n")
    pytester.makepyfile(test_step=TEST_STEP)
    result = _run(pytester, "-rP")
    result.assert_outcomes(passed=1)
    # the diff goes into the report of a passing test too
    result.stdout.fnmatch_lines(["*memsnap*", "*No change: the same requests, sizes and lives in both runs.*"])


@pytest.mark.parametrize(
    "ini, budget_file, marker, outcome",
    [
        ("5%", None, "100%", "passed"),  # the marker wins over the ini option
        (None, {"max_increase": "5%"}, None, "failed"),  # memory-budget.json beside the baseline
        ("5%", {"max_increase": "100%"}, None, "passed"),  # the file wins over the ini option
        ("100%", {"max_increase": "100%"}, "5%", "failed"),  # the marker wins over the file
        (None, None, None, "passed"),  # no budget: compared, reported, never failed
    ],
)
def test_where_the_budget_comes_from(pytester, ini, budget_file, marker, outcome):
    _replay(pytester, GROWN)
    _baseline(pytester, BASE)
    if ini:
        pytester.makeini(f"[pytest]\nmemsnap_max_increase = {ini}\n")
    if budget_file:
        (pytester.path / "memsnap_baselines" / "memory-budget.json").write_text(json.dumps(budget_file))
    mark = f"@pytest.mark.memsnap(max_increase={marker!r})" if marker else ""
    pytester.makepyfile(test_step=f"import pytest\n\n{mark}\ndef test_step(memsnap_budget):\n    pass\n")
    result = _run(pytester)
    result.assert_outcomes(**{outcome: 1})


def test_limits_set_by_the_test_body(pytester):
    _replay(pytester, GROWN)
    _baseline(pytester, BASE)
    pytester.makepyfile(
        test_step="""
def test_step(memsnap_budget):
    memsnap_budget.limits["max_peak"] = "5GiB"
"""
    )
    result = _run(pytester)
    result.assert_outcomes(failed=1)
    assert "peak allocated 5.45 GiB is over --max-peak 5.00 GiB" in result.stdout.str()


def test_failing_body_is_not_compared(pytester):
    _replay(pytester, GROWN)
    _baseline(pytester, BASE)
    pytester.makeini("[pytest]\nmemsnap_max_increase = 5%\n")
    pytester.makepyfile(test_step="def test_step(memsnap_budget):\n    assert 1 == 2\n")
    result = _run(pytester)
    result.assert_outcomes(failed=1)
    assert "assert 1 == 2" in result.stdout.str()
    assert "budget broken" not in result.stdout.str()


def test_missing_baseline_says_how_to_record_it(pytester):
    _replay(pytester, GROWN)
    pytester.makeini("[pytest]\nmemsnap_max_increase = 5%\n")
    pytester.makepyfile(test_step=TEST_STEP)
    result = _run(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "memsnap: no baseline for test_step.py::test_step: record it with"
            " `pytest --memsnap-update test_step.py::test_step` and commit it",
            "baseline: *memsnap_baselines/test_step__test_step.pickle.xz (missing)",
            "this run: *.memsnap/test_step__test_step.pickle.xz",
        ]
    )
    assert not (pytester.path / "memsnap_baselines").exists()


def test_update_writes_the_baseline(pytester):
    _replay(pytester, GROWN)
    _baseline(pytester, BASE)
    pytester.makeini("[pytest]\nmemsnap_max_increase = 5%\n")
    pytester.makepyfile(test_step=TEST_STEP)
    result = _run(pytester, "--memsnap-update")
    result.assert_outcomes(passed=1)
    stored = pytester.path / "memsnap_baselines" / "test_step__test_step.pickle.xz"
    result.stdout.fnmatch_lines(["*memsnap: wrote 1 baseline(s)*", str(stored)])
    assert lzma.decompress(stored.read_bytes()) == lzma.decompress(GROWN.read_bytes())
    # the new run is now the baseline: within budget
    _run(pytester).assert_outcomes(passed=1)


def test_update_compresses_a_plain_pickle_and_replaces_it(pytester):
    plain = pytester.path / "recorded.pickle"
    plain.write_bytes(lzma.decompress(GROWN.read_bytes()))
    _replay(pytester, plain)
    old = _baseline(pytester, BASE)
    older = old.with_name("test_step__test_step.pickle")
    older.write_bytes(b"stale")
    pytester.makepyfile(test_step=TEST_STEP)
    _run(pytester, "--memsnap-update").assert_outcomes(passed=1)
    assert old.read_bytes()[:6] == b"\xfd7zXZ\x00"
    assert lzma.decompress(old.read_bytes()) == plain.read_bytes()
    assert not older.exists()


def test_one_baseline_folder_for_all(pytester):
    _replay(pytester, GROWN)
    # with a folder of its own the name carries the test file's folder
    _baseline(pytester, BASE, name="tests__test_step__test_step", folder="central")
    (pytester.path / "central" / "memory-budget.json").write_text('{"max_increase": "5%"}')
    pytester.mkpydir("tests")
    (pytester.path / "tests" / "test_step.py").write_text(TEST_STEP)
    result = _run(pytester, "--memsnap-baselines", "central", "--memsnap-snapshots", "out")
    result.assert_outcomes(failed=1)
    assert BROKEN_5 in result.stdout.str()
    assert (pytester.path / "out" / "tests__test_step__test_step.pickle.xz").is_file()

    # the same from the ini file
    pytester.makeini("[pytest]\nmemsnap_baselines = central\n")
    _run(pytester).assert_outcomes(failed=1)


def test_unknown_marker_limit_fails(pytester):
    _replay(pytester, GROWN)
    _baseline(pytester, BASE)
    pytester.makepyfile(
        test_step="""
import pytest

@pytest.mark.memsnap(max_growth="5%")
def test_step():
    pass
"""
    )
    result = _run(pytester)
    result.assert_outcomes(errors=1)
    assert "unknown limit max_growth" in result.stdout.str()


# ---------------------------------------------------------------------------------------------
# recording: skipped without a GPU, and the calls made to torch


def test_no_torch_skips_with_the_reason(pytester, monkeypatch):
    # torch made unimportable, whatever this machine has
    pytester.makeconftest("import sys\nsys.modules['torch'] = None\n")
    pytester.makepyfile(test_step=TEST_STEP)
    result = _run_subprocess(pytester, monkeypatch, "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED *memsnap: torch is not installed, so no CUDA memory snapshot can be recorded"])


FAKE_TORCH = """
import lzma, os, pickle
LOG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "calls.txt")
AVAILABLE = {available}

def _log(what):
    with open(LOG, "a") as f:
        f.write(what + "\\n")

class _Memory:
    def _record_memory_history(self, enabled="all", **options):
        _log("_record_memory_history(" + ", ".join([repr(enabled)] + [f"{{k}}={{v!r}}" for k, v in sorted(options.items())]) + ")")

    def _snapshot(self):
        _log("_snapshot")
        with lzma.open({snapshot!r}) as f:
            return pickle.load(f)

class _Cuda:
    memory = _Memory()
    def is_available(self):
        _log("is_available")
        return AVAILABLE
    def synchronize(self, device=None):
        _log("synchronize")
    def empty_cache(self):
        _log("empty_cache")
    def reset_peak_memory_stats(self, device=None):
        _log("reset_peak_memory_stats")

cuda = _Cuda()
"""


def _fake_torch(pytester, available):
    pytester.mkpydir("torch")
    (pytester.path / "torch" / "__init__.py").write_text(FAKE_TORCH.format(available=available, snapshot=str(GROWN)))


def test_no_cuda_device_skips_with_the_reason(pytester, monkeypatch):
    _fake_torch(pytester, available=False)
    pytester.makepyfile(test_step=TEST_STEP)
    result = _run_subprocess(pytester, monkeypatch, "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED *memsnap: no CUDA device (torch.cuda.is_available() is False)"])
    assert (pytester.path / "calls.txt").read_text().split() == ["is_available"]


def test_torch_recorder_records_the_body(pytester, monkeypatch):
    _fake_torch(pytester, available=True)
    _baseline(pytester, BASE)
    pytester.makeini("[pytest]\nmemsnap_max_increase = 5%\n")
    pytester.makepyfile(
        test_step="""
from torch import _log

def test_step(memsnap_budget):
    _log("body")
"""
    )
    result = _run_subprocess(pytester, monkeypatch)
    result.assert_outcomes(failed=1)
    assert BROKEN_5 in result.stdout.str()
    calls = (pytester.path / "calls.txt").read_text().splitlines()
    assert calls == [
        "is_available",
        "synchronize",
        "empty_cache",
        "_record_memory_history('all', max_entries=1000000, stacks='python')",
        "reset_peak_memory_stats",
        "body",
        "synchronize",
        "_snapshot",
        "_record_memory_history(None)",
    ]
    recorded = pytester.path / ".memsnap" / "test_step__test_step.pickle"
    with recorded.open("rb") as f, lzma.open(GROWN) as g:
        assert pickle.load(f) == pickle.load(g)

    # --memsnap-update stores it compressed, and then it passes
    _run_subprocess(pytester, monkeypatch, "--memsnap-update").assert_outcomes(passed=1)
    stored = pytester.path / "memsnap_baselines" / "test_step__test_step.pickle.xz"
    assert lzma.decompress(stored.read_bytes()) == recorded.read_bytes()
    _run_subprocess(pytester, monkeypatch).assert_outcomes(passed=1)


def test_entry_point_is_registered():
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        dist = distribution("memsnap")
    except PackageNotFoundError:
        pytest.skip("memsnap is not installed as a package (running from the source tree)")
    points = [ep for ep in dist.entry_points if ep.group == "pytest11"]
    assert [(ep.name, ep.value) for ep in points] == [("memsnap", "memsnap.pytest_plugin")]
