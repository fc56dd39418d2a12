"""Search spaces: ``search_spaces/*.yaml`` files, validated before anything is launched.

The shipped spaces are the package ``lmtune.search_spaces`` (the repository's ``search_spaces/`` links to it),
found through importlib.resources, so a name such
as ``lr_grid`` works from any directory and from a wheel; ``--space PATH`` reads any other file.

A space is YAML data (read with ``yaml.safe_load``, never executed)::

    description: one line shown by --list-spaces
    search: grid                 # grid | optuna | edge
    sampler: tpe                 # optuna only: tpe | random | cmaes
    num_samples: 12              # optuna only
    budget: low-resource         # quick | low-resource | full
    params:                      # what varies
      lr: [1.0e-4, 3.0e-4]       # grid: a list of values
      # lr: {loguniform: [1.0e-4, 1.0e-2]}   optuna: loguniform | uniform | randint | choice
    set: {eval_interval: 250}    # fixed overrides of any model/training field
    scheduler: {name: asha, grace_period: 0.111, reduction_factor: 3}   # or {name: none}
    stopper: {recovery_window: 1.0, min_tokens_per_s: 0}   # divergence: lmtune.training.divergence
    edge: {tolerance: 1.25, seeds: 3}   # search: edge only (lmtune.searches.edge); it has no params
    model: path/to/model.py:TransformerLM   # your own model (lmtune.usercode); default: lmtune's
    model_set: {use_rope: false}        # further arguments of your model's callable
    optimizer: mypkg.optim:AdamW        # your own optimizer; schedule: mypkg.sched:cosine, your own schedule

What each search reads and builds is its strategy's (lmtune.searches); the rest of a space is
common to all. Every problem is one line naming the file, the key and the fix.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import importlib.resources
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from lmtune.errors import LmtuneError, shown
from lmtune.files import JsonObject, JsonValue, yaml_error_line
from lmtune.searches import STRATEGIES, SearchStrategy
from lmtune.searches.base import Fail, Setting, seed_refusal, settings_section
from lmtune.training.config import BUDGETS, budget_config, canonical_settings, check_setting, field_names
from lmtune.training.divergence import DivergenceRule
from lmtune.usercode.config import FLAGS, UserCode, checked_model_args, normalized

COMMON_KEYS = frozenset({"description", "search", "budget", "set", "scheduler", "stopper", "fuse", "model", "model_set",
                         "optimizer", "schedule"})
SCHEDULERS = ("asha", "none")
# Keys earlier versions had, and what replaced them.
RETIRED_STOPPER_KEYS = {
    "explode_factor": "a loss above a multiple of its initial value no longer ends a run (such runs often "
                      "recover); divergence is failure to recover: use stopper.recovery_window (a fraction "
                      "of the budget; default 1: a run fails when its budget ends above its initial loss)",
}


@dataclass(frozen=True)
class SchedulerSpec:
    """The space's ``scheduler:`` section."""

    name: str = "asha"
    """asha | none"""
    grace_period: float = 1 / 9
    """ASHA's first rung: a fraction of max_t (<= 1) or tokens (> 1)."""
    reduction_factor: float = 3.0
    """Each rung keeps the best 1/reduction_factor."""
    max_t: float = 1.0
    """A fraction of the largest trial's token budget (<= 1), or tokens."""


@dataclass(frozen=True)
class StopperSpec:
    """The space's ``stopper:`` section."""

    recovery_window: float = DivergenceRule.recovery_window
    """Diverged: above the initial loss for this fraction of the budget's steps (lmtune.training.divergence)."""
    stop_factor: float = DivergenceRule.stop_factor
    """The stopper ends a run early when its loss stayed above the initial loss x this for the whole window."""
    spike_threshold: float = DivergenceRule.spike_threshold
    """A spike: the loss more than this fraction above its running minimum."""
    min_tokens_per_s: float = 0.0
    """Throughput floor -> too_slow (0 disables)."""
    slow_grace_reports: int = 2
    """Reports ignored by the throughput checks (start-up, compilation)."""

    @property
    def rule(self) -> DivergenceRule:
        return DivergenceRule(self.recovery_window, self.stop_factor, self.spike_threshold)


