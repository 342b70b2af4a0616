"""Records snapshots with `memsnap.Capture` given the model and optimizer, so that each snapshot
has its `<snapshot>.tensors.json` (the storages of parameters, buffers, gradients and optimizer
state by name at recording start, at each recorded step's end and at an out-of-memory error),
in three programs that each print their own truth beside it:

    loop           a plain loop: a small transformers Llama built from its config (tied
                   embeddings), AdamW, `Capture(model=, optimizer=)`, steps 2 and 3 recorded;
                   gradients are set to None at the start of each step, so they live at its end
    hf             a transformers Trainer (gradient accumulation 2, its default optimizer) with
                   `transformers_callback`, steps 1 and 2 recorded
    lightning_oom  a Lightning Trainer with plain SGD (no optimizer state) and
                   `lightning_callback` under an 8 GiB cap
                   (`set_per_process_memory_fraction(8 GiB / total)`), steps 1 and 2 recorded;
                   step 2 runs its batch repeated 40000 times and runs out of memory

Prints, with exact bytes:
    VERSIONS torch=... transformers=... lightning=... get_per_process_memory_fraction=True|False
    TRUTH step=S name=NAME param=N grad=N optimizer_state=N
        (at recording start, at the end of each recorded step, and in the failing step: the
         bytes of the distinct CUDA storages of parameters and buffers, of `.grad`, and of the
         tensors in `optimizer.state`, counted here without memsnap)
    MARK step=S name=NAME memory_allocated=N
    PEAK max_memory_allocated=N max_memory_reserved=N     (after the last recorded step)
    CAP bytes=N total=N      (the cap the allocator computes: size_t(fraction * total))
    FATAL <the OutOfMemoryError message on one line>
    WROTE <path>             (each snapshot Capture wrote)

Usage: python3 capture_evidence.py OUT_DIR loop|hf|lightning_oom
"""

import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import memsnap  # noqa: E402

DEV = torch.device("cuda", 0)


def storages(tensors):
    """Bytes of the distinct CUDA storages on device 0 among `tensors`."""
    found = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.is_cuda and t.device.index == 0:
            s = t.untyped_storage()
            if s.nbytes() > 0:
                found[s.data_ptr()] = s.nbytes()
    return sum(found.values())


def unwrap(opt):
    """The torch optimizer inside Lightning's or accelerate's wrapper."""
    for _ in range(4):
        if isinstance(opt, torch.optim.Optimizer) and not hasattr(opt, "optimizer"):
            break
        opt = getattr(opt, "_optimizer", None) or getattr(opt, "optimizer")
    return opt


def truth(step, name, model, opt):
    opt = unwrap(opt)
    params = list(model.parameters()) + list(model.buffers())
    grads = [p.grad for p in model.parameters()]
    state = [v for st in opt.state.values() for v in st.values()]
    print(
        f"TRUTH step={step} name={name} param={storages(params)} grad={storages(grads)} "
        f"optimizer_state={storages(state)}",
        flush=True,
    )
    print(f"MARK step={step} name={name} memory_allocated={torch.cuda.memory_allocated(0)}", flush=True)


def peak():
    torch.cuda.synchronize()
    print(
        f"PEAK max_memory_allocated={torch.cuda.max_memory_allocated()} "
        f"max_memory_reserved={torch.cuda.max_memory_reserved()}",
        flush=True,
    )


def versions():
    import importlib.metadata as md

    def v(name):
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return "none"

    print(
        f"VERSIONS torch={torch.__version__} transformers={v('transformers')} "
        f"lightning={v('lightning')} get_per_process_memory_fraction="
        f"{hasattr(torch.cuda, 'get_per_process_memory_fraction')}",
        flush=True,
    )


def llama(tied):
    import transformers as tf

    cfg = tf.LlamaConfig(
        vocab_size=4000, hidden_size=256, intermediate_size=688, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
        tie_word_embeddings=tied,
    )
    return tf.LlamaForCausalLM(cfg)


