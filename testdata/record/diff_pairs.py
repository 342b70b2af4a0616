"""Records planted pairs for `memsnap diff BASE NEW`: one program per pair, run twice, as
`base` and as `new`, each run its own process, the two differing by one planted change.

Pairs (random weights, data made in the program, three training steps):
    logits_kept     a transformers Llama, AdamW; new appends `out.logits` to a Python list every
                    step (a logging bug): the logits of every step stay alive
    ckpt_off        a transformers Trainer on a Llama, AdamW; base `gradient_checkpointing=True`,
                    new False
    sdpa_eager      a transformers Llama, AdamW, sequence 512; base `attn_implementation="sdpa"`,
                    new "eager" (the batch x heads x seq x seq attention probabilities are
                    materialised and saved for backward)
    fp32_head       a timm ViT-S/16 (10000 classes) in bf16 with AdamW; new keeps the head in
                    fp32 (weight, gradient and AdamW state) and casts its input with a forward
                    pre-hook
    larger_batch    a Lightning Trainer on torchvision resnet18, AdamW; batch 16 vs 24
    expandable      torchvision resnet18, SGD momentum; new runs with
                    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (set by diff_pairs.sh):
                    the same requests, other segments
    same            torchvision resnet18, AdamW; base and new the identical program
    zero_grad_keep  torchvision resnet18, AdamW, `zero_grad` at the start of each step; base
                    `set_to_none=True`, new `set_to_none=False` (zeroed gradients stay alive
                    through the forward)
    mlp_batch       a plain PyTorch MLP over (batch, 128, 512) inputs, AdamW; batch 64 vs 96

Every run: `reset_peak_memory_stats()` and `_record_memory_history(max_entries=1_000_000,
stacks="python")` before the model is built; `torch.manual_seed(0)`. Prints, with exact bytes:

    PAIR pair=P variant=V alloc_conf="..."
    STEP step=S memory_allocated=N max_memory_allocated=N      (after each step, synchronized)
    PLANT what="..." bytes=N      (what the planted change holds, where the program can count it)
    VERSIONS torch=... ...
    PEAK max_memory_allocated=N max_memory_reserved=N memory_allocated=N

and writes the snapshot to OUT_DIR/PAIR/VARIANT.pickle (diff_pairs.sh compresses it).

Usage: python3 diff_pairs.py OUT_DIR PAIR base|new
"""

import os
import pickle
import sys
import tempfile

import torch

DEV = torch.device("cuda", 0)
STEPS = 3


def start_recording():
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")


def step_line(step):
    torch.cuda.synchronize()
    print(
        f"STEP step={step} memory_allocated={torch.cuda.memory_allocated()} "
        f"max_memory_allocated={torch.cuda.max_memory_allocated()}",
        flush=True,
    )


def plant(what, nbytes):
    print(f'PLANT what="{what}" bytes={int(nbytes)}', flush=True)


def storage_bytes(tensors):
    """Bytes of the distinct CUDA storages of `tensors`."""
    seen = {}
    for t in tensors:
        if torch.is_tensor(t) and t.is_cuda:
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def versions():
    parts = [f"torch={torch.__version__}", f"cuda={torch.version.cuda}"]
    # (only those the pair imported)
    for name in ("transformers", "timm", "torchvision", "lightning", "accelerate", "peft",
                 "torch_geometric"):
        mod = sys.modules.get(name)
        if mod is not None:
            parts.append(f"{name}={getattr(mod, '__version__', '?')}")
    parts.append(f'device="{torch.cuda.get_device_name(0)}"')
    print("VERSIONS " + " ".join(parts), flush=True)


def finish(path):
    torch.cuda.synchronize()
    versions()
    print(
        f"PEAK max_memory_allocated={torch.cuda.max_memory_allocated()} "
        f"max_memory_reserved={torch.cuda.max_memory_reserved()} "
        f"memory_allocated={torch.cuda.memory_allocated()}",
        flush=True,
    )
    snapshot = torch.cuda.memory._snapshot()
    with open(path, "wb") as f:
        pickle.dump(snapshot, f)


def llama_config(layers=4, hidden=256, heads=8, vocab=16000, attn="sdpa"):
    import transformers as tf

    cfg = tf.LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 2 + hidden // 2,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
        max_position_embeddings=1024, use_cache=False,
    )
    cfg._attn_implementation = attn
    return cfg


def tokens(batch, seq, vocab, step):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, vocab, (batch, seq), generator=g).to(DEV)


