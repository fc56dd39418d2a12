"""The truth's own rules, written apart from lmtune's analysis (issue 58 item 5): the ground-truth checks judge
a grid by these, so that a bug in lmtune's ``conclude`` / ``bracket`` / ``judge`` cannot pass both the search and
the truth it is checked against. Each rule is a few lines and states the definition it implements (the same
definitions as docs/searches.md, "When a run has failed", and lmtune/analysis/named_lrs.py):

- a run **diverged** when a loss or gradient went non-finite, or its budget ended with its training loss above
  ℓ₀ = ln(vocab) (nothing stops a truth's run early: it climbed and never came back);
- a run **failed** when it diverged, or, at an LR above the lowest LR where a run came through, it ran its whole
  budget and ended no better than the data's unigram baseline (below that LR it is only too slow, not the edge);
- the **best LR**: the lowest mean final val loss over the LRs where every run ran its budget and none failed;
- its **basin**: the contiguous LRs around it whose mean is within SE_MARGIN standard errors of the best's, the
  standard error of a difference of two means, sigma * sqrt(1/n + 1/n_best), with sigma the seed-to-seed standard
  deviation pooled over the LRs with two or more seeds within SPREAD_WITHIN of the best (all of them where none);
- the **failing bracket**: (the largest LR below the first failing LR at which a run came through, the first
  failing LR]; the **divergence bracket** the same for the first LR at which a run diverged (below it: an LR
  whose run ran its budget, however well it ended).

Nothing here imports lmtune: its inputs are each run's LR, seed, final val loss and whether it diverged.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

SE_MARGIN = 2.0
"""Standard errors of a difference within which a loss is as good as the best's."""
SPREAD_WITHIN = 4.0
"""The seed spread is pooled over LRs within this factor of the best: far above it seeds differ far more (the
same bound lmtune pools over; restated here, not imported, so a change there is not silently the truth's)."""
LR_TOLERANCE = 1.02
"""Two LRs closer than this ratio are one LR (a search's refinement LR beside a truth's grid LR)."""


class EndedRun(Protocol):
    """What a rule reads of one run of the grid (benchmarks.truth.TruthRun is one)."""

    lr: float
    seed: int
    end_val: float | None
    """Its val loss at the end of its budget (None: it did not reach the end with a finite loss)."""
    failed: bool
    """It diverged (``diverged``): non-finite, or ended its budget above ℓ₀."""
    baseline: float | None
    """The data's unigram baseline (None: unknown, and no run is judged by it)."""


def diverged(non_finite: bool, last_train_loss: float, ell0: float) -> bool:
    """A run with nothing stopping it diverged: a loss or gradient went non-finite, or its last training loss is
    not finite or lies above ℓ₀ = ln(vocab) (it climbed above the loss at initialisation and never came back)."""
    return non_finite or not (math.isfinite(last_train_loss) and last_train_loss <= ell0)


def untrained(run: EndedRun) -> bool:
    """It ran its whole budget without diverging and ended no better than the unigram baseline (each token
    predicted by its frequency): it did not train."""
    return (not run.failed and run.end_val is not None and run.baseline is not None
            and run.end_val >= run.baseline)


def came_through(run: EndedRun) -> bool:
    """It ran its whole budget without diverging and ended below the unigram baseline (or none is known)."""
    return not run.failed and run.end_val is not None and not untrained(run)


def failed_runs(runs: Sequence[EndedRun]) -> list[EndedRun]:
    """The runs that failed: diverged, or ended untrained at an LR above the lowest LR where a run came through
    (an untrained run below it is an LR too small, not the edge)."""
    lowest = min((r.lr for r in runs if came_through(r)), default=None)
    return [r for r in runs if r.failed or (untrained(r) and lowest is not None and r.lr > lowest)]


@dataclass(frozen=True)
class LrMean:
    """One LR's final val losses, one per seed."""

    lr: float
    seeds: tuple[int, ...]
    losses: tuple[float, ...]

    @property
    def mean(self) -> float:
        return sum(self.losses) / len(self.losses)

    def to_json(self) -> dict:
        return {"lr": self.lr, "seeds": list(self.seeds), "losses": list(self.losses), "mean": self.mean}


