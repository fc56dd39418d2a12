"""The landscape above the best LR, Ray-free: where the best LR may lie, the basin around it, the degraded
region up to the edge and the failed region above, each an LR interval whose ends are known to lie between
two tried LRs; the region every LR tried stands in (``lr_regions``: the one classification the report's text, its
table and lr_vs_loss.png all read); and the edge / best ratio as a range carrying both uncertainties.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, cast

from lmtune.analysis.bracket import Bracket, failed_runs
from lmtune.analysis.named_lrs import interpolated
from lmtune.analysis.runs import (
    SIGNIFICANCE_SE,
    LrResult,
    Run,
    clearly_worse,
    crown,
    effective_runs,
    pooled_seed_spread,
    spread_lrs,
    standard_error,
)
from lmtune.files import JsonObject

# How much worse the loss is at these multiples of the best LR (the report's answer to "how fast does it degrade").
DEGRADED_AT = (2, 4, 10, 30, 100, 300)

Gap = tuple[float | None, float | None]
"""A boundary: it lies between these two tried LRs (None: no LR tried on that side)."""


def best_lr_interval(ranking: list[LrResult], edge: Bracket | None = None) -> Gap:
    """Where the best LR lies: strictly between the nearest LRs on either side whose loss is clearly
    worse than the best's (a diverged LR above counts as worse). None for a side where no tried LR
    is clearly worse: the optimum may lie beyond the LRs tried."""
    best, _ = crown(ranking)
    if best is None:
        return None, None
    sigma = pooled_seed_spread(ranking)
    worse = sorted(r.lr for r in ranking if r is not best and r.others == best.others and clearly_worse(r, best, sigma))
    below = [lr for lr in worse if lr < best.lr]
    above = [lr for lr in worse if lr > best.lr]
    if edge is not None and edge.diverged_lr is not None and edge.diverged_lr > best.lr:
        above.append(edge.diverged_lr)
    return (max(below) if below else None), (min(above) if above else None)


def edge_ratio_range(edge: Bracket, interval: Gap) -> Gap:
    """The ratio (edge LR / best LR) as a range carrying both uncertainties: the edge lies in
    [stable_lr, diverged_lr] and the best LR in the open interval (low, high). None for an unbounded end."""
    low, high = interval
    smallest = edge.stable_lr / high if edge.stable_lr is not None and high else None
    largest = edge.diverged_lr / low if edge.diverged_lr is not None and low else None
    return smallest, largest


@dataclass(frozen=True)
class Basin:
    """The LRs whose mean full-budget loss is within SIGNIFICANCE_SE standard errors of the best's."""

    lrs: tuple[float, ...]
    """The tried LRs in it, ascending (the contiguous run of LRs around the best)."""
    low: Gap
    """Its lower end lies between these (the LR below it, its lowest LR)."""
    high: Gap
    """Its upper end lies between these (its highest LR, the next LR or the edge)."""
    best_loss: float
    """The best LR's mean full-budget loss."""
    seed_spread: float | None
    """The pooled run-to-run standard deviation (None: no LR has several seeds)."""
    spread_lrs: tuple[float, ...]
    """The LRs that spread is pooled over."""
    margin: float | None
    """SIGNIFICANCE_SE standard errors of a difference with the best's mean (None: no spread measured)."""

    def to_json(self) -> JsonObject:
        return {"lrs": list(self.lrs), "low": list(self.low), "high": list(self.high), "best_loss": self.best_loss,
                "seed_spread": self.seed_spread, "spread_lrs": list(self.spread_lrs), "margin": self.margin}


@dataclass(frozen=True)
class DegradedPoint:
    """An LR of the degraded region and how much worse than the best its loss is."""

    lr: float
    """The LR tried."""
    ratio_to_best: float
    """lr / the best LR."""
    loss: float
    """Its mean full-budget loss."""
    excess: float
    """loss - the best's mean loss (nats)."""
    seeds: int
    """How many seeds that mean is over."""


