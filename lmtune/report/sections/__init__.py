"""Which part of the report a sweep gets (``section_for``): the one its search registers in lmtune.searches.STRATEGIES
(its folder's ``report.py``, as ``SECTION``), or the common report alone (lmtune.findings.part.PlainSection: grid,
optuna, edge, and any search registered without one); and what the report reads for it besides its trials (the
search's name and its stages' reasons). Nothing is listed here, and a search's decisions never import its report part
(a sweep loads no figure code)."""

from __future__ import annotations

from pathlib import Path

from lmtune.findings.comparison import StageDecision
from lmtune.findings.part import PlainSection, ReportPart
from lmtune.searches import STRATEGIES
from lmtune.searches.state import read_search_state
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


def search_decisions(sweep_dir: Path, search: str) -> tuple[StageDecision, ...]:
    """The search's reasons for its stages, from its state (decisions/NAME_search.json), where it decided as it went
    (edge, horizon, width, compare, a new search); none for grid and optuna (one stage)."""
    state = read_search_state(sweep_dir, search) or {}
    return tuple(StageDecision(d["stage"], d["why"]) for d in state.get("decisions", []))
