"""The compare search's settings: the ``variants:`` of a space with ``search: compare`` (each a name and the settings
it changes), the LR search each variant gets (``per_variant:``, with that search's own section, e.g. ``edge:``), and
what a variant's runs train with. Ray-free and stateless; lmtune.searches.compare.search decides when.

The first variant is the reference: the others are compared with it, each at its own best LR. A variant changes any
model or training setting (``set:``), the user's model (``model:``) or its callable's arguments (``model_set:``); a
``batch_size`` keeps the budget's tokens, so its steps (and the warm-up,
evaluation, logging and checkpoint intervals, all counted in steps) scale by the reference's batch over its own.
``batch_size: largest`` is the largest batch whose run fits the trials' device by lmtune's memory estimate, among
those that divide the budget's sequences and leave at least LARGEST_MIN_STEPS steps: worked out once when the sweep
is planned (``with_largest_batch``) and recorded as a number, with what it was fitted to.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import torch

from lmtune.analysis.runs import Budget
from lmtune.errors import LmtuneError, shown
from lmtune.files import JsonObject, JsonValue
from lmtune.searches.base import Fail, Setting, settings_section
from lmtune.searches.edge.settings import RETIRED_KEYS, EdgeSettings
from lmtune.training.config import RunConfig, apply_overrides, check_setting, field_names
from lmtune.training.memory import largest_fitting_batch, usable_memory_bytes
from lmtune.usercode.config import MODEL_ARG_PREFIX, MODEL_SETTING, checked_model_args, normalized
from lmtune.usercode.spec import spec_for

# The LR searches a variant may get (each's settings: the space's section of that name).
PER_VARIANT = ("edge",)
# What a search sets per trial itself: a variant may not set them.
SEARCH_OWNS = ("lr", "seed", "run_steps")
# Settings counted in steps: a batch_size variant scales them so that its runs train the budget's tokens.
STEP_SETTINGS = ("steps", "warmup_steps", "eval_interval", "log_interval", "checkpoint_interval")
# Where a later variant's LR search starts: a search of its own (a range test and its own grid), or from the
# reference's answer (lmtune.searches.compare.search: CompareSearch._may_start).
START_OWN, START_REFERENCE = "own", "reference"
STARTS = (START_OWN, START_REFERENCE)
# The most variants a space may list: each is an LR search of its own.
MAX_VARIANTS = 12
# What a variant's entry may hold: run settings, a batch size, and the user's model and its callable's arguments.
VARIANT_KEYS = frozenset({"set", "batch_size", "model", "model_set"})
VARIANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$")
# A variant's batch_size that asks for the largest batch that fits the trials' device, among those that leave its
# runs at least LARGEST_MIN_STEPS steps of the budget (fewer leave no schedule to speak of: warm-up, decay).
LARGEST = "largest"
LARGEST_MIN_STEPS = 20


def scaled_steps(steps: int, reference_batch: int, batch: int) -> int:
    """A count of steps of the reference's batch as steps of ``batch`` over the same tokens (0 stays 0)."""
    return max(1, round(steps * reference_batch / batch)) if steps and batch else steps


