"""A corpus of small training (and one inference) programs, each recorded twice in one run: by
the CUDA memory snapshot and by PyTorch's own profiler, whose memory profile gives every tensor
storage a category. Each program also prints what it holds, so both can be judged.

Every program runs in its own process (own allocator, own counters), random weights, data made
in the program, no downloads. For each PROGRAM, in OUT_DIR:

    memory_snapshot_PROGRAM.pickle.xz   torch.cuda.memory._snapshot(), history recorded from
                                        before the model is built (stacks="python"), after
                                        reset_peak_memory_stats()
    profiler_PROGRAM.jsonl.xz           one JSON line per allocation of CUDA memory seen by
                                        torch.profiler (profile_memory, record_shapes,
                                        with_stack), with the category PyTorch's memory profile
                                        (torch/profiler/_memory_profiler.py) gave it:
        {"t_ns", "ptr", "bytes" (the block's size), "category" (PARAMETER, OPTIMIZER_STATE,
         INPUT, TEMPORARY, ACTIVATION, GRADIENT, AUTOGRAD_DETAIL, or null: unknown),
         "tensor_id", "allocation_id" (null for an allocation the profiler tied to no tensor),
         "categories_by_version": [[t_ns, category], ...] (only when a later version of the
         storage got another category; entry v is version v, from the time it began),
         "destroy_t_ns" (when freed while profiling)}

and on standard output (the log), with exact bytes:

    PROGRAM name=N library=L what=...
    MARK step=S name=NAME memory_allocated=N max_memory_allocated=N memory_reserved=N
    TRUTH step=S name=NAME param=N grad=N optimizer_state=N input=N [saved_activation=N]
    PTRS step=S name=NAME kind=param|grad|optimizer_state|input|saved_activation hex,...
    STEPS n=N            optimizer-update iterations run (a GAN's D and G updates: one)
    OPTIMIZERS n=K
    PEAK max_memory_allocated=N max_memory_reserved=N memory_allocated=N
    CAUGHT ... / FATAL ...   PyTorch's out-of-memory message, on one line
    PROFILER wrote=N seconds=S | PROFILER skipped reason=...
    NOTE ...             what the truth leaves out for this program

A MARK is preceded by an empty `record_function("memsnap.mark/STEP/NAME")`, a time stamp in the
snapshot's annotations (and in the profiler's trace). `param` counts the storages of the
parameters and buffers on the GPU (a DTensor's local shard), `grad` those of `.grad`,
`optimizer_state` the tensors in `optimizer.state` of every optimizer, `input` the storages of
data the program itself put on the GPU and still holds (a dataset on the device, a fixed batch,
noise, a loss accumulator), `saved_activation` the storages autograd saved for backward that
are still alive and are none of the above (saved-tensor hooks; left out, with a NOTE, where
hooks would change what runs: torch.compile, checkpointing). PTRS gives each kind's
storage addresses, so each can be found among the replayed blocks.

Usage: python3 corpus.py OUT_DIR PROGRAM     (CORPUS_NO_PROFILER=1: the snapshot alone)
       python3 corpus.py --list
"""

import collections
import contextlib
import json
import lzma
import os
import pickle
import signal
import socket
import sys
import tempfile
import time
import traceback
import weakref

PROGRAMS = {}


def program(library, what):
    def register(fn):
        PROGRAMS[fn.__name__] = (fn, library, what)
        return fn

    return register


import torch
import torch.nn as nn
import torch.nn.functional as F

DEV = torch.device("cuda", 0)


def say(*words):
    print(" ".join(str(w) for w in words), flush=True)


# --- what the program holds ------------------------------------------------------------------


def storage_sizes(tensors):
    """Storage address -> bytes, for the CUDA tensors among `tensors` (a DTensor by its shard)."""
    found = {}
    for t in tensors:
        if t is None or not torch.is_tensor(t):
            continue
        t = getattr(t, "_local_tensor", t)
        if not t.is_cuda:
            continue
        s = t.untyped_storage()
        if s.nbytes():
            found[s.data_ptr()] = s.nbytes()
    return found


def unwrap_optimizer(opt):
    """The torch.optim.Optimizer inside a library's wrapper (accelerate, Lightning, Trainer)."""
    for _ in range(4):
        inner = getattr(opt, "optimizer", None) or getattr(opt, "_optimizer", None)
        if inner is None or inner is opt:
            break
        opt = inner
    return opt


