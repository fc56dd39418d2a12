"""An edge search's part of the report: the why of each stage it decided (its state's decisions), in the stage
table of the common report. Its LR range test is the common report's (lr_range_test.png and its section, wherever
a sweep has one)."""

from __future__ import annotations

from dataclasses import dataclass

from lmtune.report.comparison import StageDecision
from lmtune.report.sections.base import PlainSection, SweepInputs
from lmtune.sweep.record import read_search_state


@dataclass(frozen=True)
class EdgeSection(PlainSection):
    """``search: edge``: the stages' reasons from its state (decisions/edge_search.json)."""

    name: str = "edge"
    """The search's name."""

    def decisions(self, sweep: SweepInputs) -> list[StageDecision]:
        state = read_search_state(sweep.sweep_dir, self.name) or {}
        return [StageDecision(d["stage"], d["why"]) for d in state.get("decisions", [])]
