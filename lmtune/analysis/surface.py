"""The best LR across an axis (token budgets) as one fit of the loss surface, Ray-free and deterministic: every run
near its point's crowned best LR enters one model,

    loss(LR, x) = floor_x + curvature_x * u^2 * exp(skew * u),   u = ln LR - (a - beta * ln(x / target)),

one exponent beta and one skew shared by every point, a floor and a curvature per point (scipy.optimize's least
squares, each run weighed by its point's pooled run-to-run sd). LR* at the target is exp(a).

Why one fit rather than locating each point's LR* and drawing a line through them (lmtune.analysis.locate, .fit):
the points share what they can (the skew, the exponent), so a noisy point borrows from the others instead of
being located, or carried, on its own; on simulated searches it halved the prediction's 90th-percentile error and
held its 90% interval where the located-then-line fit fell to 82% (benchmarks/README.md, "One joint fit").

Its intervals come from the fit's covariance, widened by the Birge ratio when the residuals exceed their noise and
then WIDENING times (calibrated on the tuned scenarios). Whether one power law holds is a likelihood-ratio test:
the same surface with a free optimum per point against the shared line (chi-square with points - 2 dof).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from lmtune.analysis.fit import PowerLaw
from lmtune.analysis.locate import Z90
from lmtune.analysis.runs import Run, crown, full_budget_ranking

# Runs fitted: within this factor of their point's crowned best LR (the shared curve is only meant near it).
WINDOW = 4.0
# The covariance's 90% interval is widened this many times in ln LR: the smallest of 1, 1.5 and 2 that held the
# truth in 90% of 1,000 simulated searches on every tuned scenario where the law holds (82-87% at 1, 93-96% at 1.5;
# 1.25 held 89.5-92.5%); the held-out scenarios did not enter the choice (benchmarks/horizon_joint_fit.py).
WIDENING = 1.5
# Fewest runs a point needs near its best for the surface to use it (a floor, a curvature and one more).
MIN_POINT_RUNS = 3


def fit_surface(points: Sequence[tuple[float, Sequence[Run]]], target_x: float,
                widening: float = WIDENING) -> PowerLaw | None:
    """The surface through ``points`` ((x, its runs) per searched point: x its budget's tokens, or its width) and its
    prediction at ``target_x``, as a PowerLaw (chi2 and dof: the law's likelihood-ratio test), its 90% intervals
    widened ``widening`` times (the horizon search's WIDENING by default; each search calibrates its own on its
    tuned scenarios); None where fewer than two points have MIN_POINT_RUNS runs near their best, or the fit does not
    pin the prediction down."""
    data = _SurfaceData.of(points, target_x)
    if data is None:
        return None
    from scipy import optimize  # (where it is asked for: lmtune.analysis.locate says why)

    start = data.start()
    try:
        # (tight tolerances: the search's fit, from Tune's results, and the report's, from the trials' files, agree)
        fit = optimize.least_squares(data.residuals, start, method="trf", max_nfev=4000, xtol=1e-12, ftol=1e-12,
                                     gtol=1e-12)
        covariance = np.linalg.inv(fit.jac.T @ fit.jac)
    except (ValueError, np.linalg.LinAlgError):
        return None
    dof = len(data.losses) - len(start)
    if not fit.success or dof <= 0:
        return None
    chi2 = float(np.sum(fit.fun ** 2))
    scale = math.sqrt(max(1.0, chi2 / dof))
    return _power_law(data, fit.x, covariance, (scale, widening), data.law_test(fit.x, chi2), target_x)


def surface_where_law_holds(points: Sequence[tuple[float, Sequence[Run]]], target_x: float,
                            widening: float = WIDENING) -> PowerLaw | None:
    """``fit_surface``, or None where its law test fails: one power law does not hold across these points, and the
    surface's narrow interval would rest on it (it held 12% of simulated horizon searches of a broken law); the
    line through the located LR*s, widened for its scatter, does not (the searches fall back to it)."""
    surface = fit_surface(points, target_x, widening)
    return None if surface is None or surface.law_holds is False else surface


def _power_law(data: _SurfaceData, theta: np.ndarray, covariance: np.ndarray, widened: tuple[float, float],
               law_chi2: float, target_x: float) -> PowerLaw | None:
    """The fit as a PowerLaw: ln LR* = intercept - beta ln x, its 90% intervals ``widened`` (by the Birge ratio,
    then the widening)."""
    a, beta = float(theta[0]), float(theta[1])
    log_target = math.log(target_x)
    a_se, beta_se = math.sqrt(max(covariance[0, 0], 0.0)), math.sqrt(max(covariance[1, 1], 0.0))
    # intercept = a + beta ln target (ln LR* at x = 1); its variance from a's, beta's and their covariance
    intercept_se = math.sqrt(max(covariance[0, 0] + log_target ** 2 * covariance[1, 1]
                                 + 2 * log_target * covariance[0, 1], 0.0))
    scale, widening = widened
    half = Z90 * scale * widening
    if not (math.isfinite(a_se) and 0 < a_se * half < 10):  # a degenerate fit: the data do not pin LR* down
        return None
    intercept = a + beta * log_target
    return PowerLaw(beta, (beta - half * beta_se, beta + half * beta_se), intercept,
                    (intercept - half * intercept_se, intercept + half * intercept_se), math.exp(a),
                    (math.exp(a - half * a_se), math.exp(a + half * a_se)), law_chi2, len(data.xs) - 2, scale)


class _SurfaceData:
    """The runs the surface is fitted to: ln LR, loss, their point (index), its sd, its ln(x / target)."""

    def __init__(self, xs: list[float], by_point: list[list[tuple[float, float]]], target_x: float):
        self.xs, self.n = xs, len(xs)
        self.u = np.array([math.log(x / target_x) for x in xs])
        sds = [_pooled_sd(p) for p in by_point]
        fallback = float(np.median([s for s in sds if s] or [0.02]))
        self.which = np.concatenate([[i] * len(p) for i, p in enumerate(by_point)]).astype(int)
        self.log_lrs = np.array([x for p in by_point for x, _ in p])
        self.losses = np.array([y for p in by_point for _, y in p])
        self.sd = np.array([sds[i] or fallback for i in self.which])
        self.best = [min(p, key=lambda pair: pair[1]) for p in by_point]

    @classmethod
    def of(cls, points: Sequence[tuple[float, Sequence[Run]]], target_x: float) -> _SurfaceData | None:
        xs, by_point = [], []
        for x, runs in sorted(points, key=lambda p: p[0]):
            near = _near_best(runs)
            if len(near) >= MIN_POINT_RUNS:
                xs.append(float(x))
                by_point.append(near)
        return cls(xs, by_point, target_x) if len(xs) >= 2 else None

    def _misfit(self, optima: np.ndarray, skew: float, floors: np.ndarray, log_curv: np.ndarray) -> np.ndarray:
        u = self.log_lrs - optima
        bend = np.exp(np.clip(log_curv[self.which], -30, 30)) * np.exp(np.clip(skew * u, -30, 30))
        return (self.losses - floors[self.which] - bend * u * u) / self.sd

    def residuals(self, theta: np.ndarray) -> np.ndarray:
        a, beta, skew, n = theta[0], theta[1], theta[2], self.n
        return self._misfit((a - beta * self.u)[self.which], skew, theta[3:3 + n], theta[3 + n:])

    def free_residuals(self, theta: np.ndarray) -> np.ndarray:
        """The same surface with each point's optimum its own (no law)."""
        n = self.n
        return self._misfit(theta[:n][self.which], theta[n], theta[n + 1:2 * n + 1], theta[2 * n + 1:])

    def start(self) -> np.ndarray:
        """The crowned bests' line, no skew, each point's lowest loss as its floor, a curvature of 0.1."""
        best_x = [x for x, _ in self.best]
        slope, at_target = np.polyfit(self.u, best_x, 1) if self.n > 1 else (0.0, best_x[0])
        return np.array([at_target, -slope, 0.0, *[y for _, y in self.best], *[math.log(0.1)] * self.n])

    def law_test(self, theta: np.ndarray, chi2: float) -> float:
        """How much better a free optimum per point fits than the shared law (chi-square, points - 2 dof; 0 with
        two points, where any two optima lie on a line). The free fit starts from the law's optima and from each
        point's crowned best, and keeps the better: from the law's alone it can stay stuck where the law put a
        point's optimum far from its runs' best."""
        if self.n <= 2:
            return 0.0
        from scipy import optimize

        starts = (theta[0] - theta[1] * self.u, np.array([x for x, _ in self.best]))
        free = min((optimize.least_squares(self.free_residuals, np.concatenate([optima, theta[2:]]), method="trf",
                                           max_nfev=2000) for optima in starts), key=lambda f: f.cost)
        return max(0.0, chi2 - float(np.sum(free.fun ** 2)))


def _near_best(runs: Sequence[Run]) -> list[tuple[float, float]]:
    """(ln LR, full-budget loss) of the runs within WINDOW of their point's crowned best LR."""
    ranking = full_budget_ranking(runs)
    best, _ = crown(ranking)
    if best is None:
        return []
    return [(math.log(r.lr), loss) for r in runs if (loss := r.full_loss()) is not None
            and abs(math.log(r.lr / best.lr)) <= math.log(WINDOW)]


def _pooled_sd(points: list[tuple[float, float]]) -> float | None:
    """The run-to-run sd pooled over the LRs with two or more runs (None: none has)."""
    by_lr: dict[float, list[float]] = defaultdict(list)
    for x, loss in points:
        by_lr[round(x, 9)].append(loss)
    groups = [np.asarray(v) for v in by_lr.values() if len(v) > 1]
    dof = sum(len(v) - 1 for v in groups)
    return math.sqrt(sum(float(((v - v.mean()) ** 2).sum()) for v in groups) / dof) if dof else None
