"""Learning-rate schedules: cosine with linear warm-up, as used to train LLaMA (Touvron et al. 2023), and
warmup-stable-decay (WSD: Hu et al. 2024, MiniCPM; Hägele et al. 2024), whose constant stable phase lets a run
of one length fork a cooldown at any shorter budget from a checkpoint taken before that budget's cooldown."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

SCHEDULES = ("cosine", "wsd")
# How a WSD cooldown falls from the peak to the floor, as a function of its progress p in (0, 1]:
# 1 - sqrt(p) (Hägele et al. 2024 found it better than linear at equal length), linear, or a half cosine.
COOLDOWN_SHAPES = {"1-sqrt": lambda p: 1.0 - math.sqrt(p), "linear": lambda p: 1.0 - p,
                   "cosine": lambda p: 0.5 * (1.0 + math.cos(math.pi * p))}


class Schedule(Protocol):
    """A run's LR schedule, as lmtune.training.config.TrainConfig holds it (this module does not import the
    config: the config imports the schedules to check its own)."""

    schedule: str
    lr: float
    min_lr_ratio: float
    warmup_steps: int
    steps: int
    cooldown_fraction: float
    cooldown_shape: str


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
    """The cosine schedule of a run of ``total_steps`` optimizer steps (0-based step index; the last is total-1)."""
    return cosine_lr(step, lr, lr * min_lr_ratio, warmup_steps, max(total_steps - 1, warmup_steps))


def wsd_lr(step: int, max_lr: float, min_lr: float, warmup_steps: int, total_steps: int, cooldown_steps: int,
           shape: str = "1-sqrt") -> float:
    """Linear warm-up to max_lr, max_lr until the cooldown, then ``shape`` down to min_lr at the last step
    (0-based index total_steps - 1). The first cooldown_steps - 1 ... 0 steps before the end decay."""
    if step < warmup_steps:
        return max_lr * step / warmup_steps
    last_stable = total_steps - 1 - cooldown_steps
    if step <= last_stable:
        return max_lr
    progress = min(1.0, (step - last_stable) / cooldown_steps)
    return min_lr + (max_lr - min_lr) * COOLDOWN_SHAPES[shape](progress)


def cooldown_steps(t: Schedule) -> int:
    """Steps of a WSD run's cooldown: cooldown_fraction of its steps, at least one."""
    return max(1, round(t.cooldown_fraction * t.steps))


def stable_until(t: Schedule) -> int:
    """The last 0-based step a WSD run trains at its peak LR: a run of the same LR and seed, warm-up and
    batch but more steps is identical up to here, so its checkpoint at or before it starts this run's cooldown."""
    return t.steps - 1 - cooldown_steps(t)


def scheduled_lr(step: int, t: Schedule) -> float:
    """The LR at 0-based ``step`` of the run ``t`` configures, by its schedule."""
    if t.schedule == "wsd":
        return wsd_lr(step, t.lr, t.lr * t.min_lr_ratio, t.warmup_steps, t.steps, cooldown_steps(t), t.cooldown_shape)
    return lr_at(step, t.lr, t.min_lr_ratio, t.warmup_steps, t.steps)


def first_lr_difference(old: Callable[[int], float], new: Callable[[int], float],
                        steps: int) -> tuple[int, float, float] | None:
    """Whether the schedule ``new`` (a step's LR by its 0-based index: ScheduleSpec.lr_function's) trains the first
    ``steps`` steps at ``old``'s LRs, so that a checkpoint of ``old``'s run after them is a state ``new``'s passes
    through: None if so, else the first (1-based) step whose LR differs and its two LRs (old, new)."""
    for index in range(steps):  # step k's update uses the LR of 0-based index k - 1
        before, after = old(index), new(index)
        if not math.isclose(before, after, rel_tol=1e-12, abs_tol=0.0):
            return index + 1, before, after
    return None

