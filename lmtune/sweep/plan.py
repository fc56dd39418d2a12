"""The plan of a sweep: everything a sweep's trials and its resume need to know, typed, frozen, and
written whole to sweep.json (``to_json``) and read back whole (``from_json``) on --resume.

    SweepPlan
      space   the search space as validated: its strategy and that strategy's settings, the fixed settings,
              the scheduler, the stopper (and its divergence rule), the LRs fused per trial
      base    the RunConfig every trial starts from (budget + fixed settings + --set)
      asha    ASHA's rungs in tokens (None without ASHA)
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lmtune.errors import LmtuneError, shown
from lmtune.sweep.record import SweepRecord
from lmtune.sweep.runs import Budget
from lmtune.sweep.spaces import SCHEDULERS, SchedulerSpec, SearchSpace, StopperSpec
from lmtune.sweep.strategies import STRATEGIES
from lmtune.sweep.strategies.base import Fail, settings_section
from lmtune.training.config import MODEL_FIELDS, TRAIN_FIELDS, RunConfig
from lmtune.training.divergence import DEFAULT_RULE, DivergenceRule
from lmtune.training.lr_range import RangeTestConfig


@dataclass(frozen=True)
class AshaBudget:
    """ASHA's rungs in tokens: the first at ``grace_period``, each ``reduction_factor`` x the last, up to ``max_t``."""

    max_t: int
    grace_period: int
    reduction_factor: float


def asha_budget(spec: SchedulerSpec, largest_trial_tokens: int) -> AshaBudget:
    """A space's ASHA settings in tokens: max_t and grace_period <= 1 are fractions (of the largest
    trial's token budget, and of max_t); larger values are tokens."""
    # Rounded, not cut: a grace period of 1/9 written as 0.1111111 must land on the step it names.
    max_t = round(spec.max_t * largest_trial_tokens) if spec.max_t <= 1 else int(spec.max_t)
    grace = round(spec.grace_period * max_t) if spec.grace_period <= 1 else int(spec.grace_period)
    return AshaBudget(max_t, max(1, min(grace, max_t)), spec.reduction_factor)


@dataclass(frozen=True)
class TrialSetup:
    """What every trial of a sweep shares, whole: what ``train_trial`` needs besides the trial's own values."""

    base: RunConfig
    """The config every trial starts from; a trial applies its own values (lr, seed, ...) to a copy."""
    divergence: DivergenceRule = DEFAULT_RULE
    """How a run's loss is judged (spikes; diverged: failed to recover), reported to the stopper."""
    range_test: RangeTestConfig | None = None
    """The LR range test a trial of stage "range" runs (an edge search's); None: no such trials."""
    asha: AshaBudget | None = None
    """ASHA's rungs in tokens, which a fused group applies to its members itself (None: no ASHA)."""


