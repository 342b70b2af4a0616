"""Recording snapshots from inside a training loop, without editing the framework.

    import memsnap

    cap = memsnap.Capture("snapshots", ranks={0, 3}, steps=range(0, 1))
    cap.probe("after init_process_group")
    for step, batch in enumerate(loader):
        with cap.step(step):
            train_step(batch)

On the ranks and steps chosen, memory history is recorded from the first chosen step (peak
statistics reset there) to the end of the last, and the snapshot is written to
``<dir>/memory_snapshot_rank<R>_step<S>.pickle`` (``S`` the last step recorded), through a
temporary file renamed into place. An out-of-memory error while recording writes
``..._oom.pickle`` (through the allocator's out-of-memory observer, so also inside a loop that
is not yours), and a ``torch.OutOfMemoryError`` inside ``step()`` is raised again.
Elsewhere ``step()`` does nothing.

``probe(name)`` notes the device's memory at a named point (``torch.cuda.mem_get_info``) beside
what PyTorch reserved: the difference is memory outside PyTorch's allocator (the CUDA context,
NCCL communicators, cuBLAS handles), which no snapshot holds. Probes are written next to the
snapshot as ``<snapshot>.probes.json``, and ``memsnap report`` shows them.

Given the model(s) and optimizer(s) (``Capture(..., model=m, optimizer=opt)`` or
``cap.watch(model=m, optimizer=opt)``; each one object or a list), each snapshot gets a second
side file, ``<snapshot>.tensors.json``: the program's own step numbers with their wall-clock
start and end, and the CUDA storages of the parameters, buffers, gradients and optimizer state
by name (address and bytes, one entry per storage) at recording start, at the end of every
recorded step and at an out-of-memory error; with the per-process cap the allocator enforces
(``allowed_bytes``). The callbacks find the model and optimizers themselves. Writing it never
stops the training: a failure is warned about once.

With ``summary=True`` each snapshot also gets ``<snapshot>.summary.json``: what ``memsnap report
--json`` prints of it (one small object), written by a child process started right after the
dump (at low priority, in its own session, so the training step is not held and an exiting
training process does not stop it), through a temporary file renamed into place. A job of any
size then leaves its fleet table ready: ``memsnap compare DIR`` reads the summaries instead of
the pickles where they are newer. ``wait_summaries()`` waits for the children (a test's or a
script's last line); a summary that cannot be made leaves ``<snapshot>.summary.err`` with the
command's message instead.

The rank comes from the environment (``RANK``, then ``SLURM_PROCID``, else 0), so probes can be
taken before the process group exists. torch is imported when recording starts, never at
``import memsnap``. ``lightning_callback(cap)`` and ``transformers_callback(cap)`` give the same
thing for loops that are not yours.

The module also keeps one default capture, for code that cannot pass one around:
``memsnap.capture.configure("snapshots", ranks={0})`` once, then
``memsnap.capture.probe("after init_process_group")`` and ``with memsnap.capture.step(s):``
anywhere (``configure()`` with no arguments is implied: the current folder, rank 0's step 0).
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
import warnings
from contextlib import contextmanager
from typing import Any, Dict, Iterable, Iterator, List, Optional

TENSORS_FORMAT = "memsnap-tensors/1"

__all__ = ["Capture", "configure", "probe", "step", "lightning_callback", "transformers_callback"]


def _env_rank() -> int:
    for name in ("RANK", "SLURM_PROCID"):
        value = os.environ.get(name)
        if value is not None and value.strip().isdigit():
            return int(value)
    return 0


def _write_atomically(path: str, data: bytes) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".memsnap-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        # mkstemp makes the file private; give it the mode a plain open() would have
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# The child that writes a summary: runs `memsnap report --json` on the snapshot and renames its
# output into place, or leaves the one-line error beside it. argv: binary, snapshot.
_SUMMARY_CHILD = r"""
import os, subprocess, sys, tempfile
exe, path = sys.argv[1], sys.argv[2]
try:
    os.nice(10)
except OSError:
    pass
done = subprocess.run([exe, "report", "--json", "--quiet", "--", path],
                      stdin=subprocess.DEVNULL, capture_output=True)
target = path + (".summary.json" if done.returncode == 0 else ".summary.err")
data = done.stdout if done.returncode == 0 else (done.stderr or b"memsnap failed\n")
fd, tmp = tempfile.mkstemp(prefix=".memsnap-", dir=os.path.dirname(os.path.abspath(path)))
with os.fdopen(fd, "wb") as f:
    f.write(data)
