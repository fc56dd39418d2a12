"""What the horizon search steps along: token budgets (``search: horizon``) or model widths (``search: width``).

The search's stages (grid, seeds, refine, walls, edge probes, the confirmation) are the same along either axis: at
each searched point an LR search of its own, every run trained to the point's whole budget, then a power law in
the axis through each point's LR* predicts the target's. An axis says which points are searched, which of them is
the target, what a trial at a point sets, and which runs belong to it. What a stage plans at a point (``Decision``)
and each trial it asks Tune for (``Planned``) are here too.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from lmtune.analysis.runs import Budget, Run, effective_runs
from lmtune.sweep.trial_order import TrialOrder, TuneParams


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

    def budget_at(self, point: int) -> Budget:
        """The budget of a run at ``point``, compared at its full token count only."""

    def holds(self, run: Run, point: int) -> bool:
        """Whether ``run`` was trained at ``point``."""

    def others(self, point: int) -> tuple[tuple[str, object], ...]:
        """A run's ``others`` at ``point`` (lmtune.analysis.runs.Run.others: what besides the LR tells runs apart)."""

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

    def budget_at(self, point: int) -> Budget:
        return self.budget.at_steps(point)

    def holds(self, run: Run, point: int) -> bool:
        return run.budget_tokens == point * self.budget.tokens_per_step

    def others(self, point: int) -> tuple[tuple[str, object], ...]:
        return ()  # a budget tells runs apart by their budget_tokens

    def label(self, point: int) -> str:
        return f"{point}-step budget"


def runs_at(axis: SearchAxis, runs: Iterable[Run], point: int) -> list[Run]:
    """The runs trained at ``point`` that stand (lmtune.analysis.runs.effective_runs)."""
    return effective_runs(r for r in runs if axis.holds(r, point))


@dataclass(frozen=True)
class Decision:
    """A stage's plan at one point: the LRs it asked for, and why."""

    stage: str
    point: int
    """The budget in steps (search: horizon) or the width, d_model (search: width)."""
    lrs: list[float]
    why: str


@dataclass
class Planned:
    """A trial the search asks for: its stage, point (budget in steps, or width), LR and seed, and why."""

    stage: str
    point: int
    """The budget in steps (search: horizon) or the width, d_model (search: width)."""
    lr: float
    seed: int
    why: str = ""
    fork_from: str | None = None
    """Under WSD: the trial id of this LR and seed's run at a smaller budget, whose stable phase this run
    continues from where it ended (the same run as from scratch: lmtune.training.fork)."""

    def config(self) -> TuneParams:
        """The trial's order as Tune carries it, but for what its point sets (the search's axis adds it:
        SearchAxis.params)."""
        return TrialOrder({"lr": self.lr, "seed": self.seed}, stage=self.stage, fork_from=self.fork_from).to_tune()