@dataclass(frozen=True)
class SweepPlan:
    space: SearchSpace
    base: RunConfig
    """The config every trial starts from; each trial applies its own swept settings to a copy."""
    asha: AshaBudget | None = None

    @classmethod
    def create(cls, space: SearchSpace, base: RunConfig) -> SweepPlan:
        """The plan, with ASHA's budget computed from the largest trial the space can have."""
        space.strategy.check_base(base)
        plan = cls(space, base)
        if space.scheduler.name != "asha" or space.strategy.asha_stages() == frozenset():
            return plan
        return dataclasses.replace(plan, asha=asha_budget(space.scheduler, plan.max_trial_tokens()))

    def trial_setup(self) -> TrialSetup:
        """What the sweep's trials share (lmtune.sweep.trainable.train_trial)."""
        return TrialSetup(self.base, self.divergence_rule, self.space.strategy.range_test(), self.asha)

    def budget(self) -> Budget:
        """Every trial's budget as the searchers and the report see it: steps, tokens per step, seed, ASHA's rungs."""
        return Budget.of_config(self.base.to_dict(), asdict(self.asha) if self.asha else None)

    @property
    def divergence_rule(self) -> DivergenceRule:
        return self.space.stopper.rule

    def largest_value(self, name: str, current: int) -> int:
        """The largest value trials give setting ``name`` (``current``: the base config's, when none sets it)."""
        return max([int(v) for v in self.space.strategy.values_of(name)], default=current)

    def max_trial_tokens(self) -> int:
        """The largest token budget any trial can have (batch/context/steps may vary)."""
        base = self.base
        return (self.largest_value("batch_size", base.train.batch_size)
                * self.largest_value("context_length", base.model.context_length)
                * self.largest_value("steps", base.train.steps))

    def largest_trial(self) -> RunConfig:
        """The base config with the largest batch and context any trial can have: the one that needs the
        most memory."""
        base = self.base
        largest = dataclasses.replace(base, model=dataclasses.replace(base.model),
                                      train=dataclasses.replace(base.train))
        largest.train.batch_size = self.largest_value("batch_size", base.train.batch_size)
        largest.model.context_length = self.largest_value("context_length", base.model.context_length)
        return largest

    def to_json(self) -> dict[str, Any]:
        """sweep.json's keys for the plan: ``space``, ``budget``, ``base_config`` and ``asha``."""
        return {"space": self.space.to_json(), "budget": self.base.budget, "base_config": self.base.to_dict(),
                "asha": asdict(self.asha) if self.asha else None}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SweepPlan:
        """The plan a sweep.json holds; LmtuneError when it holds none this version can use."""
        try:
            return cls(SearchSpace.from_json(data["space"]), RunConfig.from_dict(data["base_config"]),
                       AshaBudget(**data["asha"]) if data.get("asha") else None)
        except (KeyError, TypeError, ValueError) as err:
            raise LmtuneError(f"no usable sweep plan ({type(err).__name__}: {err}); it was not written by "
                              "python -m lmtune.run, or was edited: restore it") from None


# ---------------------------------------------------------------------------------------------
# sweep.json as read back: every value a reader uses checked before anything is done with it

RESTORE = "restore the file from a copy of the sweep, or start a new sweep"
# What a JSON value of each type is called in a refusal.
JSON_WORDS = {dict: "a mapping", list: "a list", str: "a string", int: "a whole number", float: "a number",
              bool: "true or false"}


def check_sweep_json(raw: dict[str, Any], path: Path) -> None:
    """Refuse, in one line naming the file and the key, a sweep.json (edited, or damaged) whose values the
    readers (analyze, diagnose, run --resume) cannot use: a key of the wrong JSON type, the space's scheduler,
    stopper and search settings checked as a space file's are, the base config's fields each of its type, ASHA's
    rungs. Keys this version does not know are left alone (a sweep of another version may hold them)."""
    def fail(key: str, message: str) -> LmtuneError:
        return LmtuneError(f"{path}: {key} {message}; {RESTORE}")

    hints = typing.get_type_hints(SweepRecord)
    for name, hint in hints.items():
        if name in raw and not _json_is(raw[name], hint):
            raise fail(name, f"is {_shown(raw[name])}, not {_json_words(hint)}")
    _check_space(raw.get("space") or {}, fail)
    _check_base_config(raw.get("base_config") or {}, fail)
    _check_asha(raw.get("asha"), fail)
    meta = (raw.get("data") or {}).get("meta")
    if meta is not None and not (isinstance(meta, dict) and isinstance(meta.get("sources", []), list)):
        raise fail("data.meta", "is not a mapping with a list of sources (what lmtune.prepare writes)")


