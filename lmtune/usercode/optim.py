"""The user's optimizer (``--optimizer MODULE:CLASS``) and LR schedule (``--schedule MODULE:FUNCTION``), each called
as CS336's are, and checked once before any step trains.

    CLASS(param_groups, lr=, betas=(beta1, beta2), eps=, weight_decay=)     a torch.optim.Optimizer
    FUNCTION(it, max_learning_rate, min_learning_rate, warmup_iters, cosine_cycle_iters) -> the LR of step ``it``

lmtune still sets every param group's ``lr`` before each step (the schedule's value times the group's multiplier),
so an optimizer must read ``param_group["lr"]``: one that keeps an LR of its own would train every trial of a
sweep at the same rate. The schedule is called with lmtune's values (the config's lr, lr * min_lr_ratio,
warmup_steps, and steps - 1, so a cosine ends at its minimum on the last step), positionally.
"""

from __future__ import annotations

import io
import math
import numbers
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from lmtune.errors import LmtuneError, shown
from lmtune.files import plain
from lmtune.training.config import RunConfig, TrainConfig
from lmtune.training.schedule import scheduled_lr
from lmtune.usercode.config import UserCode
from lmtune.usercode.guard import guarded
from lmtune.usercode.imports import load


def build_user_optimizer(code: UserCode, groups: list[dict], t: TrainConfig) -> torch.optim.Optimizer:
    """The user's optimizer over ``groups`` (lmtune's param groups: their params, weight_decay and lr)."""
    cls = load(code.optimizer, "--optimizer")
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
        raise LmtuneError(f"--optimizer {code.optimizer}: names {shown(cls)}, not a subclass of "
                          "torch.optim.Optimizer; name your optimizer's class")
    with guarded("--optimizer", code.optimizer, f"{cls.__name__}(param_groups, lr=, betas=, eps=, weight_decay=)",
                 "give it that signature (a small subclass can map it to yours)"):
        return cls(groups, lr=t.lr, betas=(t.beta1, t.beta2), eps=t.eps, weight_decay=t.weight_decay)


def check_optimizer(config: RunConfig) -> None:
    """Refuse, in one line, an optimizer that does not follow ``param_group["lr"]``: one step at lr 0 must leave a
    throw-away model unchanged, and one at the config's lr must move it."""
    code, t = config.code, config.train
    probe = nn.Sequential(nn.Linear(4, 4, bias=False), nn.LayerNorm(4))
    decay = [p for p in probe.parameters() if p.ndim >= 2]
    rest = [p for p in probe.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": t.weight_decay, "lr": t.lr},
              {"params": rest, "weight_decay": 0.0, "lr": t.lr}]
    optimizer = build_user_optimizer(code, groups, t)
    for lr, should_move in ((0.0, False), (t.lr, True)):
        before = [p.detach().clone() for p in probe.parameters()]
        for group in optimizer.param_groups:
            group["lr"] = lr
        for p in probe.parameters():
            p.grad = torch.ones_like(p)
        with guarded("--optimizer", code.optimizer, "its step()"):
            optimizer.step()
        moved = any(not torch.equal(a, p) for a, p in zip(before, probe.parameters(), strict=True))
        if moved != should_move:
            what = "changed the parameters at param_group['lr'] = 0" if moved else \
                f"left the parameters unchanged at param_group['lr'] = {lr:g}"
            raise LmtuneError(f"--optimizer {code.optimizer}: its step() {what}: lmtune sets each group's lr before "
                              "every step (the schedule), so the step must use group['lr'], not an LR of its own")
    check_checkpointable(optimizer, code.optimizer)


SAVED_AS_WEIGHTS = (torch.Tensor, int, float, bool, str, type(None), torch.dtype, torch.device, torch.Size)
"""What a checkpoint may hold (among containers: dicts, lists, tuples)."""