class Ledger:
    """The program's own account of its GPU memory, by kind."""

    def __init__(self):
        self.modules = []
        self.optimizers = []
        self.extra_grads = []  # callables giving gradients no parameter's .grad shows
        self.held = {}  # name -> weakref to a tensor the program put on the GPU
        self.saved = {}  # storage address -> weakref to a tensor autograd saved
        self.track_saved = True
        self.step = 0
        self.steps = 0

    # kinds
    def param(self):
        return storage_sizes(
            t for m in self.modules for t in [*m.parameters(), *m.buffers()]
        )

    def grad(self):
        grads = [p.grad for m in self.modules for p in m.parameters()]
        for more in self.extra_grads:
            grads.extend(more())
        return storage_sizes(grads)

    def optimizer_state(self):
        return storage_sizes(
            v
            for opt in self.optimizers
            for state in unwrap_optimizer(opt).state.values()
            for v in state.values()
        )

    def input(self):
        alive = {name: ref() for name, ref in self.held.items()}
        self.held = {n: self.held[n] for n, t in alive.items() if t is not None}
        return storage_sizes(t for t in alive.values() if t is not None)

    def kinds(self):
        return {
            "param": self.param(),
            "grad": self.grad(),
            "optimizer_state": self.optimizer_state(),
            "input": self.input(),
        }

    # inputs and saved tensors
    def hold(self, name, t):
        self.held[name] = weakref.ref(t)
        return t

    def hold_all(self, prefix, tensors):
        for i, t in enumerate(tensors):
            if torch.is_tensor(t) and t.is_cuda:
                self.hold(f"{prefix}{i}", t)

    def _pack(self, t):
        if t.is_cuda:
            with contextlib.suppress(TypeError, RuntimeError):
                self.saved[t.untyped_storage().data_ptr()] = weakref.ref(t)
        return t

    def saving(self):
        if not self.track_saved:
            return contextlib.nullcontext()
        return torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def untracked_saved(self, why):
        self.track_saved = False
        say(f"NOTE saved_activation untracked: {why}")

    def saved_activation(self, known):
        live = {}
        for ptr, ref in list(self.saved.items()):
            t = ref()
            if t is None:
                del self.saved[ptr]
            elif ptr not in known:
                live[ptr] = t.untyped_storage().nbytes()
        return live

    # the printed truth
    def mark(self, name, step=None):
        if step is not None:
            self.step = step
        torch.cuda.synchronize()
        with torch.profiler.record_function(f"memsnap.mark/{self.step}/{name}"):
            pass
        kinds = self.kinds()
        where = f"step={self.step} name={name}"
        say(
            f"MARK {where} memory_allocated={torch.cuda.memory_allocated()} "
            f"max_memory_allocated={torch.cuda.max_memory_allocated()} "
            f"memory_reserved={torch.cuda.memory_reserved()}"
        )
        if self.track_saved:
            kinds["saved_activation"] = self.saved_activation(set().union(*kinds.values()))
        say(f"TRUTH {where} " + " ".join(f"{k}={sum(v.values())}" for k, v in kinds.items()))
        for kind, found in kinds.items():
            say(f"PTRS {where} kind={kind} " + ",".join(f"{p:x}" for p in sorted(found)))


L = Ledger()


# --- recording -------------------------------------------------------------------------------


class Recorder:
    """Snapshot history and the profiler, started together before the model is built."""

    def __init__(self, out, name):
        self.out, self.name = out, name
        self.profile = os.environ.get("CORPUS_NO_PROFILER") != "1"
        self.prof = None
        self.dumped = False
        self.limit_s = int(os.environ.get("CORPUS_PROFILE_LIMIT_S", "150"))

    def start(self):
        torch.cuda.synchronize()
        torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
        torch.cuda.reset_peak_memory_stats()
        if self.profile:
            act = torch.profiler.ProfilerActivity
            self.prof = torch.profiler.profile(
                activities=[act.CPU, act.CUDA],
                profile_memory=True,
                record_shapes=True,
                with_stack=True,
            )
            self.prof.__enter__()

    def dump(self):
        """PEAK and the snapshot, once (an out-of-memory handler may call it first)."""
        if self.dumped:
            return
        self.dumped = True
        torch.cuda.synchronize()
        say(f"STEPS n={L.steps}")
        say(f"OPTIMIZERS n={len(L.optimizers)}")
        say(
            f"PEAK max_memory_allocated={torch.cuda.max_memory_allocated()} "
            f"max_memory_reserved={torch.cuda.max_memory_reserved()} "
            f"memory_allocated={torch.cuda.memory_allocated()}"
        )
        path = os.path.join(self.out, f"memory_snapshot_{self.name}.pickle.xz")
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        with lzma.open(path, "wb", preset=9) as f:
            pickle.dump(snap, f)
        say(f"SNAPSHOT bytes={os.path.getsize(path)}")

    def finish(self):
        self.dump()
        if self.prof is None:
            say("PROFILER skipped reason=not_run (CORPUS_NO_PROFILER=1)")
            return
        began = time.time()

        def too_long(*_):
            raise TimeoutError(f"memory profile took over {self.limit_s} s")

        signal.signal(signal.SIGALRM, too_long)
        signal.alarm(self.limit_s)
        try:
            self.prof.__exit__(None, None, None)
            rows = profiler_rows(self.prof)
        except BaseException as e:  # noqa: BLE001 - any failure of the analysis is reported
            signal.alarm(0)
            where = " < ".join(
                f"{os.path.basename(f.filename)}:{f.name}:{f.lineno}"
                for f in reversed(traceback.extract_tb(e.__traceback__)[-4:])
            )
            reason = f"{type(e).__name__}: {e}".replace("\n", " ")[:300] + f" in {where}"
            say(f"PROFILER skipped reason={reason}")
            return
        signal.alarm(0)
        path = os.path.join(self.out, f"profiler_{self.name}.jsonl.xz")
        with lzma.open(path, "wt", preset=9) as f:
            for row in rows:
                f.write(json.dumps(row, separators=(",", ":")) + "\n")
        by_cat = collections.Counter()
        for row in rows:
            by_cat[row["category"] or "unknown"] += row["bytes"]
        say(
            f"PROFILER wrote={len(rows)} seconds={time.time() - began:.1f} "
            + " ".join(f"{k}={v}" for k, v in sorted(by_cat.items()))
        )


def profiler_rows(prof):
    """One row per CUDA allocation of the profiled run, with the memory profile's categories."""
    from torch._C._profiler import _EventType
    from torch.profiler._memory_profiler import Action, TensorKey

    mp = prof._memory_profile()
    bumps = collections.defaultdict(list)  # TensorKey -> [(t_ns, new version)]
    for t, action, (key, version), _ in mp.timeline:
        if action == Action.INCREMENT_VERSION and isinstance(key, TensorKey):
            bumps[key].append((t, version + 1))

    def name(cat):
        return None if cat is None else cat.name

    events = [e for e in mp._op_tree.dfs() if e.typed[0] == _EventType.Allocation]
    events.sort(key=lambda e: e.start_time_ns)
    rows, live = [], {}
    for e in events:
        f = e.typed[1]
        if f.device.type != "cuda":
            continue
        if f.alloc_size < 0:
            row = live.pop(f.ptr, None)
            if row is not None:
                row["destroy_t_ns"] = e.start_time_ns
            continue
        key = TensorKey.from_allocation(f)
        row = {"t_ns": e.start_time_ns, "ptr": f.ptr, "bytes": f.alloc_size}
        if key is None:
            row.update(category=None, tensor_id=None, allocation_id=None)
        else:
            versions = [(e.start_time_ns, 0)] + sorted(bumps.get(key, ()))
            cats = [[t, name(mp._categories.get(key, v))] for t, v in versions]
            row.update(category=cats[0][1], tensor_id=key.id, allocation_id=f.allocation_id)
            if len({c for _, c in cats}) > 1:
                row["categories_by_version"] = cats
        live[f.ptr] = row
        rows.append(row)
    return rows


