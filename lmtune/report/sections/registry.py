"""The one lookup from a sweep's search name to its part of the report."""

from __future__ import annotations

from lmtune.report.sections.base import PlainSection, ReportSection
from lmtune.report.sections.edge import EdgeSection
from lmtune.report.sections.horizon import HorizonSection
from lmtune.report.sections.width import WidthSection
from lmtune.sweep.sweep_file import SweepRecord

SECTIONS: dict[str, ReportSection] = {"edge": EdgeSection(), "horizon": HorizonSection(),
                                      "optuna": PlainSection("optuna"), "width": WidthSection()}


def section_for(search: str) -> ReportSection:
    """The report's part for a search (grid, and any search without a part of its own: the common report alone)."""
    return SECTIONS.get(search) or PlainSection(search)


def search_of(record: SweepRecord) -> str:
    """The search a sweep ran, from sweep.json (a sweep that records no plan: a grid)."""
    return record.plan.space.search if record.plan is not None else "grid"