def loop(out):
    torch.manual_seed(0)
    model = llama(tied=True).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    cap = memsnap.Capture(out, steps=range(2, 4), model=model, optimizer=opt)
    for step in range(5):
        if step == 2:
            truth(step, "start", model, opt)
        with cap.step(step):
            opt.zero_grad(set_to_none=True)
            ids = torch.randint(0, 4000, (8, 128), device=DEV)
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
        if step in (2, 3):
            truth(step, "step_end", model, opt)
        if step == 3:
            peak()
    for path in cap.written:
        print(f"WROTE {path}", flush=True)


def hf(out):
    import transformers as tf

    torch.manual_seed(0)
    cap = memsnap.Capture(out, steps=range(1, 3))
    model = llama(tied=False)
    ids = torch.randint(0, 4000, (32, 128))
    data = [{"input_ids": r, "labels": r} for r in ids]

    class Truth(tf.TrainerCallback):
        def __init__(self):
            self.started = False
            self.trainer = None

        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 1 and not self.started:
                self.started = True
                truth(1, "start", self.trainer.model, self.trainer.optimizer)

        def on_step_end(self, args, state, control, **kwargs):
            step = state.global_step - 1  # global_step counts the optimizer step just taken
            if step in (1, 2):
                truth(step, "step_end", self.trainer.model, self.trainer.optimizer)
            if step == 2:
                peak()

    args = tf.TrainingArguments(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=4, gradient_accumulation_steps=2,
        max_steps=4, report_to=[], save_strategy="no", logging_strategy="no",
    )
    print(f"OPTIM {args.optim}", flush=True)
    told = Truth()
    trainer = tf.Trainer(
        model=model, args=args, train_dataset=data,
        callbacks=[told, memsnap.transformers_callback(cap)],
    )
    told.trainer = trainer
    trainer.train()
    print(f"OPTIMIZER {type(unwrap(trainer.optimizer)).__name__} wrapped in {type(trainer.optimizer).__name__}", flush=True)
    for path in cap.written:
        print(f"WROTE {path}", flush=True)


def lightning_oom(out):
    try:
        import lightning.pytorch as pl
    except ImportError:
        import pytorch_lightning as pl

    torch.manual_seed(0)
    total = torch.cuda.get_device_properties(0).total_memory
    fraction = 8 * 2**30 / total
    torch.cuda.set_per_process_memory_fraction(fraction, 0)
    print(f"CAP bytes={int(fraction * total)} total={total}", flush=True)
    cap = memsnap.Capture(out, steps=range(1, 3))

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)
            )

        def training_step(self, batch, batch_idx):
            if self.trainer.global_step == 2:
                try:
                    big = batch.repeat(40000, 1)  # 2.7 GB in, 10.7 GB out of the first layer
                    return self.net(big).square().mean()
                except torch.OutOfMemoryError:
                    truth(2, "oom", self, self.trainer.optimizers[0])
                    raise
            return self.net(batch).square().mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Truth(pl.Callback):
        def __init__(self):
            self.started = False

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            if trainer.global_step == 1 and not self.started:
                self.started = True
                truth(1, "start", module, trainer.optimizers[0])

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if trainer.global_step - 1 == 1:  # after step 1's optimizer step
                truth(1, "step_end", module, trainer.optimizers[0])
                peak()

    data = torch.utils.data.DataLoader(torch.randn(64, 1024), batch_size=16)
    trainer = pl.Trainer(
        accelerator="gpu", devices=1, max_steps=4, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
        callbacks=[Truth(), memsnap.lightning_callback(cap)],
        default_root_dir=tempfile.mkdtemp(),
    )
    try:
        trainer.fit(Module(), data)
    except torch.OutOfMemoryError as e:
        print("FATAL " + str(e).replace("\n", " "), flush=True)
    for path in cap.written:
        print(f"WROTE {path}", flush=True)


if __name__ == "__main__":
    out, kind = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    versions()
    {"loop": loop, "hf": hf, "lightning_oom": lightning_oom}[kind](out)