@dataclass(frozen=True)
class SearchSpace:
    """A space file as validated: how trials are chosen (``strategy``) and what every trial shares."""

    name: str
    """The file's stem (a shipped space's name)."""
    path: Path
    """The file it was read from."""
    description: str
    """Its ``description:``, one line."""
    budget: str
    """The budget preset trials start from (lmtune.training.config.BUDGETS)."""
    strategy: SearchStrategy
    """How trials are chosen: its ``search:`` and that search's own keys (lmtune.searches)."""
    fixed: dict[str, Setting] = field(default_factory=dict)
    """The ``set:`` section: settings every trial has."""
    scheduler: SchedulerSpec = field(default_factory=SchedulerSpec)
    stopper: StopperSpec = field(default_factory=StopperSpec)
    fuse: int = 1
    """LRs trained together as one fused model per trial (lmtune.fused); 1: a trial per LR."""
    source: str = ""
    """The space file's text, as it was read."""
    code: UserCode = field(default_factory=UserCode)
    """Its ``model:``, ``model_set:``, ``optimizer:`` and ``schedule:``: the user's code every trial trains with."""

    @property
    def search(self) -> str:
        return self.strategy.name

    @property
    def num_trials(self) -> int | None:
        """Trials the space asks for (None when the strategy decides as it goes)."""
        return self.strategy.num_trials()

    @property
    def swept(self) -> list[str]:
        """The settings each trial sets for itself."""
        return self.strategy.swept()

    def fused(self, fuse: JsonValue, fail: Callable[[str], Exception]) -> SearchSpace:
        """This space with ``fuse`` LRs per trial, refused in one line (``fail``'s) where it cannot apply."""
        if isinstance(fuse, bool) or not isinstance(fuse, int) or fuse < 1:
            raise fail(f"must be a positive integer, the LRs trained together in one process (got {shown(fuse)})")
        refusal = self.strategy.fused_refusal(fuse)
        if refusal:
            raise fail(refusal)
        # (--fuse 1000 on a grid of 2 LRs fuses 2: what a trial holds, and so its memory and disk, is counted so)
        return dataclasses.replace(self, fuse=self.strategy.fused_members(fuse))

    def describe_search(self) -> str:
        return self.strategy.describe(self.fuse)

    def to_json(self) -> JsonObject:
        """The space as sweep.json records it (its strategy's keys as in its YAML)."""
        return {"name": self.name, "path": str(self.path), "description": self.description, "search": self.search,
                "budget": self.budget, **self.strategy.to_json(), "num_trials": self.num_trials,
                "fixed": self.fixed, "fuse": self.fuse, "scheduler": asdict(self.scheduler),
                "stopper": asdict(self.stopper), "description_of_search": self.describe_search(),
                "yaml": self.source, **({"code": self.code.to_dict()} if self.code != UserCode() else {})}

    @classmethod
    def from_json(cls, data: JsonObject) -> SearchSpace:
        """The space as ``to_json`` wrote it (sweep.json's ``space``); keys it lacks take their defaults."""
        strategy = STRATEGIES[data.get("search", "grid")].strategy.from_json(data)
        return cls(name=data.get("name", ""), path=Path(data.get("path", "")), description=data.get("description", ""),
                   budget=data.get("budget", ""), strategy=strategy, fixed=dict(data.get("fixed") or {}),
                   scheduler=_known(SchedulerSpec, data.get("scheduler")),
                   stopper=_known(StopperSpec, data.get("stopper")), fuse=int(data.get("fuse", 1)),
                   source=data.get("yaml", ""), code=UserCode.from_dict(data.get("code")))


def _known(cls, values: JsonObject | None):
    """``cls`` from the keys of ``values`` it has (a sweep.json of an earlier version may hold others)."""
    return cls(**{k: v for k, v in (values or {}).items() if k in cls.__dataclass_fields__})


@functools.cache
def shipped_spaces() -> Path:
    """The folder of the spaces shipped with lmtune (the package ``lmtune.search_spaces``)."""
    spaces = importlib.resources.files("lmtune.search_spaces")
    if isinstance(spaces, Path):  # installed as files: a wheel, or the repository's own (pip install -e .)
        return spaces
    # Imported from an archive: a real folder holding a copy, for as long as this process runs.
    stack = contextlib.ExitStack()
    atexit.register(stack.close)
    return stack.enter_context(importlib.resources.as_file(spaces))


