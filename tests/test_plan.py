"""A sweep's plan: written whole to sweep.json and read back whole, for every shipped space; and the seam
for search strategies: a strategy registered by name needs nothing else to be parsed, planned and run."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest

from lmtune import searches
from lmtune.errors import LmtuneError
from lmtune.searches.base import Fail, StrategyDefaults
from lmtune.sweep.plan import SweepPlan
from lmtune.sweep.spaces import available_spaces, load_space
from lmtune.training.config import budget_config, check_setting


@pytest.mark.parametrize("name", available_spaces())
def test_a_plan_read_back_from_its_json_is_the_plan_written(name: str):
    space = load_space(name)
    plan = SweepPlan.create(space, budget_config(space.budget, space.fixed, data_dir="/data"))
    again = SweepPlan.from_json(plan.to_json())
    assert again == plan
    assert again.to_json() == plan.to_json()


def test_asha_budget_is_planned_in_tokens_from_the_largest_trial():
    space = load_space("lr_batch")  # batch sizes 16, 32 and 64
    plan = SweepPlan.create(space, budget_config(space.budget, space.fixed))
    largest = 64 * plan.base.model.context_length * plan.base.train.steps
    assert plan.max_trial_tokens() == largest
    assert plan.asha.max_t == largest and plan.asha.grace_period == round(space.scheduler.grace_period * largest)


def test_a_plan_that_is_not_one_is_refused_in_one_line():
    with pytest.raises(LmtuneError, match=r"no usable sweep plan \(KeyError") as info:
        SweepPlan.from_json({"space": {"name": "x"}})
    assert "\n" not in str(info.value)


@dataclass(frozen=True)
class LogSpaced(StrategyDefaults):
    """A strategy of the test's own: ``count`` LRs log-spaced from ``lrs: [low, high]``, each a trial."""

    low: float
    high: float
    count: int

    name: ClassVar[str] = "logspaced"
    keys: ClassVar[frozenset[str]] = frozenset({"lrs", "count"})

    @classmethod
    def parse(cls, raw: dict[str, Any], fail: Fail) -> LogSpaced:
        low, high = (check_setting("lr", v, lambda why: fail("lrs", why)) for v in raw["lrs"])
        return cls(low, high, int(raw.get("count", 3)))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LogSpaced:
        return cls(*data["lrs"], data["count"])

    def to_json(self) -> dict[str, Any]:
        return {"lrs": [self.low, self.high], "count": self.count}

    def lrs(self) -> list[float]:
        step = math.log(self.high / self.low) / (self.count - 1)
        return [self.low * math.exp(k * step) for k in range(self.count)]

    def swept(self) -> list[str]:
        return ["lr"]

    def num_trials(self) -> int:
        return self.count

    def values_of(self, name: str) -> list[Any]:
        return self.lrs() if name == "lr" else []

    def corner_samples(self) -> list[dict[str, Any]]:
        return [{"lr": self.low}, {"lr": self.high}]

    def describe(self, fuse: int) -> str:
        return f"{self.count} LRs log-spaced from {self.low:g} to {self.high:g}"

    def param_space(self, fuse: int) -> dict[str, Any]:
        from ray import tune

        return {"lr": tune.grid_search(self.lrs())}

    def searcher(self, budget, sweep_dir: Path):
        return None, 1

    def progress_columns(self, fuse: int) -> list[str]:
        return ["lr"]


def test_a_new_strategy_is_one_class_and_its_registration(tmp_path: Path, monkeypatch):
    monkeypatch.setitem(searches.STRATEGIES, LogSpaced.name, searches.SearchEntry(LogSpaced))
    path = tmp_path / "logspaced.yaml"
    path.write_text("search: logspaced\nbudget: quick\nlrs: [1.0e-4, 1.0e-2]\ncount: 3\n")
    space = load_space(str(path))
    assert space.num_trials == 3 and space.describe_search() == "3 LRs log-spaced from 0.0001 to 0.01"
    grid = space.strategy.param_space(space.fuse)["lr"]["grid_search"]
    assert grid == pytest.approx([1e-4, 1e-3, 1e-2])
    plan = SweepPlan.create(space, budget_config(space.budget, space.fixed))
    assert SweepPlan.from_json(plan.to_json()) == plan
    # Its keys are its own: another strategy's key, or a setting it sweeps, is refused by name.
    path.write_text("search: logspaced\nlrs: [1.0e-4, 1.0e-2]\nsampler: tpe\n")
    with pytest.raises(LmtuneError, match=r": sampler: only for search: optuna"):
        load_space(str(path))
    path.write_text("search: logspaced\nlrs: [1.0e-4, 1.0e-2]\nset: {lr: 0.1}\n")
    with pytest.raises(LmtuneError, match=r": set.lr: also listed under params"):
        load_space(str(path))
