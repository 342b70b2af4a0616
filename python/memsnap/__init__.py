"""memsnap from Python: explain PyTorch CUDA memory snapshots without leaving the training script.

Every function takes a snapshot as a path (``.pickle``, optionally ``.gz``, ``.xz`` or ``.zst``)
or as the dict that ``torch.cuda.memory._snapshot()`` returns. A dict is pickled and sent to the
``memsnap`` command through a pipe; nothing is written to disk and torch is not imported here.

    import memsnap
    summary = memsnap.report("rank0.pickle")
    print(summary["devices"][0]["peak_allocated_bytes"])

    try:
        train_step()
    except torch.OutOfMemoryError:
        explained = memsnap.oom(torch.cuda.memory._snapshot())
        print(explained["devices"][0]["oom"]["verdict"])

Options are the command's long flags with dashes written as underscores: ``device=1`` is
``--device 1``, ``alloc_conf="expandable_segments:True"`` is ``--alloc-conf ...``, ``True`` adds a
bare flag and ``False`` or ``None`` leaves it out; a trailing underscore is dropped, so that
``try_=["expandable_segments:True"]`` is ``--try ...``. Paths are passed after ``--``, so a file
named ``-x.pickle`` is a file, never an option. A failure raises :class:`MemsnapError` with
the command's one-line message.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

try:
    from importlib.metadata import version as _version

    __version__ = _version("memsnap")
except Exception:  # not installed as a package (running from a source tree)
    __version__ = "unknown"

from .capture import Capture, lightning_callback, transformers_callback

__all__ = [
    "MemsnapError",
    "binary",
    "report",
    "oom",
    "timeline",
    "view",
    "whatif",
    "predict",
    "compare",
    "diff",
    "BudgetError",
    "run",
    "Capture",
    "lightning_callback",
    "transformers_callback",
]

Snapshot = Union[str, "os.PathLike[str]", Dict[str, Any]]


class MemsnapError(RuntimeError):
    """The ``memsnap`` command failed; ``exit_code`` is 1 for a file it could not analyse and 2
    for a usage error."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def binary() -> str:
    """Path of the ``memsnap`` executable: ``$MEMSNAP_BINARY`` when set, else the one this
    package installed beside the interpreter's scripts, else the first on ``PATH``."""
    override = os.environ.get("MEMSNAP_BINARY")
    if override:
        return override
    name = "memsnap.exe" if sys.platform == "win32" else "memsnap"
    candidates = [Path(sysconfig.get_path("scripts")) / name, Path(sys.executable).parent / name]
    try:
        candidates.append(Path(sysconfig.get_path("scripts", f"{os.name}_user")) / name)
    except KeyError:  # no per-user scheme on this platform
        pass
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("memsnap")
    if found:
        return found
    raise MemsnapError("the memsnap command was not found: reinstall the memsnap wheel", 2)


def _flags(options: Dict[str, Any]) -> List[str]:
    args: List[str] = []
    for key, value in options.items():
        flag = "--" + key.rstrip("_").replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            args.append(flag)
        elif isinstance(value, (list, tuple)):
            for item in value:
                args += [flag, str(item)]
        elif isinstance(value, (bytes, os.PathLike)):
            # a path as it is: bytes that are no UTF-8 stay the bytes given
            args += [flag, os.fspath(value)]
        else:
            args += [flag, str(value)]
    return args


def _source(snapshot: Snapshot):
    """The command-line argument naming the snapshot, and the bytes to send on standard input."""
    if isinstance(snapshot, dict):
        return "-", pickle.dumps(snapshot, protocol=4)
    if isinstance(snapshot, (str, os.PathLike)):
        return os.fspath(snapshot), None
    raise TypeError(
        "a snapshot is a path or the dict torch.cuda.memory._snapshot() returns, not "
        + type(snapshot).__name__
    )


def run(args: List[str], stdin: Optional[bytes] = None) -> str:
    """Runs ``memsnap`` with ``args`` and returns what it printed; raises :class:`MemsnapError`
    when it exits non-zero."""
    return _run(args, stdin)[0]


