"""What every search strategy provides: the ``SearchStrategy`` protocol (a ``SpaceSection`` of lmtune.searches.contracts
that also says what the sweep runs), and the helpers strategies share to read their part of a space file.

A strategy is one ``search:`` value of ``search_spaces/*.yaml`` (grid, optuna, edge, horizon, width, compare). It
reads its own keys of the file, says which settings each trial sets, how many trials it plans, and builds what Ray Tune
runs: the param space and the searcher. Everything else about a sweep (budget, fixed settings, scheduler,
stopper, placement) is the same for every strategy (lmtune.sweep.spaces, lmtune.sweep.plan). A new search is
one package here, a file per contract of lmtune.searches.contracts (its strategy, its Ray-free decisions as a
DecidingSearch, its report part), plus its line in ``lmtune.searches.STRATEGIES``: the one Tune adapter
(lmtune.sweep.searcher) drives it, its state is decisions/NAME_search.json, and the report gives it the common part
unless it registers a part of its own (docs/contributing.md, "Adding a search"; tests/pair_search/ is one).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, cast

from lmtune.errors import LmtuneError, shown
from lmtune.files import JsonObject, JsonValue
from lmtune.searches.contracts import Fail, SpaceSection, TrialSource, TrialSourceClass
from lmtune.searches.state import read_search_state
from lmtune.searches.trial_order import TuneParams
from lmtune.training.config import MAX_SEED, field_names

if TYPE_CHECKING:
    import torch
    from ray.tune.search import Searcher

    from lmtune.analysis.runs import Budget
    from lmtune.training.config import RunConfig
    from lmtune.training.lr_range import RangeTestConfig

# The most runs of one LR a search may ask for (its seeds): 100 seeds pin a mean loss to a tenth of the
# seed-to-seed spread, far past what the crown needs; each seed is a whole run.
MAX_SEEDS = 100

Setting = int | float | bool | str
"""A run setting's value (the type of its RunConfig field: lmtune.training.config.coerce_value)."""


class SearchStrategy(SpaceSection, Protocol):
    """How a sweep chooses its trials: its section of the space file (``SpaceSection``: name, keys, parse, JSON) and
    what the sweep runs. Frozen and JSON-round-trippable: it travels inside the SweepPlan to every trial and back
    from sweep.json on --resume."""

    stage_column: ClassVar[bool]
    """Whether its trials carry a ``stage`` (the progress table shows it)."""

    def swept(self) -> list[str]:
        """The settings each trial sets for itself (a fixed setting or --set may not name them)."""

    def owns_why(self) -> str:
        """Why a fixed setting of one of ``swept()`` is refused, and what to do instead."""

    def num_trials(self) -> int | None:
        """Trials it will run (None: it decides as it goes)."""

    def values_of(self, name: str) -> list[Setting]:
        """Every value, or the extremes, that trials may give setting ``name`` ([] if it does not set it):
        for checking that each makes a valid config, and for the largest trial's memory and tokens."""

    def corner_samples(self) -> list[dict[str, Setting]]:
        """Trial settings at the corners of what it sweeps: enough to catch a shape conflict early."""

    def fused_refusal(self, fuse: int) -> str | None:
        """Why ``fuse`` LRs per trial cannot apply (None: they can)."""

    def fused_members(self, fuse: int) -> int:
        """The most LRs a trial of ``fuse`` fused LRs holds (no more than the space has to fuse)."""

    def check_base(self, base: RunConfig) -> None:
        """Raise LmtuneError (one line naming the problem and the fix) when the sweep's base config (budget,
        fixed settings, --set) cannot serve this strategy."""

    def resolved(self, base: RunConfig) -> SearchStrategy:
        """Itself with whatever depends on the sweep's base config worked out (a compare search's batch-size variants:
        their steps at the budget's tokens), once, when the sweep is planned; what it resolved travels in sweep.json
        (resolving it again changes nothing)."""

    def fitted_to_device(self, base: RunConfig, device: Callable[[], torch.device] | None) -> SearchStrategy:
        """Itself with whatever depends on the device its trials run on worked out (a compare search's
        ``batch_size: largest``), once, before ``check_base``; what it worked out travels in sweep.json.
        ``device`` gives that device (None: it is not known where the sweep is planned)."""

    def describe(self, fuse: int) -> str:
        """One sentence for the run's first line and the report."""

    def advice(self, base: RunConfig) -> str | None:
        """One line the run prints after that sentence where lmtune's measurements say this search, as configured
        for ``base``, does not pay (None: nothing to advise)."""

    def param_space(self, fuse: int) -> TuneParams:
        """Ray Tune's param_space."""

    def searcher(self, budget: Budget, sweep_dir: Path) -> tuple[Searcher | None, int]:
        """Ray Tune's search_alg of its own (None: Tune's own grid/random generation) and num_samples, for trials of
        ``budget`` (its seed the base config's); asked only of a search without ``decisions`` (a deciding search's go
        through the one adapter). Tune gets it from lmtune.sweep.searcher.tune_search_alg."""

    def decisions(self, budget: Budget) -> TrialSource | None:
        """Its Ray-free decisions for trials of ``budget`` (a ``TrialSource``, which the one Tune adapter,
        lmtune.sweep.searcher.DecidingSearcher, drives), or None: a search Tune runs by itself (grid and optuna)."""

    def progress_columns(self, fuse: int) -> list[str]:
        """The trial settings the progress table shows."""

    def asha_stages(self) -> frozenset[str] | None:
        """The stages whose trials ASHA may cut (None: every trial; empty: none, and the sweep runs no ASHA)."""

    def range_test(self) -> RangeTestConfig | None:
        """The LR range test settings of a trial of stage "range" (None: it runs none)."""

    def range_test_variant(self) -> str | None:
        """The variant whose range test the report shows (a compare search's reference; None: the sweep's one)."""

    def finished(self, sweep_dir: Path) -> bool:
        """Whether the search itself has ended (a searcher that decides as it goes may not have, when its
        trials all have)."""

    def expected_trials(self) -> tuple[int, int]:
        """(trials, full checkpoints it holds until the sweep ends at most): exact for a search that knows its
        trials in advance, a generous estimate for one that decides as it goes; the disk check's count."""

    def added_seeds(self) -> int:
        """How far past the base seed its trials' seeds may go (the largest is base seed + this)."""

    def held_checkpoints(self, outcome: str) -> frozenset[str]:
        """What of a trial that ended with ``outcome`` (the ledger's word) the search may still use until the sweep
        ends, and so must not be pruned before: ``"periodic"`` (its newest checkpoint: a run it may continue) and
        ``"stable"`` (a WSD run's stable.pt: a longer budget forks from it)."""


