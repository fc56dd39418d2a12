"""A step hook of the user's own, named on the command line (``--step-hook MODULE:FUNCTION``): code each trial's
process runs, to watch its training or to break it on purpose (lmtune's own tests inject their faults this way,
from tests/faults.py).

FUNCTION(config, out_dir) is called in the trial's process once per attempt of a single-model trial, before it
trains, with the trial's RunConfig and folder; what it returns (None: nothing) is called before every optimizer
step with (step, model), as the training loop's ``before_step``. A FUNCTION that raises, or returns something
else, fails the same way on every attempt: its trial ends as an error at once, in one line (StepHookError), and
is not retried; what the returned hook raises during training is an error like any other (retried). MODULE must
be importable by the driver and by the trials' processes (on their PYTHONPATH). Nothing of it is kept in the
sweep's records: a --resume runs it only when given it again.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

from lmtune.errors import LmtuneError, first_line, shown
from lmtune.training.config import RunConfig


class StepHookError(LmtuneError):
    """The step hook's FUNCTION raised, or returned something that is not a hook: its trial ends as an error."""


def load_step_hook(spec: str) -> Callable:
    """The function ``spec`` (MODULE:FUNCTION) names, imported; a spec that names none is refused in one line."""
    module_name, sep, name = spec.partition(":")
    if not sep or not module_name or not name.isidentifier():
        raise LmtuneError(f"--step-hook {shown(spec)}: give MODULE:FUNCTION, e.g. mypackage.hooks:watch")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise LmtuneError(f"--step-hook {shown(spec)}: cannot import {module_name} ({err}); put its folder on "
                          "PYTHONPATH") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise LmtuneError(f"--step-hook {shown(spec)}: {module_name} has no function {name}")
    return function


def start_step_hook(spec: str, config: RunConfig, out_dir: Path) -> Callable | None:
    """The training loop's ``before_step`` for one trial: what ``spec``'s FUNCTION returns for it. One that
    raises, or returns neither a function nor None, is refused in one line (StepHookError)."""
    try:
        hook = load_step_hook(spec)(config, out_dir)
    except LmtuneError as err:
        raise StepHookError(str(err)) from None
    except Exception as err:  # (the user's code: any exception is its own fault, said in one line)
        raise StepHookError(f"--step-hook {shown(spec)} raised {first_line(err)}; "
                            "fix it: it is called as FUNCTION(config, out_dir) in each trial before it "
                            "trains") from None
    if hook is not None and not callable(hook):
        raise StepHookError(f"--step-hook {shown(spec)} returned {type(hook).__name__} {shown(hook)}; "
                            "return a function of (step, model), or None")
    return hook
