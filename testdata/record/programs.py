"""Records training programs written with common libraries, each printing its own truth, for
memsnap's categories, phases and train steps.

Programs (one per process, random weights, small sizes, no downloads):
    lightning_auto    Lightning Trainer, automatic optimization, bf16-mixed, timm ViT, AdamW
    lightning_manual  Lightning Trainer, manual optimization (manual_backward), timm ViT, AdamW
    hf_trainer        transformers Trainer, Llama, gradient accumulation 2, AdamW
    accelerate        accelerate loop, GPT-2, accelerator.backward, AdamW
    peft_lora         PEFT LoRA on a bf16 Llama (fp32 adapters), AdamW
    resnet_amp        torchvision resnet50, autocast fp16 + GradScaler, SGD momentum, 6 steps of
                      different batch sizes
    compile_fused     Llama under torch.compile, AdamW(fused=True), 3 steps
    oom_survived      an MLP under a 2 GiB cap: one out-of-memory error caught and survived,
                      a step after it, then one that raises (snapshot taken after it)
    metadata_stages   a Llama whose forward hooks name each module with _set_memory_metadata

History is recorded from before the model is built (`stacks="python"`), after
`reset_peak_memory_stats()`. At each phase boundary the program synchronizes, opens and closes
an empty `record_function("memsnap.mark/STEP/NAME")` (a time stamp in the snapshot's
annotations, naming no phase) and prints, with exact bytes:

    MARK step=S name=NAME memory_allocated=N max_memory_allocated=N
    TRUTH step=S name=NAME param=N grad=N optimizer_state=N saved_activation=N saved_weight=N
    PTRS step=S name=NAME kind=param|grad|optimizer_state|saved_activation hex,hex,...

`param` counts the storages of the parameters and buffers on the GPU, `grad` those of `.grad`,
`optimizer_state` the tensors in `optimizer.state`, `saved_*` the storages autograd saved for
backward in the current step that are still alive (told weights from activations by whether
the storage is a parameter's). PTRS lists the storages' addresses, so a test can find each one
among the replayed blocks. At the end: `PEAK max_memory_allocated=N max_memory_reserved=N`.

Usage: python3 programs.py OUT_DIR PROGRAM
"""

import tempfile
import lzma
import os
import pickle
import sys
import weakref

import torch

DEV = torch.device("cuda", 0)


class Truth:
    """What the program holds, told by the program."""

    def __init__(self):
        self.model = None
        self.optimizers = []
        self.step = 0
        self.saved = {}  # storage ptr -> (nbytes, weakref to the storage's tensor)

    def params(self):
        out = {}
        if self.model is None:
            return out
        for t in list(self.model.parameters()) + list(self.model.buffers()):
            if t.is_cuda:
                s = t.untyped_storage()
                out[s.data_ptr()] = s.nbytes()
        return out

    def grads(self):
        out = {}
        if self.model is None:
            return out
        for p in self.model.parameters():
            if p.grad is not None and p.grad.is_cuda:
                s = p.grad.untyped_storage()
                out[s.data_ptr()] = s.nbytes()
        return out

    def optimizer_state(self):
        out = {}
        for opt in self.optimizers:
            opt = getattr(opt, "optimizer", opt)  # Lightning / accelerate wrappers
            for state in opt.state.values():
                for v in state.values():
                    if torch.is_tensor(v) and v.is_cuda:
                        s = v.untyped_storage()
                        out[s.data_ptr()] = s.nbytes()
        return out

    def saved_now(self):
        params = self.params()
        act, weight = {}, {}
        for ptr, (n, ref) in list(self.saved.items()):
            if ref() is None:
                del self.saved[ptr]
                continue
            (weight if ptr in params else act)[ptr] = n
        return act, weight

    def pack(self, t):
        if t.is_cuda and t.device.type == "cuda":
            s = t.untyped_storage()
            try:
                self.saved[s.data_ptr()] = (s.nbytes(), weakref.ref(t))
            except TypeError:
                pass
        return t

    def mark(self, name, ptrs=False):
        torch.cuda.synchronize()
        with torch.profiler.record_function(f"memsnap.mark/{self.step}/{name}"):
            pass
        kinds = {
            "param": self.params(),
            "grad": self.grads(),
            "optimizer_state": self.optimizer_state(),
        }
        act, weight = self.saved_now()
        kinds["saved_activation"] = act
        print(
            f"MARK step={self.step} name={name} memory_allocated={torch.cuda.memory_allocated()} "
            f"max_memory_allocated={torch.cuda.max_memory_allocated()}",
            flush=True,
        )
        print(
            f"TRUTH step={self.step} name={name} "
            + " ".join(f"{k}={sum(v.values())}" for k, v in kinds.items())
            + f" saved_weight={sum(weight.values())}",
            flush=True,
        )
        if ptrs:
            for k, v in kinds.items():
                text = ",".join(f"{p:x}" for p in sorted(v))
                print(f"PTRS step={self.step} name={name} kind={k} {text}", flush=True)

    def saving(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)


T = Truth()


def start_recording():
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
    torch.cuda.reset_peak_memory_stats()


