"""The width search (``search: width``): the best LR for the model the user will train (the target width, the
space's d_model), predicted from the best LR of narrower copies of it they can afford, and confirmed at the target.
Ray-free: the Tune Searcher that drives it is lmtune.sweep.strategies.searcher.DecidingSearcher.

It is the horizon search (lmtune.sweep.strategies.horizon.search) stepping along width instead of tokens: at each
proxy width, narrowest first, the same stages (grid, extend, seeds, refine, walls, edge probes) with the same
full-budget crowning rules, every run trained to the space's whole budget; then ln LR* = a - gamma ln width is
fitted through the located LR*s (under SP the best Adam LR falls with width; under μP gamma should be 0 and the
fit says whether it is), and the predicted LR and it divided and multiplied by ``confirm_ratio`` are trained at
the target width, ``confirm_seeds`` runs each, enough to say whether the prediction lies in the target's own basin.
"""

from __future__ import annotations

from lmtune.sweep.strategies.horizon.axis import SearchAxis
from lmtune.sweep.strategies.horizon.search import HorizonSearch
from lmtune.sweep.strategies.width.axis import WidthAxis
from lmtune.sweep.strategies.width.conclusion import WidthFit, fit_widths
from lmtune.sweep.strategies.width.settings import WidthSettings


class WidthSearch(HorizonSearch):
    """The width search's state and decisions: deterministic and JSON-serializable, like the horizon search's."""

    name = "width"
    settings_class = WidthSettings
    fit_class = WidthFit

    def make_axis(self) -> SearchAxis:
        return WidthAxis(self.budget, tuple(self.settings.widths))

    def _fit(self) -> tuple[WidthFit | None, str | None]:
        return fit_widths(self.runs.values(), self.settings, self.budget)

    def _fit_words(self, fit: WidthFit) -> tuple[str, str]:
        moves = "" if fit.resolved else ", gamma not resolved by these widths: LR* may not move with width"
        return f"gamma {fit.gamma:.2f}{moves}", f"the target d_model {self.axis.target}"
