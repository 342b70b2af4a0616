"""A pytest plugin that holds a test's GPU memory to a budget, against a stored baseline snapshot.

    def test_train_step(memsnap_budget, model, batch):
        train_step(model, batch)

    @pytest.mark.memsnap(max_increase="5%", max_peak="40GiB")
    def test_big_batch(model):
        train_step(model, big_batch)

The body of a test that asks for the ``memsnap_budget`` fixture (or carries the ``memsnap``
marker) is recorded as a CUDA memory snapshot (fixtures' own allocations before it are the
blocks alive at the start), written to ``<snapshots>/<name>.pickle``, and compared with the
baseline ``<baselines>/<name>.pickle.xz`` by ``memsnap diff`` under the budget: a broken budget
fails the test with memsnap's one-line verdict and the diff's ranked causes. A test whose body
fails is not compared. ``pytest --memsnap-update`` writes the baselines instead (a missing one
fails the test with a message saying so).

The budget, each limit from the first that gives it: the marker's keywords (or what the test
sets in ``memsnap_budget.limits``), ``memory-budget.json`` in the baselines folder (memsnap's
``--budget`` file: ``{"max_increase": "5%", "max_peak": "40GiB"}``), then the ini options
``memsnap_max_peak``, ``memsnap_max_increase``, ``memsnap_max_reserved_peak`` and
``memsnap_max_reserved_increase``. Baselines live in ``memsnap_baselines/`` beside the test file
unless ``--memsnap-baselines DIR`` or the ini option ``memsnap_baselines`` names one folder for
all; the new snapshots go to ``.memsnap/`` under the rootdir (``--memsnap-snapshots DIR``, ini
``memsnap_snapshots``), each with ``<name>.json`` saying which baseline it was compared with and
how, for a CI job that posts ``memsnap diff --markdown`` of them.

Recording is the ``memsnap_recorder`` fixture's: :class:`TorchRecorder` by default, which
skips the test when torch is missing or sees no CUDA device. Override that fixture in a
conftest.py to run the comparison without a GPU, e.g. with :class:`ReplayRecorder`, which hands
over a snapshot recorded before; :func:`check_against_baseline` is the comparison alone.
torch is imported when recording starts, never at import. Registered as the ``pytest11`` entry
point ``memsnap``.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import lzma
import os
import re
import subprocess
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Union

import pytest

from . import MemsnapError, binary
from .capture import _write_atomically

__all__ = [
    "LIMITS",
    "BUDGET_FILE",
    "BudgetCheck",
    "DiffResult",
    "TorchRecorder",
    "ReplayRecorder",
    "check_against_baseline",
    "budget_flags",
    "baseline_name",
    "find_baseline",
    "write_baseline",
    "gpu_unavailable",
]

LIMITS = ("max_peak", "max_increase", "max_reserved_peak", "max_reserved_increase")
BUDGET_FILE = "memory-budget.json"
DEFAULT_BASELINES = "memsnap_baselines"
DEFAULT_SNAPSHOTS = ".memsnap"
BASELINE_SUFFIX = ".pickle.xz"
# the suffixes a stored snapshot may have (memsnap tells the compression by the first bytes)
SNAPSHOT_SUFFIXES = (".pickle.xz", ".pickle.gz", ".pickle.zst", ".pickle")

_CHECK = pytest.StashKey["BudgetCheck"]()
_UPDATED = pytest.StashKey[List[str]]()

PathLike = Union[str, "os.PathLike[str]"]


# ---------------------------------------------------------------------------------------------
# the comparison, without pytest or a GPU


@dataclass
class DiffResult:
    """What ``memsnap diff`` said of a new snapshot against its baseline under a budget."""

    passed: bool
    """No limit of the budget broken (true as well when the budget is empty)."""
    broken: List[str]
    """The ``memsnap: budget broken: ...`` lines, one per limit broken."""
    report: str
    """The text ``memsnap diff`` printed: both peaks and the ranked causes of the change."""
    command: List[str]
    """The command that was run."""

    @property
    def message(self) -> str:
        """The broken limits, then the diff."""
        return "\n".join([*self.broken, "", self.report.rstrip()]).strip("\n")


def _suffix(path: PathLike) -> str:
    name = os.fspath(path)
    for suffix in SNAPSHOT_SUFFIXES:
        if name.endswith(suffix):
            return suffix
    return os.path.splitext(name)[1]


def budget_flags(budget: Optional[Dict[str, Any]]) -> List[str]:
    """``{"max_increase": "5%"}`` as ``["--max-increase", "5%"]``; a limit of ``None`` is left
    out, an unknown one raises :class:`ValueError`."""
    flags: List[str] = []
    for key, value in (budget or {}).items():
        if key not in LIMITS:
            raise ValueError(f"memsnap: unknown budget limit {key!r} (known: {', '.join(LIMITS)})")
        if value is not None:
            flags += ["--" + key.replace("_", "-"), str(value)]
    return flags


def check_against_baseline(
    snapshot: PathLike,
    baseline: PathLike,
    budget: Optional[Dict[str, Any]] = None,
    budget_file: Optional[PathLike] = None,
    top: int = 10,
) -> DiffResult:
    """Runs ``memsnap diff --top TOP [--budget FILE] [limits] -- BASELINE SNAPSHOT``: the limits
    of ``budget`` (keys of :data:`LIMITS`, values as on the command line: ``"5%"``,
    ``"512MiB"``, ``"40GiB"``) win over those of ``budget_file``. Returns the verdict and the
    diff's text; raises :class:`memsnap.MemsnapError` when memsnap could not compare the two
    (a file missing or unreadable, a bad limit)."""
    command = [binary(), "diff", "--quiet", "--top", str(int(top))]
    if budget_file is not None:
        command += ["--budget", os.fspath(budget_file)]
    command += budget_flags(budget)
    command += ["--", os.fspath(baseline), os.fspath(snapshot)]
    done = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = done.stdout.decode("utf-8", "replace")
    notes = done.stderr.decode("utf-8", "replace")
    broken = [line for line in notes.splitlines() if line.startswith("memsnap: budget broken: ")]
    if done.returncode == 0:
        return DiffResult(True, [], out, command)
    if done.returncode == 1 and broken:
        return DiffResult(False, broken, out, command)
    raise MemsnapError(notes.strip() or f"memsnap exited {done.returncode}", done.returncode)


# ---------------------------------------------------------------------------------------------
# recorders: what the fixture records the test's body with


def gpu_unavailable() -> Optional[str]:
    """Why no CUDA snapshot can be recorded here (torch missing, no CUDA device), or ``None``."""
    try:
        import torch
    except ModuleNotFoundError as error:
        if error.name != "torch":
            raise
        return "memsnap: torch is not installed, so no CUDA memory snapshot can be recorded"
    if not torch.cuda.is_available():
        return "memsnap: no CUDA device (torch.cuda.is_available() is False)"
    return None


class TorchRecorder:
    """Records the test's body with PyTorch's memory history: ``start()`` releases the cached
    blocks (so the test starts from the same allocator state whatever ran before), starts the
    history and resets the peak statistics; ``stop(stem)`` takes the snapshot, stops the
    history and writes ``<stem>.pickle``."""

    def __init__(self, max_entries: int = 1_000_000, stacks: str = "python"):
        self.max_entries = int(max_entries)
        self.stacks = stacks

    def unavailable(self) -> Optional[str]:
        """The reason to skip the test, or ``None``."""
        return gpu_unavailable()

    def start(self) -> None:
        import gc

        import torch

        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.memory._record_memory_history(max_entries=self.max_entries, stacks=self.stacks)
        torch.cuda.reset_peak_memory_stats()

    def stop(self, stem: str) -> str:
        import pickle

        import torch

        try:
            torch.cuda.synchronize()
            snapshot = torch.cuda.memory._snapshot()
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
        path = stem + ".pickle"
        _write_atomically(path, pickle.dumps(snapshot, protocol=4))
        return path


class ReplayRecorder:
    """Records nothing: ``stop(stem)`` copies a snapshot recorded before to ``<stem>`` plus its
    suffix (``.pickle.xz``, ...). For testing the plugin, or a budget, without a GPU::

        # conftest.py
        @pytest.fixture
        def memsnap_recorder():
            return ReplayRecorder("runs/branch.pickle.xz")
    """

    def __init__(self, snapshot: PathLike):
        self.snapshot = os.fspath(snapshot)

    def unavailable(self) -> Optional[str]:
        return None

    def start(self) -> None:
        pass

    def stop(self, stem: str) -> str:
        path = stem + _suffix(self.snapshot)
        with open(self.snapshot, "rb") as f:
            _write_atomically(path, f.read())
        return path


# ---------------------------------------------------------------------------------------------
# baselines


def baseline_name(nodeid: str, with_folder: bool = True) -> str:
    """A file-safe name from a test's node id: ``tests/test_x.py::TestA::test_step[bs=32]`` is
    ``tests__test_x__TestA__test_step_bs=32`` (``test_x__TestA__test_step_bs=32`` without the
    folder). Runs of other characters than letters, digits and ``._+=-`` become one ``_``; a
    name longer than 120 characters is cut and ends in a hash of the node id."""
    path, sep, rest = nodeid.partition("::")
    if not with_folder:
        path = path.replace("\\", "/").rsplit("/", 1)[-1]
    if path.endswith(".py"):
        path = path[: -len(".py")]
    text = "__".join([p for p in path.replace("\\", "/").split("/") if p] + ([rest] if sep else []))
    text = text.replace("::", "__")
    name = re.sub(r"[^A-Za-z0-9._+=-]+", "_", text).strip("_.") or "test"
    if len(name) > 120:
        name = name[:100].rstrip("_.") + "-" + hashlib.sha1(nodeid.encode()).hexdigest()[:12]
    return name


def find_baseline(folder: str, name: str) -> Optional[str]:
    """The stored baseline ``<folder>/<name>`` with any snapshot suffix, ``.pickle.xz`` first."""
    for suffix in SNAPSHOT_SUFFIXES:
        path = os.path.join(folder, name + suffix)
        if os.path.isfile(path):
            return path
    return None


def write_baseline(snapshot: str, folder: str, name: str) -> str:
    """Stores ``snapshot`` as ``<folder>/<name>.pickle.xz`` (compressed here unless it is xz
    already) and removes the same name's baselines of other suffixes; returns the path."""
    target = os.path.join(folder, name + BASELINE_SUFFIX)
    with open(snapshot, "rb") as f:
        data = f.read()
    if data[:6] == b"\xfd7zXZ\x00":
        packed = data
    else:
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        elif data[:4] == b"\x28\xb5\x2f\xfd":
            raise MemsnapError(
                f"memsnap: {snapshot} is zstd-compressed; store it as a .pickle or .pickle.xz baseline", 2
            )
        packed = lzma.compress(data)
    _write_atomically(target, packed)
    for suffix in SNAPSHOT_SUFFIXES:
        other = os.path.join(folder, name + suffix)
        if suffix != BASELINE_SUFFIX and os.path.isfile(other):
            os.unlink(other)
    return target


