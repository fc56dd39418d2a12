"""``search: edge``: the LR search that decides as it goes where the best LR is, how the loss degrades above
it and where training fails (the stages: lmtune.searches.edge.search)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from lmtune.analysis.runs import Outcome
from lmtune.searches.base import DecidingDefaults
from lmtune.searches.contracts import TrialSourceClass
from lmtune.searches.edge.search import ASHA_STAGES, EdgeSearch
from lmtune.searches.edge.settings import RETIRED_KEYS, EdgeSettings
from lmtune.training.lr_range import RangeTestConfig


@dataclass(frozen=True)
class EdgeStrategy(DecidingDefaults):
    settings: EdgeSettings

    name: ClassVar[str] = EdgeSearch.name
    keys: ClassVar[frozenset[str]] = frozenset({"edge", "params"})
    settings_class: ClassVar[type] = EdgeSettings
    search_class: ClassVar[TrialSourceClass] = EdgeSearch
    retired_keys: ClassVar[dict[str, str]] = RETIRED_KEYS

    def describe(self, fuse: int) -> str:
        e = self.settings
        seeds = (f", then {e.seeds} seeds of the best {e.seed_lrs} LRs (and of any LR that beats the best seed "
                 "for seed)") if e.seeds > 1 else ""
        return (f"edge search: an LR range test, a coarse grid {e.coarse_ratio:g}x apart under early stopping, "
                "the coarse LRs above the best continued to the full budget, bisection of where training fails "
                f"(full-budget probes on one seed, {e.edge_seeds} seeds at the stable end) to a bracket ratio <= "
                f"{e.tolerance:g} with a rule-judged diverged end retrained without early stopping, refinement "
                f"within {e.refine_factor:g}x of the best LR and at 2x and 4x it{seeds}")

    def asha_stages(self) -> frozenset[str]:
        return ASHA_STAGES

    def range_test(self) -> RangeTestConfig:
        s = self.settings
        return RangeTestConfig(min_lr=s.range_min_lr, max_lr=s.range_max_lr, steps=s.range_steps,
                               blowup_factor=s.range_blowup_factor)

    def expected_trials(self) -> tuple[int, int]:
        s = self.settings
        # The widest coarse grid the range test's bounds allow (each coarse run may be cut and held), a few
        # one-seed bisection probes, the stable end's further seeds, the refinement (its points, the costs at 2x
        # and 4x, a bound beyond the best) and the extra seeds of the best LRs.
        coarse = math.ceil(math.log(s.range_max_lr * s.coarse_above / s.range_min_lr) / math.log(s.coarse_ratio)) + 1
        return 1 + coarse + 4 + s.edge_seeds + s.refine_points + 3 + s.seed_lrs * (s.seeds - 1), coarse

    def held_checkpoints(self, outcome: str) -> frozenset[str]:
        # An LR that ASHA cut may be continued to the full budget (landscape, refine) from its newest checkpoint.
        return frozenset({"periodic"}) if outcome == Outcome.STOPPED_EARLY else frozenset()