def finish(out, kind):
    torch.cuda.synchronize()
    print(
        f"PEAK max_memory_allocated={torch.cuda.max_memory_allocated()} "
        f"max_memory_reserved={torch.cuda.max_memory_reserved()} "
        f"memory_allocated={torch.cuda.memory_allocated()}",
        flush=True,
    )
    name = os.path.join(out, f"memory_snapshot_{kind}.pickle.xz")
    with lzma.open(name, "wb", preset=9) as f:
        pickle.dump(torch.cuda.memory._snapshot(), f)


def llama(layers=4, hidden=512, dtype=None):
    import transformers as tf

    cfg = tf.LlamaConfig(
        vocab_size=16000, hidden_size=hidden, intermediate_size=hidden * 2 + hidden // 2,
        num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=8,
        max_position_embeddings=1024,
    )
    m = tf.LlamaForCausalLM(cfg)
    return m.to(dtype) if dtype is not None else m


def vit():
    import timm

    return timm.create_model(
        "vit_small_patch16_224", pretrained=False, num_classes=100, img_size=224
    )


# --- Lightning ------------------------------------------------------------------------------


def lightning(manual):
    import lightning as L

    class Marks(L.Callback):
        def on_train_batch_start(self, trainer, pl, batch, idx):
            T.step = idx
            T.mark("start", ptrs=True)

        def on_before_backward(self, trainer, pl, loss):
            T.mark("forward", ptrs=True)

        def on_after_backward(self, trainer, pl):
            T.mark("backward", ptrs=True)

        def on_before_optimizer_step(self, trainer, pl, optimizer):
            T.mark("before_optimizer")

        def on_train_batch_end(self, trainer, pl, outputs, batch, idx):
            T.mark("end", ptrs=True)

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = vit()
            self.automatic_optimization = not manual

        def training_step(self, batch, idx):
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self.net(x), y)
            if manual:
                opt = self.optimizers()
                opt.zero_grad()
                self.manual_backward(loss)
                opt.step()
                return None
            return loss

        def configure_optimizers(self):
            opt = torch.optim.AdamW(self.parameters(), lr=1e-4)
            T.optimizers.append(opt)
            return opt

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return 24

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            return torch.randn(3, 224, 224, generator=g), i % 100

    start_recording()
    module = Module()
    T.model = module
    trainer = L.Trainer(
        accelerator="gpu", devices=1, max_steps=3, precision="bf16-mixed",
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[Marks()], num_sanity_val_steps=0,
    )
    loader = torch.utils.data.DataLoader(Data(), batch_size=8)
    with T.saving():
        trainer.fit(module, loader)


# --- transformers Trainer --------------------------------------------------------------------


def hf_trainer():
    import transformers as tf

    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            ids = torch.randint(0, 16000, (256,), generator=g)
            return {"input_ids": ids, "labels": ids.clone()}

    class Marks(tf.TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            T.step = state.global_step
            T.mark("start", ptrs=True)

        def on_substep_end(self, args, state, control, **kw):
            T.mark("micro_backward", ptrs=True)

        def on_pre_optimizer_step(self, args, state, control, **kw):
            T.mark("backward", ptrs=True)

        def on_optimizer_step(self, args, state, control, **kw):
            T.mark("optimizer", ptrs=True)

        def on_step_end(self, args, state, control, **kw):
            T.mark("end", ptrs=True)

    start_recording()
    model = llama()
    T.model = model
    model.register_forward_hook(lambda *a: T.mark("forward", ptrs=True))
    args = tf.TrainingArguments(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=4,
        gradient_accumulation_steps=2, max_steps=3, learning_rate=1e-4, report_to=[],
        save_strategy="no", logging_strategy="no", dataloader_num_workers=0,
        optim="adamw_torch", disable_tqdm=True,
    )

    class Recording(tf.Trainer):
        def create_optimizer(self):
            opt = super().create_optimizer()
            T.optimizers.append(opt)
            return opt

    trainer = Recording(model=model, args=args, train_dataset=Tokens(), callbacks=[Marks()])
    with T.saving():
        trainer.train()


# --- loops written by hand around a library ---------------------------------------------------


def accelerate_loop():
    import transformers as tf
    from accelerate import Accelerator

    start_recording()
    acc = Accelerator()
    cfg = tf.GPT2Config(n_layer=4, n_embd=512, n_head=8, vocab_size=16000, n_positions=512)
    model = tf.GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, opt = acc.prepare(model, opt)
    T.model, T.optimizers = model, [opt]
    for step in range(3):
        T.step = step
        T.mark("start", ptrs=True)
        ids = torch.randint(0, 16000, (4, 256), device=acc.device)
        with T.saving():
            loss = model(input_ids=ids, labels=ids).loss
        T.mark("forward", ptrs=True)
        acc.backward(loss)
        T.mark("backward", ptrs=True)
        opt.step()
        T.mark("optimizer", ptrs=True)
        opt.zero_grad(set_to_none=True)
        del loss
        T.mark("end", ptrs=True)


def peft_lora():
    from peft import LoraConfig, get_peft_model

    start_recording()
    base = llama(dtype=torch.bfloat16)
    base = base.to(DEV)
    model = get_peft_model(
        base, LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "v_proj"])
    )
    for n, p in model.named_parameters():
        if p.requires_grad:
            p.data = p.data.float()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    T.model, T.optimizers = model, [opt]
    for step in range(3):
        T.step = step
        T.mark("start", ptrs=True)
        ids = torch.randint(0, 16000, (4, 512), device=DEV)
        with T.saving(), torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        T.mark("forward", ptrs=True)
        loss.backward()
        T.mark("backward", ptrs=True)
        opt.step()
        T.mark("optimizer", ptrs=True)
        opt.zero_grad(set_to_none=True)
        del loss
        T.mark("end", ptrs=True)


