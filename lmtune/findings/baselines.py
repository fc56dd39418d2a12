"""What an adaptive search's tokens are compared with, from its runs: a plain grid as fine as its bracket, the
baseline a competent user would train by hand for the same answers (a grid 2x apart, bisection, the same seeds, each
to the full budget) and the one a careful user with Ray Tune would run instead (that grid under ASHA)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from lmtune.analysis.runs import Budget
from lmtune.findings.comparison import Pair


@dataclass(frozen=True)
class GridCost:
    """What a plain grid resolving the edge as finely would train."""

    points: int
    """LRs, from the smallest to the largest tried, ``ratio`` apart."""
    ratio: float
    """The bracket ratio the search reached."""
    low: float
    """The smallest LR tried."""
    high: float
    """The largest LR tried."""
    tokens: int
    """Each LR trained to the full budget once."""


def same_resolution_grid(pairs: Sequence[Pair], resolution: float | None, budget: Budget) -> GridCost | None:
    """What a plain grid would cost to resolve the edge as finely: LRs from the smallest to the largest
    tried, ``resolution`` apart (the bracket ratio reached), each trained to the full budget once."""
    lrs = [run.lr for run, _ in pairs if run.stage != "range"]
    if not lrs or resolution is None or resolution <= 1 or min(lrs) <= 0:
        return None
    points = math.ceil(math.log(max(lrs) / min(lrs)) / math.log(resolution) - 1e-9) + 1
    return GridCost(points, resolution, min(lrs), max(lrs), points * budget.full_tokens)


@dataclass(frozen=True)
class BaselineCost:
    """What a competent user would train by hand for the same answer: a grid 2x apart over the LRs the search tried,
    bisection of its edge bracket down to the search's, and as many seeds at the best LR and at the bracket's ends."""

    grid_points: int
    """LRs 2x apart from the smallest to the largest the search tried, each trained to the full budget once."""
    bisections: int
    """Full-budget runs halving the grid's 2x edge bracket (in log LR) until it is as narrow as the search's."""
    extra_seeds: int
    """Further seeds: the search's at its best LR and at the bracket's two ends, beyond the one each already has."""
    tokens: int
    """All of them at the full budget."""

    @property
    def runs(self) -> int:
        return self.grid_points + self.bisections + self.extra_seeds


# The grid a competent user starts from: LRs this far apart (a factor of 2, as the usual 1e-4, 2e-4, 4e-4, ...).
BASELINE_GRID_RATIO = 2.0


def competent_baseline(pairs: Sequence[Pair], best_seeds: int, edge_seeds: tuple[int, int], resolution: float | None,
                       budget: Budget) -> BaselineCost | None:
    """The hand-run baseline for an adaptive search (``BaselineCost``): ``best_seeds`` seeds at its best LR,
    ``edge_seeds`` (stable end's, failed end's), its bracket ``resolution`` (None: no bracket, no bisection)."""
    lrs = [run.lr for run, _ in pairs if run.stage != "range"]
    if not lrs or min(lrs) <= 0:
        return None
    points = math.ceil(math.log(max(lrs) / min(lrs)) / math.log(BASELINE_GRID_RATIO) - 1e-9) + 1
    bisections = 0
    if resolution is not None and 1 < resolution < BASELINE_GRID_RATIO:
        bisections = math.ceil(math.log2(math.log(BASELINE_GRID_RATIO) / math.log(resolution)) - 1e-9)
    extra = max(0, best_seeds - 1) + sum(max(0, seeds - 1) for seeds in edge_seeds)
    return BaselineCost(points, bisections, extra, (points + bisections + extra) * budget.full_tokens)


@dataclass(frozen=True)
class AshaBaselineCost:
    """What a careful user would train with the same tools (issue 55): the competent baseline's 2x grid run under
    ASHA with the sweep's rungs (successive halving: a 1/eta of the LRs goes on at each rung), the best grid LRs
    continued to the full budget (the best and its two neighbours), the grid's failing bracket continued to the full
    budget from the first rung (its two ends, and each grid LR the full budget showed trains through after the first
    rung put it above the unigram baseline: ``bracket_walk``), then the same bisections and seeds as the competent
    baseline. An estimate from counts, not a run: it assumes ASHA keeps exactly a 1/eta at each rung."""

    grid_points: int
    """LRs 2x apart over the LRs the search tried."""
    at_rungs: tuple[int, ...]
    """How many of them reach each rung, the last one the full budget."""
    continued: int
    """Grid LRs near the best continued from the last rung below the full budget, beyond those ASHA let through."""
    bracket_ends: int
    """Grid LRs continued from the first rung to find the failing bracket: its two ends and the walk up to them (0: no
    bracket)."""
    bisections: int
    """Full-budget runs halving the grid's bracket to the search's."""
    extra_seeds: int
    """Further full-budget seeds at the best LR and the bracket's ends."""
    tokens: int
    """All of them."""


