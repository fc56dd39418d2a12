"""ASHA's rungs in tokens, as a sweep's plan resolves them from its space (lmtune.sweep.plan.asha_budget) and as
the comparisons of its runs read them (lmtune.sweep.runs.Budget). A module of its own so that both can import it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AshaBudget:
    """ASHA's rungs in tokens: the first at ``grace_period``, each ``reduction_factor`` x the last, up to ``max_t``."""

    max_t: int
    """The last rung: no trial is judged past this many tokens."""
    grace_period: int
    """The first rung: tokens every trial trains before ASHA may cut it."""
    reduction_factor: float
    """Each rung keeps the best 1 / reduction_factor of the trials that reached it."""