class StrategyDefaults:
    """Answers most strategies share; a strategy overrides what differs. (Its methods that return or ask ``self``
    as a whole strategy say so with ``self: SearchStrategy``: mypy then checks the class that uses them is one.)"""

    name: ClassVar[str]
    stage_column: ClassVar[bool] = False

    def decisions(self, budget: Budget) -> TrialSource | None:
        return None  # Tune generates its trials (grid) or its own searcher suggests them (optuna)

    def owns_why(self) -> str:
        return "also listed under params; keep it in one place"

    def fused_refusal(self, fuse: int) -> str | None:
        if fuse > 1:
            return f"fusing needs search: grid (search: {self.name} suggests one trial at a time); use fuse: 1"
        return None

    def fused_members(self, fuse: int) -> int:
        return fuse

    def asha_stages(self) -> frozenset[str] | None:
        return None

    def check_base(self, base: RunConfig) -> None:
        return None

    def advice(self, base: RunConfig) -> str | None:
        return None

    def resolved(self: SearchStrategy, base: RunConfig) -> SearchStrategy:
        return self  # nothing of it depends on the base config

    def fitted_to_device(self: SearchStrategy, base: RunConfig,
                         device: Callable[[], torch.device] | None) -> SearchStrategy:
        return self  # nothing of it depends on the trials' device

    def range_test(self) -> RangeTestConfig | None:
        return None

    def range_test_variant(self) -> str | None:
        return None

    def finished(self, sweep_dir: Path) -> bool:
        return True

    def expected_trials(self: SearchStrategy) -> tuple[int, int]:
        return self.num_trials() or 0, 0

    def added_seeds(self) -> int:
        return 0  # every trial has the base seed (or the one its params give it)

    def held_checkpoints(self, outcome: str) -> frozenset[str]:
        return frozenset()


