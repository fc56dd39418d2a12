"""A user's model whose attention has no causal mask: every position sees the tokens after it (lmtune must refuse
it: its next-token loss would be meaningless)."""

import torch
import torch.nn.functional as F
from torch import nn


class BidirectionalLM(nn.Module):
    def __init__(self, vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta,
                 device=None, dtype=None):
        super().__init__()
        self.heads = num_heads
        self.embed = nn.Embedding(vocab_size, d_model, device=device, dtype=dtype)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False, device=device, dtype=dtype)
        self.out = nn.Linear(d_model, vocab_size, bias=False, device=device, dtype=dtype)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(token_ids)
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in self.qkv(x).split(c, dim=2))
        y = F.scaled_dot_product_attention(q, k, v)  # is_causal forgotten
        return self.out(x + y.transpose(1, 2).reshape(b, t, c))