# The best grid LR and its two neighbours end at the full budget (the best LR is read between its neighbours).
CAREFUL_FULL_BUDGET_LRS = 3


def careful_baseline(competent: BaselineCost | None, budget: Budget, bracket_ends: int) -> AshaBaselineCost | None:
    """The competent baseline (``competent_baseline``) under ASHA over ``budget``'s rungs, its reduction factor their
    ratio (None: the sweep compared at one rung, ran no ASHA: no such baseline to price); ``bracket_ends``: the grid
    LRs continued from the first rung to bracket where training fails (``bracket_walk``; 0: no bracket)."""
    rungs, full = budget.rungs, budget.full_tokens
    if competent is None or len(rungs) < 2 or rungs[0] <= 0:
        return None
    reduction_factor = rungs[1] / rungs[0]
    counts = [competent.grid_points]
    for _ in rungs[1:]:
        counts.append(max(1, math.ceil(counts[-1] / reduction_factor)))
    tokens = sum(c * (r - prev) for c, r, prev in zip(counts, rungs, (0, *rungs[:-1]), strict=True))
    continued = max(0, min(CAREFUL_FULL_BUDGET_LRS, competent.grid_points) - counts[-1])
    tokens += continued * (full - rungs[-2]) + bracket_ends * (full - rungs[0])
    tokens += (competent.bisections + competent.extra_seeds) * full
    return AshaBaselineCost(competent.grid_points, tuple(counts), continued, bracket_ends, competent.bisections,
                            competent.extra_seeds, tokens)


def bracket_walk(pairs: Sequence[Pair], budget: Budget, failing_lr: float | None) -> int:
    """How many grid LRs (BASELINE_GRID_RATIO apart from the lowest LR tried) a careful user continues from the first
    rung to bracket where training fails (0: the search found no failing LR). The grid's first-rung losses are read
    off the search's own runs at that rung (linear in log LR between them; a diverged run's as infinite): the user
    continues the first grid LR above that rung's best whose loss there is above the unigram baseline, and the one
    below it; each that then trains through moves the bracket up one grid LR, until the first at or above the
    search's failing LR, which fails. At least the 2 ends (the first rung already right). On quick_edge the baseline,
    measured, continued 7 this way: runs above the baseline at the first rung came back below it by the full budget
    (benchmarks/README.md)."""
    if failing_lr is None:
        return 0
    first_rung, unigram = budget.rungs[0], budget.unigram_loss
    seen = sorted({run.lr: run for run, _ in pairs if run.stage != "range" and run.lr > 0}.items())
    curve = [(math.log(lr), math.inf if run.diverged else loss) for lr, run in seen
             if (loss := run.loss_at(first_rung)) is not None or run.diverged]
    if not curve or unigram is None:
        return 2
    low = seen[0][0]
    grid = [low * BASELINE_GRID_RATIO ** k
            for k in range(math.ceil(math.log(failing_lr / low) / math.log(BASELINE_GRID_RATIO) - 1e-9) + 1)]
    losses = [_read(cast(list[tuple[float, float]], curve), math.log(lr)) for lr in grid]  # (a loss, or inf)
    leader = losses.index(min(losses))  # (LRs below the first rung's best learn slowly: above the baseline early)
    above = [k for k in range(leader + 1, len(grid)) if losses[k] >= unigram]
    return max(2, len(grid) - above[0] + 1) if above else 2


def _read(curve: list[tuple[float, float]], x: float) -> float:
    """The curve's value at ``x``: linear between its points (infinite beside an infinite one), its end value
    beyond them."""
    if x <= curve[0][0]:
        return curve[0][1]
    for (x0, y0), (x1, y1) in zip(curve, curve[1:], strict=False):
        if x0 <= x <= x1:
            return math.inf if math.inf in (y0, y1) else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return curve[-1][1]
