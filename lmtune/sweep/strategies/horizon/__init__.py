"""``search: horizon``: the best LR at the budget the user will train at, predicted from the best LR at
smaller budgets (a power law in the token horizon) and confirmed at that budget (the stages:
lmtune.sweep.strategies.horizon.search; the fit: lmtune.analysis.fit)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from lmtune.files import JsonObject
from lmtune.sweep.strategies.base import DecidingDefaults, Fail
from lmtune.sweep.strategies.horizon.search import HorizonSearch
from lmtune.sweep.strategies.horizon.settings import HorizonSettings
from lmtune.training.config import RunConfig, apply_overrides

# What the horizon search sets per trial itself (seed: the base seed may be set; further seeds are added;
# steps: the space's steps are the target budget, and each trial sets its own budget).
HORIZON_OWNS = ("lr", "run_steps")


@dataclass(frozen=True)
class HorizonStrategy(DecidingDefaults):
    settings: HorizonSettings

    name: ClassVar[str] = "horizon"
    keys: ClassVar[frozenset[str]] = frozenset({"horizon", "params"})  # params: to say it has none
    search_class: ClassVar[type] = HorizonSearch
    settings_class: ClassVar[type] = HorizonSettings
    owns: ClassVar[tuple[str, ...]] = HORIZON_OWNS

    @classmethod
    def parse(cls, raw: JsonObject, fail: Fail) -> HorizonStrategy:
        refuse_early_stopping(raw, fail, cls.name)
        return super().parse(raw, fail)

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

    def progress_columns(self, fuse: int) -> list[str]:
        return ["stage", "steps", "lr", "seed"]

    def asha_stages(self) -> frozenset[str]:
        return frozenset()  # every run trains its whole budget

    def expected_trials(self) -> tuple[int, int]:
        trials = self.settings.expected_trials(self.settings.budgets)
        return trials, trials  # each run may keep a stable.pt for a larger budget

    def held_checkpoints(self, outcome: str) -> frozenset[str]:
        return frozenset({"stable"})  # a larger budget's run of the same LR and seed forks from it


def refuse_early_stopping(raw: JsonObject, fail: Fail, search: str) -> None:
    """A horizon or width search compares LRs only at a run's whole budget: a scheduler that cuts runs is refused
    (params, if any, are refused first, by the shared parse)."""
    scheduler = raw.get("scheduler")
    if isinstance(scheduler, dict) and scheduler.get("name", "asha") != "none" and not raw.get("params"):
        raise fail("scheduler.name", f"search: {search} trains every run to its whole budget (LRs are compared "
                                     "only there); set scheduler: {name: none} or remove scheduler")
