"""``search: grid``: every combination of the listed values, one trial each (or, fused, each combination
of the other settings with its LRs in groups of ``fuse``: lmtune.fused)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from lmtune.files import JsonObject
from lmtune.searches.base import Fail, Setting, StrategyDefaults, params_section
from lmtune.searches.trial_order import TuneParams
from lmtune.training.config import check_setting

# The most trials a grid may ask for: far beyond what a sweep can run (a quick trial takes ~10 s on 2 cores),
# and small enough that parsing and Tune's bookkeeping stay instant.
MAX_GRID_TRIALS = 10_000


def combinations(values: dict[str, list[Setting]]) -> list[dict[str, Setting]]:
    """Every combination of the given values per setting."""
    samples: list[dict[str, Setting]] = [{}]
    for name, options in values.items():
        samples = [{**s, name: v} for s in samples for v in options]
    return samples


@dataclass(frozen=True)
class GridSearch(StrategyDefaults):
    params: dict[str, list[Setting]]
    """Setting -> its values, in the order listed."""

    name: ClassVar[str] = "grid"
    keys: ClassVar[frozenset[str]] = frozenset({"params"})

    @classmethod
    def parse(cls, raw: JsonObject, fail: Fail) -> GridSearch:
        params = {}
        for name, spec in params_section(raw, fail).items():
            key = f"params.{name}"
            if isinstance(spec, dict):
                raise fail(key, "search: grid takes a list of values; distributions are for search: optuna")
            values = spec if isinstance(spec, list) else [spec]
            if not values:
                raise fail(key, "empty grid; list at least one value")
            if len(values) > MAX_GRID_TRIALS:
                raise fail(key, f"{len(values):,} values; a grid runs at most {MAX_GRID_TRIALS:,} trials: "
                                "use search: optuna or edge to cover a range that finely")
            coerced = [check_setting(name, v, lambda why, key=key: fail(key, why)) for v in values]
            seen: set[Setting] = set()
            repeated = sorted({v for v in coerced if v in seen or seen.add(v)}, key=str)
            if repeated:  # [1e-3, 0.001] would run the same trial twice
                raise fail(key, f"{', '.join(map(str, repeated))} listed more than once; list each value once")
            params[name] = coerced
        trials = math.prod(len(values) for values in params.values())
        if trials > MAX_GRID_TRIALS:
            raise fail("params", f"the grid has {trials:,} combinations; a grid runs at most {MAX_GRID_TRIALS:,} "
                                 "trials: list fewer values")
        return cls(params)

    @classmethod
    def from_json(cls, data: JsonObject) -> GridSearch:
        return cls({name: list(values) for name, values in data["params"].items()})

    def to_json(self) -> JsonObject:
        return {"params": self.params}

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
