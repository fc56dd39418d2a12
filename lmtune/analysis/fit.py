"""The best LR across token horizons: a power law LR*(D) = exp(a) * D^-beta fitted to each searched budget's
located LR* (lmtune.analysis.locate), and the LR it predicts for a larger budget, each with a
90% interval (Bjorck et al. 2025, "Scaling Optimal LR Across Token Horizons").

Ray-free and deterministic. Where the uncertainty comes from, and how it is carried:
- each budget's LR* is known to its standard error from the seeds (an unlocated one, to its fitted span), so
  the line is a weighted least-squares fit with those errors;
- the budgets' LR*s may scatter about the line more than those errors say (the law is only approximate, or
  the errors are underestimated): the chi-square of the residuals measures it, and when it exceeds its degrees
  of freedom every interval is widened by sqrt(chi2 / dof) (the Birge ratio). With 3 budgets that is one
  degree of freedom: the lack of fit is seen, but barely — a lack-of-fit p below LAW_P says the law does not
  hold across these budgets, and the prediction is then an extrapolation of a law the data reject.
The calibration of these 90% intervals (how often they hold the true LR*) is measured by simulation:
benchmarks/horizon_coverage.py, and held by tests/test_horizon_coverage.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lmtune.analysis.locate import Z90, LocatedLr
from lmtune.errors import LmtuneError
from lmtune.files import JsonObject

# Below this lack-of-fit p-value the power law is said not to hold across the searched budgets.
LAW_P = 0.05


@dataclass(frozen=True)
class HorizonFit:
    beta: float
    """LR*(D) falls as D^-beta."""
    beta_interval: tuple[float, float]
    """beta's 90% interval."""
    intercept: float
    """ln LR* at D = 1 token (the fit's a)."""
    intercept_interval: tuple[float, float]
    target_tokens: int
    predicted_lr: float
    predicted_lr_interval: tuple[float, float]
    """The predicted LR's nominal 90% interval (widened to the largest budget's LR* when beta is not resolved); what
        it held where the method was not tuned: lmtune.searches.axis.held_out."""
    points: tuple[LocatedLr, ...]
    """Each searched budget's LR*, smallest budget first (the points fitted: those with a finite SE)."""
    chi2: float
    """Sum of squared residuals over their variances."""
    dof: int
    """Residual degrees of freedom: budgets fitted - 2."""
    scale: float
    """The factor the intervals were widened by for lack of fit (1: none)."""
    method: str = "line"
    """How it was fitted: SURFACE (one fit of every budget's runs: lmtune.analysis.surface; chi2 and dof are then
    its law test's) or LINE (a weighted line through the budgets' located LR*s)."""

    @property
    def law(self) -> PowerLaw:
        """The fit as a power law in tokens (its exponent is beta)."""
        return PowerLaw(self.beta, self.beta_interval, self.intercept, self.intercept_interval, self.predicted_lr,
                        self.predicted_lr_interval, self.chi2, self.dof, self.scale)

    @property
    def resolved(self) -> bool:
        """Whether these budgets tell LR* moves: beta's 90% interval excludes 0."""
        return self.law.resolved

    @property
    def lack_of_fit_p(self) -> float | None:
        """P(chi2 this large | the law holds); None with 2 budgets (no residual)."""
        return self.law.lack_of_fit_p

    @property
    def law_holds(self) -> bool | None:
        """False when the budgets' LR*s are further from the line than their errors allow (p < LAW_P)."""
        return self.law.law_holds

    @property
    def best_lrs(self) -> dict[int, float]:
        """Budget (tokens) -> its LR* (the points fitted)."""
        return {p.tokens: p.lr for p in self.points}

    def to_json(self) -> JsonObject:
        return {"beta": self.beta, "beta_interval": list(self.beta_interval), "intercept": self.intercept,
                "intercept_interval": list(self.intercept_interval), "target_tokens": self.target_tokens,
                "predicted_lr": self.predicted_lr, "predicted_lr_interval": list(self.predicted_lr_interval),
                "points": [p.to_json() for p in self.points], "chi2": self.chi2, "dof": self.dof,
                "scale": self.scale, "resolved": self.resolved, "lack_of_fit_p": self.lack_of_fit_p,
                "law_holds": self.law_holds, "method": self.method}

    @classmethod
    def from_json(cls, data: JsonObject) -> HorizonFit:
        return cls(float(data["beta"]), _pair(data["beta_interval"]), float(data["intercept"]),
                   _pair(data["intercept_interval"]), int(data["target_tokens"]), float(data["predicted_lr"]),
                   _pair(data["predicted_lr_interval"]), tuple(LocatedLr.from_json(p) for p in data["points"]),
                   float(data["chi2"]), int(data["dof"]), float(data["scale"]), str(data.get("method", LINE)))


LINE, SURFACE = "line", "surface"