@dataclass(frozen=True)
class Variant:
    """One variant: its name and the settings it changes from the space's (``set:``, flat field names)."""

    name: str
    settings: Mapping[str, Setting] = field(default_factory=dict)
    derived: tuple[str, ...] = ()
    """Those of ``settings`` the search worked out rather than the space gave (a batch-size variant's step counts)."""
    largest_batch: str | None = None
    """A ``batch_size: largest`` variant's: "" until its batch is worked out, then what it fits ("the largest that
    fits this cuda's 79.1 GiB"); None for every other variant."""

    @property
    def given(self) -> dict[str, Setting]:
        """The settings the space gave it."""
        return {k: v for k, v in self.settings.items() if k not in self.derived}

    def resolved(self, base: RunConfig) -> Variant:
        """Itself with its run settings on ``base`` worked out (lmtune.searches.base.SearchStrategy.resolved)."""
        settings = self.run_settings(base)
        return replace(self, settings=settings,
                       derived=tuple(sorted({*self.derived, *(k for k in settings if k not in self.settings)})))

    def with_largest_batch(self, base: RunConfig, trials_device: Callable[[], torch.device] | None,
                           limit: int | None = None) -> Variant:
        """A ``batch_size: largest`` variant with its batch worked out for the device ``trials_device`` gives (None:
        unknown where its trials run, refused in one line), or ``limit`` bytes of it; every other variant as it is."""
        if self.largest_batch != "":
            return self
        device = trials_device() if trials_device is not None else None
        key = f"variants.{self.name}.batch_size {LARGEST}"
        if device is None:
            raise LmtuneError(f"{key}: the driver cannot see the device its trials run on (--address without a GPU "
                              "here); give the number (python -m lmtune.bench on a GPU node says what fits), or run "
                              "the driver on a node of the trials' kind")
        config = self.config(base)
        sequences = base.total_tokens // config.model.context_length
        limit = usable_memory_bytes(device) if limit is None else limit
        fits = largest_fitting_batch(config, device, lambda b: sequences % b == 0, limit, spec_for(config))
        # (a smaller batch needs less memory: the cap takes the largest divisor at or under both bounds)
        most = min(fits or 0, sequences // LARGEST_MIN_STEPS)
        batch = next((b for b in range(most, 0, -1) if sequences % b == 0), None)
        if batch is None:
            raise LmtuneError(f"{key}: not even batch 1 fits this {device.type} by lmtune's estimate (or the budget "
                              f"has under {LARGEST_MIN_STEPS} steps of it); drop the variant or make the model smaller")
        return replace(self, settings={**self.settings, "batch_size": batch},
                       largest_batch=f"the largest that fits this {device.type}'s {limit / 2**30:.1f} GiB usable"
                       + (f", capped at {LARGEST_MIN_STEPS} steps" if batch != fits else ""))

    def run_settings(self, base: RunConfig) -> dict[str, Setting]:
        """What its trials set on ``base``: its own settings, and where it sets batch_size (not steps), the step
        counts scaled to keep the budget's tokens."""
        batch = self.settings.get("batch_size")
        if batch is None or batch == base.train.batch_size or "steps" in self.settings:
            return dict(self.settings)
        tokens, per_step = base.total_tokens, int(batch) * base.model.context_length
        if tokens % per_step:
            raise LmtuneError(f"variants.{self.name}.batch_size {batch}: the budget's {tokens:,} tokens are not a "
                              f"whole number of its steps ({per_step:,} tokens each); give a batch_size that divides "
                              f"{tokens // base.model.context_length:,}, or set its steps")
        scaled = {name: scaled_steps(getattr(base.train, name), base.train.batch_size, int(batch))
                  for name in STEP_SETTINGS if name not in self.settings}
        return {**scaled, "steps": tokens // per_step, **self.settings}

    def config(self, base: RunConfig) -> RunConfig:
        """``base`` as this variant trains it, validated (one line naming the variant)."""
        return apply_overrides(base, self.run_settings(base), where=f"variants.{self.name}")

    def budget(self, base: Budget) -> Budget:
        """The reference's ``base`` budget as this variant's runs have it (its steps and tokens per step), compared at
        the reference's rungs in tokens (ASHA's: each variant's own ASHA cuts at the same token counts) below its own
        full budget."""
        settings = self.settings
        batch = int(settings.get("batch_size", base.batch_size))
        tokens_per_step = base.tokens_per_step * batch // base.batch_size if base.batch_size else base.tokens_per_step
        steps = int(settings.get("steps", base.full_tokens // tokens_per_step))
        warmup = int(settings.get("warmup_steps", scaled_steps(base.warmup_steps, base.batch_size, batch)))
        return replace(base, steps=steps, warmup_steps=warmup, tokens_per_step=tokens_per_step,
                       rungs=(*(r for r in base.rungs[:-1] if r < steps * tokens_per_step), steps * tokens_per_step),
                       batch_size=batch,
                       d_model=int(settings.get("d_model", base.d_model)), d_ff=int(settings.get("d_ff", base.d_ff)),
                       n_heads=int(settings.get("n_heads", base.n_heads)))


@dataclass(frozen=True)
class CompareSettings:
    """A compare search: its variants (the reference first) and the LR search each gets."""

    variants: tuple[Variant, ...]
    per_variant: str = "edge"
    edge: EdgeSettings = field(default_factory=EdgeSettings)
    start: str = START_OWN
    """Where a later variant's search starts (STARTS)."""

    @property
    def reference(self) -> Variant:
        return self.variants[0]

    def variant(self, name: str) -> Variant:
        return next(v for v in self.variants if v.name == name)

    def to_json(self) -> JsonObject:
        from dataclasses import asdict

        return {"variants": {v.name: {"set": dict(v.settings), **({"derived": list(v.derived)} if v.derived else {}),
                                      **({"largest_batch": v.largest_batch} if v.largest_batch is not None else {})}
                             for v in self.variants},
                "per_variant": self.per_variant, "edge": asdict(self.edge), "start": self.start}

    @classmethod
    def from_json(cls, data: JsonObject) -> CompareSettings:
        known = EdgeSettings.__dataclass_fields__
        return cls(tuple(Variant(name, dict(spec.get("set") or {}), tuple(spec.get("derived") or ()),
                                 spec.get("largest_batch"))
                         for name, spec in data["variants"].items()),
                   str(data.get("per_variant", "edge")),
                   EdgeSettings(**{k: v for k, v in (data.get("edge") or {}).items() if k in known}),
                   str(data.get("start", START_OWN)))


def parse_compare(raw: JsonObject, fail: Fail) -> CompareSettings:
    """The space's ``variants:``, ``per_variant:`` and that search's section, every problem one line naming the key."""
    per_variant = raw.get("per_variant", "edge")
    if per_variant not in PER_VARIANT:
        raise fail("per_variant", f"unknown LR search {shown(per_variant)} for each variant; use one of "
                                  f"{', '.join(PER_VARIANT)}")
    start = raw.get("start", START_OWN)
    if start not in STARTS:
        raise fail("start", f"{shown(start)}: where a later variant's LR search starts; use {START_OWN} (a search of "
                            f"its own) or {START_REFERENCE} (from the reference's best LR and edge)")
    edge = settings_section(raw.get("edge"), "edge", EdgeSettings, fail, retired=RETIRED_KEYS)
    for key, message in edge.problems():
        raise fail(f"edge.{key}", message)
    return CompareSettings(parse_variants(raw.get("variants"), fail), per_variant, edge, start)


def parse_variants(section: JsonValue, fail: Fail) -> tuple[Variant, ...]:
    example = "e.g. variants: {reference: {}, no_norm: {set: {norm: none}}}"
    if not isinstance(section, dict) or len(section) < 2:
        raise fail("variants", f"list at least two variants, the reference first, each a name and what it sets; "
                               f"{example}")
    if len(section) > MAX_VARIANTS:
        raise fail("variants", f"lists {len(section)} variants; at most {MAX_VARIANTS} (each is an LR search of its "
                               "own): split them into several sweeps that share the reference")
    return tuple(_variant(str(name), spec, fail) for name, spec in section.items())


def _variant(name: str, spec: JsonValue, fail: Fail) -> Variant:
    key = f"variants.{name}"
    if not VARIANT_NAME.match(name):
        raise fail(key, "a variant's name is letters, digits, '_', '-' or '.', at most 40, e.g. no_norm")
    spec = {} if spec is None else spec
    if not isinstance(spec, dict):
        raise fail(key, "must be a mapping, e.g. {set: {norm: none}} (or {} for the reference)")
    for other in sorted(set(spec) - VARIANT_KEYS):
        raise fail(f"{key}.{other}", f"unknown key; valid keys: {', '.join(sorted(VARIANT_KEYS))}")
    settings = spec.get("set") or {}
    if not isinstance(settings, dict):
        raise fail(f"{key}.set", "must be a mapping of setting -> value, e.g. {norm: none}")
    largest = spec.get("batch_size") == LARGEST
    if largest and ("steps" in settings or "batch_size" in settings):
        raise fail(f"{key}.batch_size", f"{LARGEST} keeps the budget's tokens and works out its steps; remove "
                                        "set.steps and set.batch_size")
    if "batch_size" in spec and not largest:
        settings = {**settings, "batch_size": spec["batch_size"]}
    checked: dict[str, Setting] = {}
    for setting, value in settings.items():
        where = f"{key}.set.{setting}"
        if setting not in field_names():
            raise fail(where, f"unknown setting; valid settings: {', '.join(field_names())}")
        if setting in SEARCH_OWNS:
            raise fail(where, "the compare search sets it per trial; remove it (set the base seed in the space's set)")
        checked[setting] = check_setting(setting, value, lambda why, where=where: fail(where, why))
    return Variant(name, {**checked, **_code_settings(key, spec, fail)}, largest_batch="" if largest else None)


def _code_settings(key: str, spec: JsonObject, fail: Fail) -> dict[str, Setting]:
    """A variant's ``model:`` (the user's model it trains instead of the space's) and ``model_set:`` (arguments of
    the model's callable) as its code settings (lmtune.usercode.config.is_code_setting)."""
    settings: dict[str, Setting] = {}
    try:
        if spec.get("model") is not None:
            settings[MODEL_SETTING] = normalized(spec["model"], f"{key}.model")
        args = checked_model_args(spec.get("model_set"), f"{key}.model_set")
    except LmtuneError as err:  # ("KEY VALUE: why" or "KEY: why": the key leads)
        where, _, message = str(err).partition(": ")
        raise fail(where.split(" ")[0], message) from None
    return {**settings, **{f"{MODEL_ARG_PREFIX}{name}": value for name, value in args.items()}}
