"""A sweep's time on this machine's CPU, from a few training steps measured here: what ``lmtune run`` says, and asks
``--yes`` for, before a bare run (lr_grid's days of work on a CPU) starts Ray."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from lmtune.tools.throughput.loops import OptimizedLoop, random_tokens, time_steps
from lmtune.training.config import RunConfig

# How a step is timed: one warm-up step (it allocates), then the fastest of MEASURED_STEPS steps, each of at
# most MEASURED_SEQUENCES sequences and scaled to the trial's batch (a CPU's step time grows with its tokens): a few
# seconds for the 17M model, where a step of its whole batch of 32 takes tens.
MEASURED_STEPS = 2
MEASURED_SEQUENCES = 2


@dataclass(frozen=True)
class CpuTime:
    """What a sweep's trials would take on this machine's CPU, from a training step measured here."""

    trials: int
    steps: int
    """Training steps per trial (its whole budget)."""
    step_s: float
    """Seconds per step of a trial's batch."""
    at_once: int
    """Trials training together (each on ``threads`` of the CPU's cores)."""
    threads: int
    parameters: int
    tokens_per_step: int

    @property
    def seconds(self) -> float:
        """Every trial to its whole budget, ``at_once`` at a time (an early stop such as ASHA's ends sooner)."""
        return math.ceil(self.trials / self.at_once) * self.steps * self.step_s

    def describe(self) -> str:
        size = f"{self.parameters / 1e6:.1f}M" if self.parameters >= 1e6 else f"{self.parameters:,}"
        return (f"up to {duration(self.seconds)} ({self.trials} trials x {self.steps * self.tokens_per_step:,} tokens "
                f"({self.steps:,} steps) of the {size}-parameter model, {self.at_once} at once; a step takes "
                f"{self.step_s:.2g} s, measured here on {self.threads} thread{'s' * (self.threads > 1)} as a trial "
                "trains; less where early stopping ends trials sooner)")


def cpu_time(config: RunConfig, trials: int, cpus_per_trial: float, cpus: int, max_concurrent: int | None) -> CpuTime:
    """The time ``trials`` trials of ``config`` would take on this CPU: ``cpus`` cores (a trial trains on
    ``cpus_per_trial`` of them, as many at once as they hold, up to ``max_concurrent``)."""
    threads = max(1, int(cpus_per_trial))
    at_once = max(1, min(trials, max_concurrent or trials, int(cpus // cpus_per_trial)))
    step_s, parameters = measured_step_s(config, threads)
    return CpuTime(trials, config.train.stop_step, step_s, at_once, threads, parameters, config.tokens_per_step)


def measured_step_s(config: RunConfig, threads: int) -> tuple[float, int]:
    """(seconds a training step of ``config`` takes on this CPU with ``threads`` threads, its model's parameters):
    lmtune's own step (lmtune.tools.throughput.loops.OptimizedLoop, uncompiled) on random token ids."""
    small = RunConfig.from_dict(config.to_dict())
    small.train.batch_size = min(MEASURED_SEQUENCES, config.train.batch_size)
    small.train.grad_accum_steps = 1
    cpu = torch.device("cpu")
    tokens = random_tokens(min(config.model.vocab_size, 65536), max(4096, 4 * (config.model.context_length + 1)))
    loop = OptimizedLoop(small, cpu, tokens, compiled=False)  # (built on every core: only its steps are timed)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        time_steps(loop, 1, cpu)
        step_s = min(time_steps(loop, 1, cpu)[0] for _ in range(MEASURED_STEPS))
    finally:
        loop.close()
        torch.set_num_threads(previous)
    parameters = sum(p.numel() for p in loop.state.model.parameters())
    return step_s * config.train.batch_size / small.train.batch_size, parameters


def duration(seconds: float) -> str:
    """``seconds`` in the unit a person plans by: minutes, hours or days."""
    if seconds < 2 * 3600:
        return f"{max(1.0, seconds / 60):.0f} minutes"
    return f"{seconds / 3600:.1f} hours" if seconds < 48 * 3600 else f"{seconds / 86400:.1f} days"
