"""ASHA's rung rule (asynchronous successive halving, Li et al. 2020), written once and free of Ray.

Rungs sit at grace_period x reduction_factor^k; at each, a value worse than the best 1/reduction_factor of the
values recorded there is cut. A sweep's trials are cut by Tune's ASHA on these rungs
(lmtune.sweep.asha_scheduler.PersistentASHA holds each result at its rung until the trials before it got there); a
fused group's members by the group itself (lmtune.sweep.fused_trial.GroupRungs), with the same rungs and cutoff.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Rungs:
    """Where ASHA compares runs (in its time attribute: lmtune's is tokens), and which losses it cuts there."""

    milestones: tuple[float, ...]
    """The rungs, ascending: grace_period x reduction_factor^k up to max_t."""
    reduction_factor: float
    """Each rung keeps the best 1/reduction_factor of the values recorded at it."""

    @classmethod
    def of(cls, grace_period: float, reduction_factor: float, max_t: float) -> Rungs:
        """The rungs Tune's ASHA places (its one bracket, ``_Bracket(grace_period, max_t, reduction_factor, 0)``),
        counted as it counts them, so that a trial and a fused member meet the same rungs."""
        count = int(np.log(max_t / grace_period) / np.log(reduction_factor) + 1)
        return cls(tuple(grace_period * reduction_factor**k for k in range(count)), reduction_factor)

    def passed(self, t: float) -> list[float]:
        """The rungs at or below ``t``, ascending."""
        return [m for m in self.milestones if m <= t]

    def rung_of(self, t: float) -> float | None:
        """The highest rung at or below ``t`` (None: below the first)."""
        passed = self.passed(t)
        return passed[-1] if passed else None

    def cutoff(self, losses: Iterable[float]) -> float | None:
        """The loss a value at a rung holding ``losses`` must not exceed: their 1/reduction_factor quantile, NaNs
        left out (None: nothing recorded). Tune's ASHA cuts a reward below the (1 - 1/reduction_factor) quantile
        of its rung's rewards; a reward is -loss, so this is the same cut."""
        values = list(losses)
        return float(np.nanpercentile(values, 100 / self.reduction_factor)) if values else None

    def cuts(self, loss: float, losses: Iterable[float]) -> bool:
        """Whether ``loss`` at a rung holding ``losses`` is cut."""
        cutoff = self.cutoff(losses)
        return cutoff is not None and loss > cutoff
