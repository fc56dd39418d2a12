"""The horizon search's prediction two ways, on the same simulated searches (issue 44 item 2): today's (each
budget's LR* located by a quadratic, then a weighted line through them: lmtune.analysis.fit) against one joint fit
of the loss as a surface in ln LR and ln D. Ray-free; the searches are benchmarks/horizon_coverage.py's (the real
HorizonSearch driven by runs on known curves), tuned and held-out scenarios alike.

The surface: loss(LR, D) = floor_D + curvature_D * x^2 * exp(skew * x), x = ln LR - (a - beta ln(D / target)): one
exponent and one skew shared by every budget, a floor and a curvature per budget, fitted by weighted least squares
(scipy.optimize.least_squares) to every run within WINDOW of its budget's crowned best, each weighed by its budget's
pooled run-to-run sd. The prediction is exp(a), its 90% interval a +- z SE(a) from the fit's covariance (widened by
the Birge ratio when the residuals exceed their noise) and WIDENING times, calibrated on the tuned scenarios; and it
says the law does not hold where a surface with a free optimum per budget fits significantly better (LAW_P).

    python benchmarks/horizon_joint_fit.py --searches 200            # tuned and held-out scenarios
    python benchmarks/horizon_joint_fit.py --searches 200 --scenario all_at_once
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import optimize, stats

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import horizon_coverage as hc  # noqa: E402 (the simulated searches)
from lmtune.analysis.locate import Z90  # noqa: E402
from lmtune.analysis.runs import crown, full_budget_ranking  # noqa: E402
from lmtune.searches.deciding import FINISHED, WAIT  # noqa: E402
from lmtune.searches.horizon.search import HorizonSearch  # noqa: E402

# Runs fitted: within this factor of their budget's crowned best LR (the shared curve is only meant near it).
WINDOW = 4.0
# The covariance's interval is widened this many times in ln LR: the smallest of 1, 1.5 and 2 that held the truth in
# 90% of 100 searches on every tuned scenario where the law holds (at 1: 81-87%; at 1.5: 89-94%; at 2: 98-99%); the
# held-out scenarios did not enter the choice.
WIDENING = 2.0
# Below this p-value the budgets' optima are said not to lie on one power law: the surface with a free optimum per
# budget fits better than the shared exponent allows (a likelihood-ratio test, chi2 with budgets - 2 dof).
LAW_P = 0.05


@dataclass(frozen=True)
class Prediction:
    lr: float
    interval: tuple[float, float]
    law_holds: bool = True
    """False: the budgets' optima are further from one power law than their noise allows (LAW_P)."""


@dataclass(frozen=True)
class Paired:
    """One simulated search, both methods' predictions against the truth at the target."""

    truth: float
    located: Prediction
    joint: Prediction | None


def _budget_points(runs) -> dict[int, list[tuple[float, float]]]:
    """Each proxy budget's (ln LR, final loss) of its finished, non-diverged runs near its crowned best."""
    by_budget = defaultdict(list)
    for run in runs:
        if run.full_loss() is not None and run.budget_tokens < hc.TARGET.full_tokens:
            by_budget[run.budget_tokens].append(run)
    points = {}
    for tokens, at in by_budget.items():
        best, _ = crown(full_budget_ranking(at))
        if best is None:
            continue
        points[tokens] = [(math.log(r.lr), r.full_loss()) for r in at if abs(math.log(r.lr / best.lr)) <= math.log(WINDOW)]
    return points


def _pooled_sd(points: list[tuple[float, float]]) -> float | None:
    by_lr = defaultdict(list)
    for x, loss in points:
        by_lr[round(x, 9)].append(loss)
    groups = [v for v in by_lr.values() if len(v) > 1]
    dof = sum(len(v) - 1 for v in groups)
    return math.sqrt(sum(((np.array(v) - np.mean(v)) ** 2).sum() for v in groups) / dof) if dof else None