mask = os.umask(0)
os.umask(mask)
os.chmod(tmp, 0o666 & ~mask)
os.replace(tmp, target)
sys.exit(done.returncode)
"""


def _import_torch():
    """torch, or an error that says how to get it."""
    try:
        import torch
    except ModuleNotFoundError as error:
        if error.name != "torch":
            raise
        raise ModuleNotFoundError(
            "memsnap.Capture records with PyTorch, which is not installed: pip install torch",
            name="torch",
        ) from None
    return torch


def _as_list(value: Any) -> List[Any]:
    """One object or a list or tuple of them (a module is one object, even a Sequential)."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [v for v in value if v is not None]
    return [value]


def _unwrap_optimizer(optimizer: Any) -> Any:
    """The torch optimizer inside a wrapper: Lightning's ``LightningOptimizer`` (``_optimizer``),
    accelerate's ``AcceleratedOptimizer`` and others (``optimizer``)."""
    for _ in range(8):
        inner = getattr(optimizer, "_optimizer", None)
        if inner is None:
            inner = getattr(optimizer, "optimizer", None)
        if inner is None or inner is optimizer or not hasattr(inner, "param_groups"):
            break
        optimizer = inner
    return optimizer


def _inventory(models: List[Any], optimizers: List[Any], device: int) -> List[Dict[str, Any]]:
    """The CUDA storages on ``device`` of the models' parameters and buffers, of the gradients
    and of the optimizers' state, one entry per storage (the first name that reaches it).

    Takes anything shaped like torch's objects: modules with ``named_parameters()`` and
    ``named_buffers()``, optimizers with ``param_groups`` and ``state``, tensors with
    ``is_cuda``, ``device.index`` and ``untyped_storage()``. Parameters an optimizer holds that
    no model names are named ``param_groups.G.I``."""
    out: List[Dict[str, Any]] = []
    seen = set()

    def add(tensor: Any, kind: str, name: str, state: Optional[str] = None) -> None:
        try:
            if not getattr(tensor, "is_cuda", False) or tensor.device.index != device:
                return
            storage = tensor.untyped_storage()
            addr, nbytes = int(storage.data_ptr()), int(storage.nbytes())
        except Exception:  # a tensor without a storage of its own (sparse, meta, a subclass)
            return
        if nbytes == 0 or addr in seen:
            return
        seen.add(addr)
        entry: Dict[str, Any] = {"addr": addr, "bytes": nbytes, "kind": kind, "name": name}
        if state is not None:
            entry["state"] = state
        out.append(entry)

    names: Dict[int, str] = {}
    params: List[Any] = []
    for model in models:
        for name, param in model.named_parameters():
            if id(param) not in names:
                names[id(param)] = name
                params.append((name, param))
    for o, optimizer in enumerate(optimizers):
        for g, group in enumerate(optimizer.param_groups):
            for i, param in enumerate(group["params"]):
                if id(param) not in names:
                    name = f"param_groups.{g}.{i}" if o == 0 else f"optimizer{o}.param_groups.{g}.{i}"
                    names[id(param)] = name
                    params.append((name, param))
    for name, param in params:
        add(param, "parameter", name)
    for model in models:
        for name, buffer in model.named_buffers():
            add(buffer, "buffer", name)
    for name, param in params:
        grad = getattr(param, "grad", None)
        if grad is not None:
            add(grad, "gradient", name)
    for optimizer in optimizers:
        for param, state in list(optimizer.state.items()):
            name = names.get(id(param), "?")
            if not isinstance(state, dict):
                continue
            for key, value in list(state.items()):
                if hasattr(value, "untyped_storage"):
                    add(value, "optimizer_state", name, str(key))
    return out


def _tensors_document(
    rank: int,
    device: int,
    device_total_bytes: Optional[int],
    allowed_bytes: Optional[int],
    steps: List[Dict[str, Any]],
    inventories: List[Dict[str, Any]],
) -> Dict[str, Any]:
    """The object of ``<snapshot>.tensors.json`` (format ``memsnap-tensors/1``)."""
    return {
        "format": TENSORS_FORMAT,
        "rank": int(rank),
        "device": int(device),
        "device_total_bytes": None if device_total_bytes is None else int(device_total_bytes),
        "allowed_bytes": None if allowed_bytes is None else int(allowed_bytes),
        "steps": [
            {"step": int(s["step"]), "start_us": int(s["start_us"]),
             "end_us": None if s["end_us"] is None else int(s["end_us"])}
            for s in steps
        ],
        "inventories": [
            {"at": i["at"], "step": int(i["step"]), "time_us": int(i["time_us"]), "tensors": i["tensors"]}
            for i in inventories
        ],
    }


