"""A user's model whose forward ends in a softmax: it returns probabilities, not logits (lmtune must refuse it)."""

import torch
from torch import nn


class ProbabilityLM(nn.Module):
    def __init__(self, vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.mix = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, vocab_size)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(token_ids).cumsum(dim=1)  # causal: each position sums its prefix
        return torch.softmax(self.out(torch.tanh(self.mix(x))), dim=-1)
