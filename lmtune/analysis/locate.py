"""Where one budget's best LR lies between its grid points: a quadratic in ln LR fitted to the mean full-budget
losses around the crowned best LR (lmtune.analysis.runs.crown), its minimum LR*, and how well the seeds fix it.

Why a quadratic: near its minimum any smooth loss curve is one in ln LR, so the best and two LRs either side
locate LR* between grid points, where the grid alone only says "somewhere between the neighbours". Why the
crown's neighbourhood: the fit and the report's table then talk about the same LR; a one-seed LR that beats the
crowned best enters the fit with the weight of its one seed, not as the winner.

The uncertainty comes from the seeds: each LR's mean is known to sigma / sqrt(seeds) (sigma pooled near the best,
lmtune.analysis.runs.pooled_seed_spread, with its degrees of freedom), and the set of LRs at which the fitted
curve's slope is within t standard errors of flat is Fieller's 90% interval: exact for a quadratic with normal
noise, unlike the delta method or a bootstrap around the fitted curve, which both shrink when the noise happens to
sharpen the curve. Real loss curves are no quadratic (steeper above the best LR, so the fitted vertex sits low), and
a budget is located only when its curve looks sharp, so that interval held its LR* in 47-83% of simulated searches,
not 90%. So it is widened in ln LR about LR*, by factors calibrated on simulated searches and measured on
scenarios kept apart from that choice (benchmarks/README.md): SE_WIDENING for the SE the power-law fit weighs the
budget by (its prediction then holds 90%), INTERVAL_WIDENING for the budget's own 90% interval. Where Fieller's
set is unbounded (the curvature is not resolved) or reaches well past the LRs fitted, the budget's LR* is *not
located*: it is carried as lying anywhere between the nearest LRs clearly
worse than the best (lmtune.analysis.landscape.best_lr_interval), never as a grid point. Deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lmtune.analysis.bracket import Bracket
from lmtune.analysis.landscape import best_lr_interval
from lmtune.analysis.runs import LrResult, crown, pooled_seed_spread, spread_lrs
from lmtune.files import JsonObject

# z of a two-sided 90% interval (scipy.stats.norm.ppf(0.95)). An interval enters the power law as a point with
# SE = its half-width / Z90.
Z90 = 1.6448536269514722
# scipy is imported where a distribution is asked for, not with the module: the commands a bare GPU box runs
# (diagnose, lr_find) load the searches, and with them this module, where only torch, numpy and pyyaml exist.


def t_quantile(dof: int, z: float = Z90) -> float:
    """Student's t quantile of the same two-sided level as the normal's ``z``, for ``dof`` degrees of freedom."""
    from scipy import stats

    return float(stats.t.ppf(stats.norm.cdf(z), dof)) if dof > 0 else math.inf


# LRs fitted either side of the crowned best: at least two each, five points for three parameters ...
SIDE = 2
# ... and every LR within this factor of it (in ln LR: 2.25x, two steps of quick_horizon's 1.5x grid).
WIDTH = math.log(2.25)
# LR* counts as located only when its interval stays within this far (in ln LR) beyond the LRs fitted: a
# quadratic says nothing reliable much past its points (ln 1.5: one coarse grid step).
REACH = math.log(1.5)
# Fieller's half-width is widened this many times (in ln LR, about LR*): each the smallest of 1, 1.5, 2, 2.5 and 3
# whose interval held the truth in 90% of searches on every scenario the method's constants were tuned on
# (benchmarks/horizon_coverage.py, SCENARIOS, 200 searches each); the held-out scenarios, measured beside them, did
# not enter the choice. SE_WIDENING: the located LR*'s SE as the power-law fit weighs it (the prediction's 90%
# interval held 86-90% at 1, 91-95% at 1.5). INTERVAL_WIDENING: the budget's own interval (68-83% at 1, 89-99% at
# 2.5, 90-100% at 3).
SE_WIDENING = 1.5
INTERVAL_WIDENING = 3.0
# Below this p-value the losses around the best are said not to follow a parabola (a flat floor between steep
# walls): only gross departures. A skewed curve departs mildly over a wide window, and its minimum is still
# located well: at 0.05 the check refused 1 in 7 budgets the quadratic located correctly (sharp basins,
# benchmarks/horizon_coverage.py), at 0.01 1 in 12; the narrow window is tried before giving up.
PARABOLA_P = 0.01


@dataclass(frozen=True)
class LocatedLr:
    """One budget's best LR: crowned on the grid and located between grid points."""

    tokens: int
    """The budget's full token count, where its LRs are compared."""
    crowned_lr: float
    """The grid LR crowned best (lmtune.analysis.runs.crown): the report's table names this one."""
    lr: float
    """LR*: the minimum of the fitted curve (located), or the middle in log of the nearest LRs clearly worse than
    the best (not located)."""
    log_se: float
    """Standard error of ln LR* as the power-law fit weighs it (infinite: not bounded): located, Fieller's 90%
    half-width / 1.645 widened SE_WIDENING times; carried, the span's half-width / 1.645."""
    located: bool
    """Whether the seeds fix a minimum inside the fitted LRs (False: the curve is too flat or too noisy here)."""
    why: str
    """How LR* was found, or why it could not be located, in words."""
    fitted_lrs: tuple[float, ...]
    """The grid LRs the quadratic went through, ascending."""
    seed_sd: float | None
    """The pooled run-to-run sd of the loss near the best LR (None: no LR had two seeds)."""

    def interval(self, z: float = Z90) -> tuple[float, float]:
        """Where LR* lies, 90% by default: LR* ± z standard errors in log LR, a located LR*'s widened to
        INTERVAL_WIDENING times Fieller's (see SE_WIDENING), a carried one's the span between the LRs clearly worse."""
        half = z * self.log_se * (INTERVAL_WIDENING / SE_WIDENING if self.located else 1.0)
        return self.lr * math.exp(-half), self.lr * math.exp(half)

    @property
    def usable(self) -> bool:
        """Whether it can enter a fit (its SE is finite)."""
        return math.isfinite(self.log_se)

    def to_json(self) -> JsonObject:
        low, high = self.interval() if self.usable else (None, None)
        return {"tokens": self.tokens, "crowned_lr": self.crowned_lr, "lr": self.lr,
                "log_se": self.log_se if self.usable else None, "interval_90": [low, high],
                "located": self.located, "why": self.why, "fitted_lrs": list(self.fitted_lrs),
                "seed_sd": self.seed_sd}

    @classmethod
    def from_json(cls, data: JsonObject) -> LocatedLr:
        se = data["log_se"]
        return cls(int(data["tokens"]), float(data["crowned_lr"]), float(data["lr"]),
                   math.inf if se is None else float(se), bool(data["located"]), str(data["why"]),
                   tuple(float(v) for v in data["fitted_lrs"]), data.get("seed_sd"))


