"""A CS336-shaped Transformer language model, written from scratch in plain PyTorch, as a student's own code would
be: its own Linear, Embedding, RMSNorm, RoPE, SwiGLU and attention (no torch.nn.Linear, no SDPA), the handout's
names and constructor, plus an AdamW and a cosine schedule with the handout's signatures.

It is lmtune's example of "your model": the README, the tests and the benchmarks train it with

    lmtune run --space quick_edge --model examples/cs336_model.py:TransformerLM
    lmtune train --model examples/cs336_model.py:TransformerLM \
        --optimizer examples/cs336_model.py:AdamW --schedule examples/cs336_model.py:get_lr_cosine_schedule

lmtune calls ``TransformerLM(vocab_size=, context_length=, d_model=, num_layers=, num_heads=, d_ff=, rope_theta=,
device=, dtype=)`` and trains ``forward(token_ids[B, T]) -> logits[B, T, vocab]``; ``use_rope`` is an ablation switch
of this model's own (``--model-set use_rope=false``: no position embedding at all, NoPE).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch
from torch import nn


class Linear(nn.Module):
    """y = x W^T without a bias; W (out, in) from a normal truncated at 3 std, std = sqrt(2 / (in + out))."""

    def __init__(self, in_features: int, out_features: int, device=None, dtype=None):
        super().__init__()
        std = math.sqrt(2.0 / (in_features + out_features))
        weight = torch.empty(out_features, in_features, device=device, dtype=dtype)
        self.weight = nn.Parameter(nn.init.trunc_normal_(weight, std=std, a=-3 * std, b=3 * std))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("...i,oi->...o", x, self.weight)


class Embedding(nn.Module):
    """A lookup table of (num_embeddings, embedding_dim), normal truncated at 3 with std 1."""

    def __init__(self, num_embeddings: int, embedding_dim: int, device=None, dtype=None):
        super().__init__()
        weight = torch.empty(num_embeddings, embedding_dim, device=device, dtype=dtype)
        self.weight = nn.Parameter(nn.init.trunc_normal_(weight, std=1.0, a=-3.0, b=3.0))

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.weight[token_ids]


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * g, computed in at least float32 whatever the input's dtype."""

    def __init__(self, d_model: int, eps: float = 1e-5, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        in_dtype = x.dtype
        x = x.to(torch.promote_types(x.dtype, torch.float32))
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * self.weight).to(in_dtype)


class SwiGLU(nn.Module):
    """W2 (SiLU(W1 x) * W3 x)."""

    def __init__(self, d_model: int, d_ff: int, device=None, dtype=None):
        super().__init__()
        self.w1 = Linear(d_model, d_ff, device, dtype)
        self.w2 = Linear(d_ff, d_model, device, dtype)
        self.w3 = Linear(d_model, d_ff, device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.w1(x)
        return self.w2(gate * torch.sigmoid(gate) * self.w3(x))


class RotaryPositionalEmbedding(nn.Module):
    """Rotates each pair (x[2i], x[2i+1]) of a head by position * theta^(-2i/d_k)."""

    def __init__(self, theta: float, d_k: int, max_seq_len: int, device=None):
        super().__init__()
        inv_freq = theta ** (-torch.arange(0, d_k, 2, device=device, dtype=torch.float32) / d_k)
        angles = torch.outer(torch.arange(max_seq_len, device=device, dtype=torch.float32), inv_freq)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor, token_positions: torch.Tensor) -> torch.Tensor:
        cos, sin = self.cos[token_positions], self.sin[token_positions]
        even, odd = x[..., 0::2], x[..., 1::2]
        rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
        return rotated.flatten(-2).to(x.dtype)


def softmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    shifted = x - x.amax(dim=dim, keepdim=True)
    exp = shifted.exp()
    return exp / exp.sum(dim=dim, keepdim=True)


