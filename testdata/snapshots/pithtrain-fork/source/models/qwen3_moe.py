"""A small Qwen3-MoE style model, split into the five stages that the pipeline overlaps."""
# fork note 0: this checkout carries local changes
# fork note 1: this checkout carries local changes
# fork note 2: this checkout carries local changes
# fork note 3: this checkout carries local changes
# fork note 4: this checkout carries local changes
# fork note 5: this checkout carries local changes
# fork note 6: this checkout carries local changes
# fork note 7: this checkout carries local changes
# fork note 8: this checkout carries local changes
# fork note 9: this checkout carries local changes
# fork note 10: this checkout carries local changes

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from pithtrain.pipeline.dualpipev import WeightGradStore, run_backward


@dataclass
class Qwen3MoeConfig:
    vocab_size: int = 32000
    hidden_size: int = 1024
    num_heads: int = 16
    num_kv_heads: int = 4
    head_dim: int = 64
    num_layers: int = 8
    first_k_dense_replace: int = 1
    dense_intermediate_size: int = 2816
    num_experts: int = 16
    num_experts_per_tok: int = 4
    moe_intermediate_size: int = 768
    rope_theta: float = 1e6


# -- zero-bubble linear ------------------------------------------------------
class ZBLinearFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x, weight)
        return F.linear(x, weight)

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors

        def grad_weight_fn():
            g = grad_out.flatten(0, -2).T @ x.flatten(0, -2)
            if weight.grad is None:
                weight.grad = g
            else:
                weight.grad += g

        if WeightGradStore.enabled:
            WeightGradStore.put(grad_weight_fn)
        else:
            grad_weight_fn()
        return grad_out @ weight, None


