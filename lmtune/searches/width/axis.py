"""The width search's axis: the proxies' d_model, then the target's (lmtune.searches.horizon.axis)."""

from __future__ import annotations

from dataclasses import dataclass

from lmtune.analysis.runs import Budget, Run
from lmtune.searches.horizon.axis import Axis
from lmtune.searches.trial_order import TuneParams
from lmtune.searches.width.settings import proxy_shape


@dataclass(frozen=True)
class WidthAxis(Axis):
    """Model widths at one token budget: a trial sets d_model (d_ff and n_heads with it); every run's budget is
    the space's."""

    name = "width"

    @property
    def target(self) -> int:
        return self.budget.d_model

    def params(self, point: int) -> TuneParams:
        return proxy_shape(self.budget, point)

    def budget_at(self, point: int) -> Budget:
        return self.budget.at_steps(self.budget.steps)  # every width trains the space's whole budget

    def holds(self, run: Run, point: int) -> bool:
        return dict(run.others).get("d_model") == point

    def others(self, point: int) -> tuple[tuple[str, object], ...]:
        return tuple(sorted(self.params(point).items()))

    def label(self, point: int) -> str:
        return f"d_model {point}"