# ---------------------------------------------------------------------------------------------
# the fixture


@dataclass
class BudgetCheck:
    """What ``memsnap_budget`` gives a test: where its snapshots are, and its budget.
    ``limits`` (the marker's keywords to start with) may be changed by the test's body; they
    win over ``memory-budget.json`` and the ini options. After the body, ``snapshot`` is the
    recorded file and ``result`` the :class:`DiffResult` (``None`` when updating)."""

    nodeid: str
    name: str
    baseline_dir: str
    snapshot_dir: str
    limits: Dict[str, Any]
    ini_limits: Dict[str, Any]
    recorder: Any
    update: bool = False
    snapshot: Optional[str] = None
    result: Optional[DiffResult] = None
    updated: Optional[str] = None
    """The baseline written by ``--memsnap-update``."""
    _started: bool = field(default=False, repr=False)

    @property
    def baseline(self) -> str:
        """The baseline's path (the one stored, or where ``--memsnap-update`` writes it)."""
        found = find_baseline(self.baseline_dir, self.name)
        return found or os.path.join(self.baseline_dir, self.name + BASELINE_SUFFIX)

    @property
    def budget_file(self) -> Optional[str]:
        """``memory-budget.json`` in the baselines folder, when there is one."""
        path = os.path.join(self.baseline_dir, BUDGET_FILE)
        return path if os.path.isfile(path) else None

    def budget(self) -> Dict[str, Any]:
        """The limits given as options to ``memsnap diff``: the test's, then the ini options' for
        the limits the budget file does not set (memsnap reads the file itself)."""
        in_file: set = set()
        if self.budget_file is not None:
            try:
                with open(self.budget_file, encoding="utf-8") as f:
                    doc = json.load(f)
                in_file = set(doc) if isinstance(doc, dict) else set()
            except (OSError, ValueError):
                pass  # memsnap says what is wrong with it
        out = {k: v for k, v in self.ini_limits.items() if v not in (None, "") and k not in in_file}
        out.update({k: v for k, v in self.limits.items() if v is not None})
        return out

    def _start(self) -> None:
        self.recorder.start()
        self._started = True

    def _finish(self, compare: bool) -> None:
        """Stops the recording; then compares (or updates) unless the body failed."""
        if not self._started:
            return
        self._started = False
        os.makedirs(self.snapshot_dir, exist_ok=True)
        self.snapshot = self.recorder.stop(os.path.join(self.snapshot_dir, self.name))
        if compare:
            self._compare()

    def _record(self, **extra: Any) -> None:
        """``<snapshots>/<name>.json``: which files were compared and how, for CI."""
        doc = {
            "nodeid": self.nodeid,
            "snapshot": os.path.abspath(self.snapshot or ""),
            "baseline": os.path.abspath(self.baseline),
            "budget": self.budget(),
            "budget_file": self.budget_file and os.path.abspath(self.budget_file),
            **extra,
        }
        path = os.path.join(self.snapshot_dir, self.name + ".json")
        _write_atomically(path, (json.dumps(doc, indent=1) + "\n").encode())

    def _compare(self) -> None:
        assert self.snapshot is not None
        if self.update:
            self.updated = write_baseline(self.snapshot, self.baseline_dir, self.name)
            self._record(updated=True)
            return
        stored = find_baseline(self.baseline_dir, self.name)
        if stored is None:
            self._record(passed=False, missing_baseline=True)
            pytest.fail(
                f"memsnap: no baseline for {self.nodeid}: record it with "
                f"`pytest --memsnap-update {_quoted(self.nodeid)}` and commit it\n"
                f"baseline: {self.baseline} (missing)\n"
                f"this run: {self.snapshot}",
                pytrace=False,
            )
        try:
            budget = self.budget()
            self.result = check_against_baseline(self.snapshot, stored, budget, self.budget_file)
        except (MemsnapError, ValueError) as error:
            self._record(passed=False, error=str(error))
            pytest.fail(f"memsnap could not compare {self.snapshot} with {stored}: {error}", pytrace=False)
        self._record(passed=self.result.passed, broken=self.result.broken)
        if not self.result.passed:
            pytest.fail(
                "\n".join(
                    [
                        self.result.message,
                        "",
                        f"baseline: {stored}",
                        f"this run: {self.snapshot}",
                        f"if the new use is intended: pytest --memsnap-update {_quoted(self.nodeid)}",
                    ]
                ),
                pytrace=False,
            )