def joint_fit(runs, target_tokens: int) -> Prediction | None:
    """The surface's prediction at ``target_tokens`` and its 90% interval (None: too few budgets or points)."""
    points = _budget_points(runs)
    budgets = sorted(points)
    if len(budgets) < 2 or any(len(points[b]) < 3 for b in budgets):
        return None
    sds = {b: _pooled_sd(points[b]) for b in budgets}
    fallback = np.median([v for v in sds.values() if v] or [0.02])
    u = {b: math.log(b / target_tokens) for b in budgets}
    xs = np.concatenate([[x for x, _ in points[b]] for b in budgets])
    ys = np.concatenate([[y for _, y in points[b]] for b in budgets])
    which = np.concatenate([[i] * len(points[b]) for i, b in enumerate(budgets)])
    sd = np.array([sds[budgets[i]] or fallback for i in which])
    us = np.array([u[budgets[i]] for i in which])
    n = len(budgets)

    def surface(optima: np.ndarray, skew: float, floors: np.ndarray, log_curv: np.ndarray) -> np.ndarray:
        x = xs - optima
        bend = np.exp(np.clip(log_curv[which], -30, 30)) * np.exp(np.clip(skew * x, -30, 30))
        return (ys - floors[which] - bend * x * x) / sd

    def residuals(theta: np.ndarray) -> np.ndarray:
        a, beta, skew = theta[:3]
        return surface(a - beta * us, skew, theta[3:3 + n], theta[3 + n:])

    def free(theta: np.ndarray) -> np.ndarray:  # each budget's optimum its own: no law
        return surface(theta[:n][which], theta[n], theta[n + 1:2 * n + 1], theta[2 * n + 1:])

    best_x = [min(points[b], key=lambda p: p[1])[0] for b in budgets]
    slope = np.polyfit([u[b] for b in budgets], best_x, 1)[0] if n > 1 else 0.0
    start = np.array([best_x[-1] - slope * u[budgets[-1]], -slope, 0.0,
                      *[min(y for _, y in points[b]) for b in budgets], *[math.log(0.1)] * n])
    try:
        fit = optimize.least_squares(residuals, start, method="trf", max_nfev=2000)
    except (ValueError, np.linalg.LinAlgError):
        return None
    dof = len(ys) - len(start)
    if not fit.success or dof <= 0:
        return None
    chi2 = float(np.sum(fit.fun ** 2))
    try:
        covariance = np.linalg.inv(fit.jac.T @ fit.jac)
    except np.linalg.LinAlgError:
        return None
    scale = max(1.0, chi2 / dof)
    se = math.sqrt(max(covariance[0, 0], 0.0) * scale)
    if not math.isfinite(se) or not 0 < se < 10:  # (a degenerate fit: the data do not pin the exponent down)
        return None
    a = float(fit.x[0])
    half = WIDENING * float(stats.norm.ppf(0.95)) * se
    law_holds = True
    if n > 2:
        optima = fit.x[0] - fit.x[1] * np.array([u[b] for b in budgets])
        unbound = optimize.least_squares(free, np.concatenate([optima, fit.x[2:]]), method="trf", max_nfev=2000)
        law_holds = bool(stats.chi2.sf(max(0.0, chi2 - float(np.sum(unbound.fun ** 2))), n - 2) >= LAW_P)
    return Prediction(math.exp(a), (math.exp(a - half), math.exp(a + half)), law_holds)


def paired(scenario: hc.Scenario, seed: int) -> Paired | None:
    """One simulated search (as horizon_coverage.simulate), then both methods on its runs."""
    rng = np.random.default_rng(seed)
    at_target = 0.006 * math.exp(rng.uniform(-0.4, 0.4))
    search, runs = HorizonSearch(hc.SETTINGS, hc.TARGET, max_pending=1), hc.SimulatedRuns(scenario, at_target, rng)
    trials = 0
    while search.fit is None and search.fit_problem is None and trials < 400:
        config = search.suggest(f"t{trials:04d}")
        if config in (FINISHED, WAIT):
            break
        runs.run(search, f"t{trials:04d}", config)
        trials += 1
    if search.fit is None:
        return None
    fit = search.fit
    return Paired(scenario.best_lr(hc.TARGET_STEPS, at_target), Prediction(fit.predicted_lr, fit.predicted_lr_interval),
                  joint_fit(list(search.runs.values()), hc.TARGET.full_tokens))


def summary(name: str, results: list[Paired | None]) -> str:
    done = [r for r in results if r is not None]
    both = [r for r in done if r.joint is not None]

    def row(get) -> str:
        errors = np.abs([math.log(get(r).lr / r.truth) for r in both])
        covered = np.mean([get(r).interval[0] <= r.truth <= get(r).interval[1] for r in both])
        width = np.median([get(r).interval[1] / get(r).interval[0] for r in both])
        return f"{covered:.1%} | {width:.2f}x | {np.percentile(errors, 90):.3f} | {np.median(errors):.3f}"

    flagged = np.mean([not r.joint.law_holds for r in both])
    return (f"| {name} | {len(both)}/{len(results)} | {row(lambda r: r.located)} | {row(lambda r: r.joint)} | "
            f"{flagged:.0%} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--searches", type=int, default=200)
    parser.add_argument("--scenario", action="append", choices=sorted({**hc.SCENARIOS, **hc.HELD_OUT}))
    args = parser.parse_args(argv)
    every = {**hc.SCENARIOS, **hc.HELD_OUT}
    print("| scenario | searches both fitted | today: 90% holds | median width | 90th pct abs ln error | median | "
          "joint: 90% holds | median width | 90th pct abs ln error | median | law flagged (joint) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.scenario or list(every):
        print(summary(name + (" (held out)" if name in hc.HELD_OUT else ""),
                      [paired(every[name], k) for k in range(args.searches)]))
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
