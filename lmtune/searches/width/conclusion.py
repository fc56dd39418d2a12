"""What a width search steps along and what its runs conclude, Ray-free and typed: the proxies' d_model, then the
target's (``WidthAxis``, a lmtune.searches.axis.axis.Axis); each width's conclusion at the budget's full token count
(lmtune.analysis.conclusion.conclude), each proxy's located LR* (lmtune.analysis.locate) and the power
law ln LR* = a - gamma ln width: the line through the located LR*s, or (``fit: surface``) the loss surface through
every proxy's runs (lmtune.analysis.surface) where its law test holds. The search (deciding when to confirm) and
the report (lmtune.searches.width.report_conclusion) both call these, so they agree.

The width search itself (``WidthSearch``) is the engine of a search along an axis (lmtune.searches.axis.search),
the horizon search's sibling, stepping along width instead of tokens: at each proxy width, narrowest first, the
same stages with the same full-budget crowning rules; then the power law in width, and the predicted LR and it
divided and multiplied by ``confirm_ratio`` trained at the target width, ``confirm_seeds`` runs each.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from lmtune.analysis.fit import LINE, SURFACE, PowerLaw, fit_power_law
from lmtune.analysis.locate import LocatedLr
from lmtune.analysis.runs import Budget, Run
from lmtune.errors import LmtuneError
from lmtune.files import JsonObject
from lmtune.searches.axis.axis import Axis, AxisConclusion, SearchAxis, conclude_along, locate_along, surface_along
from lmtune.searches.axis.axis import runs_at as runs_on
from lmtune.searches.axis.search import AxisSearch
from lmtune.searches.trial_order import TuneParams
from lmtune.searches.width.settings import WidthSettings, proxy_shape

# With ``fit: surface``, the surface's covariance interval is widened this many times in ln LR for the width search
# (the horizon search's is lmtune.analysis.surface.WIDENING): the smallest of 1, 1.25 and 1.5 that held the true LR*
# at the target width in 90% of 300 simulated searches of each tuned case, LR* ~ width^-1 (SP) and width^0 (μP) on
# the measured noise (1: 88% and 86%, 1.25: 92% and 92%, 1.5: 98% and 100%; benchmarks/width_coverage.py). The
# held-out scenarios did not enter the choice.
WIDTH_WIDENING = 1.25


@dataclass(frozen=True)
class WidthAxis(Axis):
    """Model widths at one token budget: a trial sets d_model (d_ff and n_heads with it); every run's budget is
    the space's."""

    name = "width"

    @property
    def target(self) -> int:
        return self.budget.d_model

    def params(self, point: int) -> TuneParams:
        return proxy_shape(self.budget, point)

    def budget_at(self, point: int) -> Budget:
        return self.budget.at_steps(self.budget.steps)  # every width trains the space's whole budget

    def holds(self, run: Run, point: int) -> bool:
        return dict(run.others).get("d_model") == point

    def others(self, point: int) -> tuple[tuple[str, object], ...]:
        return tuple(sorted(self.params(point).items()))

    def label(self, point: int) -> str:
        return f"d_model {point}"


@dataclass(frozen=True)
class WidthFit:
    """ln LR* = a - gamma ln width through the proxies' located LR*s, and LR* it predicts at the target width."""

    widths: tuple[int, ...]
    """The proxies fitted (those whose LR* has a finite SE), narrowest first."""
    points: tuple[LocatedLr, ...]
    """Their located LR*s, in the same order."""
    target_width: int
    """The width the prediction is for (the space's d_model)."""
    law: PowerLaw
    """The fit: its exponent is gamma (LR* ~ width^-gamma); under μP gamma should be 0."""
    method: str = LINE
    """How it was fitted: SURFACE (one fit of every proxy's runs: lmtune.analysis.surface; the law's chi2 and dof
    are then its law test's) or LINE (a weighted line through the proxies' located LR*s)."""

    @property
    def gamma(self) -> float:
        return self.law.exponent

    @property
    def predicted_lr(self) -> float:
        return self.law.predicted_lr

    @property
    def predicted_lr_interval(self) -> tuple[float, float]:
        return self.law.predicted_lr_interval

    @property
    def resolved(self) -> bool:
        """Whether these widths tell LR* moves: gamma's 90% interval excludes 0."""
        return self.law.resolved

    def to_json(self) -> JsonObject:
        return {"widths": list(self.widths), "points": [p.to_json() for p in self.points],
                "target_width": self.target_width, **self.law.to_json(), "method": self.method}

    @classmethod
    def from_json(cls, data: JsonObject) -> WidthFit:
        return cls(tuple(int(w) for w in data["widths"]), tuple(LocatedLr.from_json(p) for p in data["points"]),
                   int(data["target_width"]), PowerLaw.from_json(data), str(data.get("method", LINE)))


