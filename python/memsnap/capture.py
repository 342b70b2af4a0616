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
import tempfile
import time
from contextlib import contextmanager
from typing import Any, Dict, Iterable, Iterator, List, Optional

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
    ):
        self.out_dir = out_dir
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

    @property
    def active(self) -> bool:
        """Whether this rank records at all."""
        return bool(self.steps) and (self.ranks is None or self.rank in self.ranks)

    def probe(self, name: str) -> Optional[Dict[str, Any]]:
        """Notes the device's used memory and PyTorch's reserved bytes at a named point; returns
        the probe (``None`` on a rank that does not record, where it costs nothing)."""
        if not self.active:
            return None
        import torch

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

    def _start(self) -> None:
        import torch

        torch.cuda.memory._record_memory_history(
            max_entries=self.max_entries, stacks=self.stacks
        )
        torch.cuda.reset_peak_memory_stats()
        self._recording = True
        # the allocator tells its observers of every failed request before raising: an
        # out-of-memory error is dumped even where no `with` sees it (a Trainer's own loop)
        attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
        if attach is not None and not self._observing:
            attach(self._on_oom)
            self._observing = True

    def _on_oom(self, device, alloc, device_allocated, device_free) -> None:
        if self._recording and self._current is not None:
            # each failure writes over the last: the file holds the one that raised
            self._dump(self._current, oom=True)
            self._oom_dumped = True

    def _dump(self, step: int, oom: bool) -> str:
        import torch

        snapshot = torch.cuda.memory._snapshot()
        path = self._path(step, oom)
        _write_atomically(path, pickle.dumps(snapshot, protocol=4))
        if self.probes:
            probes = json.dumps({"probes": self.probes}, indent=1).encode()
            _write_atomically(path + ".probes.json", probes)
        self.written.append(path)
        return path

    def _stop(self) -> None:
        import torch

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
            self._start()
        if not self._recording:
            yield
            return
        self._current = step
        try:
            yield
        except BaseException as error:
            import torch

            if isinstance(error, torch.OutOfMemoryError):
                if not self._oom_dumped:
                    self._dump(step, oom=True)
                self._stop()
                self._done = True
            raise
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
    each training batch, optimizer step included) and probes at fit start."""
    try:
        from lightning.pytorch import Callback
    except ImportError:  # the older package name
        from pytorch_lightning import Callback

    class MemsnapCallback(Callback):
        def __init__(self):
            self._open = None

        def on_fit_start(self, trainer, pl_module):
            cap.probe("fit start")

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
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
    step from ``on_step_begin`` to ``on_step_end``, gradient accumulation included)."""
    from transformers import TrainerCallback

    class MemsnapCallback(TrainerCallback):
        def __init__(self):
            self._open = None

        def on_train_begin(self, args, state, control, **kwargs):
            cap.probe("train begin")

        def on_step_begin(self, args, state, control, **kwargs):
            if self._open is None:  # once per optimizer step, whatever the accumulation
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
