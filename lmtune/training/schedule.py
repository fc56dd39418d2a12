"""Cosine learning-rate schedule with linear warm-up, as used to train LLaMA (Touvron et al. 2023)."""

from __future__ import annotations

import math


def cosine_lr(step: int, max_lr: float, min_lr: float, warmup_steps: int, cosine_steps: int) -> float:
    """alpha_t for t < T_w: t/T_w * max; T_w <= t <= T_c: min + (1 + cos(pi (t-T_w)/(T_c-T_w)))/2 (max-min);
    t > T_c: min. With T_c = the last step the decay ends at min_lr exactly at the last step."""
    if step < warmup_steps:
        return max_lr * step / warmup_steps
    if step <= cosine_steps:
        if cosine_steps == warmup_steps:
            return min_lr
        progress = (step - warmup_steps) / (cosine_steps - warmup_steps)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (max_lr - min_lr)
    return min_lr


def lr_at(step: int, lr: float, min_lr_ratio: float, warmup_steps: int, total_steps: int) -> float:
    """The schedule of a run of ``total_steps`` optimizer steps (0-based step index; the last is total-1)."""
    return cosine_lr(step, lr, lr * min_lr_ratio, warmup_steps, max(total_steps - 1, warmup_steps))
