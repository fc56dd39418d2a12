"""Search spaces: ``search_spaces/*.yaml`` files, validated before anything is launched.

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
    edge: {tolerance: 1.25, seeds: 3}   # search: edge only (lmtune.sweep.edge.EdgeSettings); it has no params

Every problem is one line naming the file, the key and the fix.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lmtune.errors import LmtuneError, shown
from lmtune.sweep.edge import RETIRED_KEYS, EdgeSettings
from lmtune.training.config import BUDGETS, EXAMPLES, budget_config, coerce_value, field_names, field_type
from lmtune.training.divergence import DivergenceRule

SPACES_DIR = Path(__file__).resolve().parents[2] / "search_spaces"
TOP_KEYS = {"description", "search", "sampler", "num_samples", "budget", "params", "set", "scheduler", "stopper",
            "edge", "fuse"}
SEARCHES = ("grid", "optuna", "edge")
# What the edge search sets per trial itself (seed: the base seed may be set; further seeds are added).
EDGE_OWNS = ("lr", "run_steps")
SAMPLERS = ("tpe", "random", "cmaes")
DISTRIBUTIONS = ("loguniform", "uniform", "randint", "choice")
SCHEDULER_KEYS = {"name", "grace_period", "reduction_factor", "max_t"}
SCHEDULERS = ("asha", "none")
STOPPER_KEYS = {"recovery_window", "stop_factor", "spike_threshold", "min_tokens_per_s", "slow_grace_reports"}
EDGE_KEYS = set(EdgeSettings.__dataclass_fields__)
# Keys earlier versions had, and what replaced them.
RETIRED = {
    "stopper.explode_factor": "a loss above a multiple of its initial value no longer ends a run (such runs often "
                              "recover); divergence is failure to recover: use stopper.recovery_window (a fraction "
                              "of the budget; default 1: a run fails when its budget ends above its initial loss)",
    **{f"edge.{key}": why for key, why in RETIRED_KEYS.items()},
}


@dataclass
class SchedulerSpec:
    name: str = "asha"
    grace_period: float = 1 / 9  # as a fraction of max_t (<= 1) or in tokens (> 1)
    reduction_factor: float = 3.0
    max_t: float = 1.0  # fraction of the largest trial's token budget, or tokens


@dataclass
class StopperSpec:
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


@dataclass
class SearchSpace:
    name: str
    path: Path
    description: str
    search: str
    budget: str
    params: dict[str, Any]  # grid: name -> list; optuna: name -> (distribution, args)
    fixed: dict[str, Any] = field(default_factory=dict)
    sampler: str = "tpe"
    num_samples: int = 1
    scheduler: SchedulerSpec = field(default_factory=SchedulerSpec)
    stopper: StopperSpec = field(default_factory=StopperSpec)
    edge: EdgeSettings = field(default_factory=EdgeSettings)
    fuse: int = 1
    """LRs trained together as one fused model per trial (lmtune.fused); 1: a trial per LR."""

    @property
    def num_trials(self) -> int | None:
        """Trials the space asks for (None for the edge search: it decides as it goes)."""
        if self.search == "grid":
            return math.prod(len(values) for values in self.params.values())
        return self.num_samples if self.search == "optuna" else None

    @property
    def swept(self) -> list[str]:
        """The settings each trial sets for itself."""
        return list(EDGE_OWNS) if self.search == "edge" else list(self.params)

    def fused(self, fuse: Any, fail: Callable[[str], Exception]) -> SearchSpace:
        """This space with ``fuse`` LRs per trial, refused in one line (``fail``'s) where it cannot apply."""
        if isinstance(fuse, bool) or not isinstance(fuse, int) or fuse < 1:
            raise fail(f"must be a positive integer, the LRs trained together in one process (got {shown(fuse)})")
        if fuse > 1 and self.search != "grid":
            raise fail(f"fusing needs search: grid (search: {self.search} suggests one trial at a time); use fuse: 1")
        if fuse > 1 and "lr" not in self.params:
            raise fail("fusing groups the LRs of params.lr, which this space does not sweep; use fuse: 1")
        return dataclasses.replace(self, fuse=fuse)

    def describe_search(self) -> str:
        if self.search == "edge":
            e = self.edge
            seeds = (f", then {e.seeds} seeds of the best {e.seed_lrs} LRs (and of any LR that beats the best seed "
                     "for seed)") if e.seeds > 1 else ""
            return (f"edge search: an LR range test, a coarse grid {e.coarse_ratio:g}x apart under early stopping, "
                    "the coarse LRs above the best continued to the full budget, bisection of where training fails "
                    f"(full-budget probes) to a bracket ratio <= {e.tolerance:g} with a rule-judged diverged end "
                    f"retrained without early stopping, refinement within {e.refine_factor:g}x of the best LR{seeds}")
        if self.search == "grid":
            dims = " x ".join(f"{k} ({len(v)} values)" for k, v in self.params.items())
            fused = f", up to {self.fuse} LRs fused per process" if self.fuse > 1 else ""
            return f"grid search over {dims}: {self.num_trials} trials{fused}"
        dims = ", ".join(f"{k} ~ {dist}{tuple(args)}" for k, (dist, args) in self.params.items())
        return f"Optuna {self.sampler.upper()} search, {self.num_samples} samples of {dims}"


def available_spaces(directory: Path = SPACES_DIR) -> list[str]:
    return sorted(p.stem for p in directory.glob("*.yaml")) if directory.is_dir() else []


def resolve_space_path(name_or_path: str, directory: Path = SPACES_DIR) -> Path:
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


def load_space(name_or_path: str, directory: Path = SPACES_DIR) -> SearchSpace:
    path = resolve_space_path(name_or_path, directory)
    loader = _DataOnlyLoader(path.read_text())
    try:
        raw = loader.get_single_data()
    except _AliasRefused as err:
        raise LmtuneError(f"{path}: line {err.line}: YAML aliases (*name) are not allowed in a search space; "
                          "write each value out") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or "invalid YAML"
        raise LmtuneError(f"{path}:{where} malformed YAML ({problem}); fix the syntax") from None
    finally:
        loader.dispose()
    return parse_space(raw, path)


class _AliasRefused(yaml.YAMLError):
    def __init__(self, line: int):
        super().__init__(f"alias at line {line}")
        self.line = line


class _DataOnlyLoader(yaml.SafeLoader):
    """yaml.safe_load's loader without aliases: a space needs none, and nested aliases (a "billion
    laughs" file of a few lines) expand into gigabytes before any value could be checked."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            raise _AliasRefused(self.peek_event().start_mark.line + 1)
        return super().compose_node(parent, index)


def parse_space(raw: Any, path: Path) -> SearchSpace:
    def fail(key: str, message: str) -> LmtuneError:
        return LmtuneError(f"{path}: {key}: {message}")

    if not isinstance(raw, dict):
        raise fail("(top level)", "expected a mapping with keys search, budget, params; see search_spaces/lr_grid.yaml")
    unknown = set(raw) - TOP_KEYS
    if unknown:
        raise fail(sorted(unknown)[0], f"unknown key; valid keys: {', '.join(sorted(TOP_KEYS))}")
    search = _one_of(raw, "search", "grid", SEARCHES, fail)
    budget = _one_of(raw, "budget", "low-resource", tuple(BUDGETS), fail)
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise fail("description", "must be a string")
    if search == "edge":
        if raw.get("params"):
            raise fail("params", "search: edge chooses the learning rates itself; remove params (tune it with "
                                 "the edge: section)")
        params: dict[str, Any] = {}
        fixed = _parse_fixed(raw.get("set") or {}, dict.fromkeys(EDGE_OWNS), fail)
    else:
        if "edge" in raw:
            raise fail("edge", "only for search: edge; remove it or set search: edge")
        params = _parse_params(raw.get("params"), search, fail)
        fixed = _parse_fixed(raw.get("set") or {}, params, fail)
    sampler = _one_of(raw, "sampler", "tpe", SAMPLERS, fail)
    num_samples = raw.get("num_samples", 1 if search == "grid" else 10)
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise fail("num_samples", f"must be a positive integer (got {shown(num_samples)})")
    if search == "grid" and "num_samples" in raw:
        raise fail("num_samples", "only for search: optuna (a grid runs every combination once); remove it")
    space = SearchSpace(
        name=path.stem, path=path, description=description, search=search, budget=budget, params=params,
        fixed=fixed, sampler=sampler, num_samples=num_samples,
        scheduler=_parse_section(raw.get("scheduler"), "scheduler", SchedulerSpec, SCHEDULER_KEYS, fail),
        stopper=_parse_section(raw.get("stopper"), "stopper", StopperSpec, STOPPER_KEYS, fail),
        edge=_parse_section(raw.get("edge"), "edge", EdgeSettings, EDGE_KEYS, fail),
    )
    _check_stopping(space, fail)
    space = space.fused(raw.get("fuse", 1), fail=lambda message: fail("fuse", message))
    try:
        space.edge.validate(where=f"{path}: edge")
    except LmtuneError as err:
        raise LmtuneError(str(err)) from None
    # Every combination must make a valid run config (e.g. d_model divisible by n_heads).
    try:
        for sample in _corner_samples(space):
            budget_config(budget, {**fixed, **sample})
    except LmtuneError as err:
        raise fail("params", f"{err}") from None
    return space


def member_groups(space: SearchSpace) -> list[dict[str, Any]]:
    """The grid cut into fused trials: each combination of the other swept settings, its LRs in groups of
    up to ``space.fuse`` in the order listed, as {"lr": [...], other: value}."""
    others = [name for name in space.params if name != "lr"]
    combos = [{}]
    for name in others:
        combos = [{**c, name: v} for c in combos for v in space.params[name]]
    lrs = space.params["lr"]
    return [{"lr": lrs[i:i + space.fuse], **combo} for combo in combos for i in range(0, len(lrs), space.fuse)]


def _one_of(raw: dict[str, Any], key: str, default: str, choices: tuple[str, ...], fail) -> str:
    value = raw.get(key, default)
    if value not in choices:
        raise fail(key, f"unknown {key} '{value}'; use one of {', '.join(choices)}")
    return value


def _parse_params(params_raw: Any, search: str, fail) -> dict[str, Any]:
    if not isinstance(params_raw, dict) or not params_raw:
        raise fail("params", "must be a non-empty mapping of setting -> values, e.g. lr: [1.0e-4, 1.0e-3]")
    params = {}
    for name, spec in params_raw.items():
        key = f"params.{name}"
        if name not in field_names():
            raise fail(key, f"unknown setting; valid settings: {', '.join(field_names())}")
        params[name] = (_parse_grid_values if search == "grid" else _parse_distribution)(name, spec, key, fail)
    return params


def _parse_fixed(fixed_raw: Any, params: dict[str, Any], fail) -> dict[str, Any]:
    if not isinstance(fixed_raw, dict):
        raise fail("set", "must be a mapping of setting -> value")
    fixed = {}
    for name, value in fixed_raw.items():
        if name not in field_names():
            raise fail(f"set.{name}", f"unknown setting; valid settings: {', '.join(field_names())}")
        if name in params:
            raise fail(f"set.{name}", "also listed under params; keep it in one place" if params.get(name) is not None
                       else "the edge search sets it per trial; remove it")
        fixed[name] = _coerce(name, value, f"set.{name}", fail)
    return fixed


def _check_stopping(space: SearchSpace, fail) -> None:
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


def _coerce(name: str, value: Any, key: str, fail) -> Any:
    try:
        coerced = coerce_value(name, value, where=key)
    except LmtuneError:
        kind = field_type(name)
        raise fail(key, f"{shown(value)} is not a valid {kind.__name__}; give {EXAMPLES[kind]}") from None
    if name == "lr" and not (math.isfinite(coerced) and coerced > 0):
        raise fail(key, f"learning rates must be positive and finite (got {shown(value)})")
    if name == "batch_size" and coerced < 1:
        raise fail(key, f"batch_size must be >= 1 (got {shown(value)})")
    return coerced


def _parse_grid_values(name: str, spec: Any, key: str, fail) -> list[Any]:
    if isinstance(spec, dict):
        raise fail(key, "search: grid takes a list of values; distributions are for search: optuna")
    values = spec if isinstance(spec, list) else [spec]
    if not values:
        raise fail(key, "empty grid; list at least one value")
    coerced = [_coerce(name, v, key, fail) for v in values]
    repeated = sorted({v for v in coerced if coerced.count(v) > 1}, key=str)
    if repeated:  # [1e-3, 0.001] would run the same trial twice
        raise fail(key, f"{', '.join(map(str, repeated))} listed more than once; list each value once")
    return coerced


def _parse_distribution(name: str, spec: Any, key: str, fail) -> tuple[str, list[Any]]:
    if isinstance(spec, list):
        if not spec:
            raise fail(key, "empty choice list; list at least one value")
        return "choice", [_coerce(name, v, key, fail) for v in spec]
    if not isinstance(spec, dict) or len(spec) != 1:
        raise fail(key, f"expected one distribution, e.g. {{loguniform: [1.0e-4, 1.0e-2]}}; use one of "
                        f"{', '.join(DISTRIBUTIONS)}")
    (dist, args), = spec.items()
    if dist not in DISTRIBUTIONS:
        raise fail(key, f"unknown distribution '{dist}'; use one of {', '.join(DISTRIBUTIONS)}")
    if dist == "choice":
        if not isinstance(args, list) or not args:
            raise fail(key, "choice needs a non-empty list of values")
        return dist, [_coerce(name, v, key, fail) for v in args]
    if not isinstance(args, list) or len(args) != 2:
        raise fail(key, f"{dist} needs [low, high]")
    low, high = (_coerce(name, v, key, fail) for v in args)
    if not low < high:
        raise fail(key, f"bounds in the wrong order ({low} >= {high}); write [low, high] with low < high")
    if dist == "loguniform" and low <= 0:
        raise fail(key, "loguniform bounds must be > 0")
    if dist == "randint" and field_type(name) is not int:
        raise fail(key, "randint is for integer settings; use uniform or loguniform")
    return dist, [low, high]


def _parse_section(raw: Any, name: str, cls, keys: set[str], fail):
    if raw is None:
        return cls()
    if not isinstance(raw, dict):
        raise fail(name, f"must be a mapping with keys {', '.join(sorted(keys))}")
    unknown = sorted(set(raw) - keys)
    for key in unknown:
        if f"{name}.{key}" in RETIRED:
            raise fail(f"{name}.{key}", RETIRED[f"{name}.{key}"])
    if unknown:
        raise fail(f"{name}.{unknown[0]}", f"unknown key; valid keys: {', '.join(sorted(keys))}")
    values = {}
    defaults = cls()
    for key, value in raw.items():
        default = getattr(defaults, key)
        if isinstance(default, str):
            if not isinstance(value, str):
                raise fail(f"{name}.{key}", "must be a string")
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise fail(f"{name}.{key}", f"must be a finite number (got {shown(value)})")
        elif isinstance(default, int) and not float(value).is_integer():
            raise fail(f"{name}.{key}", f"must be a whole number (got {shown(value)})")
        values[key] = type(default)(value)
    return cls(**values)


def _corner_samples(space: SearchSpace) -> list[dict[str, Any]]:
    """Smallest and largest value of each parameter: enough to catch shape conflicts early."""
    def ends(spec):
        if space.search == "grid":
            return [min(spec), max(spec)] if all(isinstance(v, (int, float)) for v in spec) else spec[:1]
        dist, args = spec
        if dist == "choice":
            return [args[0]]
        return list(args)

    samples = [{}]
    for name, spec in space.params.items():
        samples = [{**s, name: v} for s in samples for v in ends(spec)]
    return samples


def tune_param_space(space: SearchSpace) -> dict[str, Any]:
    """The Ray Tune param_space: grid_search for grids; distributions for Optuna."""
    from ray import tune

    if space.search == "edge":
        return {}  # the edge searcher suggests every trial's config
    if space.search == "grid" and space.fuse > 1:
        return {"members": tune.grid_search(member_groups(space))}
    if space.search == "grid":
        return {name: tune.grid_search(values) for name, values in space.params.items()}
    result = {}
    for name, (dist, args) in space.params.items():
        if dist == "loguniform":
            result[name] = tune.loguniform(*args)
        elif dist == "uniform":
            result[name] = tune.uniform(*args)
        elif dist == "randint":
            result[name] = tune.randint(args[0], args[1] + 1)  # inclusive upper bound, as written
        else:
            result[name] = tune.choice(args)
    return result


def make_searcher(space: SearchSpace, metric: str = "val_loss", mode: str = "min", seed: int = 0):
    """Tune's OptunaSearch with the space's sampler (None for grids)."""
    if space.search != "optuna":
        return None
    import optuna
    from ray.tune.search.optuna import OptunaSearch

    sampler = {
        "tpe": lambda: optuna.samplers.TPESampler(seed=seed),
        "random": lambda: optuna.samplers.RandomSampler(seed=seed),
        "cmaes": lambda: optuna.samplers.CmaEsSampler(seed=seed),
    }[space.sampler]()
    return OptunaSearch(metric=metric, mode=mode, sampler=sampler)
