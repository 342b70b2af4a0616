"""A V-shaped bidirectional pipeline schedule (DualPipeV), written for the snapshot generator.

Each pp rank holds two model chunks: phase 0 runs down the V, phase 1 back up it.
The schedule has eight steps; their iteration counts depend on the pp rank.
"""
# fork note 0: this checkout carries local changes
# fork note 1: this checkout carries local changes
# fork note 2: this checkout carries local changes
# fork note 3: this checkout carries local changes
# fork note 4: this checkout carries local changes
# fork note 5: this checkout carries local changes
# fork note 6: this checkout carries local changes

import queue

import torch
import torch.distributed as dist
from torch import nn

from pithtrain.modules.distributed import distributed
from pithtrain.pipeline import comm


class WeightGradStore:
    """Deferred weight-gradient closures for zero-bubble scheduling."""

    enabled = False
    cache = []
    funcs_queue = queue.Queue()

    @classmethod
    def put(cls, fn):
        cls.cache.append(fn)

    @classmethod
    def flush(cls):
        cls.funcs_queue.put(cls.cache)
        cls.cache = []

    @classmethod
    def pop(cls):
        for fn in cls.funcs_queue.get():
            fn()

    @classmethod
    def clear(cls):
        cls.cache = []
        cls.funcs_queue = queue.Queue()


def run_backward(tensors, grads):
    # The engine entry point skips the root shape check: sent outputs were freed to size 0.
    from torch.autograd import Variable

    Variable._execution_engine.run_backward(
        tuple(tensors), tuple(grads), keep_graph=False, create_graph=False,
        inputs=(), allow_unreachable=True, accumulate_grad=True,
    )


def _mem_gb() -> float:
    """Return current CUDA memory allocated in GiB."""
    if not torch.cuda.is_available():
        return 0.0
    return torch.cuda.memory_allocated() / 1024**3