def resnet_amp():
    import torchvision

    start_recording()
    model = torchvision.models.resnet50(num_classes=1000).to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda")
    T.model, T.optimizers = model, [opt]
    for step, batch in enumerate([16, 32, 48, 24, 40, 8]):
        T.step = step
        T.mark("start", ptrs=True)
        x = torch.randn(batch, 3, 224, 224, device=DEV)
        y = torch.randint(0, 1000, (batch,), device=DEV)
        with T.saving(), torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        T.mark("forward", ptrs=True)
        scaler.scale(loss).backward()
        T.mark("backward", ptrs=True)
        scaler.step(opt)
        scaler.update()
        T.mark("optimizer", ptrs=True)
        opt.zero_grad(set_to_none=True)
        del loss, x, y
        T.mark("end", ptrs=True)


def compile_fused():
    start_recording()
    model = llama().to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    step_model = torch.compile(model)
    T.model, T.optimizers = model, [opt]
    for step in range(3):
        T.step = step
        T.mark("start", ptrs=True)
        ids = torch.randint(0, 16000, (4, 512), device=DEV)
        # saved-tensor hooks would change what the compiler builds: no saved_* truth here
        loss = step_model(input_ids=ids, labels=ids).loss
        T.mark("forward", ptrs=True)
        loss.backward()
        T.mark("backward", ptrs=True)
        opt.step()
        T.mark("optimizer", ptrs=True)
        opt.zero_grad(set_to_none=True)
        del loss
        T.mark("end", ptrs=True)


def oom_survived():
    """Under a 2 GiB cap: a request the program catches and survives, a training step after
    it, then one that raises. Prints both messages (`CAUGHT ...`, `FATAL ...`)."""
    cap = 2 << 30
    torch.cuda.set_per_process_memory_fraction(cap / torch.cuda.get_device_properties(0).total_memory)
    start_recording()
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(8)]).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    T.model, T.optimizers = model, [opt]

    def step(n):
        T.step = n
        T.mark("start", ptrs=True)
        x = torch.randn(512, 2048, device=DEV)
        loss = model(x).square().mean()
        T.mark("forward")
        loss.backward()
        T.mark("backward")
        opt.step()
        opt.zero_grad(set_to_none=True)
        T.mark("optimizer")

    step(0)
    try:
        torch.empty(3 << 30, dtype=torch.uint8, device=DEV)
    except torch.OutOfMemoryError as e:
        print("CAUGHT " + str(e).replace("\n", " "), flush=True)
    step(1)
    try:
        torch.empty(cap, dtype=torch.uint8, device=DEV)
    except torch.OutOfMemoryError as e:
        print("FATAL " + str(e).replace("\n", " "), flush=True)


def metadata_stages():
    """A Llama whose forward pre-hooks name each module with `_set_memory_metadata` (and
    whose forward hooks restore the parent's name), as PyTorch's memory tools suggest."""
    set_meta = torch.cuda.memory._set_memory_metadata
    start_recording()
    model = llama().to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    T.model, T.optimizers = model, [opt]
    for name, m in model.named_modules():
        parent = name.rpartition(".")[0]
        m.register_forward_pre_hook(lambda mod, args, n=name: set_meta(n))
        m.register_forward_hook(lambda mod, args, out, n=parent: set_meta(n))
    for step in range(2):
        T.step = step
        T.mark("start", ptrs=True)
        ids = torch.randint(0, 16000, (4, 512), device=DEV)
        with T.saving():
            loss = model(input_ids=ids, labels=ids).loss
        T.mark("forward", ptrs=True)
        loss.backward()
        T.mark("backward", ptrs=True)
        opt.step()
        T.mark("optimizer", ptrs=True)
        opt.zero_grad(set_to_none=True)
        del loss
        T.mark("end", ptrs=True)


PROGRAMS = {
    "lightning_auto": lambda: lightning(manual=False),
    "lightning_manual": lambda: lightning(manual=True),
    "hf_trainer": hf_trainer,
    "accelerate": accelerate_loop,
    "peft_lora": peft_lora,
    "resnet_amp": resnet_amp,
    "compile_fused": compile_fused,
    "oom_survived": oom_survived,
    "metadata_stages": metadata_stages,
}


def main():
    out, kind = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    torch.cuda.set_device(DEV)
    PROGRAMS[kind]()
    finish(out, kind)


if __name__ == "__main__":
    main()
