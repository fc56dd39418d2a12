"""``search: horizon``: the best LR at the budget the user will train at, predicted from the best LR at
smaller budgets (a power law in the token horizon) and confirmed at that budget (the search:
lmtune.searches.horizon.search, on the engine of a search along an axis, lmtune.searches.axis; the fit:
lmtune.analysis.fit)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from lmtune.searches.base import DecidingDefaults
from lmtune.searches.contracts import TrialSourceClass
from lmtune.searches.horizon.search import HorizonSearch
from lmtune.searches.horizon.settings import NO_GAIN_UP_TO_RATIO, HorizonSettings
from lmtune.training.config import RunConfig, apply_overrides

if TYPE_CHECKING:
    from lmtune.findings.part import ReportPart


@dataclass(frozen=True)
class HorizonStrategy(DecidingDefaults):
    settings: HorizonSettings

    name: ClassVar[str] = HorizonSearch.name
    keys: ClassVar[frozenset[str]] = frozenset({"horizon", "params"})
    settings_class: ClassVar[type] = HorizonSettings
    search_class: ClassVar[TrialSourceClass] = HorizonSearch
    whole_budget_only: ClassVar[bool] = HorizonSearch.whole_budget_only
    axis_columns: ClassVar[tuple[str, ...]] = HorizonSearch.axis_columns

    def check_base(self, base: RunConfig) -> None:
        super().check_base(base)
        self.settings.check_target(base.train.steps, base.train.warmup_steps)
        for steps in self.settings.budget_steps(base.train.steps):  # e.g. a WSD cooldown must fit each budget
            apply_overrides(base, {"steps": steps}, where=f"horizon: the {steps}-step budget")

    def describe(self, fuse: int) -> str:
        s = self.settings
        edge = (f", up to {s.edge_probes} probes per budget for where training fails" if s.edge_probes else "")
        return (f"horizon search: the best LR at {s.budgets} budgets ({s.largest_fraction:g} of the target and "
                f"{s.budget_ratio:g}x apart below it), each a grid {s.ratio:g}x apart trained to its whole budget "
                f"with {s.seeds} seeds of the best and its neighbours"
                f"{', LR* located between grid points' if s.refine else ''}{edge}; ln LR* fitted against ln tokens "
                f"and the predicted LR confirmed at the target with {s.confirm_ratio:g}x either side, "
                f"{s.confirm_seeds} seed{'s' * (s.confirm_seeds > 1)} each")

    def advice(self, base: RunConfig) -> str | None:
        ratio = 1 / self.settings.largest_fraction
        if ratio > NO_GAIN_UP_TO_RATIO:
            return None
        return (f"horizon: the target is {ratio:g}x the largest searched budget; up to {NO_GAIN_UP_TO_RATIO:g}x a "
                "direct local search at the target (as many runs as this search trains there, around the largest "
                "budget's best LR scaled by ratio^-0.3) cost less and found an LR as good in lmtune's measurements "
                "(benchmarks/README.md): consider a grid at the target over those LRs (search: grid) instead")

    def expected_trials(self) -> tuple[int, int]:
        trials = self.settings.expected_trials(self.settings.budgets)
        return trials, trials  # each run may keep a stable.pt for a larger budget

    def held_checkpoints(self, outcome: str) -> frozenset[str]:
        return frozenset({"stable"})  # a larger budget's run of the same LR and seed forks from it


def report_part() -> ReportPart[Any]:
    """Its part of the report (lmtune.searches.horizon.report.SECTION, a ReportPart), imported only when the report asks
    for it: a sweep loads none of it."""
    from lmtune.searches.horizon.report import SECTION

    return SECTION