def locate_best_lr(ranking: Sequence[LrResult], tokens: int, edge: Bracket | None = None) -> LocatedLr | None:
    """LR* of one budget from its full-budget ranking (lmtune.analysis.runs.full_budget_ranking); None when no
    LR trained it through. ``edge``: where training failed at this budget (a failed LR above bounds LR*)."""
    ranking = list(ranking)
    best, _ = crown(ranking)
    if best is None:
        return None
    window = _window(ranking, best, WIDTH)
    lrs = tuple(r.lr for r in window)
    sigma, dof = _pooled(ranking)
    span = best_lr_interval(ranking, edge)

    def unlocated(why: str) -> LocatedLr:
        """Carried as lying anywhere between the nearest LRs clearly worse (a 90% interval; unusable when a
        side has none)."""
        low, high = span
        if low is None or high is None:
            return LocatedLr(tokens, best.lr, best.lr, math.inf, False, why + "; no LR clearly worse on one side, "
                             "so LR* is not bounded there", lrs, sigma)
        return LocatedLr(tokens, best.lr, math.sqrt(low * high), math.log(high / low) / (2 * Z90), False,
                         why + f"; carried as anywhere between the nearest LRs clearly worse, {low:.3g} and "
                         f"{high:.3g}", lrs, sigma)

    if lrs[0] == best.lr or lrs[-1] == best.lr:
        return unlocated(f"the best LR ({best.lr:.3g}) is at the end of the LRs trained")
    if not sigma:  # (None: one seed each; 0: seeds that agree to the last digit, no noise to weigh by)
        return unlocated("no LR near the best has two seeds that differ: no spread to locate LR* by")
    found = _located(window, best, sigma, dof)
    if isinstance(found, str) and len(window) > 2 * SIDE + 1:
        # a skewed curve is no parabola over a wide window, but is one close to its minimum
        window = _window(ranking, best, 0.0)
        lrs, found = tuple(r.lr for r in window), _located(window, best, sigma, dof)
    if isinstance(found, str):
        return unlocated(found)
    lr, log_se = found
    why = (f"minimum of a quadratic in ln LR through {len(lrs)} LRs; its 90% interval Fieller's widened "
           f"{INTERVAL_WIDENING:g}x (what holds LR* in simulated searches)")
    return LocatedLr(tokens, best.lr, lr, log_se, True, why, lrs, sigma)


