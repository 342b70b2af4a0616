"""Records one training program at one problem size, for `memsnap whatif --scale`: the same
program at other sizes, each in its own process, printing its own truth.

Programs (random weights, no downloads, three training steps, history recorded from before the
model is built with `stacks="python"`, after `reset_peak_memory_stats()`):
    cnn SIZE          torchvision resnet50, fp32, SGD momentum, batch SIZE of 224x224 images
    llama SIZE ATTN   a transformers Llama (8 layers, hidden 1024), AdamW, batch 4, sequence
                      length SIZE, attention ATTN (`eager`: the scores are materialised and grow
                      with the square of the length; `sdpa`: a fused kernel)

With `--cap BYTES` the run is capped with `set_per_process_memory_fraction(BYTES / total)`
first. Prints, with exact bytes:

    CAP bytes=N total=N                          (with --cap: the cap PyTorch computes)
    STEP step=S max_memory_allocated=N max_memory_reserved=N memory_allocated=N
    PEAK max_memory_allocated=N max_memory_reserved=N memory_allocated=N
    FATAL <the OutOfMemoryError message on one line>   (when a step runs out of memory)

The snapshot is written in either case, as `OUT_DIR/memory_snapshot_TAG.pickle.xz`.

Usage: python3 sweeps.py OUT_DIR TAG cnn|llama SIZE [eager|sdpa] [--cap BYTES]
"""

import lzma
import os
import pickle
import sys

import torch

DEV = torch.device("cuda", 0)


def resnet(batch):
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None).to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(s):
        x = torch.randn(batch, 3, 224, 224, device=DEV)
        y = torch.randint(0, 1000, (batch,), device=DEV)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def llama(seq, attn):
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(
        vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
        num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=4096,
    )
    cfg._attn_implementation = attn
    model = tf.LlamaForCausalLM(cfg).to(DEV)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(s):
        ids = torch.randint(0, cfg.vocab_size, (4, seq), device=DEV)
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def main():
    out, tag, kind, size = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    rest = sys.argv[5:]
    cap = None
    if "--cap" in rest:
        i = rest.index("--cap")
        cap = int(rest[i + 1])
        del rest[i : i + 2]
    if cap is not None:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(cap / total)
        print(f"CAP bytes={int(cap / total * total)} total={total}", flush=True)
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
    torch.cuda.reset_peak_memory_stats()
    step = resnet(size) if kind == "cnn" else llama(size, rest[0])
    try:
        for s in range(3):
            step(s)
            torch.cuda.synchronize()
            print(
                f"STEP step={s} max_memory_allocated={torch.cuda.max_memory_allocated()} "
                f"max_memory_reserved={torch.cuda.max_memory_reserved()} "
                f"memory_allocated={torch.cuda.memory_allocated()}",
                flush=True,
            )
    except torch.OutOfMemoryError as e:
        print("FATAL " + str(e).replace("\n", " "), flush=True)
    torch.cuda.synchronize()
    print(
        f"PEAK max_memory_allocated={torch.cuda.max_memory_allocated()} "
        f"max_memory_reserved={torch.cuda.max_memory_reserved()} "
        f"memory_allocated={torch.cuda.memory_allocated()}",
        flush=True,
    )
    with lzma.open(os.path.join(out, f"memory_snapshot_{tag}.pickle.xz"), "wb", preset=9) as f:
        pickle.dump(torch.cuda.memory._snapshot(), f)


if __name__ == "__main__":
    main()