def available_spaces(directory: Path | None = None) -> list[str]:
    """The space names in ``directory`` (default: the shipped spaces)."""
    directory = shipped_spaces() if directory is None else directory
    return sorted(p.stem for p in directory.glob("*.yaml")) if directory.is_dir() else []


# The largest space file read: spaces are a few hundred bytes, and YAML parsing is slow and memory-hungry.
MAX_SPACE_BYTES = 1 << 20


def resolve_space_path(name_or_path: str, directory: Path | None = None) -> Path:
    """A YAML path as given, or the file of a space name in ``directory`` (default: the shipped spaces)."""
    directory = shipped_spaces() if directory is None else directory
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or "/" in name_or_path:
        if not candidate.is_file():
            raise LmtuneError(f"search space file {candidate} not found; give an existing YAML file or a name "
                              f"from: {', '.join(available_spaces(directory))}")
        return candidate
    path = directory / f"{name_or_path}.yaml"
    if not path.is_file():
        raise LmtuneError(f"unknown search space '{name_or_path}'; available: {', '.join(available_spaces(directory))} "
                          f"(or pass a path to a YAML file)")
    return path


def load_space(name_or_path: str, directory: Path | None = None) -> SearchSpace:
    path = resolve_space_path(name_or_path, directory)
    if (size := path.stat().st_size) > MAX_SPACE_BYTES:
        raise LmtuneError(f"{path} is {size:,} bytes; a search space is at most {MAX_SPACE_BYTES:,} (a grid of "
                          "10,000 values fits in far less): list fewer values, or use search: optuna or edge")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise LmtuneError(f"{path} is not UTF-8 text (byte {err.start}), so not a search space; give a YAML file "
                          "(the shipped spaces: lmtune run --list-spaces)") from None
    loader = _DataOnlyLoader(text)
    try:
        raw = loader.get_single_data()
    except _AliasRefused as err:
        raise LmtuneError(f"{path}: line {err.line}: YAML aliases (*name) are not allowed in a search space; "
                          "write each value out") from None
    except _DuplicateKey as err:
        raise LmtuneError(f"{path}: line {err.line}: duplicate key '{err.key}' (first at line {err.first}); YAML "
                          "would keep only the last silently: merge the two into one, or rename one") from None
    except yaml.YAMLError as err:
        line = yaml_error_line(err)
        where = f" line {line}" if line is not None else ""
        problem = getattr(err, "problem", None) or "invalid YAML"
        raise LmtuneError(f"{path}:{where} malformed YAML ({problem}); fix the syntax") from None
    finally:
        loader.dispose()
    return parse_space(raw, path, text)


class _AliasRefused(yaml.YAMLError):
    def __init__(self, line: int):
        super().__init__(f"alias at line {line}")
        self.line = line

    def __reduce__(self):
        return type(self), (self.line,)


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: object, first: int, line: int):
        super().__init__(f"duplicate key {key!r} at lines {first} and {line}")
        self.key, self.first, self.line = key, first, line

    def __reduce__(self):
        return type(self), (self.key, self.first, self.line)


