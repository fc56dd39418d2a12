"""What the horizon search steps along: token budgets (``search: horizon``) or model widths (``search: width``).

The search's stages (grid, seeds, refine, walls, edge probes, the confirmation) are the same along either axis: at
each searched point an LR search of its own, every run trained to the point's whole budget, then a power law in
the axis through each point's LR* predicts the target's. An axis says which points are searched, which of them is
the target, what a trial at a point sets, and which runs belong to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from lmtune.sweep.runs import Budget, Run
from lmtune.sweep.tune_types import TuneParams


class SearchAxis(Protocol):
    """The points a horizon-style search steps along, smallest first, and the target beyond them."""

    name: str
    """What a point is, for messages: "budget" or "width"."""

    @property
    def points(self) -> list[int]:
        """The searched points, smallest first (steps, or d_model)."""

    @property
    def target(self) -> int:
        """The point the prediction is for (the space's own steps, or d_model)."""

    def params(self, point: int) -> TuneParams:
        """What a trial at ``point`` sets besides its stage, LR and seed."""

    def budget_tokens(self, point: int) -> int:
        """The full token count of a run at ``point`` (where its LRs are compared)."""

    def holds(self, run: Run, point: int) -> bool:
        """Whether ``run`` was trained at ``point``."""

    def others(self, point: int) -> tuple[tuple[str, object], ...]:
        """A run's ``others`` at ``point`` (lmtune.sweep.runs.Run.others: what besides the LR tells runs apart)."""

    def scale(self, point: int) -> float:
        """The power law's variable at ``point`` (tokens, or width)."""

    def label(self, point: int) -> str:
        """``point`` in words ("162-step budget", "d_model 64")."""


@dataclass(frozen=True)
class TokenAxis:
    """Token budgets: a trial's ``steps`` is its budget (its schedule decays over them); the target is the
    space's own steps."""

    budget: Budget
    """The target budget (the space's)."""
    steps: tuple[int, ...]
    """The searched budgets in steps, smallest first."""
    name: str = "budget"

    @property
    def points(self) -> list[int]:
        return list(self.steps)

    @property
    def target(self) -> int:
        return self.budget.steps

    def params(self, point: int) -> TuneParams:
        return {"steps": point}

    def budget_tokens(self, point: int) -> int:
        return point * self.budget.tokens_per_step

    def holds(self, run: Run, point: int) -> bool:
        return run.budget_tokens == self.budget_tokens(point)

    def others(self, point: int) -> tuple[tuple[str, object], ...]:
        return ()  # a budget tells runs apart by their budget_tokens

    def scale(self, point: int) -> float:
        return float(self.budget_tokens(point))

    def label(self, point: int) -> str:
        return f"{point}-step budget"