class DecidingDefaults(StrategyDefaults):
    """What a strategy whose searcher decides every trial as it goes (edge, horizon, width, compare) shares: its
    settings (a dataclass, ``settings_class``, read from the space's section of its name), its decisions
    (``search_class``), no ``params``, ``owns`` set per trial itself, no param space for Tune to generate, no trial
    count known in advance, nothing swept for a config check to try. Each strategy states in its own body what it
    is: ``name``, ``keys``, ``settings_class`` and ``search_class`` (and ``settings_section``, ``whole_budget_only``
    and ``axis_columns`` where they differ from the defaults), the same as its decisions' (tests/test_layout.py
    checks they agree)."""

    name: ClassVar[str]
    """Its ``search:`` value: its decisions' ``name``."""
    keys: ClassVar[frozenset[str]]
    """The top-level keys of a space file it reads: its section and ``params`` (to say it takes none)."""
    stage_column: ClassVar[bool] = True
    settings_class: ClassVar[type]
    """The dataclass its section is read as: its decisions' ``settings_class``."""
    owns: ClassVar[tuple[str, ...]] = ("lr", "run_steps")
    """The settings it sets per trial itself (a fixed setting or --set may not name them; seed: the base seed may
    be set, and the search adds further seeds)."""
    whole_budget_only: ClassVar[bool] = False
    """Whether it compares LRs only at a run's whole budget, so refuses a scheduler that cuts runs (its decisions')."""
    axis_columns: ClassVar[tuple[str, ...]] = ()
    """What its trials step along besides the LR, shown in the progress table (its decisions')."""
    retired_keys: ClassVar[dict[str, str]] = {}
    """Keys its section once had -> what replaced them."""
    settings_section: ClassVar[tuple[str, type] | None] = None
    """Its section of the space (and of sweep.json's space) and the dataclass of plain keys it reads as, where not
    its name and settings_class (a compare search: edge:, its variants' LR search's); ``section()`` says which."""
    search_class: ClassVar[TrialSourceClass]
    """Its decisions, Ray-free (a DecidingSearch), which one Tune adapter drives for every deciding search
    (lmtune.sweep.searcher.DecidingSearcher); mypy checks it is a TrialSource made from (settings, budget)."""
    settings: Any
    """Its section of the space file, read (a ``settings_class``; each strategy's dataclass field)."""

    if TYPE_CHECKING:  # each strategy is a frozen dataclass holding its settings, and so made from them
        def __init__(self, settings: Any) -> None: ...

    @classmethod
    def parse(cls, raw: JsonObject, fail: Fail):
        if raw.get("params"):
            raise fail("params", f"search: {cls.name} chooses the learning rates itself; remove params (tune it "
                                 f"with the {cls.name}: section)")
        scheduler = raw.get("scheduler")
        if cls.whole_budget_only and isinstance(scheduler, dict) and scheduler.get("name", "asha") != "none":
            raise fail("scheduler.name", f"search: {cls.name} trains every run to its whole budget (LRs are "
                                         "compared only there); set scheduler: {name: none} or remove scheduler")
        settings = cls.parse_settings(raw.get(cls.name), fail)
        for key, message in settings.problems():
            raise fail(f"{cls.name}.{key}", message)
        return cls(settings)

    @classmethod
    def section(cls) -> tuple[str, type]:
        """Its section of the space and the dataclass of plain keys it reads as: ``settings_section``, or its name and
        settings_class."""
        return cls.settings_section or (cls.name, cls.settings_class)

    @classmethod
    def parse_settings(cls, section: JsonValue, fail: Fail):
        """Its settings from its section of the space file (a search whose section is not one settings dataclass
        of plain keys overrides this)."""
        return settings_section(section, cls.name, cls.settings_class, fail, retired=cls.retired_keys)

    @classmethod
    def from_json(cls, data: JsonObject):
        known = cast(Any, cls.settings_class).__dataclass_fields__
        section: Any = data.get(cls.name) or {}
        return cls(cls.settings_class(**{k: v for k, v in section.items() if k in known}))

    def to_json(self) -> JsonObject:
        return {self.name: asdict(self.settings)}

    def added_seeds(self) -> int:
        return self.settings.added_seeds()

    def check_base(self: SearchStrategy, base: RunConfig) -> None:
        refusal = seed_refusal(self, base.train.seed)
        if refusal:  # from --set (a space's own set: seed was refused when it was loaded)
            raise LmtuneError(f"seed {refusal} (--set seed=N)")

    def swept(self) -> list[str]:
        return list(self.owns)

    def progress_columns(self, fuse: int) -> list[str]:
        return ["stage", *self.axis_columns, "lr", "seed"]

    def asha_stages(self) -> frozenset[str] | None:
        return frozenset() if self.whole_budget_only else None  # (frozenset(): no ASHA, every run trains it all)

    def owns_why(self) -> str:
        return f"the {self.name} search sets it per trial; remove it"

    def num_trials(self) -> None:
        return None

    def values_of(self, name: str) -> list[Setting]:
        return []

    def corner_samples(self) -> list[dict[str, Setting]]:
        return [{}]

    def param_space(self, fuse: int) -> TuneParams:
        return {}  # the searcher suggests every trial's config

    def decisions(self, budget: Budget) -> TrialSource:
        return self.search_class(self.settings, budget)

    def searcher(self, budget: Budget, sweep_dir: Path) -> tuple[Searcher | None, int]:
        # Never asked: its decisions are what Tune runs (lmtune.sweep.searcher.tune_search_alg)
        raise TypeError(f"search: {self.name} decides its trials itself: Tune runs its decisions(), through "
                        "lmtune.sweep.searcher.tune_search_alg, not a searcher of its own")

    def finished(self, sweep_dir: Path) -> bool:
        return bool((read_search_state(sweep_dir, self.name) or {}).get("finished"))


