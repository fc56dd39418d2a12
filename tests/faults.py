"""Faults the tests inject into a sweep's trials, through the sweep's step hook (lmtune.sweep.hooks): the sweep
is started with ``--step-hook faults:NAME`` and FAULTS_ENV (this folder on its PYTHONPATH, so that the driver and
the Ray workers it starts import this module). Each NAME is called in a trial's process with the trial's config
and folder, and returns the hook its training loop calls before every step (None: no fault in that trial).

Every firing appends its step to FIRED in the trial's folder, so that a test can tell the fault happened."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

from lmtune.training.config import RunConfig

TESTS = Path(__file__).resolve().parent
# The environment a sweep with a fault hook runs in: this folder importable, for its driver and its Ray workers.
FAULTS_ENV = {"PYTHONPATH": os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)}
FIRED = ".fault_injected"
OOM = "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 39.39 GiB total capacity)"

StepHook = Callable[[int, object], None]


def note(message: str) -> None:
    """What a fault test measured, in the run's output (-s shows it)."""
    print(f"FAULTS: {message}", flush=True)


def raise_at(step: int, message: str | None = None, every_attempt: bool = False,
             lr: float | None = None) -> Callable[[RunConfig, Path], StepHook | None]:
    """A step hook that raises RuntimeError(``message``) before step ``step``: in the first attempt of each
    trial only, or in ``every_attempt``; in every trial, or only in the trial of learning rate ``lr``."""

    def for_trial(config: RunConfig, out_dir: Path) -> StepHook | None:
        if lr is not None and not math.isclose(config.train.lr, lr, rel_tol=1e-9):
            return None
        fired = Path(out_dir) / FIRED

        def hook(current: int, _model: object) -> None:
            if current == step and (every_attempt or not fired.exists()):
                with open(fired, "a") as handle:
                    handle.write(f"{step}\n")
                raise RuntimeError(message or f"injected fault at step {step}")

        return hook

    return for_trial


# Where meet()'s trials leave their marks (a folder the test makes, passed in the sweep's environment).
MEETING_ENV = "LMTUNE_TEST_MEETING"


def meet(step: int, trials: int) -> Callable[[RunConfig, Path], StepHook]:
    """A step hook that holds each trial before step ``step`` until ``trials`` trials have reached it (each leaves
    a mark in the folder $LMTUNE_TEST_MEETING): proof that they trained at the same time, however loaded the machine.
    A trial that waits 120 s in vain fails (AssertionError), and so does the sweep's test."""
    from conftest import wait_until

    def for_trial(config: RunConfig, out_dir: Path) -> StepHook:
        folder = Path(os.environ[MEETING_ENV])

        def hook(current: int, _model: object) -> None:
            if current == step:
                (folder / Path(out_dir).name).write_text(f"{os.getpid()}\n")
                wait_until(lambda: len(list(folder.iterdir())) >= trials, None, 120,
                           f"{trials} trials at step {step} at once", poll_s=0.05)

        return hook

    return for_trial


def meet_first(step: int, trials: int) -> Callable[[RunConfig, Path], StepHook]:
    """meet(step, trials) for the first ``trials`` trials to reach ``step``; a trial that reaches it later, once they
    have all left their marks, passes it without a mark and without waiting. In a sweep that runs ``trials`` trials
    at once these are the trials that started together, whichever they are: no other can start before one of them
    ends, and none ends before it has passed ``step``, so the meeting never depends on the order Ray starts them."""
    meeting = meet(step, trials)

    def for_trial(config: RunConfig, out_dir: Path) -> StepHook:
        folder, wait = Path(os.environ[MEETING_ENV]), meeting(config, out_dir)

        def hook(current: int, model: object) -> None:
            if current == step and len(list(folder.iterdir())) < trials:
                wait(current, model)

        return hook

    return for_trial


def compose(*faults: Callable[[RunConfig, Path], StepHook | None]) -> Callable[[RunConfig, Path], StepHook | None]:
    """One step hook of several (a sweep takes one --step-hook): each fault's hook, in order, before every step."""

    def for_trial(config: RunConfig, out_dir: Path) -> StepHook | None:
        hooks = [hook for fault in faults if (hook := fault(config, out_dir)) is not None]
        if not hooks:
            return None

        def hook(current: int, model: object) -> None:
            for each in hooks:
                each(current, model)

        return hook

    return for_trial


# The faults the tests name (--step-hook faults:NAME).
# The fault sweep of tests/test_faults.py (lrs 3e-3, 1e-3 and 1e-4, two trials at once): the two trials that start
# together meet at step 10; the lr=1e-3 trial raises a CUDA OOM at step 15 on every attempt; the lr=3e-3 trial
# crashes once, at step 25.
FAULT_SWEEP_LRS = {"crash": 3e-3, "oom": 1e-3, "plain": 1e-4}
MEET_STEP, OOM_STEP, CRASH_STEP = 10, 15, 25
fault_sweep = compose(meet_first(MEET_STEP, 2),
                      raise_at(OOM_STEP, OOM, every_attempt=True, lr=FAULT_SWEEP_LRS["oom"]),
                      raise_at(CRASH_STEP, lr=FAULT_SWEEP_LRS["crash"]))