def _quoted(nodeid: str) -> str:
    return "'" + nodeid.replace("'", "'\\''") + "'" if re.search(r"[^\w./:=+-]", nodeid) else nodeid


def _folder(config: pytest.Config, option: str, ini: str) -> Optional[str]:
    """The folder the command line names (from where pytest was started), else the ini file's
    (from the ini file's folder), else ``None``."""
    given = config.getoption(option)
    if given:
        return os.path.join(str(config.invocation_params.dir), given)
    value = config.getini(ini)
    if value:
        base = config.inipath.parent if config.inipath else config.rootpath
        return os.path.join(str(base), value)
    return None


@pytest.fixture
def memsnap_recorder() -> Any:
    """What records the test's body: an object with ``unavailable() -> reason or None``,
    ``start()`` and ``stop(stem) -> path written``. :class:`TorchRecorder` here; override this
    fixture (e.g. with :class:`ReplayRecorder`) to test without a GPU."""
    return TorchRecorder()


@pytest.fixture
def memsnap_budget(request: pytest.FixtureRequest, memsnap_recorder: Any) -> Iterator[BudgetCheck]:
    """Records the test's body as a CUDA memory snapshot and holds it to the budget against the
    stored baseline (see the module's documentation); skipped without a GPU."""
    reason = memsnap_recorder.unavailable()
    if reason:
        pytest.skip(reason)
    config = request.config
    item = request.node
    marker = item.get_closest_marker("memsnap")
    limits = dict(marker.kwargs) if marker is not None else {}
    if marker is not None and marker.args:
        pytest.fail(f"@pytest.mark.memsnap takes keywords only ({', '.join(LIMITS)})", pytrace=False)
    unknown = sorted(set(limits) - set(LIMITS))
    if unknown:
        pytest.fail(
            f"@pytest.mark.memsnap: unknown limit {', '.join(unknown)} (known: {', '.join(LIMITS)})",
            pytrace=False,
        )
    central = _folder(config, "memsnap_baselines", "memsnap_baselines")
    baseline_dir = central or os.path.join(os.path.dirname(str(item.path)), DEFAULT_BASELINES)
    snapshot_dir = _folder(config, "memsnap_snapshots", "memsnap_snapshots") or os.path.join(
        str(config.rootpath), DEFAULT_SNAPSHOTS
    )
    check = BudgetCheck(
        nodeid=item.nodeid,
        name=baseline_name(item.nodeid, with_folder=central is not None),
        baseline_dir=baseline_dir,
        snapshot_dir=snapshot_dir,
        limits=limits,
        ini_limits={k: config.getini("memsnap_" + k) for k in LIMITS},
        recorder=memsnap_recorder,
        update=bool(config.getoption("memsnap_update")),
    )
    item.stash[_CHECK] = check
    yield check
    check._finish(compare=False)  # a recording the body's hook left open
    del item.stash[_CHECK]


