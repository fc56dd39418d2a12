"""What the runs of each searched budget show, Ray-free: the runs at a budget, each budget's located LR*
(lmtune.analysis.locate) and the power law through them (lmtune.analysis.fit).
The search (deciding when to confirm) and the report (lmtune.report.horizon) both call these, so they agree."""

from __future__ import annotations

from collections.abc import Iterable

from lmtune.analysis.bracket import bracket
from lmtune.analysis.fit import HorizonFit, fit_horizon
from lmtune.analysis.locate import LocatedLr, locate_best_lr
from lmtune.analysis.runs import Budget, Run, full_budget_ranking
from lmtune.errors import LmtuneError
from lmtune.sweep.strategies.horizon.axis import TokenAxis
from lmtune.sweep.strategies.horizon.axis import runs_at as runs_on
from lmtune.sweep.strategies.horizon.settings import HorizonSettings


def runs_at(runs: Iterable[Run], steps: int, target: Budget) -> list[Run]:
    """The runs (those that stand: lmtune.analysis.runs.effective_runs) whose budget is ``steps``."""
    return runs_on(TokenAxis(target, ()), runs, steps)


def locate_budgets(runs: Iterable[Run], settings: HorizonSettings, target: Budget) -> list[LocatedLr | None]:
    """Each searched budget's LR* (None: no LR trained it through), smallest budget first. The edge probes are
    left out: they are one seed each, far above the basin, and may end after the fit was made."""
    runs = [r for r in runs if r.stage != "edge"]  # one-seed probes for failure, far above the basin
    located = []
    for steps in settings.budget_steps(target.steps):
        at = runs_at(runs, steps, target)
        located.append(locate_best_lr(full_budget_ranking(at), steps * target.tokens_per_step, bracket(at)))
    return located


def fit_budgets(runs: Iterable[Run], settings: HorizonSettings, target: Budget) -> tuple[HorizonFit | None, str | None]:
    """The power law through the located LR* of every searched budget that has one, predicting the target's;
    or None and why it cannot be fitted. The search and the report both fit with this, so they agree."""
    located = [p for p in locate_budgets(runs, settings, target) if p is not None]
    try:
        return fit_horizon(located, target.full_tokens), None
    except LmtuneError as err:
        return None, str(err)
