"""A user's model shaped otherwise than CS336's constructor: a GPT-2-style decoder (learned positions, LayerNorm with
biases, GELU MLP, torch's SDPA, the output tied to the embedding, GPT-2's initialization, blocks under ``h.N``), built
from its own config object and argument names. ``make`` is the small factory its user writes so lmtune can build it."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class GPTConfig:
    vocab: int
    context_len: int
    width: int
    depth: int
    heads: int
    hidden: int


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.width)
        self.c_attn = nn.Linear(cfg.width, 3 * cfg.width)
        self.c_proj = nn.Linear(cfg.width, cfg.width)
        self.ln_2 = nn.LayerNorm(cfg.width)
        self.mlp = nn.Sequential(nn.Linear(cfg.width, cfg.hidden), nn.GELU(), nn.Linear(cfg.hidden, cfg.width))
        self.heads = cfg.heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + self.c_proj(y)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab, cfg.width)
        self.wpe = nn.Embedding(cfg.context_len, cfg.width)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.depth))
        self.ln_f = nn.LayerNorm(cfg.width)
        self.head = nn.Linear(cfg.width, cfg.vocab, bias=False)
        self.head.weight = self.wte.weight  # tied
        for module in self.modules():  # GPT-2's initialization, as nanoGPT writes it
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[-1], device=idx.device))
        for block in self.h:
            x = block(x)
        return self.head(self.ln_f(x))


def make(vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta, **ignored):
    """lmtune's arguments mapped to this model's (it has no RoPE: rope_theta is not used)."""
    return GPT(GPTConfig(vocab=vocab_size, context_len=context_length, width=d_model, depth=num_layers,
                         heads=num_heads, hidden=d_ff))