def _allowed_from_fraction(fraction: float, total: int) -> Optional[int]:
    """The allocator's cap from the fraction torch reports. The caching allocator keeps
    ``allowed_memory_maximum = size_t(fraction * totalGlobalMem)`` when a fraction below 1 is
    set, and reports ``allowed_memory_maximum / totalGlobalMem``; rounding that back times the
    total gives the allocator's integer exactly (the error is far below one byte)."""
    if fraction >= 1.0:
        return None
    return int(round(fraction * total))


def _allowed_bytes(torch: Any, device: int, total: int) -> Optional[int]:
    get = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    if get is None:
        get = getattr(torch._C, "_cuda_getMemoryFraction", None)
    if get is None:  # a torch with no getter: the cap is not known here
        return None
    return _allowed_from_fraction(float(get(device)), total)


class Capture:
    """Records memory history on chosen ranks and steps and writes the snapshots."""

    def __init__(
        self,
        out_dir: str = ".",
        ranks: Optional[Iterable[int]] = None,
        steps: Iterable[int] = range(0, 1),
        stacks: str = "python",
        max_entries: int = 1_000_000,
        rank: Optional[int] = None,
        device: Optional[int] = None,
        model: Any = None,
        optimizer: Any = None,
        summary: bool = False,
    ):
        self.out_dir = out_dir
        self.summary = bool(summary)
        self._children: List[Any] = []
        self.rank = _env_rank() if rank is None else int(rank)
        self.ranks = None if ranks is None else {int(r) for r in ranks}
        self.steps = sorted({int(s) for s in steps})
        self.stacks = stacks
        self.max_entries = int(max_entries)
        self.device = device
        self.probes: List[Dict[str, Any]] = []
        self.written: List[str] = []
        self._recording = False
        self._done = False
        self._current: Optional[int] = None
        self._oom_dumped = False
        self._observing = False
        self._models: List[Any] = []
        self._optimizers: List[Any] = []
        self._device_index: Optional[int] = None
        self._device_total: Optional[int] = None
        self._step_log: List[Dict[str, Any]] = []
        self._inventories: List[Dict[str, Any]] = []
        self._warned = False
        self.watch(model=model, optimizer=optimizer)

    def watch(self, model: Any = None, optimizer: Any = None) -> "Capture":
        """Adds model(s) and optimizer(s) (each one object or a list) whose tensors go into
        ``<snapshot>.tensors.json``; an object already watched is not added twice. Wrapped
        optimizers (Lightning, accelerate) are unwrapped."""
        for m in _as_list(model):
            if not any(m is known for known in self._models):
                self._models.append(m)
        for o in _as_list(optimizer):
            o = _unwrap_optimizer(o)
            if not any(o is known for known in self._optimizers):
                self._optimizers.append(o)
        return self

    @property
    def active(self) -> bool:
        """Whether this rank records at all."""
        return bool(self.steps) and (self.ranks is None or self.rank in self.ranks)

    def probe(self, name: str) -> Optional[Dict[str, Any]]:
        """Notes the device's used memory and PyTorch's reserved bytes at a named point; returns
        the probe (``None`` on a rank that does not record, where it costs nothing)."""
        if not self.active:
            return None
        torch = _import_torch()

        device = torch.cuda.current_device() if self.device is None else self.device
        torch.cuda.synchronize(device)
        free, total = torch.cuda.mem_get_info(device)
        reserved = torch.cuda.memory_reserved(device)
        entry = {
            "name": str(name),
            "time_us": int(time.time() * 1e6),
            "device": int(device),
            "device_total_bytes": int(total),
            "device_used_bytes": int(total - free),
            "reserved_bytes": int(reserved),
            "allocated_bytes": int(torch.cuda.memory_allocated(device)),
        }
        self.probes.append(entry)
        return entry

    def _path(self, step: int, oom: bool) -> str:
        name = f"memory_snapshot_rank{self.rank}_step{step}{'_oom' if oom else ''}.pickle"
        return os.path.join(self.out_dir, name)

    def _warn(self, what: str, error: BaseException) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(f"memsnap: {what}: {type(error).__name__}: {error}", RuntimeWarning, stacklevel=3)

    def _start(self, step: int) -> None:
        torch = _import_torch()

        torch.cuda.memory._record_memory_history(
            max_entries=self.max_entries, stacks=self.stacks
        )
        torch.cuda.reset_peak_memory_stats()
        self._recording = True
        try:
            d = torch.device(self.device) if isinstance(self.device, str) else self.device
            if d is None or (hasattr(d, "type") and d.index is None):
                self._device_index = int(torch.cuda.current_device())
            else:
                self._device_index = int(d.index if hasattr(d, "type") else d)
            self._device_total = int(torch.cuda.get_device_properties(self._device_index).total_memory)
        except Exception as error:
            self._warn("could not read the device", error)
        # the blocks alive before recording
        self._take("start", step)
        # the allocator tells its observers of every failed request before raising: an
        # out-of-memory error is dumped even where no `with` sees it (a Trainer's own loop)
        attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
        if attach is not None and not self._observing:
            attach(self._on_oom)
            self._observing = True

    def _on_oom(self, device, alloc, device_allocated, device_free) -> None:
        # called by the allocator before it raises: never raise from here
        try:
            if self._recording and self._current is not None:
                # each failure writes over the last: the file holds the one that raised
                self._take("oom", self._current)
                self._dump(self._current, oom=True)
                self._oom_dumped = True
        except Exception as error:
            self._warn("could not write the out-of-memory snapshot", error)

    def _take(self, at: str, step: int) -> None:
        """Notes the watched tensors' storages now (``at``: start, step_end or oom)."""
        if not (self._models or self._optimizers) or self._device_index is None:
            return
        try:
            entry = {
                "at": at,
                "step": int(step),
                "time_us": int(time.time() * 1e6),
                "tensors": _inventory(self._models, self._optimizers, self._device_index),
            }
            last = self._inventories[-1] if self._inventories else None
            if at == "oom":  # each failure replaces the last one's
                self._inventories = [i for i in self._inventories if i["at"] != "oom"]
            elif last is not None and last["at"] == at == "step_end" and last["step"] == step:
                self._inventories.pop()  # the same step again (accumulation): its last end
            self._inventories.append(entry)
        except Exception as error:
            self._warn("could not list the model's tensors", error)

    def _write_tensors(self, path: str) -> None:
        if not (self._models or self._optimizers) or self._device_index is None:
            return
        try:
            torch = _import_torch()
            allowed = None
            if self._device_total is not None:
                allowed = _allowed_bytes(torch, self._device_index, self._device_total)
            doc = _tensors_document(
                self.rank, self._device_index, self._device_total, allowed,
                self._step_log, self._inventories,
            )
            _write_atomically(path + ".tensors.json", json.dumps(doc, indent=1).encode())
        except Exception as error:
            self._warn(f"could not write {path}.tensors.json", error)

    def _dump(self, step: int, oom: bool) -> str:
        torch = _import_torch()

        snapshot = torch.cuda.memory._snapshot()
        path = self._path(step, oom)
        _write_atomically(path, pickle.dumps(snapshot, protocol=4))
        if self.probes:
            probes = json.dumps({"probes": self.probes}, indent=1).encode()
            _write_atomically(path + ".probes.json", probes)
        self._write_tensors(path)
        self.written.append(path)
        if self.summary:
            self._summarize(path)
        return path

    def _summarize(self, path: str) -> None:
        """Starts the child that writes ``<path>.summary.json``; never stops the training."""
        try:
            from . import binary

            child = subprocess.Popen(
                [sys.executable, "-c", _SUMMARY_CHILD, binary(), path],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                close_fds=True,
                start_new_session=True,
            )
            self._children.append(child)
        except Exception as error:
            self._warn(f"could not start the summary of {path}", error)

    def wait_summaries(self, timeout: Optional[float] = None) -> List[str]:
        """Waits for the summaries started so far (each at most ``timeout`` seconds) and
        returns the paths of those written."""
        for child in self._children:
            try:
                child.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self._children = [c for c in self._children if c.poll() is None]
        return [p + ".summary.json" for p in self.written if os.path.exists(p + ".summary.json")]

    def _stop(self) -> None:
        torch = _import_torch()

        torch.cuda.memory._record_memory_history(enabled=None)
        self._recording = False

    @contextmanager
    def step(self, step: int) -> Iterator[None]:
        """The training step ``step``: recorded when it is one of the chosen steps on a chosen
        rank (the recording runs from the first chosen step to the end of the last)."""
        if not self.active or self._done or step > self.steps[-1]:
            yield
            return
        if not self._recording and step in self.steps:
            self._start(step)
        if not self._recording:
            yield
            return
        self._current = step
        last = self._step_log[-1] if self._step_log else None
        if last is not None and last["step"] == step:
            record = last  # the same step again (gradient accumulation): one entry
            record["end_us"] = None
        else:
            record = {"step": int(step), "start_us": int(time.time() * 1e6), "end_us": None}
            self._step_log.append(record)
        try:
            yield
        except BaseException as error:
            torch = _import_torch()

            if isinstance(error, torch.OutOfMemoryError):
                # the step stays open: it ended in the error
                if not self._oom_dumped:
                    self._take("oom", step)
                    self._dump(step, oom=True)
                self._stop()
                self._done = True
            else:
                record["end_us"] = int(time.time() * 1e6)
            raise
        record["end_us"] = int(time.time() * 1e6)
        self._take("step_end", step)
        if step >= self.steps[-1]:
            self._dump(step, oom=False)
            self._stop()
            self._done = True

    def __call__(self, fn):
        """As a decorator of the step function: each call is the next step, counted from 0."""
        calls = {"n": 0}

        def wrapped(*args, **kwargs):
            n = calls["n"]
            calls["n"] += 1
            with self.step(n):
                return fn(*args, **kwargs)

        wrapped.__name__ = getattr(fn, "__name__", "step")
        wrapped.__doc__ = getattr(fn, "__doc__", None)
        return wrapped