# --- transformers ----------------------------------------------------------------------------


def logits_kept(new):
    import transformers as tf

    cfg = llama_config(layers=2, hidden=256, vocab=16000)
    model = tf.LlamaForCausalLM(cfg).to(DEV)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    kept = []  # the logging bug: every step's logits, kept for "later"
    for step in range(STEPS):
        ids = tokens(4, 256, cfg.vocab_size, step)
        out = model(input_ids=ids, labels=ids)
        if new:
            kept.append(out.logits)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del out, ids
        step_line(step)
    plant(
        f"bytes of the {len(kept)} logits tensors kept in a Python list at the end "
        "(4 x 256 x 16000 fp32 each)",
        storage_bytes(kept),
    )
    return model, opt, kept


def ckpt_off(new):
    import transformers as tf

    cfg = llama_config(layers=4, hidden=512, vocab=16000)
    vocab, seq = cfg.vocab_size, 256

    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            ids = torch.randint(0, vocab, (seq,), generator=g)
            return {"input_ids": ids, "labels": ids.clone()}

    class Steps(tf.TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            step_line(state.global_step - 1)

    forward_left = []

    class Recording(tf.Trainer):
        def compute_loss(self, model, inputs, *args, **kwargs):
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            out = super().compute_loss(model, inputs, *args, **kwargs)
            torch.cuda.synchronize()
            forward_left.append(torch.cuda.memory_allocated() - before)
            return out

    model = tf.LlamaForCausalLM(cfg)
    args = tf.TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="diff_pairs_", dir="/tmp"),
        per_device_train_batch_size=8, gradient_accumulation_steps=1, max_steps=STEPS,
        learning_rate=1e-4, report_to=[], save_strategy="no", eval_strategy="no",
        logging_strategy="no", dataloader_num_workers=0, optim="adamw_torch",
        disable_tqdm=True, use_cpu=False, gradient_checkpointing=not new, seed=0,
    )
    trainer = Recording(model=model, args=args, train_dataset=Tokens(), callbacks=[Steps()])
    trainer.train()
    print(f"GRADIENT_CHECKPOINTING {model.is_gradient_checkpointing}", flush=True)
    plant(
        "memory_allocated() after the forward (compute_loss) of the last step minus at its "
        "start: what the forward leaves alive for backward, activations included",
        forward_left[-1],
    )
    return trainer


def sdpa_eager(new):
    import transformers as tf

    cfg = llama_config(layers=4, hidden=256, heads=8, vocab=8000, attn="eager" if new else "sdpa")
    model = tf.LlamaForCausalLM(cfg).to(DEV)
    model.train()
    print(f"ATTN {model.config._attn_implementation}", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    weights = []

    def hook(module, args, output):
        w = output[1] if isinstance(output, tuple) and len(output) > 1 else None
        if torch.is_tensor(w):
            weights.append(w.untyped_storage().nbytes())

    for layer in model.model.layers:
        layer.self_attn.register_forward_hook(hook)
    for step in range(STEPS):
        weights.clear()
        ids = tokens(4, 512, cfg.vocab_size, step)
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del out, ids
        step_line(step)
    plant(
        f"bytes of the attention probabilities (4 x 8 x 512 x 512 fp32) returned by the "
        f"{len(weights)} attention layers and saved for backward in the last step",
        sum(weights),
    )
    return model, opt


# --- timm ------------------------------------------------------------------------------------


def fp32_head(new):
    import timm

    model = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=10000)
    model = model.to(DEV, torch.bfloat16)
    if new:
        model.head.to(torch.float32)
        model.head.register_forward_pre_hook(lambda m, args: (args[0].float(),) + tuple(args[1:]))
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    head = list(model.head.parameters())
    extra = 0
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        g = torch.Generator(device=DEV).manual_seed(step)
        x = torch.randn(8, 3, 224, 224, device=DEV, generator=g).to(torch.bfloat16)
        y = torch.randint(0, 10000, (8,), device=DEV, generator=g)
        loss = torch.nn.functional.cross_entropy(model(x).float(), y)
        loss.backward()
        opt.step()
        if step == STEPS - 1:
            # the head's weight, gradient and AdamW state, less what they would take in bf16
            held = []
            for p in head:
                held.append(p)
                held.append(p.grad)
                for v in opt.state[p].values():
                    if torch.is_tensor(v) and v.is_cuda and v.shape == p.shape:
                        held.append(v)
            extra = sum(t.nbytes - t.numel() * 2 for t in held if t is not None)
            print(
                "HEAD dtype=%s params=%d held_bytes=%d"
                % (head[0].dtype, sum(p.numel() for p in head), storage_bytes(held)),
                flush=True,
            )
        del loss, x, y
        step_line(step)
    plant(
        "extra bytes of the head's weight, bias, gradients and AdamW exp_avg/exp_avg_sq in "
        "fp32 rather than bf16, after the last optimizer step",
        extra,
    )
    return model, opt


