"""The report of a width search (``search: width``): per width (the proxies, narrowest first, then the target) the
model's size and training FLOPs per token, the crowned LR at the budget's full token count with its seed spread,
and its LR* located between grid points with its SE; the power law ln LR* = a - gamma ln width through the proxies
with its interval; the LR it predicts at the target width; the confirmation's verdict (the horizon search's,
lmtune.searches.axis.report_confirmation, judged by the target width's own runs); and what the search cost in
training FLOPs, which (unlike tokens) compare runs of different widths.

Read from the trials' own files like the rest of the report (never from the searcher's state): the fit is
recomputed from the runs by the search's own functions (lmtune.searches.width.conclusion), so they agree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from lmtune.analysis.runs import Budget, Run
from lmtune.files import JsonObject
from lmtune.searches.axis.axis import PointConclusion
from lmtune.searches.axis.report_confirmation import Predicted, TargetConfirmation, confirmation, search_tokens
from lmtune.searches.base import SearchStrategy
from lmtune.searches.width import WidthStrategy
from lmtune.searches.width.conclusion import WidthFit, conclude_widths, runs_at_width
from lmtune.searches.width.report_coord import SweepCoordCheck
from lmtune.searches.width.settings import WidthSettings, proxy_shape
from lmtune.training.config import RunConfig, apply_overrides
from lmtune.usercode.spec import flops_per_token, model_size

# What a width search's trial sets of the model (lmtune.searches.width.settings.proxy_shape).
SHAPE_KEYS = ("d_model", "d_ff", "n_heads")


def width_settings(strategy: SearchStrategy) -> WidthSettings | None:
    """The width search's settings of a sweep's plan's ``strategy`` (None: not a width search)."""
    return strategy.settings if isinstance(strategy, WidthStrategy) else None


@dataclass(frozen=True)
class WidthRow:
    """One width as the report's table gives it: its model and what its runs conclude."""

    point: PointConclusion
    """Its runs' conclusion and located LR* (lmtune.searches.width.conclusion)."""
    params: int
    """Its non-embedding parameters (lmtune.usercode.spec.model_size)."""
    flops_per_token: float
    """Its training FLOPs per token (lmtune.usercode.spec.model_size; estimated for a user's model)."""

    def to_json(self) -> JsonObject:
        c = self.point.conclusion
        return {"d_model": self.point.value, "params": self.params, "flops_per_token": self.flops_per_token,
                "trials": self.point.trials, "crowned_lr": c.best_lr,
                "best_lr_mean_loss": c.best.mean if c.best else None,
                "best_lr_spread": c.best.spread if c.best else None,
                "best_lr_seeds": list(c.best.seeds) if c.best else [],
                **self.point.located_json(self.not_located)}

    @property
    def not_located(self) -> str:
        return ("no LR trained this width through" if self.point.trials
                else "no run at this width yet")