def lightning_callback(cap: Capture):
    """A Lightning ``Callback`` that records ``cap``'s steps (the trainer's global step around
    each training batch, optimizer step included) and probes at fit start; it watches the
    trainer's ``lightning_module`` and ``optimizers``."""
    try:
        from lightning.pytorch import Callback
    except ImportError:
        try:  # the older package name
            from pytorch_lightning import Callback
        except ImportError:
            raise ImportError(
                "memsnap.lightning_callback needs Lightning, which is not installed: pip install lightning"
            ) from None

    class MemsnapCallback(Callback):
        def __init__(self):
            self._open = None

        def on_fit_start(self, trainer, pl_module):
            cap.probe("fit start")

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if cap.active:
                cap.watch(model=trainer.lightning_module, optimizer=list(trainer.optimizers or []))
            self._open = cap.step(trainer.global_step)
            self._open.__enter__()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if self._open is not None:
                opened, self._open = self._open, None
                opened.__exit__(None, None, None)

        def on_exception(self, trainer, pl_module, exception):
            if self._open is not None:
                opened, self._open = self._open, None
                try:
                    opened.__exit__(type(exception), exception, exception.__traceback__)
                except BaseException:
                    pass

    return MemsnapCallback()


def transformers_callback(cap: Capture):
    """A transformers ``TrainerCallback`` that records ``cap``'s steps (the trainer's global
    step from ``on_step_begin`` to ``on_step_end``, gradient accumulation included); it watches
    the ``model`` and ``optimizer`` the trainer passes to its callbacks."""
    try:
        from transformers import TrainerCallback
    except ImportError:
        raise ImportError(
            "memsnap.transformers_callback needs transformers, which is not installed: pip install transformers"
        ) from None

    class MemsnapCallback(TrainerCallback):
        def __init__(self):
            self._open = None

        def on_train_begin(self, args, state, control, **kwargs):
            cap.probe("train begin")

        def on_step_begin(self, args, state, control, **kwargs):
            if self._open is None:  # once per optimizer step, whatever the accumulation
                if cap.active:
                    cap.watch(model=kwargs.get("model"), optimizer=kwargs.get("optimizer"))
                self._open = cap.step(state.global_step)
                self._open.__enter__()

        def on_step_end(self, args, state, control, **kwargs):
            if self._open is not None:
                opened, self._open = self._open, None
                opened.__exit__(None, None, None)

    return MemsnapCallback()


_default: Optional[Capture] = None


def configure(out_dir: str = ".", **options: Any) -> Capture:
    """Sets the module's default capture (arguments as :class:`Capture`) and returns it."""
    global _default
    _default = Capture(out_dir, **options)
    return _default


def _the_default() -> Capture:
    return _default if _default is not None else configure()


def probe(name: str) -> Optional[Dict[str, Any]]:
    """:meth:`Capture.probe` of the default capture."""
    return _the_default().probe(name)


def step(number: int):
    """:meth:`Capture.step` of the default capture."""
    return _the_default().step(number)
