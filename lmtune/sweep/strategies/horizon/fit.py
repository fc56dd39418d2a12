"""The best LR across token horizons: a power law LR*(D) = exp(a) * D^-beta fitted to the best LR found at
several budgets, and the LR it predicts for a larger budget, each with an interval (Bjorck et al. 2025,
"Scaling Optimal LR Across Token Horizons").

Ray-free: it reads full-budget losses (per budget, per LR, per seed) and nothing else. Where the uncertainty
comes from, and how the bootstrap carries it:
- the seeds: each resample draws every LR's seeds with replacement, so a flat basin, whose LRs trade places
  from seed to seed, moves the best LR between them;
- the grid: the best LR is only known to lie between its neighbours, so each resample places it uniformly
  (in log LR) within half a grid step either side.
The interval is the 5th-95th percentile of the resampled fits (90%).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from lmtune.errors import LmtuneError

INTERVAL = (5.0, 95.0)


@dataclass(frozen=True)
class BudgetLosses:
    """One budget's full-budget losses: tokens, and LR -> the loss of each seed."""

    tokens: int
    losses: Mapping[float, Sequence[float]]

    def best_lr(self) -> float:
        """The LR of the lowest mean loss (non-finite losses count as worse than any finite one)."""
        return min(self.losses, key=lambda lr: _mean(self.losses[lr]))


@dataclass(frozen=True)
class HorizonFit:
    beta: float
    """LR*(D) falls as D^-beta."""
    beta_interval: tuple[float, float]
    intercept: float
    """ln LR* at D = 1 token (the fit's a)."""
    intercept_interval: tuple[float, float]
    target_tokens: int
    predicted_lr: float
    predicted_lr_interval: tuple[float, float]
    best_lrs: dict[int, float]
    """Budget (tokens) -> the best LR found there (the points fitted)."""

    def to_json(self) -> dict:
        return {"beta": self.beta, "beta_interval": list(self.beta_interval), "intercept": self.intercept,
                "intercept_interval": list(self.intercept_interval), "target_tokens": self.target_tokens,
                "predicted_lr": self.predicted_lr, "predicted_lr_interval": list(self.predicted_lr_interval),
                "best_lrs": {str(k): v for k, v in self.best_lrs.items()}}

    @classmethod
    def from_json(cls, data: dict) -> HorizonFit:
        pairs = ("beta_interval", "intercept_interval", "predicted_lr_interval")
        return cls(**{**{k: v for k, v in data.items() if k in cls.__dataclass_fields__},
                      **{k: tuple(data[k]) for k in pairs},
                      "best_lrs": {int(k): float(v) for k, v in data["best_lrs"].items()}})


def fit_horizon(budgets: Sequence[BudgetLosses], target_tokens: int, resamples: int = 2000,
                seed: int = 0) -> HorizonFit:
    """Fit ln LR* = a - beta ln D through each budget's best LR, predict LR* at ``target_tokens``, and give
    both their bootstrap intervals."""
    if len({b.tokens for b in budgets}) < 2:
        raise LmtuneError("a horizon fit needs the best LR at two or more different budgets")
    best = {b.tokens: b.best_lr() for b in budgets}
    a, slope = _line(list(best), list(best.values()))
    rng = np.random.default_rng(seed)
    draws = np.array([_line(*zip(*((b.tokens, _resampled_best(b, rng)) for b in budgets), strict=True))
                      for _ in range(resamples)])
    predicted = draws[:, 0] + draws[:, 1] * math.log(target_tokens)
    return HorizonFit(
        beta=-slope, beta_interval=_interval(-draws[:, 1]), intercept=a, intercept_interval=_interval(draws[:, 0]),
        target_tokens=target_tokens, predicted_lr=math.exp(a + slope * math.log(target_tokens)),
        predicted_lr_interval=tuple(math.exp(v) for v in _interval(predicted)), best_lrs=best)


def _resampled_best(budget: BudgetLosses, rng: np.random.Generator) -> float:
    lrs = sorted(budget.losses)
    means = [_mean(rng.choice(np.asarray(budget.losses[lr], dtype=float), size=len(budget.losses[lr])))
             for lr in lrs]
    i = int(np.argmin(means))
    # Half a grid step either side in log LR (at the grid's ends: the step to the one neighbour).
    left = math.log(lrs[i] / lrs[i - 1]) / 2 if i > 0 else math.log(lrs[i + 1] / lrs[i]) / 2 if len(lrs) > 1 else 0
    right = math.log(lrs[i + 1] / lrs[i]) / 2 if i + 1 < len(lrs) else left
    return lrs[i] * math.exp(rng.uniform(-left, right))


def _line(tokens: Sequence[float], lrs: Sequence[float]) -> tuple[float, float]:
    """Least squares ln lr = a + b ln tokens: (a, b)."""
    x, y = np.log(np.asarray(tokens, dtype=float)), np.log(np.asarray(lrs, dtype=float))
    b, a = np.polyfit(x, y, 1)
    return float(a), float(b)


def _interval(values: np.ndarray) -> tuple[float, float]:
    lo, hi = np.percentile(values, INTERVAL)
    return float(lo), float(hi)


def _mean(losses: Sequence[float]) -> float:
    values = [v if v is not None and math.isfinite(v) else math.inf for v in losses]
    return sum(values) / len(values) if values else math.inf
