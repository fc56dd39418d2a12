"""The horizon search (``search: horizon``): the best LR at the budget the user will train at (the target,
D), predicted from the best LR at budgets they can afford and confirmed at D. What differs from a search along
another axis: its axis (token budgets: lmtune.searches.horizon.budgets.TokenAxis) and its fit, ln LR* = a - beta ln D
(lmtune.analysis.fit.HorizonFit); and, under WSD, a run that continues the same LR and seed's run at a smaller
budget from where its stable phase ended. The stages are the engine's (lmtune.searches.axis.search)."""

from __future__ import annotations

from lmtune.analysis.fit import HorizonFit
from lmtune.analysis.runs import same_lr
from lmtune.searches.axis.axis import SearchAxis
from lmtune.searches.axis.search import AxisSearch
from lmtune.searches.deciding import Planned
from lmtune.searches.horizon.budgets import budget_axis, fit_budgets
from lmtune.searches.horizon.settings import HorizonSettings


class HorizonSearch(AxisSearch):
    """The horizon search's state and decisions (lmtune.searches.axis.search.AxisSearch) along token budgets."""

    name = "horizon"
    settings_class = HorizonSettings
    axis_columns = ("steps",)
    fit_class = HorizonFit

    def make_axis(self) -> SearchAxis:
        """The budgets D/16, D/8, D/4 (by default) of the target D, the space's steps."""
        return budget_axis(self.settings, self.budget)

    def _fork_source(self, planned: Planned) -> str | None:
        """Under WSD, the trial id of the same LR and seed's run at the largest smaller budget that ran its budget
        without diverging (however well it learned): this run continues it from where its stable phase ended
        instead of training those steps again."""
        if self.budget.schedule != "wsd":
            return None
        tokens = self.axis.budget_at(planned.point).full_tokens
        sources = [(r.budget_tokens, tid) for tid, r in self.runs.items()
                   if r.seed == planned.seed and same_lr(r.lr, planned.lr) and r.budget_tokens < tokens
                   and r.ran_its_budget()]
        return max(sources)[1] if sources else None

    def _fit(self) -> tuple[HorizonFit | None, str | None]:
        return fit_budgets(self.runs.values(), self.settings, self.budget)

    def _fit_words(self, fit: HorizonFit) -> tuple[str, str]:
        resolved = "" if fit.resolved else ", beta not resolved by these budgets"
        return f"beta {fit.beta:.2f}{resolved}", f"the {self.axis.target}-step target"
