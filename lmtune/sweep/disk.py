"""How much disk a sweep's checkpoints take, and whether the results folder has it: checked at the start,
so a sweep that would fill the disk hours in is one line, not a crash mid-write.

The sizes are analytic (no model is built, nothing is saved): a 17M model's estimate is instant.
"""

from __future__ import annotations

import logging
import math
import pickle
import shutil
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from lmtune.errors import LmtuneError, format_bytes
from lmtune.files import existing_ancestor
from lmtune.training.config import RunConfig, TrainConfig
from lmtune.training.metrics import METRIC_COLUMNS
from lmtune.usercode.spec import model_size, spec_for

log = logging.getLogger(__name__)

# torch.save's fixed cost: the zip's headers and central directory, data.pkl's frame, version, byteorder.
FILE_BYTES = 1_300
# Per tensor: its zip entry (local header, 64-byte alignment, central directory record) and its pickled
# reference (key, storage tuple, shape, stride). Measured 250-320 bytes on torch 2.13.
TENSOR_BYTES = 300
# TrainState's rng: torch's 5,056-byte generator state and the 624/625-word numpy and Python states as lists.
RNG_BYTES = 13_000
# A history cell: a memoised key (2 bytes) and an 8-byte float (ints and None take less, a GPU's floats more).
CELL_BYTES = 10
# A row's columns: metrics.csv's and the LossWatch fields the loop adds beside them ("spikes").
ROW_COLUMNS = len(METRIC_COLUMNS) + 1


class Keep(StrEnum):
    """What an ended trial keeps on disk (the sweep's --keep)."""

    BEST = "best"
    """best.pt only: the model at its lowest validation loss."""
    LAST = "last"
    """best.pt and the newest full checkpoint (a run can be resumed or continued)."""
    ALL = "all"
    """best.pt, the newest keep_checkpoints full checkpoints and a WSD run's stable.pt."""


def tensor_count(config: RunConfig) -> int:
    """Parameter tensors of the model, by its training spec (lmtune's TransformerLM's from the config alone, a
    user's model's counted from its parameters)."""
    return spec_for(config).model.parameter_tensors(config)


