"""A user's model whose rotary tables live in a module-level cache: every model built in the process shares one
RoPE module (its buffers). Each model trains correctly on its own, but two built in one process share memory, so
lmtune refuses to fuse it and runs each of its trials in a process of its own."""

import torch
from torch import nn

_ROPE_CACHE: dict[tuple, nn.Module] = {}


class Rope(nn.Module):
    def __init__(self, head_dim: int, context_length: int, theta: float):
        super().__init__()
        freqs = theta ** (-torch.arange(0, head_dim, 2).float() / head_dim)
        angles = torch.outer(torch.arange(context_length).float(), freqs)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[-2]
        cos, sin = self.cos[:t], self.sin[:t]
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)


def shared_rope(head_dim, context_length, theta) -> nn.Module:
    key = (head_dim, context_length, theta)
    if key not in _ROPE_CACHE:
        _ROPE_CACHE[key] = Rope(head_dim, context_length, theta)
    return _ROPE_CACHE[key]


class Layer(nn.Module):
    def __init__(self, d_model, num_heads, d_ff, rope):
        super().__init__()
        self.heads, self.rope = num_heads, rope
        self.norm1, self.norm2 = nn.RMSNorm(d_model), nn.RMSNorm(d_model)
        self.q, self.k, self.v, self.o = (nn.Linear(d_model, d_model, bias=False) for _ in range(4))
        self.up, self.down = nn.Linear(d_model, d_ff, bias=False), nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x):
        b, t, c = x.shape
        h = self.norm1(x)
        q, k, v = (p(h).view(b, t, self.heads, -1).transpose(1, 2) for p in (self.q, self.k, self.v))
        y = torch.nn.functional.scaled_dot_product_attention(self.rope(q), self.rope(k), v, is_causal=True)
        x = x + self.o(y.transpose(1, 2).reshape(b, t, c))
        return x + self.down(torch.relu(self.up(self.norm2(x))))


class CachedRopeLM(nn.Module):
    def __init__(self, vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta):
        super().__init__()
        rope = shared_rope(d_model // num_heads, context_length, rope_theta)
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.layers = nn.ModuleList(Layer(d_model, num_heads, d_ff, rope) for _ in range(num_layers))
        self.norm = nn.RMSNorm(d_model)
        self.unembed = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, tokens):
        x = self.embedding(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.unembed(self.norm(x))
