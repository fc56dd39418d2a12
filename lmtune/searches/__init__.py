"""Search strategies: how a sweep chooses its trials. The protocol is ``base.SearchStrategy``; each
``search:`` value of a space file is one strategy, registered here by that name."""

from __future__ import annotations

from lmtune.searches.base import SearchStrategy
from lmtune.searches.compare import CompareStrategy
from lmtune.searches.edge import EdgeStrategy
from lmtune.searches.grid import GridSearch
from lmtune.searches.horizon import HorizonStrategy
from lmtune.searches.optuna import OptunaSearch
from lmtune.searches.width import WidthStrategy

STRATEGIES: dict[str, type[SearchStrategy]] = {
    s.name: s for s in (GridSearch, OptunaSearch, EdgeStrategy, HorizonStrategy, WidthStrategy, CompareStrategy)}

__all__ = ["STRATEGIES", "CompareStrategy", "EdgeStrategy", "GridSearch", "HorizonStrategy", "OptunaSearch",
           "SearchStrategy", "WidthStrategy"]
