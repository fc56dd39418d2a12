"""The horizon search's axis, token budgets (``TokenAxis``), and what the runs of each searched budget show,
Ray-free: the runs at a budget, each budget's located LR* (lmtune.analysis.locate), the power law through them
(lmtune.analysis.fit), and every budget's conclusion with the fit as one value (``conclude_horizon``; the
axis-generic parts: lmtune.searches.axis.axis). The search (deciding when to confirm) and the report
(lmtune.searches.horizon.report_conclusion) both call these, so they agree."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from lmtune.analysis.fit import HorizonFit, fit_horizon
from lmtune.analysis.locate import LocatedLr
from lmtune.analysis.runs import Budget, Run
from lmtune.errors import LmtuneError
from lmtune.searches.axis.axis import Axis, AxisConclusion, conclude_along, locate_along, surface_along
from lmtune.searches.axis.axis import runs_at as runs_on
from lmtune.searches.horizon.settings import HorizonSettings
from lmtune.searches.trial_order import TuneParams


@dataclass(frozen=True)
class TokenAxis(Axis):
    """Token budgets: a trial's ``steps`` is its budget (its schedule decays over them); the target is the
    space's own steps."""

    name = "budget"

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


def budget_axis(settings: HorizonSettings, target: Budget) -> TokenAxis:
    """The searched budgets of a horizon search with ``target`` its space's budget."""
    return TokenAxis(target, tuple(settings.budget_steps(target.steps)))


def runs_at(runs: Iterable[Run], steps: int, target: Budget) -> list[Run]:
    """The runs (those that stand: lmtune.analysis.runs.effective_runs) whose budget is ``steps``."""
    return runs_on(TokenAxis(target, ()), runs, steps)


def locate_budgets(runs: Iterable[Run], settings: HorizonSettings, target: Budget) -> list[LocatedLr | None]:
    """Each searched budget's LR* (None: no LR trained it through), smallest budget first."""
    return locate_along(budget_axis(settings, target), runs)


def fit_budgets(runs: Iterable[Run], settings: HorizonSettings, target: Budget) -> tuple[HorizonFit | None, str | None]:
    """The power law in tokens predicting the target's LR*: the loss surface fitted to every searched budget's runs
    (lmtune.analysis.surface), else (no surface, or one whose law test fails) the line through their located LR*s;
    or None and why it cannot be fitted. The search and the report both fit with this, so they agree."""
    runs = list(runs)
    return fit_located_budgets(locate_budgets(runs, settings, target), runs, settings, target)


def fit_located_budgets(located: list[LocatedLr | None], runs: Iterable[Run], settings: HorizonSettings,
                        target: Budget) -> tuple[HorizonFit | None, str | None]:
    """``fit_budgets`` with the budgets' LR*s located already (None: not located)."""
    axis = budget_axis(settings, target)
    surface = surface_along(axis, runs, lambda steps: axis.budget_at(steps).full_tokens, target.full_tokens)
    try:
        return fit_horizon([p for p in located if p is not None], target.full_tokens, surface), None
    except LmtuneError as err:
        return None, str(err)


def conclude_horizon(runs: Iterable[Run], settings: HorizonSettings, target: Budget) -> AxisConclusion[HorizonFit]:
    """Each budget's conclusion (the searched budgets, then the target) and the fit, from the runs of every budget.
    The report reads this one value; the fit is the search's own (deterministic), so the two agree."""
    runs = list(runs)
    return conclude_along(budget_axis(settings, target), runs,
                          lambda located: fit_located_budgets(located, runs, settings, target))