def seed_refusal(strategy: SearchStrategy, seed: int) -> str | None:
    """Why trials of ``strategy`` from base seed ``seed`` would carry a seed no trial accepts (None: they would
    not): the search adds seeds past the base, and the largest must fit (lmtune.training.config.MAX_SEED)."""
    added = strategy.added_seeds()
    if seed + added <= MAX_SEED:
        return None
    return (f"{shown(seed)} plus the {added} further seeds the {strategy.name} search adds reaches {seed + added}, "
            f"above the largest seed a trial accepts ({MAX_SEED}): give a seed of at most {MAX_SEED - added}")


def failed_checks(settings: Any, checks: list[tuple[str, bool, str]]) -> list[tuple[str, str]]:
    """(key, message with the value got) for each (key, ok, message) of a settings section's checks that failed."""
    return [(key, f"{message} (got {shown(getattr(settings, key))})") for key, ok, message in checks if not ok]


def params_section(raw: JsonObject, fail: Fail) -> JsonObject:
    """The space's ``params:`` mapping, each name a known setting."""
    params = raw.get("params")
    if not isinstance(params, dict) or not params:
        raise fail("params", "must be a non-empty mapping of setting -> values, e.g. lr: [1.0e-4, 1.0e-3]")
    for name in params:
        if name not in field_names():
            raise fail(f"params.{name}", f"unknown setting; valid settings: {', '.join(field_names())}")
    return params


def settings_section(raw: Any, name: str, cls: type, fail: Fail, retired: dict[str, str] | None = None):
    """A section of numbers (and strings) such as ``scheduler:``, ``stopper:`` or ``edge:`` as the dataclass
    ``cls``: unknown keys refused (a retired one told what replaced it), each value of its field's type."""
    if raw is None:
        return cls()
    fields = cast(Any, cls).__dataclass_fields__
    if not isinstance(raw, dict):
        raise fail(name, f"must be a mapping with keys {', '.join(sorted(fields))}")
    unknown = sorted(set(raw) - set(fields))
    retired = retired or {}
    for key in unknown:
        if key in retired:
            raise fail(f"{name}.{key}", retired[key])
    if unknown:
        raise fail(f"{name}.{unknown[0]}", f"unknown key; valid keys: {', '.join(sorted(fields))}")
    values = {}
    defaults = cls()
    for key, value in raw.items():
        default = getattr(defaults, key)
        if isinstance(default, bool):  # (a switch, e.g. horizon.refine: a number is no answer to it)
            if not isinstance(value, bool):
                raise fail(f"{name}.{key}", f"must be true or false (got {shown(value)})")
        elif isinstance(default, str):
            if not isinstance(value, str):
                raise fail(f"{name}.{key}", "must be a string")
        elif isinstance(default, tuple):  # (a list of whole numbers, e.g. width.widths read back from sweep.json)
            if not isinstance(value, list | tuple) or not all(type(v) is int for v in value):
                raise fail(f"{name}.{key}", f"must be a list of whole numbers (got {shown(value)})")
            value = tuple(value)
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise fail(f"{name}.{key}", f"must be a finite number (got {shown(value)})")
        elif isinstance(default, int) and not float(value).is_integer():
            raise fail(f"{name}.{key}", f"must be a whole number (got {shown(value)})")
        values[key] = type(default)(value)
    return cls(**values)
