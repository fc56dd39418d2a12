"""What a horizon search's runs conclude, Ray-free and typed: each budget's conclusion at its own full token count
(lmtune.analysis.conclusion.conclude), each searched budget's located LR* (lmtune.analysis.locate)
and the power law fitted through them. The report reads this one value (lmtune.report.horizon); the fit is the
search's own (fit_budgets, deterministic), so the two agree.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from lmtune.analysis.conclusion import Conclusion, conclude
from lmtune.analysis.fit import HorizonFit
from lmtune.analysis.locate import LocatedLr
from lmtune.analysis.runs import Budget, Run
from lmtune.sweep.strategies.horizon.budgets import fit_budgets, locate_budgets, runs_at
from lmtune.sweep.strategies.horizon.settings import HorizonSettings


@dataclass(frozen=True)
class BudgetConclusion:
    """One budget's runs, compared at its full token count."""

    steps: int
    """The budget's steps (its schedule's length)."""
    tokens: int
    """The budget's full token count, where its LRs are compared."""
    fraction: float
    """steps / the target's steps."""
    trials: int
    """The runs that stand at this budget."""
    conclusion: Conclusion
    """What this budget's runs conclude (lmtune.analysis.conclusion.conclude)."""
    located: LocatedLr | None
    """Its LR* located between grid points around the crowned best (None: the target, or no LR trained it)."""


@dataclass(frozen=True)
class HorizonConclusion:
    """Every budget's conclusion and the fit through them."""

    budgets: tuple[BudgetConclusion, ...]
    """The searched budgets, smallest first, then the target."""
    fit: HorizonFit | None
    """ln LR* = a - beta ln D through the searched budgets' located LR*s (None: it cannot be fitted)."""
    fit_problem: str | None
    """Why there is no fit."""


def conclude_horizon(runs: Iterable[Run], settings: HorizonSettings, target: Budget) -> HorizonConclusion:
    """Each budget's conclusion (the searched budgets, then the target) and the fit, from the runs of every budget."""
    runs = list(runs)
    budgets = []
    located = locate_budgets(runs, settings, target)
    for i, steps in enumerate([*settings.budget_steps(target.steps), target.steps]):
        at = runs_at(runs, steps, target)
        budgets.append(BudgetConclusion(steps, steps * target.tokens_per_step, steps / target.steps, len(at),
                                        conclude(at, target.at_steps(steps)),
                                        located[i] if i < len(located) else None))
    fit, problem = fit_budgets(runs, settings, target)
    return HorizonConclusion(tuple(budgets), fit, problem)
