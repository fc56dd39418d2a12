"""The report's part of each search: what every part provides and the common report (``base``), and which part a
sweep gets (``section_for``): the one its search registers in lmtune.searches.STRATEGIES (its folder's ``report.py``,
as ``SECTION``), or the common report alone (grid, optuna, edge, and any search registered without one). Nothing is
listed here, and a search's decisions never import its report part (a sweep loads no figure code)."""

from __future__ import annotations

from lmtune.report.sections.base import PlainSection, ReportPart
from lmtune.searches import STRATEGIES
from lmtune.sweep.sweep_file import SweepRecord


def section_for(search: str) -> ReportPart:
    """The report's part for a search (one registered without a part of its own, or not registered: the common
    report)."""
    entry = STRATEGIES.get(search)
    if entry is None or entry.report is None:
        return PlainSection(search)
    return entry.report()


def search_of(record: SweepRecord) -> str:
    """The search a sweep ran, from sweep.json (a sweep that records no plan: a grid)."""
    return record.plan.space.search if record.plan is not None else "grid"
