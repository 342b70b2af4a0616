"""Records snapshots of programs written with Hugging Face transformers, for memsnap's generic
attribution: a Llama-style model trained with AdamW (plain, with gradient checkpointing, under
torch.compile, with memory metadata set per phase), GPT-2 under DDP on two GPUs, and a
Qwen3-MoE (or Mixtral) model. Random weights, small sizes, no downloads.

Each run records two training steps with `stacks="python"` (peak stats reset when recording
starts) and prints, with exact bytes, `torch.cuda.memory_allocated()` after each phase
(`PHASE step=S phase=P memory_allocated=N`) and at the end
`PEAK max_memory_allocated=N max_memory_reserved=N memory_allocated=N`.

Usage (a machine with CUDA GPUs, torch and transformers):
    python3 real_world.py OUT_DIR MODEL          # llama, llama_ckpt, llama_compile, llama_meta, moe
    torchrun --nproc_per_node=2 real_world.py OUT_DIR gpt2_ddp
"""

import lzma
import os
import pickle
import sys

import torch


def build(kind):
    import transformers as tf

    if kind.startswith("llama"):
        cfg = tf.LlamaConfig(
            vocab_size=32000, hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
            num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=1024,
        )
        return tf.LlamaForCausalLM(cfg)
    if kind == "moe":
        if hasattr(tf, "Qwen3MoeConfig"):
            cfg = tf.Qwen3MoeConfig(
                vocab_size=32000, hidden_size=512, intermediate_size=1024,
                moe_intermediate_size=256, num_hidden_layers=4, num_attention_heads=8,
                num_key_value_heads=8, num_experts=16, num_experts_per_tok=4,
                decoder_sparse_step=1, max_position_embeddings=1024,
            )
            return tf.Qwen3MoeForCausalLM(cfg)
        cfg = tf.MixtralConfig(
            vocab_size=32000, hidden_size=512, intermediate_size=512, num_hidden_layers=4,
            num_attention_heads=8, num_key_value_heads=8, num_local_experts=8,
            num_experts_per_tok=2, max_position_embeddings=1024,
        )
        return tf.MixtralForCausalLM(cfg)
    if kind == "gpt2_ddp":
        cfg = tf.GPT2Config(n_layer=4, n_embd=512, n_head=8, vocab_size=32000, n_positions=512)
        return tf.GPT2LMHeadModel(cfg)
    raise SystemExit(f"unknown model {kind}")


def main():
    out, kind = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    rank = 0
    ddp = kind == "gpt2_ddp"
    if ddp:
        torch.distributed.init_process_group("nccl")
        rank = torch.distributed.get_rank()
        torch.cuda.set_device(rank)
    device = torch.device("cuda", torch.cuda.current_device())
    torch.manual_seed(0)
    model = build(kind).to(device)
    model.train()
    if kind == "llama_ckpt":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if ddp:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    step_model = torch.compile(model) if kind == "llama_compile" else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    meta = kind == "llama_meta" and hasattr(torch.cuda.memory, "_set_memory_metadata")

    def phase(step, name):
        torch.cuda.synchronize()
        print(f"PHASE rank={rank} step={step} phase={name} memory_allocated={torch.cuda.memory_allocated()}", flush=True)

    def set_meta(text):
        if meta:
            torch.cuda.memory._set_memory_metadata(text)

    batch, seq = 4, 512
    first = 1 if kind == "llama_compile" else 0  # compile during an unrecorded step
    for step in range(first + 2):
        if step == first:
            torch.cuda.synchronize()
            torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
            torch.cuda.reset_peak_memory_stats()
            phase(step, "start")
        tokens = torch.randint(0, 32000, (batch, seq), device=device)
        set_meta("forward")
        loss = step_model(input_ids=tokens, labels=tokens).loss
        phase(step, "forward")
        set_meta("backward")
        loss.backward()
        phase(step, "backward")
        set_meta("optimizer")
        optimizer.step()
        phase(step, "optimizer")
        optimizer.zero_grad(set_to_none=True)
        del loss
        set_meta("")
        phase(step, "zero_grad")
    torch.cuda.synchronize()
    print(
        f"PEAK rank={rank} max_memory_allocated={torch.cuda.max_memory_allocated()} "
        f"max_memory_reserved={torch.cuda.max_memory_reserved()} "
        f"memory_allocated={torch.cuda.memory_allocated()}",
        flush=True,
    )
    name = os.path.join(out, f"memory_snapshot_{kind}_rank{rank}.pickle.xz")
    with lzma.open(name, "wb", preset=9) as f:
        pickle.dump(torch.cuda.memory._snapshot(), f)
    if ddp:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