REC = None


def start():
    REC.start()


def out_of_memory(e, fatal=True):
    say(("FATAL " if fatal else "CAUGHT ") + str(e).replace("\n", " "))
    if fatal:
        REC.dump()


# --- a training loop, configurable enough for most programs ----------------------------------


def train(model, opts, batch, loss_of, steps=3, accum=1, scaler=None, set_to_none=True,
          sync=None, keep_batch=False):
    """`batch(step, micro)` puts data on the GPU (and holds it); `loss_of(data)` runs forward.
    `sync(micro, last)` gives a context for the micro-batch (DDP's no_sync and the like)."""
    L.modules = L.modules or [model]
    L.optimizers = L.optimizers or list(opts)
    data = None
    for step in range(steps):
        L.mark("start", step)
        for micro in range(accum):
            tag = "" if accum == 1 else f"_mb{micro}"
            data = batch(step, micro)
            ctx = sync(micro, micro == accum - 1) if sync else contextlib.nullcontext()
            with ctx:
                with L.saving():
                    loss = loss_of(data)
                    if accum > 1:
                        loss = loss / accum
                L.mark("forward" + tag)
                (scaler.scale(loss) if scaler else loss).backward()
                del loss
            L.mark("backward" + tag)
            if not keep_batch:
                data = None
        for opt in opts:
            if scaler:
                scaler.step(opt)
            else:
                opt.step()
        if scaler:
            scaler.update()
        L.mark("optimizer")
        for opt in opts:
            opt.zero_grad(set_to_none=set_to_none)
        L.steps += 1
        L.mark("zero_grad")
    L.mark("end")
    return data


def to_gpu(name, t):
    """Moves a CPU tensor to the GPU as a training loop does, and holds it as input."""
    return L.hold(name, t.to(DEV, non_blocking=True))


def classify(model):
    return lambda d: F.cross_entropy(model(d[0]), d[1])


def random_batch(n, shape, classes, pinned=False):
    def make(step, micro):
        x = torch.randn(n, *shape)
        y = torch.randint(0, classes, (n,))
        if pinned:
            x, y = x.pin_memory(), y.pin_memory()
        return to_gpu("x", x), to_gpu("y", y)

    return make


def mlp(sizes, act=nn.GELU, norm=None):
    layers = []
    for a, b in zip(sizes, sizes[1:]):
        layers.append(nn.Linear(a, b))
        if b != sizes[-1]:
            if norm:
                layers.append(norm(b))
            layers.append(act())
    return nn.Sequential(*layers)


# --- plain PyTorch ----------------------------------------------------------------------------


@program("torch", "MLP, AdamW, 3 steps")
def mlp_adamw():
    start()
    model = mlp([512, 1024, 1024, 10]).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train(model, [opt], random_batch(128, (512,), 10), classify(model))


@program("torch", "CNN with BatchNorm2d, SGD momentum 0.9, pinned non_blocking copies")
def cnn_sgd_momentum():
    start()
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 16 * 16, 10),
    ).to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    train(model, [opt], random_batch(32, (3, 64, 64), 10, pinned=True), classify(model))


@program("torch", "MLP with BatchNorm1d running stats, an eval pass under no_grad each step")
def batchnorm_eval():
    start()
    model = mlp([256, 512, 512, 10], act=nn.ReLU, norm=nn.BatchNorm1d).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    held_out = to_gpu("held_out", torch.randn(512, 256))
    forward = classify(model)

    def loss_of(d):
        model.eval()
        with torch.no_grad():
            model(held_out).argmax(1)
        model.train()
        return forward(d)

    train(model, [opt], random_batch(128, (256,), 10), loss_of)


@program("torch", "zero_grad(set_to_none=False): gradients kept and zeroed in place, Adam")
def zero_grad_keep():
    start()
    model = mlp([512, 1024, 1024, 10]).to(DEV)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    train(model, [opt], random_batch(128, (512,), 10), classify(model), set_to_none=False)


@program("torch", "a trainer-style loss accumulator on the GPU: total += loss.detach()")
def loss_accumulator():
    start()
    model = mlp([512, 1024, 10]).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    total = L.hold("total_loss", torch.zeros((), device=DEV))
    forward = classify(model)

    def loss_of(d):
        loss = forward(d)
        total.add_(loss.detach())
        return loss

    train(model, [opt], random_batch(128, (512,), 10), loss_of, steps=4)
    say(f"NOTE total_loss={total.item():.4f}")


@program("torch", "autocast fp16, GradScaler, AdamW")
def amp_gradscaler():
    start()
    model = mlp([1024, 2048, 2048, 10]).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda")
    forward = classify(model)

    def loss_of(d):
        with torch.autocast("cuda", dtype=torch.float16):
            return forward(d)

    train(model, [opt], random_batch(256, (1024,), 10), loss_of, scaler=scaler)


class TinyLM(nn.Module):
    """Token embeddings, transformer encoder layers, a language-model head."""

    def __init__(self, vocab=8000, dim=256, layers=2, tie=True):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(dim, 4, dim * 4, batch_first=True, dropout=0.0)
            for _ in range(layers)
        )
        self.head = nn.Linear(dim, vocab, bias=False)
        if tie:
            self.head.weight = self.embed.weight

    def forward(self, ids):
        h = self.embed(ids)
        for block in self.blocks:
            h = block(h, is_causal=False)
        return self.head(h)