@dataclass(frozen=True)
class WidthResult(Predicted):
    """A width search's own results: every width's conclusion, the fit and its prediction, the confirmation, the
    cost."""

    widths: tuple[WidthRow, ...]
    """The proxies, narrowest first, then the target."""
    target_width: int
    """The target's d_model (the space's)."""
    parametrization: str
    """The model's parametrization: "sp" or "mup"."""
    mup_base_width: int | None
    """μP's base width, where it equals SP (None: SP)."""
    fit: WidthFit | None
    """ln LR* = a - gamma ln width through the proxies' located LR*s (None: it cannot be fitted)."""
    fit_problem: str | None
    """Why there is no fit (None: there is one)."""
    confirmed: TargetConfirmation
    """What the target width's own runs show of the prediction."""
    search_flops: float
    """Training FLOPs of the whole search: every trial's tokens trained x its own model's FLOPs per token."""
    confirmation_flops: float
    """Of which the runs at the target width (the confirmation)."""
    target_run_flops: float
    """One full run at the target width: the budget's tokens x the target's FLOPs per token."""
    sweep_dir: Path | None = None
    """The sweep's folder (where a coord check's coord_check.json lies; None: summarized from runs alone)."""
    coord: SweepCoordCheck | None = None
    """The coord check at the search's widths under its parametrization (None: not asked for)."""

    @property
    def target_runs_equal(self) -> float | None:
        """The search's cost in full runs at the target width."""
        return self.search_flops / self.target_run_flops if self.target_run_flops else None

    def to_json(self) -> JsonObject:
        """summary.json's width keys."""
        interval = self.predicted_lr_interval
        return {"widths": [row.to_json() for row in self.widths], "target_width": self.target_width,
                "parametrization": self.parametrization, "mup_base_width": self.mup_base_width,
                "width_fit": None if self.fit is None else fit_json(self.fit), "predicted_lr": self.predicted_lr,
                "predicted_lr_interval": list(interval) if interval else None, "fit_problem": self.fit_problem,
                "confirmed": self.confirmed.to_json(), "search_flops": self.search_flops,
                "confirmation_flops": self.confirmation_flops, "target_run_flops": self.target_run_flops,
                "target_runs_equal": self.target_runs_equal,
                "coord_check": self.coord.to_json() if self.coord else None}


def fit_json(fit: WidthFit) -> JsonObject:
    law = fit.law
    return {"gamma": fit.gamma, "gamma_interval": list(law.exponent_interval), "gamma_resolved": fit.resolved,
            "intercept": law.intercept, "intercept_interval": list(law.intercept_interval),
            "widths_fitted": list(fit.widths), "chi2": law.chi2, "dof": law.dof, "scale": law.scale,
            "lack_of_fit_p": law.lack_of_fit_p, "law_holds": law.law_holds,
            "points": [{"d_model": w, **p.to_json()} for w, p in zip(fit.widths, fit.points, strict=True)]}


def shaped(base: RunConfig, shape: Mapping[str, object]) -> RunConfig:
    """The base config with a trial's d_model, d_ff and n_heads (those it sets)."""
    return apply_overrides(base, {k: v for k, v in shape.items() if k in SHAPE_KEYS}, where="a width search's trial")


def width_summary(runs: Sequence[Run], settings: WidthSettings, base: RunConfig,
                  sweep_dir: Path | None = None) -> WidthResult:
    """Every width's conclusion and located LR*, the fit (gamma and its 90% interval) and its prediction at the
    target, the confirmation's verdict and the FLOPs, from every trial as a run (lmtune.findings.comparison.
    record_runs) and the sweep's base config (the target's model)."""
    target = Budget.of_run(base, None)
    found = conclude_widths(runs, settings, target)
    at_target = runs_at_width(runs, target.d_model, target)
    fit = found.fit
    confirmed = confirmation(at_target, fit.predicted_lr if fit else None, search_tokens(runs))
    models: dict[tuple[tuple[str, object], ...], RunConfig] = {}

    def model_of(shape: Mapping[str, object]) -> RunConfig:
        key = tuple(sorted((k, v) for k, v in shape.items() if k in SHAPE_KEYS))
        if key not in models:
            models[key] = shaped(base, dict(key))
        return models[key]

    rows = []
    for point in found.points:
        size = model_size(model_of(proxy_shape(target, point.value)))
        rows.append(WidthRow(point, size.non_embedding, size.flops_per_token))
    # every trial's own model, the runs that others replaced too: FLOPs spent, not the plan's
    cost = [(run, run.tokens * flops_per_token(model_of(dict(run.others)))) for run in runs]
    confirming = {id(run) for run in runs if dict(run.others).get("d_model") == target.d_model}
    mup = base.model.parametrization == "mup"
    return WidthResult(tuple(rows), target.d_model, base.model.parametrization,
                       base.model.mup_base_width if mup else None, fit, found.fit_problem, confirmed,
                       sum(f for _, f in cost), sum(f for run, f in cost if id(run) in confirming),
                       target.full_tokens * flops_per_token(base), sweep_dir)
