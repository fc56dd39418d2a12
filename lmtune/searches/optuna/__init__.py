"""``search: optuna``: ``num_samples`` trials whose settings Optuna's sampler draws from the distributions
of ``params`` (Ray Tune's OptunaSearch)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from lmtune.errors import shown
from lmtune.files import JsonObject
from lmtune.searches.base import Fail, Setting, StrategyDefaults, params_section
from lmtune.searches.grid.settings import MAX_GRID_TRIALS, combinations
from lmtune.searches.optuna.settings import SAMPLERS, Distribution, distribution
from lmtune.searches.trial_order import TuneParams


@dataclass(frozen=True)
class OptunaSearch(StrategyDefaults):
    params: dict[str, Distribution]
    """Setting -> the distribution its values are drawn from."""
    sampler: str = "tpe"
    """Optuna's sampler: tpe | random | cmaes."""
    num_samples: int = 10
    """Trials to draw."""

    name: ClassVar[str] = "optuna"
    keys: ClassVar[frozenset[str]] = frozenset({"params", "sampler", "num_samples"})

    @classmethod
    def parse(cls, raw: JsonObject, fail: Fail) -> OptunaSearch:
        params = {name: distribution(name, spec, f"params.{name}", fail)
                  for name, spec in params_section(raw, fail).items()}
        sampler = raw.get("sampler", "tpe")
        if sampler not in SAMPLERS:
            raise fail("sampler", f"unknown sampler '{sampler}'; use one of {', '.join(SAMPLERS)}")
        num_samples = raw.get("num_samples", 10)
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise fail("num_samples", f"must be a positive integer (got {shown(num_samples)})")
        if num_samples > MAX_GRID_TRIALS:  # the bound a grid has, for the same reasons
            raise fail("num_samples", f"must be at most {MAX_GRID_TRIALS:,}, as a grid space's trials (got "
                                      f"{shown(num_samples)}): ask for fewer")
        return cls(params, sampler, num_samples)

    @classmethod
    def from_json(cls, data: JsonObject) -> OptunaSearch:
        saved: Any = data  # (what to_json wrote)
        params = {name: Distribution(kind, tuple(args)) for name, (kind, args) in saved["params"].items()}
        return cls(params, saved.get("sampler", "tpe"), int(saved.get("num_samples", 10)))

    def to_json(self) -> JsonObject:
        return {"params": {name: [d.kind, list(d.args)] for name, d in self.params.items()},
                "sampler": self.sampler, "num_samples": self.num_samples}

    def swept(self) -> list[str]:
        return list(self.params)

    def num_trials(self) -> int:
        return self.num_samples

    def values_of(self, name: str) -> list[Setting]:
        return list(self.params[name].args) if name in self.params else []

    def corner_samples(self) -> list[dict[str, Setting]]:
        return combinations({name: d.ends() for name, d in self.params.items()})

    def describe(self, fuse: int) -> str:
        dims = ", ".join(f"{k} ~ {d.kind}{d.args}" for k, d in self.params.items())
        return f"Optuna {self.sampler.upper()} search, {self.num_samples} samples of {dims}"

    def param_space(self, fuse: int) -> TuneParams:
        return {name: d.tune_domain() for name, d in self.params.items()}

    def searcher(self, budget, sweep_dir: Path):
        # OptunaSearch reads its metric from every result; val_loss comes every eval_interval only, so it
        # sees "objective": the latest val loss (ln(vocab) for a diverged trial).
        return self.optuna_searcher(metric="objective", seed=budget.seed), self.num_samples

    def optuna_searcher(self, metric: str = "val_loss", mode: str = "min", seed: int = 0):
        """Tune's OptunaSearch with this space's sampler."""
        import optuna
        from ray.tune.search.optuna import OptunaSearch as TuneOptunaSearch

        sampler = {"tpe": optuna.samplers.TPESampler, "random": optuna.samplers.RandomSampler,
                   "cmaes": optuna.samplers.CmaEsSampler}[self.sampler](seed=seed)
        return TuneOptunaSearch(metric=metric, mode=mode, sampler=sampler)

    def progress_columns(self, fuse: int) -> list[str]:
        return list(self.params)
