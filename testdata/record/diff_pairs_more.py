"""Records more planted pairs for `memsnap diff BASE NEW`, in the manner of diff_pairs.py (whose
helpers it uses): one program per pair, run twice, as `base` and as `new`, each run its own
process, the two differing by one planted change (two in `two_changes`).

Pairs (random weights, data made in the program, three steps):
    loss_graph_kept  a timm resnet18, AdamW; after each training step a validation loss on a
                     held-out batch (model.eval(), grad left on) is added to a running total;
                     base `running += vloss.item()`, new `running = running + vloss` (no
                     .item()/.detach()): each step's validation autograd graph, with the
                     activations it saved for a backward that never comes, stays alive
    peft_full        a transformers Llama, AdamW; base trains PEFT LoRA adapters (r=8 on q_proj
                     and v_proj, base weights frozen), new trains all weights without PEFT
                     (gradients and AdamW state for every parameter)
    accelerate_bf16  an accelerate.Accelerator loop over a transformers GPT-2, AdamW; base
                     mixed_precision="no", new "bf16" (autocast: fp32 weights and optimizer
                     state, bf16 activations)
    no_grad_eval     an eval loop over a transformers BERT classifier (model.eval()); base under
                     torch.no_grad(), new without it (activations saved for a backward that
                     never comes, freed with each batch's outputs)
    two_changes      a plain PyTorch token MLP with a 8000-word head, AdamW; new plants two
                     independent changes: every step's logits kept in a Python list (detached),
                     and an EMA copy of the weights kept on the GPU
    gnn_batch        a torch-geometric two-layer GCN, Adam, full-batch on a random graph;
                     base 20000 nodes and 300000 edges, new 1.5x both

Every run: `reset_peak_memory_stats()` and `_record_memory_history(max_entries=1_000_000,
stacks="python")` before the model is built; `torch.manual_seed(0)`. Prints, with exact bytes:

    PAIR pair=P variant=V alloc_conf="..."
    STEP step=S memory_allocated=N max_memory_allocated=N      (after each step, synchronized)
    PLANT what="..." bytes=N      (what a planted change holds, where the program can count it;
                                   some pairs print the same measure in both variants, so that
                                   new minus base is the planted bytes)
    VERSIONS torch=... ...
    PEAK max_memory_allocated=N max_memory_reserved=N memory_allocated=N

and writes the snapshot to OUT_DIR/PAIR/VARIANT.pickle (diff_pairs_more.sh compresses it).

Usage: python3 diff_pairs_more.py OUT_DIR PAIR base|new
"""

import torch

import diff_pairs
from diff_pairs import DEV, STEPS, llama_config, plant, step_line, storage_bytes, tokens


def allocated():
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated()


def grad_and_state_bytes(params, opt):
    """Bytes of the CUDA gradients and optimizer state of `params`."""
    held = []
    for p in params:
        held.append(p.grad)
        for v in opt.state.get(p, {}).values():
            held.append(v)
    return storage_bytes(held)


# --- timm ------------------------------------------------------------------------------------


def loss_graph_kept(new):
    import timm

    model = timm.create_model("resnet18", pretrained=False, num_classes=100).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator(device=DEV).manual_seed(99)
    vx = torch.randn(16, 3, 96, 96, device=DEV, generator=g)
    vy = torch.randint(0, 100, (16,), device=DEV, generator=g)
    running = 0.0
    kept = 0
    for step in range(STEPS):
        model.train()
        g = torch.Generator(device=DEV).manual_seed(step)
        x = torch.randn(16, 3, 96, 96, device=DEV, generator=g)
        y = torch.randint(0, 100, (16,), device=DEV, generator=g)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del loss, x, y
        # the validation loss of this step, summed for a log line at the end
        before = allocated()
        model.eval()
        vloss = torch.nn.functional.cross_entropy(model(vx), vy)
        if new:
            running = running + vloss  # the bug: keeps this step's graph alive
        else:
            running += vloss.item()
        del vloss
        kept += allocated() - before
        step_line(step)
    print(f"RUNNING type={type(running).__name__} value={float(running):.4f}", flush=True)
    plant(
        "memory_allocated() after each step's validation-loss block minus before it, summed "
        "over the steps: what the running validation loss keeps alive (its autograd graphs "
        "with their saved activations; 0 when the loss is taken with .item())",
        kept,
    )
    return model, opt, running


# --- transformers / peft / accelerate --------------------------------------------------------


def peft_full(new):
    import transformers as tf

    cfg = llama_config(layers=4, hidden=512, heads=8, vocab=16000)
    model = tf.LlamaForCausalLM(cfg)
    if not new:
        import peft

        lora = peft.LoraConfig(
            r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
            task_type="CAUSAL_LM",
        )
        model = peft.get_peft_model(model, lora)
    model = model.to(DEV)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    print(
        "TRAINABLE params=%d of %d"
        % (sum(p.numel() for p in params), sum(p.numel() for p in model.parameters())),
        flush=True,
    )
    opt = torch.optim.AdamW(params, lr=1e-4)
    held = 0
    for step in range(STEPS):
        ids = tokens(4, 256, cfg.vocab_size, step)
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        held = grad_and_state_bytes(params, opt)
        opt.zero_grad(set_to_none=True)
        del out, ids
        step_line(step)
    plant(
        "bytes of the gradients and AdamW state (exp_avg, exp_avg_sq) of the trainable "
        "parameters after the last optimizer step (LoRA adapters only in base, every weight "
        "in new)",
        held,
    )
    return model, opt


