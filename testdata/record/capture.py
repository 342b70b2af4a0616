"""Records snapshots with `memsnap.Capture` in four kinds of training program, each printing its
own truth beside what Capture wrote (the device's memory right after each probe, PyTorch's peak
for the recorded step, the out-of-memory message).

    loop        a plain loop on one GPU: probes at CUDA init, after the model, after the
                optimizer; step 1 recorded
    oom         the same loop under a cap that the recorded step exceeds: the _oom snapshot
    lightning   a Lightning Trainer (automatic optimization), lightning_callback, step 1
    hf          a transformers Trainer with gradient accumulation 2, transformers_callback,
                step 1
    ranks       two processes under torchrun (gloo process group), ranks={1}: only rank 1
                writes, with a probe after init_process_group
    lightning_oom, hf_oom
                the Lightning and transformers programs asking for 200 GiB in step 1: the
                _oom snapshot written by the allocator's out-of-memory observer

Prints, with exact bytes:
    PROBE name=... used=N reserved=N total=N      (mem_get_info and memory_reserved right after
                                                   the probe, nothing allocated in between)
    PEAK step=S max_memory_allocated=N max_memory_reserved=N
    FATAL <the OutOfMemoryError message on one line>
    WROTE <path>                                  (each file Capture wrote)

Usage: python3 capture.py OUT_DIR loop|oom|lightning|hf|ranks|lightning_oom|hf_oom
"""

import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import memsnap  # noqa: E402

DEV = torch.device("cuda", 0)


def truth(cap, name):
    cap.probe(name)
    free, total = torch.cuda.mem_get_info(0)
    print(
        f"PROBE name={name!r} used={total - free} reserved={torch.cuda.memory_reserved(0)} total={total}",
        flush=True,
    )


def peak(step):
    torch.cuda.synchronize()
    print(
        f"PEAK step={step} max_memory_allocated={torch.cuda.max_memory_allocated()} "
        f"max_memory_reserved={torch.cuda.max_memory_reserved()}",
        flush=True,
    )


def mlp():
    return torch.nn.Sequential(
        torch.nn.Linear(2048, 8192), torch.nn.GELU(), torch.nn.Linear(8192, 2048)
    ).to(DEV)


def loop(out, cap_bytes=None):
    cap = memsnap.Capture(out, steps=range(1, 2))
    torch.cuda.init()
    truth(cap, "after CUDA init")
    model = mlp()
    truth(cap, "after the model")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    truth(cap, "after the optimizer")
    if cap_bytes:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(cap_bytes / total)
    try:
        for step in range(3):
            rows = 4096 if cap_bytes is None or step == 0 else 65536
            with cap.step(step):
                x = torch.randn(rows, 2048, device=DEV)
                model(x).square().mean().backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            if step == 1:
                peak(step)
    except torch.OutOfMemoryError as e:
        print("FATAL " + str(e).replace("\n", " "), flush=True)
    for path in cap.written:
        print(f"WROTE {path}", flush=True)


def lightning(out, oom=False):
    import lightning.pytorch as pl

    cap = memsnap.Capture(out, steps=range(1, 2))

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)
            )

        def training_step(self, batch, batch_idx):
            if oom and self.trainer.global_step == 1:
                torch.empty(200 << 30, dtype=torch.uint8, device=DEV)
            return self.net(batch).square().mean()

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    class Peak(pl.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if trainer.global_step == 2:  # after step 1's optimizer step
                peak(1)

    data = torch.utils.data.DataLoader(torch.randn(64, 1024), batch_size=16)
    trainer = pl.Trainer(
        accelerator="gpu", devices=1, max_steps=3, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
        callbacks=[memsnap.lightning_callback(cap), Peak()],
        default_root_dir=tempfile.mkdtemp(),
    )
    try:
        trainer.fit(Module(), data)
    except torch.OutOfMemoryError as e:
        print("FATAL " + str(e).replace("\n", " "), flush=True)
    for path in cap.written:
        print(f"WROTE {path}", flush=True)


def hf(out, oom=False):
    import transformers as tf

    cap = memsnap.Capture(out, steps=range(1, 2))
    cfg = tf.LlamaConfig(
        vocab_size=4000, hidden_size=256, intermediate_size=688, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
    )
    model = tf.LlamaForCausalLM(cfg)
    ids = torch.randint(0, 4000, (32, 128))
    data = [{"input_ids": r, "labels": r} for r in ids]

    class Peak(tf.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                peak(1)

    args = tf.TrainingArguments(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=4, gradient_accumulation_steps=2,
        max_steps=3, report_to=[], save_strategy="no", logging_strategy="no",
    )
    class Big(tf.Trainer):
        def compute_loss(self, model, inputs, *a, **k):
            if oom and self.state.global_step == 1:
                torch.empty(200 << 30, dtype=torch.uint8, device=DEV)
            return super().compute_loss(model, inputs, *a, **k)

    trainer = Big(
        model=model, args=args, train_dataset=data,
        callbacks=[memsnap.transformers_callback(cap), Peak()],
    )
    try:
        trainer.train()
    except torch.OutOfMemoryError as e:
        print("FATAL " + str(e).replace("\n", " "), flush=True)
    for path in cap.written:
        print(f"WROTE {path}", flush=True)


def ranks(out):
    import torch.distributed as dist

    cap = memsnap.Capture(out, ranks={1}, steps=range(0, 1))
    torch.cuda.init()
    if cap.active:
        truth(cap, "before init_process_group")
    dist.init_process_group("gloo")
    if cap.active:
        truth(cap, "after init_process_group")
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(2):
        with cap.step(step):
            model(torch.randn(1024, 2048, device=DEV)).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        if step == 0 and cap.active:
            peak(0)
    dist.barrier()
    print(f"RANK {dist.get_rank()} wrote {len(cap.written)}", flush=True)
    for path in cap.written:
        print(f"WROTE {path}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    out, kind = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    if kind == "loop":
        loop(out)
    elif kind == "oom":
        loop(out, cap_bytes=3 << 30)
    elif kind == "lightning":
        lightning(out)
    elif kind == "hf":
        hf(out)
    elif kind == "lightning_oom":
        lightning(out, oom=True)
    elif kind == "hf_oom":
        hf(out, oom=True)
    else:
        ranks(out)