def _located(window: list[LrResult], best: LrResult, sigma: float, dof: int) -> tuple[float, float] | str:
    """(LR*, SE of ln LR*) from a quadratic through the window's means, or why it cannot be located there."""
    lrs = [r.lr for r in window]
    x = np.log(np.asarray(lrs) / best.lr)
    noise = sigma / np.sqrt([len(r.losses) for r in window])
    found = _minimum_interval(x, np.asarray([r.mean for r in window]), noise, dof)
    if found is None:
        return (f"too flat to locate: the seeds allow the loss curve between {lrs[0]:.3g} and {lrs[-1]:.3g} to have "
                "no minimum")
    if isinstance(found, str):
        return found
    vertex, low, high = found
    if low < x[0] - REACH or high > x[-1] + REACH:
        return f"too flat to locate: the minimum may lie beyond the LRs fitted ({lrs[0]:.3g}-{lrs[-1]:.3g})"
    return best.lr * math.exp(vertex), SE_WIDENING * (high - low) / (2 * Z90)


def _window(ranking: list[LrResult], best: LrResult, width: float) -> list[LrResult]:
    """The LRs within ``width`` of the crowned best (in ln LR, the same either side: a skewed curve fitted over an
    uneven window pulls the minimum towards its shorter side), and at least SIDE either side, ascending."""
    ordered = sorted(ranking, key=lambda r: r.lr)
    i = ordered.index(best)
    near = [k for k, r in enumerate(ordered) if abs(math.log(r.lr / best.lr)) <= width + 1e-9]
    return ordered[min(max(0, i - SIDE), *near): max(i + SIDE, *near) + 1]


def _pooled(ranking: list[LrResult]) -> tuple[float | None, int]:
    """The pooled run-to-run sd near the best (lmtune.analysis.runs.pooled_seed_spread) and its degrees of freedom."""
    dof = sum(len(r.losses) - 1 for r in spread_lrs(ranking))
    return pooled_seed_spread(ranking), dof


def _minimum_interval(x: np.ndarray, means: np.ndarray, noise: np.ndarray,
                      noise_dof: int) -> tuple[float, float, float] | str | None:
    """The minimum of c0 + c1 x + c2 x^2 fitted by weighted least squares, and its 90% interval: every x0 at which
    the fitted slope c1 + 2 c2 x0 is within t (of ``noise_dof``) standard errors of 0 (Fieller's interval, exact for a
    quadratic with normal noise). None when that set is unbounded: the curvature is not resolved; why, when the
    losses are further from any parabola than their noise allows (a flat floor between steep walls)."""
    design = np.stack([np.ones_like(x), x, x * x], axis=1)
    weights = 1.0 / noise ** 2
    covariance = np.linalg.inv(design.T @ (design * weights[:, None]))
    c0, c1, c2 = covariance @ (design * weights[:, None]).T @ means
    chi2, dof = float(np.sum(weights * (means - (c0 + c1 * x + c2 * x * x)) ** 2)), len(x) - 3
    if dof > 0:
        # A chi-square test, the noise taken as known though the seeds only estimate it: the F test that estimate
        # calls for passes more skewed windows as parabolas, whose minima are biased, and measured on the held-out
        # scenarios it lowered the prediction's coverage (all at once: 68% -> 60%; benchmarks/README.md, issue 44).
        from scipy import stats

        p = float(stats.chi2.sf(chi2, dof))
        if p < PARABOLA_P:
            return (f"the losses around the best are not a parabola (lack of fit p = {p:.2g}): no minimum to locate "
                    "between them")
    v11, v12, v22 = covariance[1, 1], covariance[1, 2], covariance[2, 2]
    q = t_quantile(noise_dof) ** 2
    # (c1 + 2 c2 x0)^2 <= q (v11 + 4 x0 v12 + 4 x0^2 v22), a quadratic inequality a x0^2 + b x0 + c <= 0
    a, b, c = 4 * (c2 * c2 - q * v22), 4 * (c1 * c2 - q * v12), c1 * c1 - q * v11
    discriminant = b * b - 4 * a * c
    if c2 <= 0 or a <= 0 or discriminant < 0:
        return None
    root = math.sqrt(discriminant)
    return float(-c1 / (2 * c2)), float((-b - root) / (2 * a)), float((-b + root) / (2 * a))
