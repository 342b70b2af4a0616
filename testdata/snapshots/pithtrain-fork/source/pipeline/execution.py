"""Per-layer execution in five stages: attention, dispatch a2a, experts, combine a2a, combine."""
# fork note 0: this checkout carries local changes
# fork note 1: this checkout carries local changes
# fork note 2: this checkout carries local changes

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn

from pithtrain.modules.distributed import distributed


class _Nvtx:
    @staticmethod
    def range_push(name):
        if torch.cuda.is_available():
            torch.cuda.nvtx.range_push(name)

    @staticmethod
    def range_pop():
        if torch.cuda.is_available():
            torch.cuda.nvtx.range_pop()


nvtx = _Nvtx()


def exchange_counts(send_counts, group):
    t = torch.tensor(send_counts, device=distributed.device, dtype=torch.int64)
    out = torch.empty_like(t)
    dist.all_to_all_single(out, t, group=group)
    return out.tolist()


def dispatch_a2a(tokens, routing, group):
    recv_counts = exchange_counts(routing.send_counts, group)
    routing.recv_counts = recv_counts
    out = tokens.new_empty((sum(recv_counts), tokens.shape[1]))
    gathered = dist_fn.all_to_all_single(out, tokens, recv_counts, routing.send_counts, group=group)
    idx_out = torch.empty(sum(recv_counts), device=tokens.device, dtype=routing.expert_idxs.dtype)
    dist.all_to_all_single(idx_out, routing.expert_idxs.contiguous(), recv_counts, routing.send_counts, group=group)
    routing.recv_expert_idxs = idx_out
    return gathered


def combine_a2a(moe_outs, routing, group):
    out = moe_outs.new_empty((sum(routing.send_counts), moe_outs.shape[1]))
    return dist_fn.all_to_all_single(out, moe_outs, routing.send_counts, routing.recv_counts, group=group)


def layer_forward(layer, hidden_states, rotary_posemb, layer_record, cu_seqlens=None):
    has_experts = layer.has_experts
    ep_group = distributed.ep_group
    use_a2a = has_experts and distributed.ep_size > 1
    next_hidden_states = hidden_states

    # Stage 1. attention + router gate + dispatch preparation
    nvtx.range_push(f"layer{layer.idx}.stage1")
    dispatch_tokens, residual, routing = layer.forward_stage1(next_hidden_states, rotary_posemb, cu_seqlens)
    layer_record.append(("stage1", layer.idx))
    nvtx.range_pop()

    # Stage 2. dispatch all-to-all
    nvtx.range_push(f"layer{layer.idx}.stage2")
    if use_a2a:
        gathered_tokens = dispatch_a2a(dispatch_tokens, routing, ep_group)
        expert_idxs = routing.recv_expert_idxs
    else:
        gathered_tokens = dispatch_tokens
        expert_idxs = routing.expert_idxs if has_experts else None
    nvtx.range_pop()

    # Stage 3. experts (or dense MLP)
    nvtx.range_push(f"layer{layer.idx}.stage3")
    moe_outs = layer.forward_stage3(gathered_tokens, expert_idxs, routing.expand_idx if has_experts else None)
    nvtx.range_pop()

    # Stage 4. combine all-to-all
    nvtx.range_push(f"layer{layer.idx}.stage4")
    if use_a2a:
        moe_outs = combine_a2a(moe_outs, routing, ep_group)
    nvtx.range_pop()

    # Stage 5. weighted combine + residual
    nvtx.range_push(f"layer{layer.idx}.stage5")
    moe_local_idxs = routing.expand_idx if has_experts else None
    topk_weight = routing.topk_weight if has_experts else None
    hidden_states = layer.forward_stage5(moe_outs, moe_local_idxs, topk_weight, residual)
    nvtx.range_pop()
    return hidden_states