def ranking(runs: Sequence[EndedRun]) -> list[LrMean]:
    """The LRs at which no run failed, each with the final val losses of its runs that ran their budget, lowest
    mean first (the best LR first; ties to the lower LR). A failing LR is no candidate, and its seeds' spread is
    not the seed noise near the optimum."""
    failing = {r.lr for r in failed_runs(runs)}
    by_lr: dict[float, dict[int, float]] = {}
    for run in runs:
        if run.lr not in failing and not run.failed and run.end_val is not None:
            by_lr.setdefault(run.lr, {}).setdefault(run.seed, run.end_val)
    ranked = [LrMean(lr, tuple(ends), tuple(ends.values())) for lr, ends in by_lr.items()]
    return sorted(ranked, key=lambda r: (r.mean, r.lr))


def pooled_spread(ranked: Sequence[LrMean]) -> tuple[float | None, list[float]]:
    """The seed-to-seed standard deviation, pooled (sum of (n-1)s^2 over sum of (n-1)) over the LRs with two or
    more seeds within SPREAD_WITHIN of the best (all LRs with two or more where none is that close), and those LRs in
    ``ranked``'s order (None: no LR has two seeds)."""
    seeded = [r for r in ranked if len(r.losses) > 1]
    near = [r for r in seeded if ranked and max(r.lr / ranked[0].lr, ranked[0].lr / r.lr) <= SPREAD_WITHIN]
    pool = near or seeded
    squares = sum(sum((x - r.mean) ** 2 for x in r.losses) for r in pool)
    dof = sum(len(r.losses) - 1 for r in pool)
    return (math.sqrt(squares / dof) if dof else None), [r.lr for r in pool]


def margin(result: LrMean, best: LrMean, sigma: float | None) -> float:
    """SE_MARGIN standard errors of (its mean - the best's mean): SE_MARGIN * sigma * sqrt(1/n + 1/n_best);
    0 without a measured spread (then only a loss no higher than the best's is as good)."""
    return 0.0 if sigma is None else SE_MARGIN * sigma * math.sqrt(1 / len(result.losses) + 1 / len(best.losses))


def basin(ranked: Sequence[LrMean], sigma: float | None) -> list[LrMean]:
    """The contiguous LRs around the best (``ranked[0]``), ascending, whose mean is within ``margin`` of the
    best's: from the best outwards, up to the first LR on each side that is clearly worse."""
    if not ranked:
        return []
    best, line = ranked[0], sorted(ranked, key=lambda r: r.lr)
    low = high = line.index(best)
    while low > 0 and line[low - 1].mean - best.mean <= margin(line[low - 1], best, sigma):
        low -= 1
    while high + 1 < len(line) and line[high + 1].mean - best.mean <= margin(line[high + 1], best, sigma):
        high += 1
    return line[low:high + 1]


def first_bracket(bad_lrs: Iterable[float], good_lrs: Iterable[float]) -> tuple[float | None, float | None]:
    """(the largest good LR below the first bad LR, the first bad LR): the bad LR's bracket (None: no such
    LR). Without a bad LR: (the largest good LR, None)."""
    bad, good = sorted(set(bad_lrs)), set(good_lrs)
    if not bad:
        return max(good, default=None), None
    return max((lr for lr in good if lr < bad[0]), default=None), bad[0]


def failing_bracket(runs: Sequence[EndedRun]) -> tuple[float | None, float | None]:
    """The edge: (the largest LR below the first failing LR where a run came through, the first failing LR]."""
    return first_bracket((r.lr for r in failed_runs(runs)), (r.lr for r in runs if came_through(r)))


def divergence_bracket(runs: Sequence[EndedRun]) -> tuple[float | None, float | None]:
    """(the largest LR below the first LR where a run diverged at which a run ran its budget without diverging,
    however well it ended, that first diverging LR]."""
    ran = (r.lr for r in runs if not r.failed and r.end_val is not None)
    return first_bracket((r.lr for r in runs if r.failed), ran)
