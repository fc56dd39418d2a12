"""AdamW and gradient clipping with hyperparameters per member of a fused model.

Each parameter of a ``FusedLM`` has the members on its first dimension, so a member's
learning rate, weight decay, betas and eps are (K,) tensors broadcast along it. The arithmetic is
torch.optim.AdamW's (decoupled weight decay, bias-corrected moments), so a member trains exactly as
it would alone, and ``member_moments`` hands a member's moments back for an ordinary AdamW state dict.
Each parameter also has the model's own multipliers of the LR and the weight decay (μP's, all 1 under SP),
applied as ``build_optimizer``'s param groups apply them: lr * lr_scale, weight_decay * weight_decay_scale.
A member whose ``active`` flag is off is frozen: nothing of it changes, not even when its gradient is NaN.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from lmtune.fused.model import FusedLM
from lmtune.training.config import TrainConfig


@dataclass
class MemberHyperparameters:
    """The AdamW settings of each member, as (K,) tensors in the parameters' dtype and device."""

    weight_decay: torch.Tensor
    beta1: torch.Tensor
    beta2: torch.Tensor
    eps: torch.Tensor
    grad_clip: torch.Tensor

    @classmethod
    def of(cls, settings: Sequence[TrainConfig], like: torch.Tensor) -> MemberHyperparameters:
        def column(name: str) -> torch.Tensor:
            return torch.tensor([float(getattr(t, name)) for t in settings], dtype=like.dtype, device=like.device)

        return cls(*(column(name) for name in ("weight_decay", "beta1", "beta2", "eps", "grad_clip")))

    def keep(self, index: torch.Tensor) -> None:
        for name in ("weight_decay", "beta1", "beta2", "eps", "grad_clip"):
            setattr(self, name, getattr(self, name).index_select(0, index))


def _per_member(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """(K,) values shaped to broadcast along ``like``'s member dimension."""
    return values.view(-1, *([1] * (like.dim() - 1)))


class MemberAdamW:
    """AdamW over a fused model's parameters, every hyperparameter per member.

    Weight decay applies to the matrices (embeddings and linear weights), never to gains or biases, as
    ``build_optimizer`` does for one model: ``model``'s multipliers are a member's (lmtune.fused.model.FusedLM).
    """

    def __init__(self, model: FusedLM, hyper: MemberHyperparameters):
        self.named = list(model.stacked.named_parameters())
        self.hyper = hyper
        self.lr_scale = model.lr_multipliers
        self.decay_scale = model.weight_decay_multipliers
        self.distinct_lr_scales = sorted(set(self.lr_scale.values()))
        first = self.named[0][1]
        self.steps = torch.zeros(first.shape[0], dtype=first.dtype, device=first.device)
        self.exp_avg = {name: torch.zeros_like(p) for name, p in self.named}
        self.exp_avg_sq = {name: torch.zeros_like(p) for name, p in self.named}

    @torch.no_grad()
    def step(self, lrs: torch.Tensor, active: torch.Tensor) -> None:
        """One update at learning rates ``lrs`` (K,) for the members where ``active`` (K,) is true. Every
        tensor is updated in place (a compiled step then writes into the same memory every time)."""
        h = self.hyper
        self.steps.copy_(torch.where(active, self.steps + 1, self.steps))
        bias_correction1 = 1 - h.beta1 ** self.steps
        bias_correction2_sqrt = (1 - h.beta2 ** self.steps).sqrt()
        # Each distinct LR multiplier's LRs and step sizes, once (SP: one, and no multiplication at all).
        scaled = {s: lrs if s == 1.0 else lrs * s for s in self.distinct_lr_scales}
        step_sizes = {s: lr / bias_correction1 for s, lr in scaled.items()}
        for name, p in self.named:
            grad = p.grad
            if grad is None:
                continue
            on = _per_member(active, p)
            lr_scale, decay_scale = self.lr_scale[name], self.decay_scale[name]
            wd = h.weight_decay if decay_scale == 1.0 else h.weight_decay * decay_scale
            decay = _per_member(scaled[lr_scale] * wd, p) if decay_scale > 0 else torch.zeros_like(on, dtype=p.dtype)
            m = self.exp_avg[name].lerp(grad, _per_member(1 - h.beta1, p))
            v = self.exp_avg_sq[name] * _per_member(h.beta2, p) + _per_member(1 - h.beta2, p) * grad * grad
            denom = v.sqrt() / _per_member(bias_correction2_sqrt, p) + _per_member(h.eps, p)
            updated = p * (1 - decay) - _per_member(step_sizes[lr_scale], p) * m / denom
            p.copy_(torch.where(on, updated, p))
            self.exp_avg[name].copy_(torch.where(on, m, self.exp_avg[name]))
            self.exp_avg_sq[name].copy_(torch.where(on, v, self.exp_avg_sq[name]))

    def zero_grad(self) -> None:
        for _, p in self.named:
            p.grad = None

    def keep(self, positions: list[int]) -> None:
        """Keep the members at ``positions`` (after the model's own ``keep``)."""
        index = torch.tensor(positions, dtype=torch.long, device=self.steps.device)
        self.steps = self.steps.index_select(0, index)
        self.hyper.keep(index)
        for name in self.exp_avg:
            self.exp_avg[name] = self.exp_avg[name].index_select(0, index)
            self.exp_avg_sq[name] = self.exp_avg_sq[name].index_select(0, index)

    def member_moments(self, k: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Member k's (exp_avg, exp_avg_sq) per parameter name, copied."""
        return {name: (self.exp_avg[name][k].clone(), self.exp_avg_sq[name][k].clone()) for name, _ in self.named}

    def load_member_moments(self, k: int, moments: dict[str, tuple[torch.Tensor, torch.Tensor]], steps: int) -> None:
        """Member k's moments and step count from a single-model AdamW (a resumed checkpoint)."""
        for name, (m, v) in moments.items():
            self.exp_avg[name][k].copy_(m)
            self.exp_avg_sq[name][k].copy_(v)
        self.steps[k] = steps


@torch.no_grad()
def clip_member_gradients(model: nn.Module, max_norms: torch.Tensor) -> torch.Tensor:
    """Each member's global gradient norm (K,) before clipping; each member's gradients clipped to its
    own ``max_norms`` entry (0: not clipped), as torch.nn.utils.clip_grad_norm_ does for one model."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    squares = torch.stack([g.pow(2).flatten(1).sum(1) for g in grads]).sum(0)
    norms = squares.sqrt()
    coef = torch.where(max_norms > 0, (max_norms / (norms + 1e-6)).clamp(max=1.0), torch.ones_like(norms))
    for g in grads:
        g.mul_(_per_member(coef, g))
    return norms