class ZBLinear(nn.Linear):
    def forward(self, x):
        return ZBLinearFunc.apply(x, self.weight)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def apply_rotary(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def rotary_embedding(seq_len, head_dim, theta, device, dtype):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    t = torch.arange(seq_len, device=device, dtype=torch.float32)
    freqs = torch.outer(t, inv)
    return freqs.cos().to(dtype), freqs.sin().to(dtype)


class Attention(nn.Module):
    def __init__(self, cfg: Qwen3MoeConfig):
        super().__init__()
        self.cfg = cfg
        h, nh, nkv, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = ZBLinear(h, nh * hd, bias=False)
        self.k_proj = ZBLinear(h, nkv * hd, bias=False)
        self.v_proj = ZBLinear(h, nkv * hd, bias=False)
        self.o_proj = ZBLinear(nh * hd, h, bias=False)
        self.q_norm = RMSNorm(hd)
        self.k_norm = RMSNorm(hd)

    def forward(self, x, rotary_posemb):
        b, s, _ = x.shape
        cfg = self.cfg
        q = self.q_norm(self.q_proj(x).view(b, s, cfg.num_heads, cfg.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, s, cfg.num_kv_heads, cfg.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, s, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
        cos, sin = rotary_posemb
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o_proj(o.transpose(1, 2).reshape(b, s, -1))


def silu_mul(g, u):
    return F.silu(g) * u


class DenseMLP(nn.Module):
    def __init__(self, h, inter):
        super().__init__()
        self.gate_proj = ZBLinear(h, inter, bias=False)
        self.up_proj = ZBLinear(h, inter, bias=False)
        self.down_proj = ZBLinear(inter, h, bias=False)

    def forward(self, x):
        return self.down_proj(silu_mul(self.gate_proj(x), self.up_proj(x)))


def _grouped_mm_ok(device):
    if device.type != "cuda" or not hasattr(torch, "_grouped_mm"):
        return False
    try:
        a = torch.randn(32, 64, device=device, dtype=torch.bfloat16, requires_grad=True)
        w = torch.randn(2, 64, 32, device=device, dtype=torch.bfloat16, requires_grad=True)
        offs = torch.tensor([16, 32], device=device, dtype=torch.int32)
        torch._grouped_mm(a, w, offs=offs).sum().backward()
        return True
    except Exception:
        return False


class GroupedLinear(nn.Module):
    """One weight per local expert: tokens arrive sorted by expert, with cumulative offsets."""

    def __init__(self, num_experts, in_f, out_f, use_grouped_mm):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, in_f, out_f))
        self.use_grouped_mm = use_grouped_mm

    def forward(self, x, offs, ks):
        if self.use_grouped_mm:
            return torch._grouped_mm(x, self.weight, offs=offs)
        outs, start = [], 0
        for e, k in enumerate(ks):
            outs.append(x[start : start + k] @ self.weight[e])
            start += k
        return torch.cat(outs, dim=0)


class Qwen3MoeExperts(nn.Module):
    def __init__(self, num_local_experts, h, inter, use_grouped_mm):
        super().__init__()
        self.gate_proj = GroupedLinear(num_local_experts, h, inter, use_grouped_mm)
        self.up_proj = GroupedLinear(num_local_experts, h, inter, use_grouped_mm)
        self.down_proj = GroupedLinear(num_local_experts, inter, h, use_grouped_mm)

    def forward(self, x, grouped_mm_offs, ks=None, ks_tensor=None):
        g = self.gate_proj(x, grouped_mm_offs, ks)
        u = self.up_proj(x, grouped_mm_offs, ks)
        return self.down_proj(silu_mul(g, u), grouped_mm_offs, ks)


class Qwen3MoeMLP(nn.Module):
    def __init__(self, cfg, num_local_experts, use_grouped_mm):
        super().__init__()
        self.gate = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        self.experts = Qwen3MoeExperts(num_local_experts, cfg.hidden_size, cfg.moe_intermediate_size, use_grouped_mm)


@dataclass
class Routing:
    expert_idxs: torch.Tensor = None
    expand_idx: torch.Tensor = None
    topk_weight: torch.Tensor = None
    send_counts: list = None
    recv_counts: list = None
    recv_expert_idxs: torch.Tensor = None
    sort_idx: torch.Tensor = None


def padded_index_gather(x, idx):
    return x.index_select(0, idx)


def scatter_for_grouped_gemm(tokens, local_expert_idxs, num_local_experts, align):
    order = torch.argsort(local_expert_idxs, stable=True)
    counts = torch.bincount(local_expert_idxs, minlength=num_local_experts)
    ks = counts.tolist()
    padded = [((k + align - 1) // align) * align for k in ks]
    total = sum(padded)
    output_tokens = tokens.new_zeros((total, tokens.shape[1]))
    dst, src_start, pos = [], 0, 0
    for k, p in zip(ks, padded):
        dst.append(torch.arange(pos, pos + k, device=tokens.device))
        pos += p
    dst = torch.cat(dst)
    output_tokens = output_tokens.index_copy(0, dst, tokens.index_select(0, order))
    offs = torch.tensor(list(_cumsum(padded)), device=tokens.device, dtype=torch.int32)
    return output_tokens, offs, padded, order, dst


def _cumsum(xs):
    acc = 0
    for x in xs:
        acc += x
        yield acc


class Qwen3MoeDecoderLayer(nn.Module):
    def __init__(self, cfg, idx, ep_size, ep_rank, use_grouped_mm):
        super().__init__()
        self.cfg, self.idx = cfg, idx
        self.ep_size, self.ep_rank = ep_size, ep_rank
        self.input_layernorm = RMSNorm(cfg.hidden_size)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size)
        self.self_attn = Attention(cfg)
        self.has_experts = idx >= cfg.first_k_dense_replace
        if self.has_experts:
            self.num_local_experts = cfg.num_experts // ep_size
            self.mlp = Qwen3MoeMLP(cfg, self.num_local_experts, use_grouped_mm)
        else:
            self.mlp = DenseMLP(cfg.hidden_size, cfg.dense_intermediate_size)

    def forward_stage1_compute(self, hidden_states, rotary_posemb):
        residual = hidden_states
        h = self.input_layernorm(hidden_states)
        h = self.self_attn(h, rotary_posemb)
        h = residual + h
        residual = h
        h = self.post_attention_layernorm(h)
        if not self.has_experts:
            return h, residual, None
        logits = self.mlp.gate(h).float()
        weights, expert_idxs = torch.topk(torch.softmax(logits, dim=-1), self.cfg.num_experts_per_tok, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return h, residual, (weights.to(h.dtype), expert_idxs)

    def prepare_dispatch(self, h, gate_out):
        weights, expert_idxs = gate_out
        tokens = h.flatten(0, 1)
        k = self.cfg.num_experts_per_tok
        flat_experts = expert_idxs.flatten()
        dest_rank = flat_experts // self.num_local_experts
        sort_idx = torch.argsort(dest_rank, stable=True)
        expand_idx = torch.arange(tokens.shape[0], device=h.device).repeat_interleave(k)[sort_idx]
        dispatch_tokens = padded_index_gather(tokens, expand_idx)
        send_counts = torch.bincount(dest_rank, minlength=self.ep_size).tolist()
        routing = Routing(
            expert_idxs=flat_experts[sort_idx],
            expand_idx=expand_idx,
            topk_weight=weights.flatten()[sort_idx],
            send_counts=send_counts,
            sort_idx=sort_idx,
        )
        return dispatch_tokens, routing

    def forward_stage1(self, hidden_states, rotary_posemb, cu_seqlens=None):
        h, residual, gate_out = self.forward_stage1_compute(hidden_states, rotary_posemb)
        if not self.has_experts:
            return h, residual, None
        dispatch_tokens, routing = self.prepare_dispatch(h, gate_out)
        return dispatch_tokens, residual, routing

    def forward_stage3(self, gathered_tokens, expert_idxs, expand_idx):
        if not self.has_experts:
            return self.mlp(gathered_tokens)
        local = expert_idxs - self.ep_rank * self.num_local_experts
        output_tokens, offs, ks, order, dst = scatter_for_grouped_gemm(gathered_tokens, local, self.num_local_experts, 16)
        outs = self.mlp.experts(output_tokens, offs, ks=ks, ks_tensor=None)
        outs = padded_index_gather(outs, dst)
        reverse_shuffle_idxs = torch.argsort(order)
        outs = padded_index_gather(outs, reverse_shuffle_idxs)
        return outs

    def forward_stage5(self, moe_outs, moe_local_idxs, topk_weight, residual):
        if not self.has_experts:
            return residual + moe_outs
        b, s, h = residual.shape
        weighted = moe_outs * topk_weight.unsqueeze(-1)
        combined = torch.zeros((b * s, h), device=residual.device, dtype=moe_outs.dtype)
        combined = combined.index_add(0, moe_local_idxs, weighted)
        return residual + combined.view(b, s, h)


class Qwen3MoeModel(nn.Module):
    """One pipeline chunk: optional embedding (prolog), decoder layers, optional head (epilog)."""

    def __init__(self, cfg, layer_ids, ep_size, ep_rank, with_prolog, with_epilog, use_grouped_mm):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size) if with_prolog else None
        self.layers = nn.ModuleList(
            [Qwen3MoeDecoderLayer(cfg, i, ep_size, ep_rank, use_grouped_mm) for i in layer_ids]
        )
        self.norm = RMSNorm(cfg.hidden_size) if with_epilog else None
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False) if with_epilog else None
        self._rotary = None

    def init_weights(self):
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
            else:
                nn.init.normal_(p, std=0.02)

    def rotary(self, seq_len, device, dtype):
        if self._rotary is None or self._rotary[0].shape[0] != seq_len:
            self._rotary = rotary_embedding(seq_len, self.cfg.head_dim // 2 * 2, self.cfg.rope_theta, device, dtype)
        cos, sin = self._rotary
        half = self.cfg.head_dim // 2
        return cos[:, :half], sin[:, :half]

    def forward_prolog(self, input_ids):
        hidden_states = self.embed_tokens(input_ids)
        return hidden_states

    def forward_epilog(self, hidden_states):
        hidden_states = self.norm(hidden_states)
        logits = self.lm_head(hidden_states)
        return logits

    def forward(self, x):
        from pithtrain.pipeline.execution import layer_forward

        if self.embed_tokens is not None:
            x = self.forward_prolog(x)
        rotary_posemb = self.rotary(x.shape[1], x.device, x.dtype)
        layer_record = []
        for layer in self.layers:
            x = layer_forward(layer, x, rotary_posemb, layer_record)
        if self.lm_head is not None:
            x = self.forward_epilog(x)
        return x

    @classmethod
    def overlapped_forward_backward(cls, module0, inputs0, objective0, labels0, loss1, outputs1, grads1):
        outputs0 = module0(*inputs0)
        outputs0 = [outputs0] if isinstance(outputs0, torch.Tensor) else list(outputs0)
        loss0 = objective0(outputs0[0], labels0) if objective0 is not None else None
        if loss1 is not None:
            loss1.backward()
            loss1.detach_()
        else:
            run_backward(outputs1, grads1)
        return outputs0, loss0