@dataclass(frozen=True)
class Degraded:
    """Above the basin, up to the edge: trained through without diverging, loss clearly worse."""

    low: Gap
    """Its lower end lies between the basin's last LR and the next."""
    high: Gap
    """Its upper end lies between its last LR and the edge."""
    points: tuple[DegradedPoint, ...]
    """Its LRs, ascending."""
    excess_at: tuple[tuple[int, float], ...]
    """(multiple of the best LR, excess loss there): at the DEGRADED_AT multiples within the LRs tried,
    interpolated in log LR."""
    per_doubling: float
    """The least-squares slope of the excess against log2 LR (nats per doubling of the LR): a mean rate."""
    per_doubling_se: float | None
    """Its standard error as if the curve were a straight line (None with fewer than 3 points): the scatter of a
    saturating curve about a line, not seed noise, so the report prints ``neighbour_slopes`` instead."""
    neighbour_slopes: tuple[float, ...] = ()
    """The slope between each two neighbouring LRs, from the basin's last LR up (nats per doubling): how far
    the rate is from one number (not in summary.json)."""
    seeds: tuple[int, ...] = ()
    """How many seeds each LR the rate rests on has, from the basin's last LR up (not in summary.json)."""

    def to_json(self) -> JsonObject:
        return {"low": list(self.low), "high": list(self.high),
                "points": [{"lr": p.lr, "ratio_to_best": p.ratio_to_best, "loss": p.loss, "excess": p.excess,
                            "seeds": p.seeds} for p in self.points],
                "excess_at": {str(f): v for f, v in self.excess_at}, "per_doubling": self.per_doubling,
                "per_doubling_se": self.per_doubling_se}


@dataclass(frozen=True)
class Landscape:
    """The three regions (None: not measured, or none); where each LR tried stands: ``lr_regions``."""

    basin: Basin | None
    """Around the best LR (None: no LR trained its whole budget)."""
    degraded: Degraded | None
    """Above the basin, below the edge (None: fewer than two LRs there trained through)."""
    diverged: Gap | None
    """Where the failed region begins: between the failing LR's bracket's ends (None: no LR failed). (Named
    ``diverged`` in summary.json since before a run could fail without diverging.)"""

    def to_json(self) -> JsonObject:
        return {"basin": self.basin.to_json() if self.basin else None,
                "degraded": self.degraded.to_json() if self.degraded else None,
                "diverged": {"low": list(self.diverged)} if self.diverged is not None else None}


def landscape(ranking: list[LrResult], edge: Bracket) -> Landscape:
    """The three regions, each an LR interval whose ends are known to lie between two tried LRs:

    - basin: LRs whose mean full-budget loss is within SIGNIFICANCE_SE standard errors of the best's
      (the contiguous run of tried LRs around the best; with no seed spread measured, the best LR alone);
    - degraded: above the basin, up to the edge: trained through without diverging, loss clearly worse
      (how much worse per doubling of the LR: the slope of loss against log2 LR between neighbours);
    - failed: from the edge (the failing LR) up."""
    diverged = (edge.stable_lr, edge.diverged_lr) if edge.diverged_lr is not None else None
    best, _ = crown(ranking)
    if best is None:
        return Landscape(None, None, diverged)
    sigma = pooled_seed_spread(ranking)
    line = sorted((r for r in ranking if r.others == best.others), key=lambda r: r.lr)
    i = line.index(best)
    lo = hi = i
    while lo > 0 and not clearly_worse(line[lo - 1], best, sigma):
        lo -= 1
    while hi < len(line) - 1 and not clearly_worse(line[hi + 1], best, sigma):
        hi += 1
    margin = standard_error(best, best, sigma)
    basin = Basin(tuple(r.lr for r in line[lo:hi + 1]), (line[lo - 1].lr if lo > 0 else None, line[lo].lr),
                  (line[hi].lr, line[hi + 1].lr if hi + 1 < len(line) else edge.diverged_lr), best.mean, sigma,
                  tuple(r.lr for r in spread_lrs(ranking)), None if margin is None else SIGNIFICANCE_SE * margin)
    return Landscape(basin, _degraded(line[hi:], best, edge), diverged)


def _degraded(above: list[LrResult], best: LrResult, edge: Bracket) -> Degraded | None:
    """The LRs above the basin's last one (``above[0]``) that trained through, below the edge: each one's
    loss over the best's, that excess at round multiples of the best LR (interpolated in log LR between
    the LRs tried, never beyond them), and the least-squares slope of loss against log2 LR with its
    straight-line standard error (a mean rate: the curve is rarely a straight line), and the slopes between
    neighbouring LRs that show how far from one."""
    top = [r for r in above if edge.diverged_lr is None or r.lr < edge.diverged_lr]
    if len(top) < 2:
        return None
    points = tuple(DegradedPoint(r.lr, r.lr / best.lr, r.mean, r.mean - best.mean, len(r.losses)) for r in top[1:])
    xs, ys = [math.log2(r.lr / best.lr) for r in top], [r.mean - best.mean for r in top]
    # (within the LRs tried, so never None: interpolated is None only outside its points)
    at = tuple((f, cast(float, interpolated(list(zip(xs, ys, strict=True)), math.log2(f)))) for f in DEGRADED_AT
               if xs[0] <= math.log2(f) <= xs[-1])
    slope, error = _slope(xs, ys)
    between = tuple((y1 - y0) / (x1 - x0) for x0, y0, x1, y1 in zip(xs, ys, xs[1:], ys[1:], strict=False))
    return Degraded((top[0].lr, top[1].lr), (top[-1].lr, edge.diverged_lr), points, at, slope, error, between,
                    tuple(len(r.losses) for r in top))


