"""The Ray boundary of a trial: what Tune hands lmtune and takes back (``TuneParams``, ``TuneResult``: plain dicts,
named), the one objective lmtune ranks by, and a trial's order, what a search asks of one trial, typed.

Tune carries the order as the trial's config dict (a grid's param space, a searcher's suggestion: JSON-able, so
Tune can snapshot and restore it); ``TrialOrder.from_tune`` reads that dict once, at the trainable's door, and
everything after it (the trainable, a fused group, the stopper's stage rule) takes the typed order. The run's own
settings (lr, seed, steps, d_model, ...) stay a mapping of config field names, applied to the sweep's base config
by ``run_config``: validated there only when no space file of lmtune's checked them first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lmtune.errors import LmtuneError
from lmtune.training.config import RunConfig, apply_overrides, canonical_settings, with_settings

# What Ray Tune hands lmtune and takes back: plain dicts, as Tune types them, named so that the code reading them
# says it stands at Ray's boundary.
TuneResult = dict[str, Any]
"""A result: what a trial reports (``tune.report``), and what Tune hands its callbacks, stoppers and schedulers."""

TuneParams = dict[str, Any]
"""A trial's config: its values from the sweep's param space (lr, stage, members, ...), as Tune hands them to the
trainable."""

# The one objective lmtune's searchers and ASHA rank trials by.
METRIC, MODE = "val_loss", "min"


def check_objective(who: str, metric: str | None, mode: str | None) -> None:
    """A user's ``TuneConfig(metric=..., mode=...)`` handed to lmtune's searcher or ASHA: val_loss, lowest first (or
    left unset); anything else refused, naming the fix (mode="max" would keep the worst LRs and cut the best)."""
    if metric not in (None, METRIC) or mode not in (None, MODE):
        raise ValueError(f"{who} ranks runs by {METRIC}, lowest first; set TuneConfig(metric={METRIC!r}, "
                         f"mode={MODE!r}) (got metric={metric!r}, mode={mode!r})")


RANGE_STAGE = "range"
"""The edge search's LR range test: a trial that sweeps the LR up within one run instead of training at one."""

ORDER_KEYS = ("stage", "continue_from", "fork_from", "early_stop", "members", "variant")
"""The keys of a trial's Tune config that say how a search runs it, not which settings it trains with."""


@dataclass(frozen=True)
class FusedMembers:
    """A fused trial's runs: one per LR, trained in one process, sharing every other setting."""

    lrs: tuple[float, ...]
    shared: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TrialOrder:
    """What a search asks of one trial: the settings it trains with and how the search runs it."""

    settings: Mapping[str, Any] = field(default_factory=dict)
    """Config field names to values (lr, seed, steps, d_model, ...), applied to the sweep's base config."""
    stage: str | None = None
    """The search's stage that asked for it (an adaptive search's), or None (a grid's or Optuna's)."""
    continue_from: str | None = None
    """An edge search's: the trial id of an ASHA-cut run this one continues from its newest checkpoint."""
    fork_from: str | None = None
    """A horizon search's, under WSD: the trial id whose stable.pt this run forks from."""
    early_stop: bool = True
    """False: the stopper's divergence rule leaves the trial alone (an edge search's confirmations)."""
    members: FusedMembers | None = None
    """A fused group's runs (then ``settings`` is empty)."""
    variant: str | None = None
    """A compare search's: the variant the trial trains (its settings are among ``settings``)."""

    @property
    def is_range_test(self) -> bool:
        return self.stage == RANGE_STAGE

    @property
    def source(self) -> str | None:
        """The trial whose checkpoint this run starts from (continued or forked), if any."""
        return self.continue_from or self.fork_from

    def run_config(self, base: RunConfig, where: str, checked: bool) -> RunConfig:
        """The sweep's base config with this trial's settings applied. ``checked``: they come from a space file
        lmtune parsed, which held each to its rule and every combination to the config's (lmtune.sweep.spaces),
        and are put in place as they are; otherwise (a Tuner of the user's may hand any value) they are coerced and
        validated here, once (one line naming ``where``)."""
        if checked:
            return with_settings(base, self.settings)
        return apply_overrides(base, self.settings, where=where)

    def member_configs(self, base: RunConfig, names: list[str], checked: bool) -> list[RunConfig]:
        """A fused group's configs, one per member LR (``names``: the members, for the refusal's line)."""
        assert self.members is not None
        return [TrialOrder({**self.members.shared, "lr": lr}).run_config(base, f"trial {name}", checked)
                for name, lr in zip(names, self.members.lrs, strict=True)]

    def to_tune(self) -> TuneParams:
        """The order as Tune carries it (what ``from_tune`` reads back)."""
        params: TuneParams = {"stage": self.stage} if self.stage is not None else {}
        params.update(self.settings)
        if self.members is not None:
            params["members"] = {"lr": list(self.members.lrs), **self.members.shared}
        if self.continue_from:
            params["continue_from"] = self.continue_from
        if self.fork_from:
            params["fork_from"] = self.fork_from
        if not self.early_stop:
            params["early_stop"] = False
        if self.variant is not None:
            params["variant"] = self.variant
        return params

    @classmethod
    def from_tune(cls, params: Mapping[str, Any]) -> TrialOrder:
        """Read a trial's Tune config (a user's own Tuner may hand any dict: a wrong type is one line)."""
        def text(key: str) -> str | None:
            value = params.get(key)
            if value is not None and not isinstance(value, str):
                raise LmtuneError(f"trial config {key}={value!r}: must be a string (a trial id, a stage or a variant "
                                  "name)")
            return value or None

        early_stop = params.get("early_stop", True)
        if not isinstance(early_stop, bool):
            raise LmtuneError(f"trial config early_stop={early_stop!r}: must be true or false")
        settings = canonical_settings({k: v for k, v in params.items() if k not in ORDER_KEYS}, "trial config")
        return cls(settings=settings, stage=text("stage"),
                   continue_from=text("continue_from"), fork_from=text("fork_from"), early_stop=early_stop,
                   members=_members(params.get("members")), variant=text("variant"))


def _members(value: Any) -> FusedMembers | None:
    if value is None:
        return None
    lrs = value.get("lr") if isinstance(value, Mapping) else None
    if not isinstance(lrs, (list, tuple)) or not lrs:
        raise LmtuneError(f"trial config members={value!r}: must be {{'lr': [LR, ...], other settings}}")
    return FusedMembers(tuple(lrs), {k: v for k, v in value.items() if k != "lr"})


def evaluated_val_loss(result: TuneResult) -> float | None:
    """The validation loss a Tune result of lmtune's trainable measured at its own step (None at a step without an
    evaluation: every result repeats the latest one, measured at ``val_step``, for Tune's metric checks)."""
    loss = result.get("val_loss")
    if not isinstance(loss, int | float) or result.get("val_step", result.get("step")) != result.get("step"):
        return None
    return float(loss)
