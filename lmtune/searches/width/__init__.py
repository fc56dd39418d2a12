"""``search: width``: the best LR for the model the user will train, predicted from the best LR of narrower copies of
it (a power law in the width, or μP's flat line) and confirmed at the target width (the stages:
lmtune.searches.width.conclusion; the fit: lmtune.searches.width.conclusion)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from lmtune.analysis.runs import Budget
from lmtune.errors import LmtuneError
from lmtune.files import JsonValue
from lmtune.searches.base import DecidingDefaults, Fail, settings_section
from lmtune.searches.contracts import TrialSourceClass
from lmtune.searches.width.conclusion import WidthSearch
from lmtune.searches.width.settings import WidthSettings, check_widths, proxy_shape
from lmtune.training.config import RunConfig, apply_overrides
from lmtune.usercode.spec import model_size

if TYPE_CHECKING:
    from lmtune.findings.part import ReportPart

# The ratio (target d_model over the widest proxy's) up to which the width search gained nothing in lmtune's
# measurements: a direct local search at the target cost less for an answer as good (benchmarks/README.md,
# "Where the horizon and width searches pay").
NO_GAIN_UP_TO_RATIO = 4.0  # (2x on the built-in corpus; 4x on real text, where the search's proxies failed it)


@dataclass(frozen=True)
class WidthStrategy(DecidingDefaults):
    settings: WidthSettings

    name: ClassVar[str] = WidthSearch.name
    keys: ClassVar[frozenset[str]] = frozenset({"width", "params"})
    settings_class: ClassVar[type] = WidthSettings
    search_class: ClassVar[TrialSourceClass] = WidthSearch
    whole_budget_only: ClassVar[bool] = WidthSearch.whole_budget_only
    axis_columns: ClassVar[tuple[str, ...]] = WidthSearch.axis_columns

    @classmethod
    def parse_settings(cls, section: JsonValue, fail: Fail) -> WidthSettings:
        if not isinstance(section, dict) or "widths" not in section:
            raise fail("width.widths", "list the proxy widths (d_model) below the space's, e.g. "
                                       "widths: [64, 128, 256]")
        widths = section["widths"]
        if not isinstance(widths, list) or not all(isinstance(w, int) and not isinstance(w, bool) for w in widths):
            raise fail("width.widths", "must be a list of whole numbers (d_model of each proxy), e.g. [64, 128, 256]")
        rest = settings_section({k: v for k, v in section.items() if k != "widths"}, "width", WidthSettings, fail)
        return WidthSettings(**{**asdict(rest), "widths": tuple(widths)})

    def check_base(self, base: RunConfig) -> None:
        super().check_base(base)
        target = Budget.of_run(base, None)
        check_widths(self.settings, target)
        widths = sorted({*self.settings.widths, base.model.d_model})
        if base.model.parametrization == "mup" and base.model.mup_base_width > widths[-1]:
            raise LmtuneError(f"mup_base_width {base.model.mup_base_width} is above every width the search trains "
                              f"({widths[0]} to {widths[-1]}): μP's output would be scaled up "
                              f"{base.model.mup_base_width / widths[0]:g}x at d_model {widths[0]} (a fresh model's "
                              "loss far above ln vocab, every run diverged); set mup_base_width to one of the widths "
                              "(the smallest proxy, usually)")
        for width in self.settings.widths:  # each proxy must be a model a run accepts (a user's: one it builds)
            proxy = apply_overrides(base, proxy_shape(target, width), where=f"width: the d_model {width} proxy")
            model_size(proxy)

    def describe(self, fuse: int) -> str:
        s = self.settings
        edge = f", up to {s.edge_probes} probes per width for where training fails" if s.edge_probes else ""
        return (f"width search: the best LR at d_model {', '.join(map(str, sorted(s.widths)))}, each a grid "
                f"{s.ratio:g}x apart trained to the whole budget with {s.seeds} seeds of the best and its neighbours"
                f"{', LR* located between grid points' if s.refine else ''}{edge}; ln LR* fitted against ln width and "
                f"the predicted LR confirmed at the space's d_model with {s.confirm_ratio:g}x either side, "
                f"{s.confirm_seeds} seed{'s' * (s.confirm_seeds > 1)} each")

    def advice(self, base: RunConfig) -> str | None:
        ratio = base.model.d_model / max(self.settings.widths)
        if ratio > NO_GAIN_UP_TO_RATIO:
            return None
        return (f"width: the target is {ratio:g}x the widest proxy; up to {NO_GAIN_UP_TO_RATIO:g}x a direct local "
                "search at the target (as many runs as this search trains there, around the widest proxy's best LR "
                "scaled by its parametrization's rule) cost less and found an LR as good in lmtune's measurements "
                "(benchmarks/README.md): consider a grid at the target width over those LRs (search: grid) instead")

    def expected_trials(self) -> tuple[int, int]:
        return self.settings.expected_trials(len(self.settings.widths)), 0


def report_part() -> ReportPart[Any]:
    """Its part of the report (lmtune.searches.width.report.SECTION, a ReportPart), imported only when the report asks
    for it: a sweep loads none of it."""
    from lmtune.searches.width.report import SECTION

    return SECTION
