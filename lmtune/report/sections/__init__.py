"""The report's part of each search: what every part provides and the common report (``base``), and which part a
sweep gets (``section_for``): its search's own, the ``SECTION`` of the ``report`` module in the search's folder
(lmtune.searches.NAME.report), or the common report alone (grid, optuna, edge, and any search without a report
module). The searches' one registry is lmtune.searches.STRATEGIES; nothing is listed here, and a search's decisions
never import its report part (a sweep loads no figure code)."""

from __future__ import annotations

import importlib

from lmtune.report.sections.base import PlainSection, ReportPart
from lmtune.searches import STRATEGIES
from lmtune.sweep.sweep_file import SweepRecord

REPORT_MODULE = "report"
"""The module of a search's folder that holds its part of the report, as ``SECTION``."""


def section_for(search: str) -> ReportPart:
    """The report's part for a search (one without a report module, or not registered: the common report)."""
    strategy = STRATEGIES.get(search)
    if strategy is None:
        return PlainSection(search)
    name = f"{strategy.__module__}.{REPORT_MODULE}"  # a search's strategy is its folder's __init__
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name != name:  # the report module exists, and something it imports does not
            raise
        return PlainSection(search)
    return module.SECTION


def search_of(record: SweepRecord) -> str:
    """The search a sweep ran, from sweep.json (a sweep that records no plan: a grid)."""
    return record.plan.space.search if record.plan is not None else "grid"