def token_batch(n, seq, vocab):
    def make(step, micro):
        ids = to_gpu("ids", torch.randint(0, vocab, (n, seq)))
        return ids, ids

    return make


def lm_loss(model):
    return lambda d: F.cross_entropy(model(d[0]).flatten(0, 1), d[1].flatten())


@program("torch", "language model whose head shares the embedding's weight (tied)")
def tied_embeddings():
    start()
    model = TinyLM().to(DEV)
    assert model.head.weight is model.embed.weight
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train(model, [opt], token_batch(8, 128, 8000), lm_loss(model))


@program("torch", "parametrizations.weight_norm on convolutions and linears, AdamW")
def weight_norm():
    from torch.nn.utils.parametrizations import weight_norm as wn

    start()
    model = nn.Sequential(
        wn(nn.Conv1d(16, 64, 5, padding=2)), nn.GELU(), wn(nn.Conv1d(64, 64, 5, padding=2)),
        nn.GELU(), nn.Flatten(), wn(nn.Linear(64 * 256, 10)),
    ).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train(model, [opt], random_batch(32, (16, 256), 10), classify(model))


class CheckpointedMLP(nn.Module):
    def __init__(self, reentrant, dim=1024, depth=4):
        super().__init__()
        self.reentrant = reentrant
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, dim * 2), nn.GELU(), nn.Linear(dim * 2, dim))
            for _ in range(depth)
        )
        self.out = nn.Linear(dim, 10)

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        for block in self.blocks:
            x = x + checkpoint(block, x, use_reentrant=self.reentrant)
        return self.out(x)


def checkpointed(reentrant):
    start()
    L.untracked_saved("activation checkpointing")
    model = CheckpointedMLP(reentrant).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = random_batch(256, (1024,), 10)

    def with_grad_input(step, micro):
        x, y = batch(step, micro)
        return x.requires_grad_(reentrant), y  # reentrant checkpointing needs an input with grad

    train(model, [opt], with_grad_input, classify(model), steps=2, accum=2)


@program("torch", "checkpoint(use_reentrant=True) per block, gradient accumulation 2")
def ckpt_reentrant():
    checkpointed(True)


@program("torch", "checkpoint(use_reentrant=False) per block, gradient accumulation 2")
def ckpt_nonreentrant():
    checkpointed(False)