def accelerate_bf16(new):
    import accelerate
    import transformers as tf

    acc = accelerate.Accelerator(mixed_precision="bf16" if new else "no")
    print(f"MIXED_PRECISION {acc.mixed_precision}", flush=True)
    cfg = tf.GPT2Config(
        vocab_size=8000, n_positions=512, n_embd=384, n_layer=4, n_head=6, use_cache=False,
    )
    model = tf.GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, opt = acc.prepare(model, opt)
    model.train()
    forward_left = 0
    for step in range(STEPS):
        ids = tokens(8, 256, cfg.vocab_size, step)
        before = allocated()
        out = model(input_ids=ids, labels=ids)
        forward_left = allocated() - before
        acc.backward(out.loss)
        opt.step()
        opt.zero_grad(set_to_none=True)
        del out, ids
        step_line(step)
    plant(
        "memory_allocated() after the last step's forward minus before it: what the forward "
        "leaves alive (activations saved for backward, logits, loss)",
        forward_left,
    )
    return acc, model, opt


def no_grad_eval(new):
    import contextlib

    import transformers as tf

    cfg = tf.BertConfig(
        vocab_size=8000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
        intermediate_size=1024, max_position_embeddings=512, num_labels=10,
    )
    model = tf.BertForSequenceClassification(cfg).to(DEV)
    model.eval()
    forward_left = 0
    correct = 0
    total = 0.0
    for step in range(STEPS):
        ids = tokens(32, 256, cfg.vocab_size, step)
        labels = torch.randint(0, 10, (32,), generator=torch.Generator().manual_seed(step)).to(DEV)
        with contextlib.nullcontext() if new else torch.no_grad():
            before = allocated()
            out = model(input_ids=ids, labels=labels)
            forward_left = allocated() - before
            total += out.loss.item()
            correct += int((out.logits.argmax(-1) == labels).sum().item())
        del out, ids, labels
        step_line(step)
    print(f"EVAL loss_sum={total:.4f} correct={correct} grad_enabled={new}", flush=True)
    plant(
        "memory_allocated() after the last batch's forward minus before it: what the forward "
        "leaves alive (outputs; with grad enabled also the activations saved for backward)",
        forward_left,
    )
    return model


# --- plain PyTorch ---------------------------------------------------------------------------


class TokenMLP(torch.nn.Module):
    def __init__(self, vocab=8000, dim=512, hidden=2048):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.body = torch.nn.Sequential(
            torch.nn.Linear(dim, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, dim),
            torch.nn.GELU(),
            torch.nn.Linear(dim, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, dim),
        )
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, ids):
        return self.head(self.body(self.embed(ids)))


def two_changes(new):
    vocab = 8000
    model = TokenMLP(vocab=vocab).to(DEV)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=1e-4)
    ema = []
    if new:  # change 1: an EMA copy of the weights, kept on the GPU
        ema = [p.detach().clone() for p in params]
    kept = []  # change 2 (new only): every step's logits, kept for "later"
    for step in range(STEPS):
        ids = tokens(8, 256, vocab, step)
        logits = model(ids)
        if new:
            kept.append(logits.detach())
        loss = torch.nn.functional.cross_entropy(logits.view(-1, vocab), ids.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if new:
            with torch.no_grad():
                torch._foreach_lerp_(ema, [p.detach() for p in params], 0.01)
        del logits, loss, ids
        step_line(step)
    plant(
        f"bytes of the EMA copy of the weights kept on the GPU ({len(ema)} tensors; 0 in base)",
        storage_bytes(ema),
    )
    plant(
        f"bytes of the {len(kept)} logits tensors kept in a Python list at the end "
        f"(8 x 256 x {vocab} fp32 each; 0 in base)",
        storage_bytes(kept),
    )
    return model, opt, ema, kept


# --- torch-geometric -------------------------------------------------------------------------


def gnn_batch(new):
    from torch_geometric.nn import GCNConv

    nodes = 30000 if new else 20000
    edges = 15 * nodes
    features, hidden, classes = 128, 256, 16

    class GCN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = GCNConv(features, hidden)
            self.conv2 = GCNConv(hidden, classes)

        def forward(self, x, edge_index):
            x = torch.relu(self.conv1(x, edge_index))
            return self.conv2(x, edge_index)

    model = GCN().to(DEV)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator(device=DEV).manual_seed(0)
    x = torch.randn(nodes, features, device=DEV, generator=g)
    edge_index = torch.randint(0, nodes, (2, edges), device=DEV, generator=g)
    y = torch.randint(0, classes, (nodes,), device=DEV, generator=g)
    print(f"GRAPH nodes={nodes} edges={edges} features={features}", flush=True)
    for step in range(STEPS):
        loss = torch.nn.functional.cross_entropy(model(x, edge_index), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del loss
        step_line(step)
    plant(
        f"bytes of the graph on the GPU (node features, edge_index, labels; {nodes} nodes, "
        f"{edges} edges)",
        storage_bytes([x, edge_index, y]),
    )
    return model, opt, x, edge_index, y


PAIRS = {
    "loss_graph_kept": loss_graph_kept,
    "peft_full": peft_full,
    "accelerate_bf16": accelerate_bf16,
    "no_grad_eval": no_grad_eval,
    "two_changes": two_changes,
    "gnn_batch": gnn_batch,
}


if __name__ == "__main__":
    diff_pairs.main(PAIRS)