def _run(args: List[str], stdin: Optional[bytes] = None):
    """What ``memsnap args`` printed on stdout and on stderr; raises on a non-zero exit."""
    done = subprocess.run(
        [binary(), *args],
        input=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    if done.returncode != 0:
        message = done.stderr.decode("utf-8", "replace").strip() or f"memsnap exited {done.returncode}"
        raise MemsnapError(message, done.returncode)
    return done.stdout.decode("utf-8"), done.stderr.decode("utf-8", "replace")


def _json_command(command: str, snapshot: Snapshot, options: Dict[str, Any]) -> Dict[str, Any]:
    path, data = _source(snapshot)
    out = run([command, "--json", "--quiet", *_flags(options), "--", path], stdin=data)
    return json.loads(out)


def report(snapshot: Snapshot, **options: Any) -> Dict[str, Any]:
    """The ``memsnap report --json`` object: peaks, breakdowns, steps and OOM explanation per
    device. Options as in ``memsnap report --help`` (``device``, ``rules``, ``source_root``, ...)."""
    return _json_command("report", snapshot, options)


def oom(snapshot: Snapshot, **options: Any) -> Dict[str, Any]:
    """The ``memsnap oom --json`` object: the failed request, the verdict (fragmentation, capacity
    or cap), what was live, and settings that would fit. Options: ``cap``, ``device_total``, ..."""
    return _json_command("oom", snapshot, options)


def whatif(snapshot: Snapshot, **options: Any) -> Dict[str, Any]:
    """The ``memsnap whatif --json`` object: the trace replayed under other allocator settings
    (``alloc_conf="expandable_segments:True"``, ``cap="40GiB"``, ...)."""
    return _json_command("whatif", snapshot, options)


def predict(
    snapshots: Dict[Union[str, "os.PathLike[str]"], int],
    to: Union[int, List[int]],
    **options: Any,
) -> Dict[str, Any]:
    """The ``memsnap whatif --scale --json`` object: the program of ``snapshots`` (each file with
    the value of the one size that differs: batch, sequence length, micro-batches) predicted at
    the size or sizes ``to``, allocator included. One snapshot scales by category (or, for a
    DualPipeV rank at its number of micro-batches, by its schedule). Options as for
    :func:`whatif` (``cap``, ``try_``, ``min_cap``, ...)::

        memsnap.predict({"b16.pickle": 16, "b32.pickle": 32}, to=64, cap="40GiB")
    """
    sizes = [to] if isinstance(to, int) else list(to)
    # FILE=SIZE attached to its flag: a file named -x.pickle is never read as an option
    scale = [f"--scale={os.fspath(path)}={int(size)}" for path, size in snapshots.items()]
    targets = [f"--to={int(size)}" for size in sizes]
    return json.loads(run(["whatif", "--json", "--quiet", *_flags(options), *scale, *targets]))


def timeline(snapshot: Snapshot, output: Union[str, "os.PathLike[str]"], by: str = "category", **options: Any) -> List[str]:
    """Draws memory over time into ``output`` (.png or .svg), stacked by ``by`` (category, step,
    op, stage, site, phase or annotation), and returns the image paths written (one per device)."""
    path, data = _source(snapshot)
    output = os.fspath(output)
    flags = _flags({"output": output, "by": by, **options})
    _, notes = _run(["timeline", "--quiet", *flags, "--", path], stdin=data)
    # The files this run wrote, as it announced them (never images an earlier run left
    # behind), each as the path itself: the notes show names escaped for a terminal.
    return [_written_path(output, shown) for shown in _announced(notes)]


def _announced(notes: str) -> List[str]:
    """The names memsnap said it wrote, as shown (control characters escaped)."""
    prefix = "memsnap: wrote "
    return [line[len(prefix):] for line in notes.splitlines() if line.startswith(prefix)]


def _shown(path: Union[str, bytes]) -> str:
    """``path`` as memsnap's notes show it (``escape::printable`` of its display)."""
    if isinstance(path, bytes):
        text = path.decode("utf-8", "replace")
    else:
        text = path.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    out = []
    for c in text:
        o = ord(c)
        if c in "\n\r\t":
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t"}[c])
        elif o < 0x20 or o == 0x7F:
            out.append("\\x%02x" % o)
        elif 0x80 <= o <= 0x9F or 0x202A <= o <= 0x202E or 0x2066 <= o <= 0x2069 or o in (0x200E, 0x200F, 0x61C):
            out.append("\\u{%x}" % o)
        else:
            out.append(c)
    return "".join(out)


def _written_path(output: Union[str, bytes], shown: str) -> Union[str, bytes]:
    """The path memsnap announced as ``shown``: ``output`` itself, or its name for one of several
    devices (``t-device1.png``, ``t-host.png`` beside ``t.png``), of the type ``output`` has."""
    if shown == _shown(output):
        return output
    found = re.search(r"-(device[0-9]+|host)\.[^/]*$", shown)
    if not found:
        return output
    slug = found.group(1)
    head, tail = os.path.split(output)
    stem, ext = os.path.splitext(tail)
    if isinstance(output, bytes):
        name = stem + b"-" + slug.encode() + (ext or b".png")
    else:
        name = stem + "-" + slug + (ext or ".png")
    return os.path.join(head, name)


def view(
    snapshot: Union[Snapshot, List[Union[str, "os.PathLike[str]"]]],
    output: Union[str, "os.PathLike[str]"],
    **options: Any,
) -> str:
    """Writes one self-contained interactive HTML page of ``snapshot`` (or of a list of snapshot
    files or folders, one panel per rank) to ``output`` and returns its path. The page needs no
    network: open it in any browser, attach it to a pull request."""
    output = os.fspath(output)
    flags = _flags({"output": output, **options})
    if isinstance(snapshot, (list, tuple)):
        paths, data = [os.fspath(s) for s in snapshot], None
    else:
        path, data = _source(snapshot)
        paths = [path]
    _run(["view", "--quiet", *flags, "--", *paths], stdin=data)
    # the path as given (str or bytes): the note shows it escaped for a terminal
    return output


class BudgetError(MemsnapError):
    """A budget given to :func:`diff` was broken: ``diffs`` holds the ``memsnap diff --json``
    objects (one per pair of snapshots), the message the broken limits, one per line."""

    def __init__(self, message: str, diffs: List[Dict[str, Any]]):
        super().__init__(message, 1)
        self.diffs = diffs


def diff(base: Snapshot, new: Snapshot, **options: Any) -> Dict[str, Any]:
    """The ``memsnap diff --json`` object: why ``new`` used more (or less) memory than ``base``,
    cause by cause (``causes``, each with ``kind``, ``site``, ``module``, ``category``, ``step``,
    ``phase`` and ``peak_effect_bytes``, adding up to ``peak_allocated_delta_bytes``; a change
    made of several causes lists them in ``parts``, whose effects add up to its own). Two
    folders of ranks give ``{"ranks": [...]}``. Budget options (``max_increase="5%"``,
    ``max_peak="40GiB"``, ``budget="memory-budget.json"``) raise :class:`BudgetError` when
    broken. ``new`` (not both) may be the dict of ``torch.cuda.memory._snapshot()``."""
    if isinstance(base, dict):
        raise TypeError("diff: the base is a path (only the new run may be a dict)")
    new_path, data = _source(new)
    args = ["diff", "--json", "--quiet", *_flags(options), "--", os.fspath(base), new_path]
    done = subprocess.run([binary(), *args], input=data, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = done.stdout.decode("utf-8")
    message = done.stderr.decode("utf-8", "replace").strip()
    diffs = [json.loads(line) for line in out.splitlines() if line.strip()]
    if done.returncode == 1 and diffs and "budget broken" in message:
        lines = [l for l in message.splitlines() if "budget broken" in l]
        raise BudgetError("\n".join(lines), diffs)
    if done.returncode != 0:
        raise MemsnapError(message or f"memsnap exited {done.returncode}", done.returncode)
    if len(diffs) == 1 and "rank" not in diffs[0]:
        return diffs[0]
    return {"ranks": diffs}


def compare(*snapshots: Union[str, "os.PathLike[str]"], **options: Any) -> Dict[str, Any]:
    """The ``memsnap compare --json`` object for two or more snapshot files, folders or report
    summaries (``.json``/``.jsonl``)."""
    paths = [os.fspath(s) for s in snapshots]
    return json.loads(run(["compare", "--json", "--quiet", *_flags(options), "--", *paths]))