class Attention(nn.Module):
    def __init__(self, dim=256, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, dim * 4), nn.GELU(), nn.Linear(dim * 4, dim))
        self.n1, self.n2 = nn.LayerNorm(dim), nn.LayerNorm(dim)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, s, 3, self.heads, -1).transpose(1, 3).unbind(2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.mlp(self.n2(x))


class SmallGPT(nn.Module):
    def __init__(self, vocab=4000, dim=256, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.Sequential(*[Attention(dim) for _ in range(layers)])
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids):
        return self.head(self.blocks(self.embed(ids)))


@program("torch", "torch.compile (default mode) of a small GPT, AdamW, 3 steps")
def compile_default():
    start()
    L.untracked_saved("torch.compile")
    model = SmallGPT().to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    compiled = torch.compile(model)
    train(model, [opt], token_batch(8, 128, 4000), lm_loss(compiled))


@program("torch", 'torch.compile(mode="reduce-overhead"): CUDA graphs, 4 steps')
def compile_cudagraphs():
    start()
    L.untracked_saved("torch.compile with CUDA graphs")
    model = mlp([512, 1024, 1024, 10]).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    compiled = torch.compile(model, mode="reduce-overhead")
    batch = random_batch(128, (512,), 10)

    def marked(step, micro):
        torch.compiler.cudagraph_mark_step_begin()
        return batch(step, micro)

    train(model, [opt], marked, classify(compiled), steps=4)


@program("torch", "GAN: D and G, two Adam optimizers; per iteration a D update then a G update")
def gan():
    start()
    g = mlp([64, 256, 512, 784], act=nn.ReLU).to(DEV)
    d = mlp([784, 512, 256, 1], act=nn.LeakyReLU).to(DEV)
    opt_g = torch.optim.Adam(g.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(d.parameters(), lr=2e-4, betas=(0.5, 0.999))
    L.modules, L.optimizers = [g, d], [opt_d, opt_g]
    bce = nn.BCEWithLogitsLoss()
    real_set = to_gpu("real_set", torch.randn(256, 784))
    for it in range(3):
        L.mark("start", it)
        real = real_set[it * 64:(it + 1) * 64]
        z = L.hold("z", torch.randn(64, 64, device=DEV))
        ones = L.hold("ones", torch.ones(64, 1, device=DEV))
        zeros = L.hold("zeros", torch.zeros(64, 1, device=DEV))
        opt_d.zero_grad()
        with L.saving():
            fake = g(z)
            loss_d = bce(d(real), ones) + bce(d(fake.detach()), zeros)
        L.mark("d_forward")
        loss_d.backward()
        L.mark("d_backward")
        opt_d.step()
        L.mark("d_optimizer")
        opt_g.zero_grad()
        with L.saving():
            loss_g = bce(d(fake), ones)
        L.mark("g_forward")
        loss_g.backward()
        L.mark("g_backward")
        opt_g.step()
        L.steps += 1
        L.mark("g_optimizer")
        del fake, loss_d, loss_g, z, ones, zeros
        L.mark("end")


@program("torch", "actor-critic: separate actor and critic, an Adam optimizer each")
def actor_critic():
    start()
    actor = mlp([32, 256, 256, 8], act=nn.Tanh).to(DEV)
    critic = mlp([32, 256, 256, 1], act=nn.Tanh).to(DEV)
    opt_a = torch.optim.Adam(actor.parameters(), lr=3e-4)
    opt_c = torch.optim.Adam(critic.parameters(), lr=1e-3)
    L.modules, L.optimizers = [actor, critic], [opt_a, opt_c]
    for it in range(3):
        L.mark("start", it)
        states = to_gpu("states", torch.randn(1024, 32))
        actions = to_gpu("actions", torch.randint(0, 8, (1024,)))
        returns = to_gpu("returns", torch.randn(1024))
        with L.saving():
            value = critic(states).squeeze(1)
            advantage = (returns - value).detach()
            logp = torch.log_softmax(actor(states), 1).gather(1, actions[:, None]).squeeze(1)
            actor_loss = -(logp * advantage).mean()
            critic_loss = F.mse_loss(value, returns)
        L.mark("forward")
        opt_a.zero_grad()
        opt_c.zero_grad()
        actor_loss.backward()
        L.mark("actor_backward")
        critic_loss.backward()
        L.mark("critic_backward")
        opt_a.step()
        opt_c.step()
        L.steps += 1
        L.mark("optimizer")
        del value, advantage, logp, actor_loss, critic_loss, states, actions, returns
        L.mark("end")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_group():
    import torch.distributed as dist

    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
        device_id=DEV,
    )
    return dist


def ddp_program(oom):
    from torch.nn.parallel import DistributedDataParallel as DDP

    start()
    dist = process_group()
    try:
        width, features = (4096, 1024) if oom else (2048, 1024)
        model = mlp([features] + [width] * 4 + [10], act=nn.ReLU).to(DEV)
        ddp = DDP(model, device_ids=[0], bucket_cap_mb=16)
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
        L.modules, L.optimizers = [model], [opt]
        n = 16384 if oom else 256

        def sync(micro, last):
            return contextlib.nullcontext() if last else ddp.no_sync()

        if oom:
            # the cap leaves too little for the first micro-batch's activations
            torch.cuda.synchronize()
            cap = torch.cuda.memory_reserved() + (256 << 20)
            total = torch.cuda.get_device_properties(0).total_memory
            torch.cuda.set_per_process_memory_fraction(cap / total)
            say(f"CAP bytes={cap}")
        try:
            train(ddp, [opt], random_batch(n, (features,), 10), classify(ddp), accum=2, sync=sync)
        except torch.OutOfMemoryError as e:
            out_of_memory(e)
    finally:
        dist.destroy_process_group()


@program("torch", "DDP (world size 1, NCCL), gradient accumulation 2 with no_sync, AdamW")
def ddp_accum():
    ddp_program(oom=False)


@program("torch", "DDP with no_sync accumulation; out of memory in the first micro-batch")
def ddp_oom():
    ddp_program(oom=True)


def fsdp_unsharded_grads(model):
    """Gradients FSDP2 accumulates on unsharded parameters while gradient sync is off."""

    def found():
        grads = []
        for m in model.modules():
            get_state = getattr(m, "_get_fsdp_state", None)
            if get_state is None:
                continue
            try:
                group = get_state()._fsdp_param_group
                params = group.fsdp_params if group is not None else []
            except Exception:  # noqa: BLE001 - private structure, best effort
                continue
            for fp in params:
                with contextlib.suppress(Exception):
                    grads.append(getattr(fp, "unsharded_accumulated_grad", None))
                with contextlib.suppress(Exception):
                    grads.append(fp._unsharded_param.grad)
        return grads

    return found


@program("torch", "FSDP2 fully_shard (world size 1), set_requires_gradient_sync(False) accumulation")
def fsdp2_accum():
    from torch.distributed.fsdp import fully_shard

    start()
    dist = process_group()
    try:
        model = SmallGPT(layers=3).to(DEV)
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        L.extra_grads.append(fsdp_unsharded_grads(model))

        def sync(micro, last):
            model.set_requires_gradient_sync(last)
            return contextlib.nullcontext()

        train(model, [opt], token_batch(8, 128, 4000), lm_loss(model), accum=2, sync=sync)
    finally:
        dist.destroy_process_group()


@program("torch", "out of memory in step 2's forward (cap set after step 1); snapshot in except")
def oom_step2():
    start()
    model = mlp([256, 4096, 4096, 10], act=nn.ReLU).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sizes = [256, 256, 65536]

    def batch(step, micro):
        if step == 2:
            torch.cuda.synchronize()
            cap = torch.cuda.memory_reserved() + (128 << 20)
            total = torch.cuda.get_device_properties(0).total_memory
            torch.cuda.set_per_process_memory_fraction(cap / total)
            say(f"CAP bytes={cap}")
        return random_batch(sizes[step], (256,), 10)(step, micro)

    try:
        train(model, [opt], batch, classify(model), steps=3)
    except torch.OutOfMemoryError as e:
        out_of_memory(e)


class UNet(nn.Module):
    """A small diffusion U-Net: conv down and up blocks with skips, a timestep embedding."""

    def __init__(self, ch=32, tdim=128):
        super().__init__()
        self.tdim = tdim
        self.temb = nn.Sequential(nn.Linear(tdim, tdim), nn.SiLU(), nn.Linear(tdim, tdim))
        self.inp = nn.Conv2d(3, ch, 3, padding=1)
        self.down = nn.ModuleList([self.block(ch, ch * 2), self.block(ch * 2, ch * 4)])
        self.mid = self.block(ch * 4, ch * 4)
        self.up = nn.ModuleList([self.block(ch * 8, ch * 2), self.block(ch * 4, ch)])
        self.tproj = nn.ModuleList(
            nn.Linear(tdim, c) for c in (ch * 2, ch * 4, ch * 4, ch * 2, ch)
        )
        self.out = nn.Conv2d(ch, 3, 3, padding=1)

    @staticmethod
    def block(cin, cout):
        return nn.Sequential(
            nn.GroupNorm(8, cin), nn.SiLU(), nn.Conv2d(cin, cout, 3, padding=1),
            nn.GroupNorm(8, cout), nn.SiLU(), nn.Conv2d(cout, cout, 3, padding=1),
        )

    def embed(self, t):
        half = self.tdim // 2
        freqs = torch.exp(-torch.arange(half, device=t.device) * (9.21 / half))
        angles = t[:, None].float() * freqs[None]
        return self.temb(torch.cat([angles.sin(), angles.cos()], 1))

    def forward(self, x, t):
        e = self.embed(t)
        proj = iter(self.tproj)
        h = self.inp(x)
        skips = []
        for blk in self.down:
            h = blk(h) + next(proj)(e)[:, :, None, None]
            skips.append(h)
            h = F.avg_pool2d(h, 2)
        h = self.mid(h) + next(proj)(e)[:, :, None, None]
        for blk in self.up:
            h = F.interpolate(h, scale_factor=2.0)
            h = blk(torch.cat([h, skips.pop()], 1)) + next(proj)(e)[:, :, None, None]
        return self.out(h)


@program("torch", "diffusion-style U-Net, timestep embedding, noise-prediction MSE, dataset on GPU")
def diffusion_unet():
    start()
    model = UNet().to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    images = to_gpu("images", torch.rand(64, 3, 32, 32) * 2 - 1)
    alphas = to_gpu("alpha_bar", torch.cumprod(1 - torch.linspace(1e-4, 0.02, 1000), 0))

    def batch(step, micro):
        idx = torch.randint(0, 64, (16,), device=DEV)
        t = L.hold("t", torch.randint(0, 1000, (16,), device=DEV))
        noise = L.hold("noise", torch.randn(16, 3, 32, 32, device=DEV))
        return L.hold("x0", images[idx]), t, noise

    def loss_of(d):
        x0, t, noise = d
        a = alphas[t][:, None, None, None]
        xt = a.sqrt() * x0 + (1 - a).sqrt() * noise
        return F.mse_loss(model(xt, t), noise)

    train(model, [opt], batch, loss_of)


# --- torchvision ----------------------------------------------------------------------------


def jpeg_pictures(n, size=96):
    """Real JPEG files, encoded here from drawn patterns."""
    import torchvision

    pics = []
    for i in range(n):
        yy, xx = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
        img = torch.stack([(xx * (i + 1)) % 256, (yy * 3 + i * 40) % 256, (xx + yy) % 256])
        pics.append(torchvision.io.encode_jpeg(img.to(torch.uint8), quality=90))
    return pics


@program("torchvision", "resnet18; a fixed batch of real JPEGs decoded on the GPU each step, "
         "each batch alive until the next one replaces it; SGD momentum")
def tv_resnet_fixed_batch():
    import torchvision
    from torchvision.transforms import v2

    start()
    model = torchvision.models.resnet18(num_classes=10).to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    files = jpeg_pictures(16)
    labels = to_gpu("labels", torch.arange(16) % 10)
    prep = v2.Compose([v2.Resize(112, antialias=True), v2.ToDtype(torch.float32, scale=True),
                       v2.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])

    def batch(step, micro):
        try:
            pics = torchvision.io.decode_jpeg(files, device="cuda")
        except Exception as e:  # noqa: BLE001 - nvjpeg may be missing: decode on the CPU
            if step == 0:
                say(f"NOTE decode_jpeg on cuda failed ({type(e).__name__}); CPU decode")
            pics = [p.to(DEV) for p in torchvision.io.decode_jpeg(files)]
        return L.hold("images", prep(torch.stack(pics))), labels

    train(model, [opt], batch, classify(model), keep_batch=True)


# --- Lightning -------------------------------------------------------------------------------


def lightning_run(module_cls, marks, precision="32-true", steps=3):
    """Runs a LightningModule under a Trainer whose callback prints a MARK at each hook named
    in `marks` (hook name -> mark name)."""
    import lightning as pl

    def hook(mark):
        def run(self, trainer, module, *args):
            if mark == "start":
                L.step = trainer.global_step
            L.mark(mark)
            if mark == "end":
                L.steps += 1

        return run

    Marks = type("Marks", (pl.Callback,), {h: hook(m) for h, m in marks.items()})
    data = torch.utils.data.TensorDataset(torch.randn(64, 3, 32, 32), torch.randint(0, 10, (64,)))
    loader = torch.utils.data.DataLoader(data, batch_size=16)
    start()
    module = module_cls()
    L.modules = [module]
    trainer = pl.Trainer(
        accelerator="gpu", devices=1, max_steps=steps, precision=precision, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[Marks()], num_sanity_val_steps=0, default_root_dir=tempfile.mkdtemp(),
    )
    with L.saving():
        trainer.fit(module, loader)


def small_cnn():
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(64 * 16, 10),
    )


