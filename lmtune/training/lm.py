"""What lmtune needs of a language model, whoever wrote it.

A run trains lmtune's own TransformerLM (lmtune.training.model) or the model its user brings (``--model``,
lmtune.usercode): any nn.Module whose ``forward(token_ids[B, T])`` gives logits ``[B, T, vocab]``. What the training
loops, the fused groups and the probes need of any model alike is here:

    LanguageModelLoss(model, z_loss)   forward(idx, targets): the mean loss lmtune trains (cross-entropy + z-loss)
    block_parameters(model)            its parameters by transformer block (the relative update size per block)
    ModelSize                          parameter counts and training FLOPs per token

How a run builds its model, and what differs between lmtune's and the user's (probes, multipliers, size), is the
run's training spec's (lmtune.training.spec.TrainSpec), asked by the callers.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

import torch
from torch import nn

from lmtune.training.config import RunConfig
from lmtune.training.model import lm_loss

log = logging.getLogger(__name__)


class LanguageModelLoss(nn.Module):
    """``forward(idx, targets)``: the mean next-token loss of ``model``'s logits (cross-entropy + z-loss, in at least
    float32): what a training step differentiates and torch.compile compiles, the model inside."""

    def __init__(self, model: nn.Module, z_loss: float = 0.0):
        super().__init__()
        self.model = model
        self.z_loss = z_loss

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return lm_loss(self.model(idx), targets, self.z_loss)


# The first dotted component of a parameter name that is a layer index: "layers.3.attn.q" -> "layers.3".
_LAYER_INDEX = re.compile(r"^((?:[^.]+\.)*?\d+)\.")


def block_parameters(model: nn.Module) -> list[list[nn.Parameter]]:
    """The model's parameters by transformer block, in the model's order: a block is everything under a name with a
    layer index (``blocks.3.`` in lmtune's model, ``layers.3.`` in CS336's); parameters outside every block (the
    embedding, the final norm, the output) are left out. A model without layer indices: one group per top-level
    module."""
    groups: dict[str, list[nn.Parameter]] = {}
    for name, param in model.named_parameters():
        if (match := _LAYER_INDEX.match(name)) is not None:
            groups.setdefault(match.group(1), []).append(param)
    if groups:
        return list(groups.values())
    for name, param in model.named_parameters():
        groups.setdefault(name.split(".")[0], []).append(param)
    return list(groups.values())


@dataclass(frozen=True)
class ModelSize:
    """A model's parameter counts and training FLOPs per token."""

    total: int
    """Every parameter (a tied one once)."""
    non_embedding: int
    """All but the token embedding and the output projection (the convention of CS336's "17M")."""
    flops_per_token: float
    """Training FLOPs per token: 6 x (non-embedding + output projection) + attention, 12 n_layers context d_model."""
    estimated: bool = False
    """True where the FLOPs are a formula's over a user's model's parameters (its count failed): the embedding and
    output told apart by shape, the attention term the config's. lmtune's own model's formula is exact."""
    counted: bool = False
    """True where the FLOPs of a user's model were counted (lmtune.usercode.spec.counted_flops_per_token)."""


def formula_flops_per_token(config: RunConfig, non_embedding: int) -> float:
    """The 6N rule over a user's model's non-embedding parameters, its output projection's matmul (tied or not) and
    attention's 12 n_layers context d_model: the fallback where its FLOPs cannot be counted."""
    m = config.model
    return 6.0 * (non_embedding + m.vocab_size * m.d_model) + 12.0 * m.n_layers * m.context_length * m.d_model
