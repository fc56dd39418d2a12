"""``search: grid``: every combination of the listed values, one trial each (or, fused, each combination
of the other settings with its LRs in groups of ``fuse``: lmtune.fused)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, cast

from lmtune.files import JsonObject
from lmtune.searches.base import Fail, Setting, StrategyDefaults
from lmtune.searches.grid.settings import combinations, parse_grid
from lmtune.searches.trial_order import TuneParams


@dataclass(frozen=True)
class GridSearch(StrategyDefaults):
    params: dict[str, list[Setting]]
    """Setting -> its values, in the order listed."""

    name: ClassVar[str] = "grid"
    keys: ClassVar[frozenset[str]] = frozenset({"params"})

    @classmethod
    def parse(cls, raw: JsonObject, fail: Fail) -> GridSearch:
        return cls(parse_grid(raw, fail))

    @classmethod
    def from_json(cls, data: JsonObject) -> GridSearch:
        return cls({name: list(values) for name, values in cast(Any, data["params"]).items()})

    def to_json(self) -> JsonObject:
        return {"params": cast(Any, self.params)}

    def swept(self) -> list[str]:
        return list(self.params)

    def num_trials(self) -> int:
        return math.prod(len(values) for values in self.params.values())

    def values_of(self, name: str) -> list[Setting]:
        return list(self.params.get(name, []))

    def corner_samples(self) -> list[dict[str, Setting]]:
        def ends(values: list[Setting]) -> list[Setting]:
            return [min(values), max(values)] if all(isinstance(v, (int, float)) for v in values) else values[:1]

        return combinations({name: ends(values) for name, values in self.params.items()})

    def fused_refusal(self, fuse: int) -> str | None:
        if fuse > 1 and "lr" not in self.params:
            return "fusing groups the LRs of params.lr, which this space does not sweep; use fuse: 1"
        return None

    def fused_members(self, fuse: int) -> int:
        return min(fuse, len(self.params.get("lr", [])) or 1)

    def member_groups(self, fuse: int) -> list[dict[str, Setting | list[Setting]]]:
        """The grid cut into fused trials: each combination of the other swept settings, its LRs in groups of
        up to ``fuse`` in the order listed, as {"lr": [...], other: value}."""
        others = combinations({name: values for name, values in self.params.items() if name != "lr"})
        lrs = self.params["lr"]
        return [{"lr": lrs[i:i + fuse], **combo} for combo in others for i in range(0, len(lrs), fuse)]

    def describe(self, fuse: int) -> str:
        dims = " x ".join(f"{k} ({len(v)} values)" for k, v in self.params.items())
        fused = f", up to {fuse} LRs fused per process" if fuse > 1 else ""
        return f"grid search over {dims}: {self.num_trials()} trials{fused}"

    def param_space(self, fuse: int) -> TuneParams:
        from ray import tune

        if fuse > 1:
            return {"members": tune.grid_search(self.member_groups(fuse))}
        return {name: tune.grid_search(values) for name, values in self.params.items()}

    def searcher(self, budget, sweep_dir: Path) -> tuple[None, int]:
        return None, 1  # Tune's own grid generation: every combination once

    def progress_columns(self, fuse: int) -> list[str]:
        return ["members"] if fuse > 1 else list(self.params)