def lightning_module(manual=False, late_zero_grad=False):
    import lightning as pl

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = small_cnn()
            self.automatic_optimization = not manual

        def training_step(self, batch, idx):
            x, y = batch
            loss = F.cross_entropy(self.net(x), y)
            if not manual:
                return loss
            opt = self.optimizers()
            L.mark("forward")
            opt.zero_grad()
            L.mark("zero_grad")
            self.manual_backward(loss)
            L.mark("backward")
            opt.step()
            L.mark("optimizer")
            return None

        def optimizer_zero_grad(self, epoch, batch_idx, optimizer):
            if late_zero_grad:
                L.mark("before_zero_grad")
                optimizer.zero_grad(set_to_none=False)
                L.mark("zero_grad")
            else:
                optimizer.zero_grad()

        def configure_optimizers(self):
            opt = torch.optim.AdamW(self.parameters(), lr=1e-3)
            L.optimizers.append(opt)
            return opt

    return Module


@program("lightning", "Trainer, automatic optimization, bf16-mixed, AdamW")
def lightning_auto():
    lightning_run(lightning_module(), {
        "on_train_batch_start": "start", "on_before_backward": "forward",
        "on_after_backward": "backward", "on_before_optimizer_step": "before_optimizer",
        "on_train_batch_end": "end",
    }, precision="bf16-mixed")


