"""The learning rate of each step of a run: its user's schedule function (``--schedule``, lmtune.usercode.optim) or
lmtune's own (lmtune.training.schedule), as one function of the 0-based step the loops, the resume and fork checks
and the run's figures call."""

from __future__ import annotations

import functools
from collections.abc import Callable

from lmtune.training.config import RunConfig
from lmtune.training.schedule import scheduled_lr
from lmtune.usercode.optim import user_schedule


def step_lr_function(config: RunConfig) -> Callable[[int], float]:
    """The LR of each 0-based step of the run ``config`` configures (the user's schedule is checked here)."""
    if config.code.schedule:
        return user_schedule(config)
    return functools.partial(scheduled_lr, t=config.train)