def runs_at_width(runs: Iterable[Run], width: int, target: Budget) -> list[Run]:
    """The runs (those that stand: lmtune.analysis.runs.effective_runs) trained at ``width``."""
    return runs_on(WidthAxis(target, ()), runs, width)


def width_axis(settings: WidthSettings, target: Budget) -> WidthAxis:
    """The proxy widths of a width search with ``target`` its space's budget and model."""
    return WidthAxis(target, tuple(settings.widths))


def locate_widths(runs: Iterable[Run], settings: WidthSettings, target: Budget) -> list[LocatedLr | None]:
    """Each proxy's LR* (None: no LR trained it through), narrowest first."""
    return locate_along(width_axis(settings, target), runs)


def fit_widths(runs: Iterable[Run], settings: WidthSettings, target: Budget) -> tuple[WidthFit | None, str | None]:
    """The power law in width predicting the target's LR*: the line through the proxies' located LR*s, or with
    ``fit: surface`` the loss surface fitted to every proxy's runs (lmtune.analysis.surface) where its law test
    holds; or None and why it cannot be fitted. The search and the report both fit with this, so they agree."""
    runs = list(runs)
    return fit_located_widths(locate_widths(runs, settings, target), runs, settings, target)


def fit_located_widths(located: list[LocatedLr | None], runs: Iterable[Run], settings: WidthSettings,
                       target: Budget) -> tuple[WidthFit | None, str | None]:
    """``fit_widths`` with the proxies' LR*s located already (None: not located), narrowest first."""
    pairs = [(w, p) for w, p in zip(sorted(settings.widths), located, strict=True) if p is not None and p.usable]
    surface = (surface_along(width_axis(settings, target), runs, float, float(target.d_model), WIDTH_WIDENING)
               if settings.fit == SURFACE else None)
    if surface is not None:
        return WidthFit(tuple(w for w, _ in pairs), tuple(p for _, p in pairs), target.d_model, surface, SURFACE), None
    if len(pairs) < 2:
        return None, ("a width fit needs LR* at two or more widths (each width's best LR not at the end of its LRs, "
                      "and trained through)")
    try:
        law = fit_power_law([float(w) for w, _ in pairs], [p for _, p in pairs], float(target.d_model))
    except (LmtuneError, ValueError) as err:
        return None, str(err)
    return WidthFit(tuple(w for w, _ in pairs), tuple(p for _, p in pairs), target.d_model, law, LINE), None


def conclude_widths(runs: Iterable[Run], settings: WidthSettings, target: Budget) -> AxisConclusion[WidthFit]:
    """Each width's conclusion (the proxies, then the target) and the fit."""
    runs = list(runs)
    return conclude_along(width_axis(settings, target), runs,
                          lambda located: fit_located_widths(located, runs, settings, target))


class WidthSearch(AxisSearch):
    """The width search's state and decisions (lmtune.searches.axis.search.AxisSearch) along the proxies' widths."""

    name = "width"
    settings_class = WidthSettings
    axis_columns = ("d_model",)
    fit_class = WidthFit

    def make_axis(self) -> SearchAxis:
        return width_axis(self.settings, self.budget)

    def _fit(self) -> tuple[WidthFit | None, str | None]:
        return fit_widths(self.runs.values(), self.settings, self.budget)

    def _fit_words(self, fit: WidthFit) -> tuple[str, str]:
        moves = "" if fit.resolved else ", gamma not resolved by these widths: LR* may not move with width"
        return f"gamma {fit.gamma:.2f}{moves}", f"the target d_model {self.axis.target}"
