"""Search strategies: how a sweep chooses its trials. The protocol is ``base.SearchStrategy``; each
``search:`` value of a space file is one strategy, registered here by that name."""

from __future__ import annotations

from lmtune.sweep.strategies.base import SearchStrategy
from lmtune.sweep.strategies.edge import EdgeStrategy
from lmtune.sweep.strategies.grid import GridSearch
from lmtune.sweep.strategies.horizon import HorizonStrategy
from lmtune.sweep.strategies.optuna_search import OptunaSearch
from lmtune.sweep.strategies.width import WidthStrategy

STRATEGIES: dict[str, type[SearchStrategy]] = {
    s.name: s for s in (GridSearch, OptunaSearch, EdgeStrategy, HorizonStrategy, WidthStrategy)}

__all__ = ["STRATEGIES", "EdgeStrategy", "GridSearch", "HorizonStrategy", "OptunaSearch", "SearchStrategy",
           "WidthStrategy"]