def fit_horizon(points: Sequence[LocatedLr], target_tokens: int, surface: PowerLaw | None = None) -> HorizonFit:
    """The power law in tokens predicting LR* at ``target_tokens``, every interval 90%: the ``surface`` fitted to
    every budget's runs (lmtune.analysis.surface) where there is one, else ln LR* = a - beta ln D through the
    budgets' located LR*s, weighted by their errors and widened for lack of fit. ``points``: the located LR*s,
    kept beside it for the report either way."""
    ordered = tuple(sorted(points, key=lambda p: p.tokens))
    if surface is not None:
        return HorizonFit(surface.exponent, surface.exponent_interval, surface.intercept, surface.intercept_interval,
                          target_tokens, surface.predicted_lr, surface.predicted_lr_interval, ordered, surface.chi2,
                          surface.dof, surface.scale, SURFACE)
    usable = sorted((p for p in points if p.usable), key=lambda p: p.tokens)
    if len({p.tokens for p in usable}) < 2:
        raise LmtuneError("a horizon fit needs LR* at two or more budgets (each budget's best LR not at the end "
                          "of its LRs)")
    law = fit_power_law([float(p.tokens) for p in usable], usable, float(target_tokens))
    return HorizonFit(law.exponent, law.exponent_interval, law.intercept, law.intercept_interval, target_tokens,
                      law.predicted_lr, law.predicted_lr_interval, ordered, law.chi2, law.dof, law.scale, LINE)


@dataclass(frozen=True)
class PowerLaw:
    """ln LR* = intercept - exponent ln x, fitted by weighted least squares, and what it predicts at a target x."""

    exponent: float
    """LR* moves as x^-exponent."""
    exponent_interval: tuple[float, float]
    """The exponent's 90% interval."""
    intercept: float
    """ln LR* at x = 1."""
    intercept_interval: tuple[float, float]
    predicted_lr: float
    """LR* at the target x."""
    predicted_lr_interval: tuple[float, float]
    """Its 90% interval (widened to the largest x's LR* interval when the exponent is not resolved)."""
    chi2: float
    dof: int
    scale: float
    """The factor the intervals were widened by for lack of fit (1: none)."""

    @property
    def resolved(self) -> bool:
        """The exponent's 90% interval excludes 0: LR* moves along x."""
        low, high = self.exponent_interval
        return low > 0 or high < 0

    @property
    def lack_of_fit_p(self) -> float | None:
        """P(chi2 this large | the law holds); None with 2 points (no residual)."""
        from scipy import stats  # (where it is asked for: lmtune.analysis.locate says why)

        return float(stats.chi2.sf(self.chi2, self.dof)) if self.dof > 0 else None

    @property
    def law_holds(self) -> bool | None:
        """False when the points' LR*s are further from the line than their errors allow (p < LAW_P)."""
        p = self.lack_of_fit_p
        return None if p is None else p >= LAW_P

    def to_json(self) -> JsonObject:
        return {"exponent": self.exponent, "exponent_interval": list(self.exponent_interval),
                "intercept": self.intercept, "intercept_interval": list(self.intercept_interval),
                "predicted_lr": self.predicted_lr, "predicted_lr_interval": list(self.predicted_lr_interval),
                "chi2": self.chi2, "dof": self.dof, "scale": self.scale, "resolved": self.resolved,
                "lack_of_fit_p": self.lack_of_fit_p, "law_holds": self.law_holds}

    @classmethod
    def from_json(cls, data: JsonObject) -> PowerLaw:
        return cls(float(data["exponent"]), _pair(data["exponent_interval"]), float(data["intercept"]),
                   _pair(data["intercept_interval"]), float(data["predicted_lr"]),
                   _pair(data["predicted_lr_interval"]), float(data["chi2"]), int(data["dof"]), float(data["scale"]))


def fit_power_law(x: Sequence[float], points: Sequence[LocatedLr], target_x: float) -> PowerLaw:
    """The weighted line ln LR* = a + b ln x through ``points`` (their LR*s at ``x``, each known to its log SE),
    its prediction at ``target_x``; 90% intervals widened by the Birge ratio when the residuals exceed their
    errors. When the slope is not resolved the prediction's interval also takes in the largest x's LR* interval
    (LR* may not move at all). Needs two distinct x."""
    order = np.argsort(x)
    logx = np.log(np.asarray(x, dtype=float)[order])
    ordered = [points[i] for i in order]
    y = np.log([p.lr for p in ordered])
    weights = 1.0 / np.asarray([max(p.log_se, 1e-6) for p in ordered]) ** 2
    design = np.stack([np.ones_like(logx), logx], axis=1)
    covariance = np.linalg.inv(design.T @ (design * weights[:, None]))
    a, b = covariance @ (design * weights[:, None]).T @ y
    residuals = y - (a + b * logx)
    chi2, dof = float(np.sum(weights * residuals ** 2)), len(ordered) - 2
    scale = math.sqrt(chi2 / dof) if dof > 0 and chi2 > dof else 1.0
    half = Z90 * scale
    at_target = np.array([1.0, math.log(target_x)])
    predicted, predicted_se = float(at_target @ [a, b]), math.sqrt(float(at_target @ covariance @ at_target))
    slope_se, a_se = math.sqrt(covariance[1, 1]), math.sqrt(covariance[0, 0])
    exponent_interval = (float(-b) - half * slope_se, float(-b) + half * slope_se)
    interval = (math.exp(predicted - half * predicted_se), math.exp(predicted + half * predicted_se))
    if not (exponent_interval[0] > 0 or exponent_interval[1] < 0):
        # not resolved: LR* may not move at all, so the target's may be the largest x's
        low, high = ordered[-1].interval()
        interval = (min(interval[0], low), max(interval[1], high))
    return PowerLaw(float(-b), exponent_interval, float(a), (float(a) - half * a_se, float(a) + half * a_se),
                    math.exp(predicted), interval, chi2, dof, scale)


def _pair(values: Sequence[float]) -> tuple[float, float]:
    return float(values[0]), float(values[1])
