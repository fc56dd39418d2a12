"""The width search (``search: width``): the best LR for the model the user will train (the target width, the
space's d_model), predicted from the best LR of narrower copies of it they can afford, and confirmed at the target.
Ray-free: the Tune Searcher that drives it is lmtune.sweep.strategies.searcher.WidthSearcher.

It is the horizon search (lmtune.sweep.strategies.horizon.search) stepping along width instead of tokens: at each
proxy width, narrowest first, the same stages (grid, extend, seeds, refine, walls, edge probes) with the same
full-budget crowning rules, every run trained to the space's whole budget; then ln LR* = a - gamma ln width is
fitted through the located LR*s (under SP the best Adam LR falls with width; under μP gamma should be 0 and the
fit says whether it is), and the predicted LR and it divided and multiplied by ``confirm_ratio`` are trained at
the target width, ``confirm_seeds`` runs each, enough to say whether the prediction lies in the target's own basin.
"""

from __future__ import annotations

from lmtune.files import JsonObject
from lmtune.sweep.conclusion import conclude
from lmtune.sweep.runs import Budget
from lmtune.sweep.strategies.horizon.axis import SearchAxis
from lmtune.sweep.strategies.horizon.planned import Planned
from lmtune.sweep.strategies.horizon.search import HorizonSearch
from lmtune.sweep.strategies.width.axis import WidthAxis
from lmtune.sweep.strategies.width.conclusion import WidthFit, fit_widths
from lmtune.sweep.strategies.width.settings import WidthSettings


class WidthSearch(HorizonSearch):
    """The width search's state and decisions: deterministic and JSON-serializable, like the horizon search's."""

    settings_class = WidthSettings

    def __init__(self, settings: WidthSettings, budget: Budget, max_pending: int = 1):
        super().__init__(settings, budget, max_pending)
        self.width_fit: WidthFit | None = None

    def make_axis(self) -> SearchAxis:
        return WidthAxis(self.budget, tuple(self.settings.widths))

    def _confirm(self) -> None:
        target = self.axis.target
        self.width_fit, self.fit_problem = fit_widths(self.runs.values(), self.settings, self.budget)
        fit = self.width_fit
        if fit is None:
            self._plan("target", target, [], f"no fit: {self.fit_problem}")
            return
        lrs = self.settings.confirmation_lrs(fit.predicted_lr)
        low, high = fit.predicted_lr_interval
        seeds = self._seeds_of(self.settings.confirm_seeds)
        moves = "" if fit.resolved else ", gamma not resolved by these widths: LR* may not move with width"
        self._plan("target", target, [Planned("target", target, lr, s) for lr in lrs for s in seeds],
                   f"the fit predicts {fit.predicted_lr:.3g} (90% interval {low:.3g}-{high:.3g}, gamma "
                   f"{fit.gamma:.2f}{moves}) at the target d_model {target}: it and "
                   f"{self.settings.confirm_ratio:g}x either side, trained at the target with {len(seeds)} "
                   f"seed{'s' * (len(seeds) > 1)}")

    def conclusion(self) -> JsonObject:
        """Per width, what its runs show (best LR, seeds, edge), the fit and the confirmation."""
        full = self.budget.at_steps(self.budget.steps)
        per_width = {str(w): conclude(self.runs_at(w), full).to_json() for w in [*self.points, self.axis.target]}
        return {"widths": per_width, "fit": self.width_fit.to_json() if self.width_fit else None,
                "fit_problem": self.fit_problem}

    def to_json(self) -> JsonObject:
        return {**super().to_json(), "fit": self.width_fit.to_json() if self.width_fit else None}

    def _restore(self, data: JsonObject) -> None:
        self.seed_rounds = {int(k): int(v) for k, v in (data.get("seed_rounds") or {}).items()}
        self.width_fit = WidthFit.from_json(data["fit"]) if data.get("fit") else None
        self.fit_problem = data.get("fit_problem")