def _check_space(space: dict[str, Any], fail: Fail) -> None:
    """The space's sections the readers use, as a space file's are checked (lmtune.sweep.spaces)."""
    def section(name: str, cls: type) -> Any:
        values = space.get(name)
        if isinstance(values, dict):  # another version's keys are left out, not refused
            values = {k: v for k, v in values.items() if k in cls.__dataclass_fields__}
        return settings_section(values, f"space.{name}", cls, fail)

    scheduler = section("scheduler", SchedulerSpec)
    if scheduler.name not in SCHEDULERS or scheduler.reduction_factor <= 1 or scheduler.grace_period <= 0:
        raise fail("space.scheduler", f"is {_shown(space.get('scheduler'))}: not a scheduler {', '.join(SCHEDULERS)} "
                                      "with grace_period > 0 and reduction_factor > 1")
    stopper = section("stopper", StopperSpec)
    try:
        stopper.rule.validate("space.stopper")
    except LmtuneError as err:  # "space.stopper.KEY: what is wrong (got VALUE)"
        key, _, message = str(err).partition(": ")
        raise fail(key, message) from None
    search = space.get("search", "grid")
    if not isinstance(search, str):
        raise fail("space.search", f"is {_shown(search)}, not a string")
    settings_class = getattr(STRATEGIES.get(search), "settings_class", None)
    if settings_class is not None:  # a search with a section of its own (edge:, horizon:), as its YAML is checked
        for key, message in section(search, settings_class).problems():  # (the report divides by them, too)
            raise fail(f"space.{search}.{key}", message)


def _check_base_config(config: dict[str, Any], fail: Fail) -> None:
    for part, fields in (("model", MODEL_FIELDS), ("train", TRAIN_FIELDS)):
        values = config.get(part, {})
        if not isinstance(values, dict):
            raise fail(f"base_config.{part}", f"is {_shown(values)}, not a mapping")
        for key, value in values.items():
            kind = fields[key].type if key in fields else None
            hint = {"int": int, "float": float, "bool": bool, "str": str}.get(str(kind))
            if hint is not None and not _json_is(value, hint):
                raise fail(f"base_config.{part}.{key}", f"is {_shown(value)}, not {_json_words(hint)}")


def _check_asha(asha: dict[str, Any] | None, fail: Fail) -> None:
    """ASHA's rungs in tokens (AshaBudget): a rung of 1 token or more, growing by a factor above 1 (its rungs are
    counted up to max_t: a factor of 1 would never get there)."""
    if asha is None:
        return
    tokens = [asha.get(k) for k in ("max_t", "grace_period")]
    if set(asha) != set(AshaBudget.__dataclass_fields__) or not all(_json_is(t, int) and t >= 1 for t in tokens) \
            or not (_json_is(asha["reduction_factor"], float) and asha["reduction_factor"] > 1):
        raise fail("asha", f"is {_shown(asha)}, not ASHA's max_t and grace_period in tokens and a reduction_factor "
                           "above 1")


def _json_is(value: Any, hint: Any) -> bool:
    """Whether a JSON value has the type ``hint`` (str, int, float, bool, dict[str, X], list[X], X | None)."""
    if isinstance(hint, types.UnionType):
        return any(_json_is(value, h) for h in typing.get_args(hint))
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    origin, args = typing.get_origin(hint) or hint, typing.get_args(hint)
    if origin is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if origin is int:
        return _json_is(value, float) and float(value).is_integer()
    if not isinstance(value, origin):
        return False
    if origin is dict and args:
        return all(_json_is(v, args[1]) for v in value.values())
    if origin is list and args:
        return all(_json_is(v, args[0]) for v in value)
    return True


def _json_words(hint: Any) -> str:
    """``hint`` in words: "a mapping of numbers", "a string or null"."""
    kinds = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    words = []
    for kind in kinds:
        origin, item = typing.get_origin(kind) or kind, (typing.get_args(kind) or (Any,))[-1]
        word = JSON_WORDS.get(origin, "null")
        words.append(word if item is Any else f"{word} of {JSON_WORDS[item].split(' ', 1)[1]}s")
    return " or ".join(words)


def _shown(value: Any) -> str:
    return "null" if value is None else shown(value)