# ---------------------------------------------------------------------------------------------
# hooks


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("memsnap", "memsnap: GPU memory budgets against baseline snapshots")
    group.addoption(
        "--memsnap-update",
        action="store_true",
        default=False,
        help="record the memsnap baselines of the tests run instead of comparing with them",
    )
    group.addoption(
        "--memsnap-baselines",
        metavar="DIR",
        default=None,
        help="one folder for every baseline (default: memsnap_baselines/ beside each test file)",
    )
    group.addoption(
        "--memsnap-snapshots",
        metavar="DIR",
        default=None,
        help="where each test's new snapshot is written (default: .memsnap/ under the rootdir)",
    )
    parser.addini("memsnap_baselines", "one folder for every memsnap baseline (from the ini file's folder)", default="")
    parser.addini("memsnap_snapshots", "where memsnap writes each test's new snapshot", default="")
    for key, example in zip(LIMITS, ("40GiB", "5%", "48GiB", "5%")):
        flag = "--" + key.replace("_", "-")
        parser.addini("memsnap_" + key, f"default budget: memsnap diff {flag} (e.g. {example})", default="")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "memsnap(max_peak=None, max_increase=None, max_reserved_peak=None, max_reserved_increase=None): "
        "record the test's CUDA memory and hold it to this budget against its baseline snapshot "
        "(the memsnap_budget fixture)",
    )
    config.stash[_UPDATED] = []


def pytest_collection_modifyitems(items: List[pytest.Item]) -> None:
    # the marker alone asks for the fixture
    for item in items:
        names = getattr(item, "fixturenames", None)
        if names is not None and "memsnap_budget" not in names and item.get_closest_marker("memsnap"):
            names.append("memsnap_budget")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    check = item.stash.get(_CHECK, None)
    if check is None:
        return (yield)
    check._start()
    try:
        result = yield
    except BaseException:
        check._finish(compare=False)
        raise
    check._finish(compare=True)
    if check.updated:
        item.config.stash[_UPDATED].append(check.updated)
    elif check.result is not None:
        item.add_report_section("call", "memsnap", check.result.report)
    return result


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    written = config.stash.get(_UPDATED, [])
    if written:
        terminalreporter.write_sep("-", f"memsnap: wrote {len(written)} baseline(s)")
        for path in written:
            terminalreporter.write_line(path)