# --- Lightning -------------------------------------------------------------------------------


def larger_batch(new):
    import lightning.pytorch as pl
    import torchvision

    batch = 24 if new else 16
    inputs = []

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torchvision.models.resnet18(num_classes=100)

        def training_step(self, data, idx):
            x, y = data
            inputs.append(storage_bytes([x, y]))
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    class Images(torch.utils.data.Dataset):
        def __len__(self):
            return batch * STEPS

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            return torch.randn(3, 160, 160, generator=g), i % 100

    class Steps(pl.Callback):
        def on_train_batch_end(self, trainer, module, outputs, data, idx):
            step_line(idx)

    module = Module()
    trainer = pl.Trainer(
        accelerator="gpu", devices=1, max_steps=STEPS, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, callbacks=[Steps()],
    )
    loader = torch.utils.data.DataLoader(Images(), batch_size=batch, num_workers=0)
    trainer.fit(module, loader)
    plant(f"bytes of one input batch on the GPU (batch {batch}: images and labels)", inputs[-1])
    return trainer


# --- torchvision / plain PyTorch -------------------------------------------------------------


def resnet_loop(optimizer, set_to_none=True, batch=16):
    import torchvision

    model = torchvision.models.resnet18(num_classes=1000).to(DEV)
    model.train()
    if optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    grads_at_forward = 0
    for step in range(STEPS):
        opt.zero_grad(set_to_none=set_to_none)
        grads_at_forward = storage_bytes(p.grad for p in model.parameters())
        g = torch.Generator(device=DEV).manual_seed(step)
        x = torch.randn(batch, 3, 224, 224, device=DEV, generator=g)
        y = torch.randint(0, 1000, (batch,), device=DEV, generator=g)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        del loss, x, y
        step_line(step)
    return model, opt, grads_at_forward


def expandable(new):
    return resnet_loop("sgd")[:2]


def same(new):
    return resnet_loop("adamw")[:2]


def zero_grad_keep(new):
    model, opt, grads = resnet_loop("adamw", set_to_none=not new)
    plant(
        f"bytes of the gradients alive at the start of the last step's forward "
        f"(after zero_grad(set_to_none={not new}))",
        grads,
    )
    return model, opt


def mlp_batch(new):
    batch = 96 if new else 64
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 2048), torch.nn.GELU(),
        torch.nn.Linear(2048, 2048), torch.nn.GELU(),
        torch.nn.Linear(2048, 512),
    ).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    held = 0
    for step in range(STEPS):
        g = torch.Generator(device=DEV).manual_seed(step)
        x = torch.randn(batch, 128, 512, device=DEV, generator=g)
        y = torch.randn(batch, 128, 512, device=DEV, generator=g)
        held = storage_bytes([x, y])
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del loss, x, y
        step_line(step)
    plant(f"bytes of one input and target batch (batch {batch} x 128 x 512 fp32)", held)
    return model, opt


PAIRS = {
    "logits_kept": logits_kept,
    "ckpt_off": ckpt_off,
    "sdpa_eager": sdpa_eager,
    "fp32_head": fp32_head,
    "larger_batch": larger_batch,
    "expandable": expandable,
    "same": same,
    "zero_grad_keep": zero_grad_keep,
    "mlp_batch": mlp_batch,
}


def main(pairs=PAIRS):
    """Records one variant of one of `pairs` (name → function of `new`), as the arguments say."""
    out, pair, variant = sys.argv[1], sys.argv[2], sys.argv[3]
    assert variant in ("base", "new"), variant
    folder = os.path.join(out, pair)
    os.makedirs(folder, exist_ok=True)
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    print(f'PAIR pair={pair} variant={variant} alloc_conf="{conf}"', flush=True)
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = False
    torch.cuda.set_device(DEV)
    start_recording()
    alive = pairs[pair](variant == "new")  # kept alive until the snapshot is taken
    finish(os.path.join(folder, f"{variant}.pickle"))
    del alive


if __name__ == "__main__":
    main()