def _slope(xs: list[float], ys: list[float]) -> tuple[float, float | None]:
    """Least-squares slope of ys on xs and its standard error (None with fewer than 3 points)."""
    n, mx, my = len(xs), sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    if n < 3:
        return slope, None
    residual = sum((y - my - slope * (x - mx)) ** 2 for x, y in zip(xs, ys, strict=True))
    return slope, math.sqrt(residual / (n - 2) / sxx)


class Region(StrEnum):
    """Where an LR tried stands. The report's text, its table of full-budget losses and lr_vs_loss.png's bands and
    marks all read these (``lr_regions``), so none calls an LR what another does not."""

    BELOW = "below the basin"
    """Trained its whole budget, below the basin (clearly worse than the best)."""
    BASIN = "basin"
    """In the basin: its full-budget loss is not clearly worse than the best's (the best LR among them)."""
    DEGRADED = "degraded"
    """Above the basin and below the failing LR: trained through, clearly worse."""
    FAILED = "failed"
    """A run there failed: it diverged, or (above an LR that trained) ended no better than the unigram baseline."""
    ABOVE_FAILING = "trained through above the failing LR"
    """Above the failing LR, its runs trained through (failure is not monotone there: seed or chance)."""
    UNCONFIRMED = "unconfirmed (cut while above ℓ₀)"
    """No run there trained its whole budget or failed, and one was cut early (by ASHA or the stopper) while its
    loss stood above its initial loss ℓ₀: whether it would have come back, or diverged, is not known."""
    UNTRAINED = "ran its budget, no better than the unigram baseline"
    """Nothing trained (no run beat the data's unigram baseline): its runs ran their whole budget, no LR is crowned
    and there is no basin to place it in."""
    OTHER = "other settings than the best's"
    """Trained its whole budget with other varied parameters than the best LR's (a grid over more than the LR): not
    on the best LR's line, so in none of its regions."""


@dataclass(frozen=True)
class LrRegion:
    """An LR tried (with the other parameters its runs share) and the region it stands in."""

    lr: float
    region: Region
    others: tuple[tuple[str, Any], ...] = ()

    def to_json(self) -> JsonObject:
        return {"lr": self.lr, **dict(self.others), "region": str(self.region)}


def lr_regions(runs: Iterable[Run], ranking: list[LrResult], regions: Landscape) -> tuple[LrRegion, ...]:
    """The region of every LR tried that trained its whole budget, failed, or was cut while above ℓ₀ (an LR whose
    runs were only cut below ℓ₀ stands in none: nothing says where). A failed run puts its LR in the failed region
    whatever its other seeds did (the bracket's rule); an LR that trained its whole budget stands where the
    landscape put it (basin, degraded, below the basin, or above the failing LR), or, where the landscape has no
    basin (nothing trained: no best LR), is untrained; one with neither, but a run cut while above ℓ₀, is
    unconfirmed."""
    runs = effective_runs(runs)
    failed = {(r.lr, r.others) for r in failed_runs(runs)}
    cut = {(r.lr, r.others) for r in runs if r.cut_loss is not None}
    ranked = {(r.lr, r.others) for r in ranking}
    best, _ = crown(ranking)
    basin = set(regions.basin.lrs) if regions.basin else set()
    degraded = {p.lr for p in regions.degraded.points} if regions.degraded else set()
    found = []
    for lr, others in sorted(ranked | failed | cut, key=lambda key: (key[0], repr(key[1]))):
        if (lr, others) in failed:
            region = Region.FAILED
        elif (lr, others) not in ranked:
            region = Region.UNCONFIRMED
        elif regions.basin is None:  # ranked, yet no basin: nothing trained, so no best LR to place it by
            region = Region.UNTRAINED
        elif best is None or others != best.others:
            region = Region.OTHER
        elif lr in basin:
            region = Region.BASIN
        elif lr in degraded:
            region = Region.DEGRADED
        elif basin and lr < min(basin):
            region = Region.BELOW
        else:  # above the basin, not degraded: at or above the failing LR (the degraded region ends below it)
            region = Region.ABOVE_FAILING
        found.append(LrRegion(lr, region, others))
    return tuple(found)