class _DataOnlyLoader(yaml.SafeLoader):
    """yaml.safe_load's loader without aliases and without duplicate keys: a space needs no alias, and nested
    aliases (a "billion laughs" file of a few lines) expand into gigabytes before any value could be checked; a
    key given twice in one mapping (two variants named alike, a second ``set:``) PyYAML keeps the last of."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            raise _AliasRefused(self.peek_event().start_mark.line + 1)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            first_line: dict[object, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    if key in first_line:
                        raise _DuplicateKey(key, first_line[key], line)
                    first_line[key] = line
                except TypeError:  # an unhashable key: SafeLoader refuses it below
                    continue
        return super().construct_mapping(node, deep)


def parse_space(raw: JsonValue, path: Path, source: str = "") -> SearchSpace:
    def fail(key: str, message: str) -> LmtuneError:
        return LmtuneError(f"{path}: {key}: {message}")

    if not isinstance(raw, dict):
        raise fail("(top level)", "expected a mapping with keys search, budget, params; see "
                   f"{shipped_spaces() / 'lr_grid.yaml'}")
    search = _one_of(raw, "search", "grid", tuple(STRATEGIES), fail)
    strategy_class = STRATEGIES[search].strategy
    _check_keys(raw, strategy_class, fail)
    budget = _one_of(raw, "budget", "low-resource", tuple(BUDGETS), fail)
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise fail("description", "must be a string")
    strategy = strategy_class.parse(raw, fail)
    space = SearchSpace(
        name=path.stem, path=path, description=description, budget=budget, strategy=strategy,
        fixed=_parse_fixed(raw.get("set") or {}, strategy, fail),
        scheduler=settings_section(raw.get("scheduler"), "scheduler", SchedulerSpec, fail),
        stopper=settings_section(raw.get("stopper"), "stopper", StopperSpec, fail, retired=RETIRED_STOPPER_KEYS),
        source=source, code=_parse_code(raw, fail),
    )
    _check_stopping(space, fail)
    space = space.fused(raw.get("fuse", 1), fail=lambda message: fail("fuse", message))
    # Every combination must make a valid run config (e.g. d_model divisible by n_heads).
    try:
        configs = [budget_config(budget, {**space.fixed, **sample}, code=space.code)
                   for sample in strategy.corner_samples()]
    except LmtuneError as err:
        raise fail("params", f"{err}") from None
    # ... and so must the seeds a search adds past the base seed (--set seed: lmtune.sweep.plan, check_base).
    if refusal := seed_refusal(strategy, max(config.train.seed for config in configs)):
        raise fail("set.seed", refusal)
    return space


def _parse_code(raw: JsonObject, fail: Fail) -> UserCode:
    """The space's ``model:``, ``model_set:``, ``optimizer:`` and ``schedule:`` (a file's path relative to the current
    directory, as --model's)."""
    try:
        return UserCode(**{name: normalized(raw.get(name) or "", name) for name in FLAGS},
                        model_args=checked_model_args(raw.get("model_set"), "model_set"))
    except LmtuneError as err:
        key, _, message = str(err).partition(" ")
        raise fail(key.rstrip(":"), message) from None


def _check_keys(raw: JsonObject, strategy_class: type[SearchStrategy], fail: Fail) -> None:
    """Every top-level key is one every space has or one this strategy reads; another strategy's key is
    named as such."""
    valid = COMMON_KEYS | strategy_class.keys
    for key in raw:
        if key in valid:
            continue
        owners = [name for name, other in STRATEGIES.items() if key in other.strategy.keys]
        if owners:
            raise fail(key, f"only for search: {' or '.join(owners)}; remove it or set search: {owners[0]}")
        raise fail(key, f"unknown key; valid keys: {', '.join(sorted(valid))}")


def _one_of(raw: JsonObject, key: str, default: str, choices: tuple[str, ...], fail: Fail) -> str:
    value = raw.get(key, default)
    if value not in choices:
        raise fail(key, f"unknown {key} '{value}'; use one of {', '.join(choices)}")
    return value


def _parse_fixed(fixed_raw: JsonValue, strategy: SearchStrategy, fail: Fail) -> dict[str, Setting]:
    if not isinstance(fixed_raw, dict):
        raise fail("set", "must be a mapping of setting -> value")
    fixed = {}
    try:
        fixed_raw = canonical_settings(fixed_raw, "set")
    except LmtuneError as e:
        raise fail("set", str(e).removeprefix("set: ")) from None
    for name, value in fixed_raw.items():
        if name not in field_names():
            raise fail(f"set.{name}", f"unknown setting; valid settings: {', '.join(field_names())}")
        if name in strategy.swept():
            raise fail(f"set.{name}", strategy.owns_why())
        fixed[name] = check_setting(name, value, lambda why, key=f"set.{name}": fail(key, why))
    return fixed


def _check_stopping(space: SearchSpace, fail: Fail) -> None:
    if space.scheduler.name not in SCHEDULERS:
        raise fail("scheduler.name", f"unknown scheduler '{space.scheduler.name}'; use one of {', '.join(SCHEDULERS)}")
    if space.scheduler.reduction_factor <= 1:
        raise fail("scheduler.reduction_factor", "must be > 1 (e.g. 3)")
    if not 0 < space.scheduler.grace_period:
        raise fail("scheduler.grace_period", "must be > 0 (a fraction of the budget, or tokens)")
    try:
        space.stopper.rule.validate()
    except LmtuneError as err:
        key, _, message = str(err).partition(": ")
        raise fail(key, message) from None