def _mem_detail() -> str:
    """Return allocated, cached-pool, and non-pytorch memory in GiB."""
    if not torch.cuda.is_available():
        return "alloc=0.00 cached=0.00 non-pt=0.00"
    free, total = torch.cuda.mem_get_info()
    allocated = torch.cuda.memory_allocated()
    reserved = torch.cuda.memory_reserved()
    G = 1024**3
    return f"alloc={allocated / G:.2f} cached={(reserved - allocated) / G:.2f} non-pt={(total - free - reserved) / G:.2f}"


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class DualPipeV(nn.Module):
    def __init__(self, modules, group, ranks_in_group):
        super().__init__()
        self.module = nn.ModuleList(modules)
        self.group = group
        self.num_ranks = dist.get_world_size(group) if group is not None else 1
        self.rank = dist.get_rank(group) if group is not None else 0
        self.global_ranks = ranks_in_group
        self.is_first_pp_rank = self.rank == 0
        self.is_last_pp_rank = self.rank == self.num_ranks - 1
        self.device = distributed.device
        self.comm_stream = torch.cuda.Stream() if torch.cuda.is_available() else None
        self.memory_profiling = False  # Set to True to enable per-step memory logging
        self.last_profile_log = []

    # -- state -------------------------------------------------------------
    def _reset_states(self):
        WeightGradStore.clear()
        self.input_chunks = ([], [])
        self.output_chunks = ([], [])
        self.input_grad_chunks = ([], [])
        self.output_grad_chunks = ([], [])
        self.loss_chunks = []
        self.labels = None
        self.objective = None
        self.f_id = [0, 0]
        self.b_id = [0, 0]
        self.send_f_id = [0, 0]
        self.send_b_id = [0, 0]
        self.comm_ops = []
        self.to_free = []

    def _peer(self, offset):
        return self.global_ranks[self.rank + offset]

    # -- compute -----------------------------------------------------------
    def _is_loss_stage(self, phase):
        return self.is_first_pp_rank and phase == 1

    def _forward_compute_chunk(self, phase):
        cid = self.f_id[phase]
        self.f_id[phase] += 1
        inputs = self.input_chunks[phase][cid]
        outputs = self.module[phase](*inputs)
        outputs = [outputs] if isinstance(outputs, torch.Tensor) else list(outputs)
        if self._is_loss_stage(phase):
            self.loss_chunks.append(self.objective(outputs[0], self.labels[cid]))
        if self.is_last_pp_rank and phase == 0:
            self.input_chunks[1].append([o.detach().requires_grad_() for o in outputs])
        if not self._is_loss_stage(phase):
            self.output_chunks[phase].append(outputs)

    def _backward_compute_chunk(self, phase, enable_zb=False):
        cid = self.b_id[phase]
        self.b_id[phase] += 1
        WeightGradStore.enabled = enable_zb
        if self._is_loss_stage(phase):
            loss = self.loss_chunks[cid]
            loss.backward()
            loss.detach_()
        else:
            outputs = self.output_chunks[phase][cid]
            self.output_chunks[phase][cid] = None
            grads = self.output_grad_chunks[phase][cid]
            self.output_grad_chunks[phase][cid] = None
            run_backward(outputs, grads)
        WeightGradStore.enabled = False
        if enable_zb:
            WeightGradStore.flush()
        inputs = self.input_chunks[phase][cid]
        self.input_chunks[phase][cid] = None
        input_grads = [t.grad if t.requires_grad else None for t in inputs]
        if self.is_last_pp_rank and phase == 1:
            self.output_grad_chunks[0].append(input_grads)
        else:
            self.input_grad_chunks[phase].append(input_grads)

    def _forward_backward_compute_chunk(self, phase0, phase1):
        module0 = self.module[phase0]
        cid0 = self.f_id[phase0]
        self.f_id[phase0] += 1
        inputs0 = self.input_chunks[phase0][cid0]
        cid1 = self.b_id[phase1]
        self.b_id[phase1] += 1
        if self._is_loss_stage(phase1):
            loss1, outs1, grads1 = self.loss_chunks[cid1], None, None
        else:
            loss1 = None
            outs1 = self.output_chunks[phase1][cid1]
            self.output_chunks[phase1][cid1] = None
            grads1 = self.output_grad_chunks[phase1][cid1]
            self.output_grad_chunks[phase1][cid1] = None
        objective0 = self.objective if self._is_loss_stage(phase0) else None
        labels0 = self.labels[cid0] if objective0 is not None else None
        outputs0, loss0 = type(module0).overlapped_forward_backward(
            module0, inputs0, objective0, labels0, loss1, outs1, grads1
        )
        if self.is_last_pp_rank and phase0 == 0:
            self.input_chunks[1].append([o.detach().requires_grad_() for o in outputs0])
        if self._is_loss_stage(phase0):
            self.loss_chunks.append(loss0)
        else:
            self.output_chunks[phase0].append(outputs0)
        inputs1 = self.input_chunks[phase1][cid1]
        self.input_chunks[phase1][cid1] = None
        input_grads1 = [t.grad if t.requires_grad else None for t in inputs1]
        if self.is_last_pp_rank and phase1 == 1:
            self.output_grad_chunks[0].append(input_grads1)
        else:
            self.input_grad_chunks[phase1].append(input_grads1)

    # -- chunks ------------------------------------------------------------
    def _forward_chunk(self, phase, recv=True, send=True):
        if recv:
            self._recv_forward(phase)
        self._commit_and_wait_comm()
        self._forward_compute_chunk(phase)
        if send:
            self._send_forward(phase)

    def _backward_chunk(self, phase, enable_zb=False, recv=True, send=True):
        if recv:
            self._recv_backward(phase)
        self._commit_and_wait_comm()
        self._backward_compute_chunk(phase, enable_zb)
        if send:
            self._send_backward(phase)

    def _forward_backward_chunk(self, phase0, phase1, recv0=True):
        if recv0:
            self._recv_forward(phase0)
        self._recv_backward(phase1)
        self._commit_and_wait_comm()
        self._forward_backward_compute_chunk(phase0, phase1)
        self._send_forward(phase0)
        self._send_backward(phase1)

    def _weight_chunk(self):
        self._commit_and_wait_comm()
        WeightGradStore.pop()

    # -- communication -----------------------------------------------------
    def _recv_forward(self, phase):
        if (self.is_first_pp_rank and phase == 0) or (self.is_last_pp_rank and phase == 1):
            return
        peer = self._peer(-1 if phase == 0 else 1)
        self.input_chunks[phase].append(comm.append_irecv(self.comm_ops, peer, self.device))

    def _send_forward(self, phase):
        if (self.is_first_pp_rank and phase == 1) or (self.is_last_pp_rank and phase == 0):
            return
        cid = self.send_f_id[phase]
        self.send_f_id[phase] += 1
        tensors = self.output_chunks[phase][cid]
        comm.append_isend(self.comm_ops, tensors, self._peer(1 if phase == 0 else -1))
        self.to_free.extend(tensors)

    def _recv_backward(self, phase):
        if (self.is_first_pp_rank and phase == 1) or (self.is_last_pp_rank and phase == 0):
            return
        peer = self._peer(1 if phase == 0 else -1)
        self.output_grad_chunks[phase].append(comm.append_irecv(self.comm_ops, peer, self.device))

    def _send_backward(self, phase):
        if (self.is_first_pp_rank and phase == 0) or (self.is_last_pp_rank and phase == 1):
            return
        cid = self.send_b_id[phase]
        self.send_b_id[phase] += 1
        tensors = self.input_grad_chunks[phase][cid]
        self.input_grad_chunks[phase][cid] = None
        comm.append_isend(self.comm_ops, tensors, self._peer(-1 if phase == 0 else 1))

    def _free_tensors(self):
        for t in self.to_free:
            t.data = torch.empty(0, device=t.device, dtype=t.dtype)
        self.to_free = []

    def _commit_and_wait_comm(self):
        if not self.comm_ops:
            return
        for req in dist.batch_isend_irecv(self.comm_ops):
            req.wait()
        self.comm_ops = []
        self._free_tensors()

    def _log(self, msg):
        line = f"[rank={distributed.rank} pp={self.rank}] {msg}"
        print(line, flush=True)
        self.last_profile_log.append(line)

    # -- schedule ----------------------------------------------------------
    def step(self, microbatches, objective, labels, num_chunks):
        num_ranks, rank = self.num_ranks, self.rank
        assert num_chunks >= num_ranks * 2
        pp_rank = rank
        self._reset_states()
        if self.is_first_pp_rank:
            self.input_chunks = ([[mb] for mb in microbatches], [])
            self.labels = labels
            self.objective = objective

        _profiling = self.memory_profiling
        if _profiling:
            _sync()
            _m0 = _mem_gb()
            self._log(f"Before pipeline: {_m0:.2f} GiB | {_mem_detail()}")

        # Step 1: nF0
        step_1 = (num_ranks - rank - 1) * 2
        for i in range(step_1):
            self._forward_chunk(0)
            if _profiling:
                _sync()
                self._log(f"Step1 F0 i={i}: {_mem_gb():.2f} GiB (+{_mem_gb() - _m0:.2f}) | {_mem_detail()}")
        if _profiling:
            _sync()
            self._log(f"After Step1 ({step_1} F0): {_mem_gb():.2f} GiB | {_mem_detail()}")

        # Step 2: nF0F1
        step_2 = rank + 1
        self._recv_forward(0)
        for i in range(step_2):
            self._forward_chunk(0, recv=False, send=False)
            self._recv_forward(0)
            self._forward_chunk(1, send=(not self.is_last_pp_rank) or (i < step_2 - 1))
            self._send_forward(0)
        if _profiling:
            _sync()
            self._log(f"After Step2 ({step_2} F0F1): {_mem_gb():.2f} GiB | {_mem_detail()}")

        # Step 3: nB1W1F1 (zero bubble)
        step_3 = num_ranks - rank - 1
        for i in range(step_3):
            self._backward_chunk(1, enable_zb=True)
            self._recv_forward(1)
            self._weight_chunk()
            self._forward_chunk(1, recv=False)
        if _profiling:
            _sync()
            self._log(f"After Step3 ({step_3} B1W1F1): {_mem_gb():.2f} GiB | {_mem_detail()}")

        # Step 4 (main step): nF0B1F1B0
        step_4 = num_chunks - num_ranks * 2 + rank + 1
        for i in range(step_4):
            if i == 0:
                if self.is_last_pp_rank:
                    self._forward_chunk(0, recv=False, send=False)
                    self._send_forward(1)
                    self._backward_chunk(1, send=False)
                    self._send_forward(0)
                    self._send_backward(1)
                else:
                    self._forward_backward_chunk(0, 1, recv0=False)
            else:
                self._forward_backward_chunk(0, 1)
            self._forward_backward_chunk(1, 0)
            if _profiling:
                _sync()
                self._log(f"Step4 i={i}: {_mem_gb():.2f} GiB | {_mem_detail()}")
        if _profiling:
            _sync()
            self._log(f"After Step4 ({step_4} F0B1F1B0): {_mem_gb():.2f} GiB | {_mem_detail()}")

        # Step 5: nB1F1B0
        step_5 = num_ranks - rank - 1
        for i in range(step_5):
            self._backward_chunk(1)
            self._forward_backward_chunk(1, 0)

        # Step 6: nB1B0 (second half uses zero bubble)
        step_6 = rank + 1
        enable_zb = False
        for i in range(step_6):
            if i == step_6 // 2 and rank % 2 == 1:
                enable_zb = True
            self._backward_chunk(1, enable_zb=enable_zb)
            if i == step_6 // 2 and rank % 2 == 0:
                enable_zb = True
            self._backward_chunk(0, enable_zb=enable_zb)

        # Step 7: nWB0 (zero bubble)
        step_7 = num_ranks - rank - 1
        for i in range(step_7):
            self._weight_chunk()
            self._backward_chunk(0, enable_zb=True)

        # Step 8: nW
        step_8 = rank + 1
        for i in range(step_8):
            self._weight_chunk()
        assert WeightGradStore.funcs_queue.empty()
        if _profiling:
            _sync()
            self._log(f"After Step8 (end of pipeline): {_mem_gb():.2f} GiB | {_mem_detail()}")

        self._commit_and_wait_comm()
        loss = torch.stack(self.loss_chunks).detach() if self.is_first_pp_rank else None
        self._reset_states()
        return loss