def history_rows(t: TrainConfig) -> int:
    """Rows of a history at the run's end: every step TrainConfig.logs_at holds, counted by inclusion-exclusion
    over the log, eval and checkpoint intervals (no loop: steps may be huge), plus the last and fork steps."""
    n, a, b, c = t.stop_step, t.log_interval, t.eval_interval, t.checkpoint_interval
    rows = (n // a + n // b + n // c - n // math.lcm(a, b) - n // math.lcm(a, c) - n // math.lcm(b, c)
            + n // math.lcm(a, b, c))
    extra = {n, t.fork_step} - {None}
    return rows + sum(1 for s in extra if s <= n and s % a and s % b and s % c)


@dataclass(frozen=True)
class CheckpointBytes:
    """File sizes of a run's checkpoints, in bytes."""

    full: int
    """A periodic checkpoint (or stable.pt) at the run's end: model, AdamW state, rng, history, config."""
    best: int
    """best.pt: the model's weights, step, val_loss and config."""

    @classmethod
    def of(cls, config: RunConfig) -> CheckpointBytes:
        """Estimated from the config: float32 weights (4 bytes a parameter) in best.pt; weights and AdamW's two
        moments (12 bytes a parameter) plus a 4-byte step tensor per parameter tensor in a full one; the
        fixed and per-tensor costs of torch.save's zip; the pickled history and config."""
        params, tensors = model_size(config).total, tensor_count(config)
        meta = len(pickle.dumps(config.to_dict(), protocol=2)) + FILE_BYTES
        history = history_rows(config.train) * ROW_COLUMNS * CELL_BYTES
        best = 4 * params + tensors * TENSOR_BYTES + meta
        # Four tensors per parameter tensor: the weight, exp_avg, exp_avg_sq and step.
        full = 12 * params + tensors * (4 * TENSOR_BYTES + 4) + RNG_BYTES + history + meta
        return cls(full=full, best=best)


@dataclass(frozen=True)
class DiskNeed:
    """A sweep's checkpoint bytes: what a running and an ended trial hold, what the search holds, the peak."""

    per_running_trial: int
    per_ended_trial: int
    held_by_search: int
    """Bytes of the full checkpoints of ended trials a deciding search holds until the sweep ends."""
    total: int
    trials: int = 1

    def describe(self, free: int) -> str:
        """One line for the sweep's start, with ``free`` bytes under the results folder."""
        held = f", {format_bytes(self.held_by_search)} of it held by the search" if self.held_by_search else ""
        return (f"disk: about {format_bytes(self.per_running_trial)} per running trial, "
                f"{format_bytes(self.per_ended_trial)} kept per ended trial, about {format_bytes(self.total)} "
                f"in all for {self.trials} trial{'s' * (self.trials != 1)}{held} ({format_bytes(free)} free)")


def trial_bytes(config: RunConfig, keep: Keep, size: CheckpointBytes) -> tuple[int, int]:
    """(running, ended) bytes of one run of ``config``. Running: the newest full checkpoint, a second while the
    next is persisted, best.pt, and a WSD run's stable.pt. Ended: what ``keep`` leaves."""
    stable = size.full if config.train.fork_step is not None else 0
    running = 2 * size.full + size.best + stable
    ended = {Keep.BEST: size.best, Keep.LAST: size.best + size.full,
             Keep.ALL: size.best + config.train.keep_checkpoints * size.full + stable}[Keep(keep)]
    return running, ended


def disk_need(config: RunConfig, trials: int, max_concurrent: int, keep: Keep, held_by_search: int = 0,
              members: int = 1, size: CheckpointBytes | None = None) -> DiskNeed:
    """The disk a sweep of ``trials`` trials of ``config`` can reach at its peak:

        total = R x max(running, ended) + (trials - R) x ended + held_by_search x full
        R = min(trials, max_concurrent)

    the last R trials running (or ended, under --keep all an ended trial can hold more than a running one)
    while every other trial has ended and keeps what ``keep`` says. ``held_by_search``: full checkpoints of
    ended trials a deciding search holds (the edge search's ASHA-cut trials, the horizon search's stable.pt),
    counted apart even where --keep keeps the same file (an upper bound). A fused trial of ``members`` runs
    holds ``members`` times a run's bytes. ``size``: the checkpoint sizes (measured ones); default the estimate."""
    size = size or CheckpointBytes.of(config)
    running, ended = (members * b for b in trial_bytes(config, keep, size))
    slots = min(trials, max_concurrent)
    held = held_by_search * size.full
    total = slots * max(running, ended) + (trials - slots) * ended + held
    return DiskNeed(per_running_trial=running, per_ended_trial=ended, held_by_search=held, total=total, trials=trials)


def free_disk(directory: Path) -> int:
    """Free bytes where ``directory`` is or will be: its nearest existing ancestor (the sweep creates it later)."""
    return shutil.disk_usage(existing_ancestor(directory)).free


def check_free_disk(directory: Path, need: DiskNeed, force: bool, flag: str = "--results") -> int:
    """Free bytes under ``directory``; refuse, in one line, a sweep that needs more (unless ``force``). ``flag``: the
    option that named the folder (--results, or --storage), named in the fix."""
    free = free_disk(directory)
    if free >= need.total:
        return free
    problem = (f"only {format_bytes(free)} free under {directory}, and this sweep needs about "
               f"{format_bytes(need.total)} ({format_bytes(need.per_running_trial)} per running trial, "
               f"{format_bytes(need.per_ended_trial)} kept per ended trial)")
    if not force:
        raise LmtuneError(f"{problem}; free space, choose another {flag}, lower --keep, "
                          "or pass --force to start anyway")
    log.warning("%s; starting anyway (--force)", problem)
    return free