def check_checkpointable(optimizer: torch.optim.Optimizer, spec: str) -> None:
    """Refuse, in one line, an optimizer whose state a checkpoint cannot hold: every checkpoint is read back with
    torch.load(weights_only=True) (tensors, numbers, text, lists and dicts; numpy scalars are converted at save)."""
    with guarded("--optimizer", spec, "its state_dict()"):
        state = optimizer.state_dict()
    state, buffer = plain(state), io.BytesIO()
    try:
        torch.save(state, buffer)
        torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
    except Exception:  # noqa: BLE001 - pickling or weights_only's refusal, whatever the object
        kinds = sorted({f"{type(v).__module__}.{type(v).__qualname__}".removeprefix("builtins.")
                        for v in _leaves(state) if not isinstance(v, SAVED_AS_WEIGHTS)})
        raise LmtuneError(f"--optimizer {spec}: its state holds {', '.join(kinds[:3]) or 'an object'}, which a "
                          "checkpoint cannot hold (lmtune reads checkpoints back with torch.load(weights_only=True), "
                          "which builds no other objects); keep tensors and Python numbers in the optimizer's "
                          "state") from None


def _leaves(value: object):
    if isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _leaves(item)
    else:
        yield value


def schedule_arguments(t: TrainConfig) -> tuple[float, float, int, int]:
    """(max_learning_rate, min_learning_rate, warmup_iters, cosine_cycle_iters) of the run ``t`` configures."""
    return t.lr, t.lr * t.min_lr_ratio, t.warmup_steps, max(t.steps - 1, t.warmup_steps)


def user_schedule(config: RunConfig) -> Callable[[int], float]:
    """The LR of each 0-based step by the user's schedule function, computed once for the run's steps and checked:
    a number, finite, >= 0 at every step, and its peak the config's lr (the LR the sweep varies)."""
    code, t = config.code, config.train
    function = load(code.schedule, "--schedule")
    if not callable(function):
        raise LmtuneError(f"--schedule {code.schedule}: names {shown(function)}, not a function")
    arguments = schedule_arguments(t)
    table = [_lr(function, it, arguments, code.schedule) for it in range(t.steps)]
    # The peak a warm-up to max_learning_rate reaches within the run (lmtune's cosine's: max_learning_rate itself
    # unless the warm-up outlasts the run).
    expected = max(scheduled_lr(it, t) for it in range(min(t.steps, t.warmup_steps + 1)))
    if not math.isclose(max(table), expected, rel_tol=1e-6):
        raise LmtuneError(f"--schedule {code.schedule}: peaks at {max(table):.6g} over the run's {t.steps} steps, "
                          f"where a warm-up to max_learning_rate = {t.lr:.6g} over warmup_iters = {t.warmup_steps} "
                          f"reaches {expected:.6g}: the LR a sweep varies must be the schedule's peak; fix the "
                          "function (or its warmup_iters handling)")
    return lambda it: table[it] if 0 <= it < len(table) else _lr(function, it, arguments, code.schedule)


def _lr(function: Callable, it: int, arguments: tuple, spec: str) -> float:
    with guarded("--schedule", spec, f"calling it as f({it}, {', '.join(f'{a:g}' for a in arguments)})",
                 "lmtune calls f(it, max_learning_rate, min_learning_rate, warmup_iters, cosine_cycle_iters)"):
        value = function(it, *arguments)
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if callable(value):
        raise LmtuneError(f"--schedule {spec}: returned a function, not a learning rate; name a function "
                          "f(it, max_learning_rate, min_learning_rate, warmup_iters, cosine_cycle_iters) -> float "
                          "(a small wrapper around yours)")
    number = real_number(value)
    if number is None or not math.isfinite(number) or number < 0:
        raise LmtuneError(f"--schedule {spec}: gave {shown(value)} at step {it}; a learning rate is a finite "
                          "number >= 0")
    return number


def real_number(value: object) -> float | None:
    """``value`` as a float where it is a real number (int, float, numpy's, Fraction, Decimal, any object with
    __float__ but a bool or a complex), else None."""
    if isinstance(value, bool | np.bool_ | complex | np.complexfloating | str | bytes):
        return None
    if not (isinstance(value, numbers.Real | np.number) or hasattr(value, "__float__")):
        return None
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return None