def scaled_dot_product_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                 mask: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T / sqrt(d_k)) v, positions where ``mask`` is False never attended to."""
    scores = torch.einsum("...qd,...kd->...qk", q, k) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("...qk,...kd->...qd", softmax(scores, dim=-1), v)


class MultiHeadSelfAttention(nn.Module):
    """Causal multi-head self-attention, RoPE on queries and keys (none when ``rope`` is None)."""

    def __init__(self, d_model: int, num_heads: int, rope: RotaryPositionalEmbedding | None, device=None, dtype=None):
        super().__init__()
        self.num_heads = num_heads
        self.q_proj = Linear(d_model, d_model, device, dtype)
        self.k_proj = Linear(d_model, d_model, device, dtype)
        self.v_proj = Linear(d_model, d_model, device, dtype)
        self.output_proj = Linear(d_model, d_model, device, dtype)
        self.rope = rope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        *batch, seq_len, d_model = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:  # (..., T, d_model) -> (..., heads, T, d_head)
            return t.view(*batch, seq_len, self.num_heads, d_model // self.num_heads).transpose(-3, -2)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        if self.rope is not None:
            positions = torch.arange(seq_len, device=x.device)
            q, k = self.rope(q, positions), self.rope(k, positions)
        causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=x.device).tril()
        out = scaled_dot_product_attention(q, k, v, causal)
        return self.output_proj(out.transpose(-3, -2).reshape(*batch, seq_len, d_model))


class TransformerBlock(nn.Module):
    """Pre-norm: x + attn(norm(x)), then + ffn(norm(.))."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int, rope: RotaryPositionalEmbedding | None,
                 device=None, dtype=None):
        super().__init__()
        self.ln1 = RMSNorm(d_model, device=device, dtype=dtype)
        self.attn = MultiHeadSelfAttention(d_model, num_heads, rope, device, dtype)
        self.ln2 = RMSNorm(d_model, device=device, dtype=dtype)
        self.ffn = SwiGLU(d_model, d_ff, device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.ffn(self.ln2(x))


class TransformerLM(nn.Module):
    """Token embedding, ``num_layers`` pre-norm blocks, a final RMSNorm and an untied output projection."""

    def __init__(self, vocab_size: int, context_length: int, d_model: int, num_layers: int, num_heads: int,
                 d_ff: int, rope_theta: float, device=None, dtype=None, use_rope: bool = True):
        super().__init__()
        self.context_length = context_length
        self.token_embeddings = Embedding(vocab_size, d_model, device, dtype)
        # One RoPE shared by this model's layers: built here, so every model has its own tables.
        rope = RotaryPositionalEmbedding(rope_theta, d_model // num_heads, context_length, device) if use_rope \
            else None
        self.layers = nn.ModuleList(TransformerBlock(d_model, num_heads, d_ff, rope, device, dtype)
                                    for _ in range(num_layers))
        self.ln_final = RMSNorm(d_model, device=device, dtype=dtype)
        self.lm_head = Linear(d_model, vocab_size, device, dtype)

    def forward(self, in_indices: torch.Tensor) -> torch.Tensor:
        x = self.token_embeddings(in_indices)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.ln_final(x))


class AdamW(torch.optim.Optimizer):
    """AdamW as the handout writes it: bias correction folded into the step size, decay as theta -= lr * wd * theta."""

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01):
        if lr < 0:
            raise ValueError(f"invalid learning rate {lr}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure: Callable | None = None):
        loss = None if closure is None else closure()
        for group in self.param_groups:
            lr, (beta1, beta2), eps, decay = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["t"] = 0
                    state["m"] = torch.zeros_like(p)
                    state["v"] = torch.zeros_like(p)
                state["t"] += 1
                t, m, v = state["t"], state["m"], state["v"]
                m.mul_(beta1).add_(p.grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                step_size = lr * math.sqrt(1 - beta2 ** t) / (1 - beta1 ** t)
                p.addcdiv_(m, v.sqrt().add_(eps), value=-step_size)
                p.add_(p, alpha=-lr * decay)
        return loss


def get_lr_cosine_schedule(it: int, max_learning_rate: float, min_learning_rate: float, warmup_iters: int,
                           cosine_cycle_iters: int) -> float:
    """Linear warm-up to the maximum, a cosine down to the minimum at ``cosine_cycle_iters``, the minimum after."""
    if it < warmup_iters:
        return it / warmup_iters * max_learning_rate
    if it > cosine_cycle_iters:
        return min_learning_rate
    progress = (it - warmup_iters) / max(1, cosine_cycle_iters - warmup_iters)
    return min_learning_rate + 0.5 * (1 + math.cos(math.pi * progress)) * (max_learning_rate - min_learning_rate)