@program("lightning", "Trainer, manual optimization (manual_backward), AdamW")
def lightning_manual():
    lightning_run(lightning_module(manual=True), {
        "on_train_batch_start": "start", "on_train_batch_end": "end",
    })


@program("lightning", "automatic optimization whose zero_grad (overridden optimizer_zero_grad, "
         "set_to_none=False) runs after the forward")
def lightning_late_zero_grad():
    lightning_run(lightning_module(late_zero_grad=True), {
        "on_train_batch_start": "start", "on_before_zero_grad": "forward",
        "on_after_backward": "backward", "on_train_batch_end": "end",
    })


# --- transformers, accelerate, PEFT, sentence-transformers ------------------------------------


def tiny_llama(layers=2, hidden=256, vocab=4000):
    import transformers as tf

    cfg = tf.LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 3,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512,
    )
    return tf.LlamaForCausalLM(cfg)


def hf_trainer_run(accum, optim):
    import transformers as tf

    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            ids = torch.randint(0, 4000, (128,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": ids, "labels": ids.clone()}

    marks = {"on_step_begin": "start", "on_substep_end": "micro_backward",
             "on_pre_optimizer_step": "backward", "on_optimizer_step": "optimizer",
             "on_step_end": "end"}

    def hook(mark):
        def run(self, args, state, control, **kw):
            if mark == "start":
                L.step = state.global_step
            L.mark(mark)
            if mark == "end":
                L.steps += 1

        return run

    Marks = type("Marks", (tf.TrainerCallback,), {h: hook(m) for h, m in marks.items()})

    class Recording(tf.Trainer):
        def create_optimizer(self, *a, **k):
            opt = super().create_optimizer(*a, **k)
            L.optimizers = [opt]
            return opt

    start()
    model = tiny_llama()
    L.modules = [model]
    model.register_forward_hook(lambda *a: L.mark("forward"))
    args = tf.TrainingArguments(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=4,
        gradient_accumulation_steps=accum, max_steps=3, learning_rate=1e-4, report_to=[],
        save_strategy="no", logging_strategy="no", dataloader_num_workers=0, optim=optim,
        disable_tqdm=True,
    )
    trainer = Recording(model=model, args=args, train_dataset=Tokens(), callbacks=[Marks()])
    with L.saving():
        trainer.train()


@program("transformers", "Trainer on a tiny Llama, no accumulation, fused AdamW")
def hf_trainer():
    hf_trainer_run(1, "adamw_torch_fused")


@program("transformers", "Trainer on a tiny Llama, gradient accumulation 2, AdamW")
def hf_trainer_accum():
    hf_trainer_run(2, "adamw_torch")


@program("transformers", "inference: generate() with a KV cache on a tiny Llama, no grad")
def llama_generate_kv():
    import transformers as tf

    class MarkTokens(tf.LogitsProcessor):
        def __init__(self):
            self.n = 0

        def __call__(self, input_ids, scores):
            if self.n % 4 == 0:
                L.mark(f"token{self.n}")
            self.n += 1
            return scores

    start()
    model = tiny_llama().to(DEV).eval()
    L.modules = [model]
    for call in range(2):
        L.mark("start", call)
        ids = to_gpu("prompt", torch.randint(3, 4000, (4, 32)))
        with torch.no_grad():
            out = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, min_new_tokens=12,
                do_sample=False, use_cache=True, pad_token_id=0,
                logits_processor=tf.LogitsProcessorList([MarkTokens()]),
            )
        L.hold("generated", out)
        L.mark("generated")
        del out
        L.mark("end")


@program("accelerate", "Accelerator(gradient_accumulation_steps=2) loop, accumulate(), GPT-2")
def accelerate_accum():
    import transformers as tf
    from accelerate import Accelerator

    start()
    acc = Accelerator(gradient_accumulation_steps=2)
    cfg = tf.GPT2Config(n_layer=2, n_embd=256, n_head=4, vocab_size=4000, n_positions=256)
    model = tf.GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, opt = acc.prepare(model, opt)
    L.modules, L.optimizers = [model], [opt]
    for micro in range(6):
        if micro % 2 == 0:
            L.mark("start", L.steps)
        with acc.accumulate(model):
            ids = to_gpu("ids", torch.randint(0, 4000, (4, 128)))
            with L.saving():
                loss = model(input_ids=ids, labels=ids).loss
            L.mark(f"forward_mb{micro % 2}")
            acc.backward(loss)
            L.mark(f"backward_mb{micro % 2}")
            opt.step()
            opt.zero_grad()
            if acc.sync_gradients:
                L.steps += 1
                L.mark("optimizer_zero_grad")
            del loss, ids
    L.mark("end")


@program("peft", "LoRA (q_proj, v_proj) on a tiny Llama, AdamW on the adapters")
def peft_lora():
    from peft import LoraConfig, get_peft_model

    start()
    base = tiny_llama().to(DEV)
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    train(model, [opt], token_batch(4, 128, 4000),
          lambda d: model(input_ids=d[0], labels=d[1]).loss)


@program("sentence-transformers", "SentenceTransformer (tiny BERT from config, mean pooling, "
         "normalize), MultipleNegativesRankingLoss, AdamW")
def sentence_transformers_mnrl():
    import transformers as tf
    from sentence_transformers import SentenceTransformer, losses

    try:
        from sentence_transformers.models import Normalize, Pooling
    except ImportError:
        from sentence_transformers.sentence_transformer.models import Normalize, Pooling

    class Bert(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            self.bert = tf.BertModel(cfg, add_pooling_layer=False)

        def forward(self, features):
            out = self.bert(input_ids=features["input_ids"], attention_mask=features["attention_mask"])
            features["token_embeddings"] = out.last_hidden_state
            return features

        def get_word_embedding_dimension(self):
            return self.bert.config.hidden_size

    start()
    cfg = tf.BertConfig(vocab_size=3000, hidden_size=128, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=512, max_position_embeddings=128)
    model = SentenceTransformer(modules=[Bert(cfg), Pooling(128, pooling_mode="mean"), Normalize()],
                                device="cuda")
    loss_fn = losses.MultipleNegativesRankingLoss(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def features(name):
        ids = to_gpu(name + "_ids", torch.randint(1, 3000, (32, 48)))
        mask = to_gpu(name + "_mask", torch.ones(32, 48, dtype=torch.long))
        return {"input_ids": ids, "attention_mask": mask}

    def batch(step, micro):
        return [features("anchor"), features("positive")]

    train(model, [opt], batch, lambda d: loss_fn(d, None))


# --- timm, torchaudio, torch-geometric, torchdiffeq, gpytorch ---------------------------------


@program("timm", "timm ViT (depth 4, 64 px) with timm's LAMB optimizer (create_optimizer_v2)")
def timm_vit_lamb():
    import timm
    from timm.optim import create_optimizer_v2

    start()
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10,
                              img_size=64, depth=4).to(DEV)
    opt = create_optimizer_v2(model, opt="lamb", lr=1e-3, weight_decay=0.05)
    train(model, [opt], random_batch(32, (3, 64, 64), 10), classify(model))


@program("torchaudio", "MelSpectrogram on the GPU and a Conformer encoder, AdamW")
def torchaudio_conformer():
    import torchaudio

    start()
    mel = torchaudio.transforms.MelSpectrogram(sample_rate=16000, n_fft=400, n_mels=80).to(DEV)

    class Speech(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = torchaudio.models.Conformer(
                input_dim=80, num_heads=4, ffn_dim=256, num_layers=2,
                depthwise_conv_kernel_size=15)
            self.head = nn.Linear(80, 32)

        def forward(self, wave):
            feats = (mel(wave) + 1e-6).log().transpose(1, 2)
            lengths = torch.full((feats.shape[0],), feats.shape[1], device=feats.device)
            out, _ = self.encoder(feats, lengths)
            return self.head(out.mean(1))

    model = Speech().to(DEV)
    L.modules = [model, mel]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train(model, [opt], random_batch(8, (16000,), 32), classify(model))


@program("torch-geometric", "GCN (cached normalisation) on a graph moved to the GPU once with "
         "data.to(device), full-batch, AdamW")
def pyg_gcn():
    from torch_geometric.data import Data
    from torch_geometric.nn import GCNConv

    start()
    n = 4000
    edges = torch.randint(0, n, (2, 40000))
    data = Data(x=torch.randn(n, 128), edge_index=edges, y=torch.randint(0, 7, (n,)),
                train_mask=torch.rand(n) < 0.5)
    data = data.to(DEV)
    for key, value in data:
        if torch.is_tensor(value):
            L.hold("data." + key, value)

    class GCN(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = GCNConv(128, 256, cached=True), GCNConv(256, 7, cached=True)

        def forward(self, d):
            return self.c2(F.relu(self.c1(d.x, d.edge_index)), d.edge_index)

    model = GCN().to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    m = data.train_mask
    train(model, [opt], lambda s, u: data, lambda d: F.cross_entropy(model(d)[m], d.y[m]),
          keep_batch=True)


@program("torchdiffeq", "neural ODE trained through odeint_adjoint (rk4), Adam")
def torchdiffeq_adjoint():
    from torchdiffeq import odeint_adjoint

    class Field(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = mlp([64, 256, 256, 64], act=nn.Tanh)

        def forward(self, t, y):
            return self.net(y)

    start()
    field = Field().to(DEV)
    opt = torch.optim.Adam(field.parameters(), lr=1e-3)
    times = to_gpu("times", torch.linspace(0, 1, 5))

    def batch(step, micro):
        return to_gpu("y0", torch.randn(256, 64)), to_gpu("target", torch.randn(256, 64))

    def loss_of(d):
        path = odeint_adjoint(field, d[0], times, method="rk4", options={"step_size": 0.1})
        return F.mse_loss(path[-1], d[1])

    train(field, [opt], batch, loss_of)


@program("gpytorch", "exact GP regression (RBF kernel), training data on the GPU, Adam on "
         "the marginal likelihood")
def gpytorch_exact_gp():
    import gpytorch

    start()
    train_x = to_gpu("train_x", torch.rand(600, 4))
    train_y = to_gpu("train_y", torch.sin(train_x.sum(1) * 3).cpu() + 0.1 * torch.randn(600))

    class GP(gpytorch.models.ExactGP):
        def __init__(self, likelihood):
            super().__init__(train_x, train_y, likelihood)
            self.mean = gpytorch.means.ConstantMean()
            self.kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean(x), self.kernel(x))

    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = GP(likelihood).to(DEV)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    train(model, [opt], lambda s, u: (train_x, train_y),
          lambda d: -mll(model(d[0]), d[1]), keep_batch=True)


# --- main ------------------------------------------------------------------------------------


def main():
    global REC
    if sys.argv[1:] == ["--list"]:
        print(" ".join(PROGRAMS))
        return 0
    out, name = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    fn, library, what = PROGRAMS[name]
    say(f"PROGRAM name={name} library={library} what={what}")
    torch.manual_seed(0)
    torch.cuda.set_device(DEV)
    REC = Recorder(out, name)
    if not REC.profile:
        say("NOTE recorded without the profiler (CORPUS_NO_PROFILER=1)")
    fn()
    REC.finish()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown (compile workers, NCCL) that can hang
