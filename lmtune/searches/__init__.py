"""Search strategies: how a sweep chooses its trials. Each ``search:`` value of a space file is one search, registered
here by that name with its three parts (lmtune.searches.contracts): its strategy, whose section of the space file it
reads (a SpaceSection) and whose ``decisions`` are where its next trial comes from (a TrialSource; grid and optuna:
Tune's own), and its part of the report (a ReportPart), behind a function that imports it only when the report asks
(a sweep loads no figure code)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lmtune.searches import compare, horizon, width
from lmtune.searches.base import SearchStrategy
from lmtune.searches.compare import CompareStrategy
from lmtune.searches.edge import EdgeStrategy
from lmtune.searches.grid import GridSearch
from lmtune.searches.horizon import HorizonStrategy
from lmtune.searches.optuna import OptunaSearch
from lmtune.searches.width import WidthStrategy

if TYPE_CHECKING:
    from lmtune.findings.part import ReportPart


@dataclass(frozen=True)
class SearchEntry:
    """One search as registered: its strategy and its part of the report."""

    strategy: type[SearchStrategy]
    """Its section of the space file and what its sweep runs (lmtune.searches.base.SearchStrategy)."""
    report: Callable[[], ReportPart[Any]] | None = None
    """Its part of the report (a lmtune.findings.part.ReportPart), imported when called (None: the common
    report alone, lmtune.findings.part.PlainSection)."""


STRATEGIES: dict[str, SearchEntry] = {
    "grid": SearchEntry(GridSearch),
    "optuna": SearchEntry(OptunaSearch),
    "edge": SearchEntry(EdgeStrategy),
    "horizon": SearchEntry(HorizonStrategy, report=horizon.report_part),
    "width": SearchEntry(WidthStrategy, report=width.report_part),
    "compare": SearchEntry(CompareStrategy, report=compare.report_part),
}
"""Every search by its ``search:`` value: a new search is its folder and one line here."""

__all__ = ["STRATEGIES", "CompareStrategy", "EdgeStrategy", "GridSearch", "HorizonStrategy", "OptunaSearch",
           "SearchEntry", "SearchStrategy", "WidthStrategy"]
