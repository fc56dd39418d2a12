"""The one lookup from a sweep's search name to its part of the report, and the edge search's part: the why of each
stage it decided (its state's decisions), in the stage table of the common report. Its LR range test is the common
report's (lr_range_test.png and its section, wherever a sweep has one)."""

from __future__ import annotations

from dataclasses import dataclass

from lmtune.report.comparison import StageDecision
from lmtune.report.sections.base import PlainSection, ReportSection, SweepInputs
from lmtune.report.sections.horizon import HorizonSection
from lmtune.report.sections.width import WidthSection
from lmtune.sweep.record import read_search_state
from lmtune.sweep.sweep_file import SweepRecord


@dataclass(frozen=True)
class EdgeSection(PlainSection):
    """``search: edge``: the stages' reasons from its state (decisions/edge_search.json)."""

    name: str = "edge"
    """The search's name."""

    def decisions(self, sweep: SweepInputs) -> list[StageDecision]:
        state = read_search_state(sweep.sweep_dir, self.name) or {}
        return [StageDecision(d["stage"], d["why"]) for d in state.get("decisions", [])]


# The searches with a part of their own, by their ``search:`` value (lmtune.sweep.strategies.STRATEGIES); any
# other (grid, optuna, a new one) gets the common report alone.
SECTIONS: dict[str, ReportSection] = {"edge": EdgeSection(), "horizon": HorizonSection(), "width": WidthSection()}


def section_for(search: str) -> ReportSection:
    """The report's part for a search (grid, and any search without a part of its own: the common report alone)."""
    return SECTIONS.get(search) or PlainSection(search)


def search_of(record: SweepRecord) -> str:
    """The search a sweep ran, from sweep.json (a sweep that records no plan: a grid)."""
    return record.plan.space.search if record.plan is not None else "grid"
