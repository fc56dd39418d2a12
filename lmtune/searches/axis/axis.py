"""What a search along an axis steps along: token budgets (``search: horizon``: lmtune.searches.horizon.budgets)
or model widths (``search: width``: lmtune.searches.width.conclusion), and what its runs conclude point by point.

An axis says which points are searched, which of them is the target, what a trial at a point sets, and which runs
belong to it; each point's LR* is located on its own runs and a search's fit (a power law in the axis) goes through
them (``conclude_along``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from lmtune.analysis.bracket import bracket
from lmtune.analysis.conclusion import Conclusion, conclude
from lmtune.analysis.fit import PowerLaw
from lmtune.analysis.locate import LocatedLr, locate_best_lr
from lmtune.analysis.runs import Budget, Run, effective_runs, full_budget_ranking
from lmtune.analysis.surface import WIDENING, surface_where_law_holds
from lmtune.files import JsonObject
from lmtune.searches.trial_order import TuneParams


class SearchAxis(Protocol):
    """The points a horizon-style search steps along, smallest first, and the target beyond them."""

    name: str
    """What a point is, for messages: "budget" or "width"."""

    @property
    def points(self) -> list[int]:
        """The searched points, smallest first (steps, or d_model)."""

    @property
    def target(self) -> int:
        """The point the prediction is for (the space's own steps, or d_model)."""

    def params(self, point: int) -> TuneParams:
        """What a trial at ``point`` sets besides its stage, LR and seed."""

    def budget_at(self, point: int) -> Budget:
        """The budget of a run at ``point``, compared at its full token count only."""

    def holds(self, run: Run, point: int) -> bool:
        """Whether ``run`` was trained at ``point``."""

    def others(self, point: int) -> tuple[tuple[str, object], ...]:
        """A run's ``others`` at ``point`` (lmtune.analysis.runs.Run.others: what besides the LR tells runs apart)."""

    def label(self, point: int) -> str:
        """``point`` in words ("162-step budget", "d_model 64")."""


@dataclass(frozen=True)
class Axis:
    """What every axis holds: the target's budget and model, and the searched values; an axis adds what a point
    means (``target``, ``params``, ``budget_at``, ``holds``, ``others``, ``label``: SearchAxis)."""

    budget: Budget
    """The space's budget and model: the target's."""
    values: tuple[int, ...]
    """The searched points: budgets in steps, or the proxies' d_model."""

    @property
    def points(self) -> list[int]:
        return sorted(self.values)


def runs_at(axis: SearchAxis, runs: Iterable[Run], point: int) -> list[Run]:
    """The runs trained at ``point`` that stand (lmtune.analysis.runs.effective_runs)."""
    return effective_runs(r for r in runs if axis.holds(r, point))


@dataclass(frozen=True)
class PointConclusion:
    """One point of the axis (a budget, or a width): its runs compared at the point's full token count."""

    value: int
    """The budget in steps (search: horizon) or the width, d_model (search: width)."""
    tokens: int
    """The point's full token count, where its LRs are compared."""
    fraction: float
    """value / the target's."""
    trials: int
    """The runs that stand at this point."""
    conclusion: Conclusion
    """What its runs conclude (lmtune.analysis.conclusion.conclude)."""
    located: LocatedLr | None
    """Its LR* located between grid points around the crowned best (None: the target, or no LR trained it)."""

    def located_json(self, not_located: str) -> JsonObject:
        """summary.json's keys of its located LR* (a horizon budget's and a width's alike); ``not_located``: why
        there is none, where none was located."""
        at = self.located
        usable = at if at is not None and at.usable else None
        return {"located_lr": at.lr if at else None, "located_lr_se": usable.log_se if usable else None,
                "located_lr_interval": list(usable.interval()) if usable else None,
                "located": at.located if at else None, "located_why": at.why if at else not_located}


class SearchFit(Protocol):
    """What the engine (lmtune.searches.axis.search) reads of a search's fit (lmtune.analysis.fit.HorizonFit,
    lmtune.searches.width.conclusion.WidthFit)."""

    @property
    def predicted_lr(self) -> float: ...

    @property
    def predicted_lr_interval(self) -> tuple[float, float]: ...

    def to_json(self) -> JsonObject: ...


Fit = TypeVar("Fit")


@dataclass(frozen=True)
class AxisConclusion(Generic[Fit]):
    """Every point's conclusion, the searched ones then the target, and the power law fitted through them."""

    points: tuple[PointConclusion, ...]
    """The searched points, smallest first, then the target."""
    fit: Fit | None
    """ln LR* against ln of the axis through the searched points' located LR*s (None: it cannot be fitted)."""
    fit_problem: str | None
    """Why there is no fit."""


def locate_along(axis: SearchAxis, runs: Iterable[Run]) -> list[LocatedLr | None]:
    """Each searched point's LR* (None: no LR trained it through), smallest first. The edge probes are left out:
    they are one seed each, far above the basin, and may end after the fit was made."""
    runs = [r for r in runs if r.stage != "edge"]
    located = []
    for point in axis.points:
        at = runs_at(axis, runs, point)
        located.append(locate_best_lr(full_budget_ranking(at), axis.budget_at(point).full_tokens, bracket(at)))
    return located


def surface_along(axis: SearchAxis, runs: Iterable[Run], x_of: Callable[[int], float], target_x: float,
                  widening: float = WIDENING) -> PowerLaw | None:
    """The loss surface through every searched point's runs (lmtune.analysis.surface), ``x_of(point)`` the point's
    value on the fitted axis (its tokens, its width), where one power law holds across them (else None). The edge
    probes are left out, as in ``locate_along``."""
    runs = [r for r in runs if r.stage != "edge"]
    return surface_where_law_holds([(x_of(point), runs_at(axis, runs, point)) for point in axis.points], target_x,
                                   widening)


def conclude_along(axis: SearchAxis, runs: Iterable[Run],
                   fit: Callable[[list[LocatedLr | None]], tuple[Fit | None, str | None]]) -> AxisConclusion[Fit]:
    """Each point's conclusion at its own full token count (the searched points, then the target) with its located
    LR*, and the search's ``fit`` of those located LR*s (the fit or why there is none)."""
    runs = list(runs)
    located = locate_along(axis, runs)
    points = []
    for i, value in enumerate([*axis.points, axis.target]):
        at, budget = runs_at(axis, runs, value), axis.budget_at(value)
        points.append(PointConclusion(value, budget.full_tokens, value / axis.target, len(at), conclude(at, budget),
                                      located[i] if i < len(located) else None))
    return AxisConclusion(tuple(points), *fit(located))
