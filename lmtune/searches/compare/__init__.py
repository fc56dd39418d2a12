"""``search: compare``: variants of the model or its training (ablations, batch sizes), each at its own best LR: an
LR search per variant in one sweep (lmtune.searches.compare.search), and a report that compares them
(lmtune.searches.compare.report)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, cast

import torch

from lmtune.errors import LmtuneError
from lmtune.files import JsonObject
from lmtune.searches.base import DecidingDefaults, Fail, Setting
from lmtune.searches.compare.search import CompareSearch
from lmtune.searches.compare.settings import CompareSettings, parse_compare
from lmtune.searches.contracts import TrialSourceClass
from lmtune.searches.edge import EdgeStrategy
from lmtune.searches.edge.settings import EdgeSettings
from lmtune.training.config import RunConfig, budget_config
from lmtune.training.lr_range import RangeTestConfig
from lmtune.usercode.checks import check_code
from lmtune.usercode.config import is_code_setting
from lmtune.usercode.spec import model_size

if TYPE_CHECKING:
    from lmtune.findings.part import ReportPart


@dataclass(frozen=True)
class CompareStrategy(DecidingDefaults):
    settings: CompareSettings

    name: ClassVar[str] = CompareSearch.name
    # (its variants are checked where they are parsed, its edge: section as the edge search's)
    keys: ClassVar[frozenset[str]] = frozenset({"variants", "per_variant", "edge", "params", "start"})
    settings_class: ClassVar[type] = CompareSettings
    settings_section: ClassVar[tuple[str, type]] = ("edge", EdgeSettings)
    search_class: ClassVar[TrialSourceClass] = CompareSearch
    axis_columns: ClassVar[tuple[str, ...]] = CompareSearch.axis_columns

    @classmethod
    def parse(cls, raw: JsonObject, fail: Fail) -> CompareStrategy:
        if raw.get("params"):
            raise fail("params", "search: compare chooses each variant's learning rates itself; remove params (list "
                                 "what differs under variants)")
        settings = parse_compare(raw, fail)
        _check_variants(settings, raw, fail)
        return cls(settings)

    @classmethod
    def from_json(cls, data: JsonObject) -> CompareStrategy:
        return cls(CompareSettings.from_json(data))

    def to_json(self) -> JsonObject:
        return self.settings.to_json()

    def values_of(self, name: str) -> list[Setting]:
        return [v.settings[name] for v in self.settings.variants if name in v.settings]

    def corner_samples(self) -> list[dict[str, Setting]]:
        # (each variant's config is checked as it loads, and with the user's code in check_base, naming the variant)
        return [{}]

    def check_base(self, base: RunConfig) -> None:
        """Every variant a model a run builds, before any trial starts: a variant of the user's model (its own model
        or arguments) built and checked as the sweep's is, one line naming the variant."""
        super().check_base(base)
        for variant in self.settings.variants:
            config = variant.config(base)
            try:
                model_size(config)
                if config.code != base.code:
                    check_code(config)
            except LmtuneError as err:
                raise LmtuneError(f"variants.{variant.name}: {err}") from None

    def fitted_to_device(self, base: RunConfig, device: Callable[[], torch.device] | None) -> CompareStrategy:
        variants = tuple(v.with_largest_batch(base, device) for v in self.settings.variants)
        return replace(self, settings=replace(self.settings, variants=variants))

    def resolved(self, base: RunConfig) -> CompareStrategy:
        variants = tuple(v.resolved(base) for v in self.settings.variants)
        return replace(self, settings=replace(self.settings, variants=variants))

    def added_seeds(self) -> int:
        return self.settings.edge.added_seeds()

    def describe(self, fuse: int) -> str:
        names = [v.name for v in self.settings.variants]
        return (f"compare search: {len(names)} variants, {names[0]} (the reference), {', '.join(names[1:])}: each "
                f"its own {self.settings.per_variant} search for its best LR and where training fails, at the same "
                "tokens (under an ASHA of its own where the space runs ASHA)"
                + (", each later variant's starting from the reference's answer" if self.settings.start == "reference"
                   else "") + "; then each variant at its own best LR against the reference")

    def held_checkpoints(self, outcome: str) -> frozenset[str]:
        # Each variant's edge search's: a coarse LR its ASHA cut is continued from its newest checkpoint.
        return EdgeStrategy(self.settings.edge).held_checkpoints(outcome)

    def asha_stages(self) -> frozenset[str]:
        # Each variant's edge search's (its coarse grid), under an ASHA of the variant's own (lmtune.sweep.variant_asha:
        # one ASHA would cut a variant's LRs against another variant's losses).
        return EdgeStrategy(self.settings.edge).asha_stages()

    def range_test(self) -> RangeTestConfig:
        return EdgeStrategy(self.settings.edge).range_test()  # each variant's edge search's

    def range_test_variant(self) -> str | None:
        return self.settings.reference.name  # (each variant's own: its coarse grid's line in the decisions)

    def expected_trials(self) -> tuple[int, int]:
        per_variant, _ = EdgeStrategy(self.settings.edge).expected_trials()
        return per_variant * len(self.settings.variants), 0


def _check_variants(settings: CompareSettings, raw: JsonObject, fail: Fail) -> None:
    """Each variant's config on the space's budget and set (its shape, its switches), one line naming the variant;
    the user's code and --set are checked with the base config when the sweep is planned (check_base)."""
    try:
        base = budget_config(str(raw.get("budget", "low-resource")), cast(Any, raw.get("set") or {}))
    except LmtuneError:
        return  # the space's own budget or set is wrong: lmtune.sweep.spaces says so, naming it
    for variant in settings.variants:  # (its code settings: with the user's code, in check_base)
        try:
            run_settings = {k: v for k, v in variant.settings.items() if not is_code_setting(k)}
            replace(variant, settings=run_settings).config(base)
        except LmtuneError as err:  # ("variants.NAME: ..." or "variants.NAME.KEY VALUE: ...": the key leads)
            key, _, message = str(err).partition(": ")
            raise fail(key.split(" ")[0], message) from None


def report_part() -> ReportPart[Any]:
    """Its part of the report (lmtune.searches.compare.report.SECTION, a ReportPart), imported only when the report asks
    for it: a sweep loads none of it."""
    from lmtune.searches.compare.report import SECTION

    return SECTION
