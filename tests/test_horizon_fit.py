"""The power-law fit of the best LR across token horizons: recovered from budgets whose best LR follows one,
with an interval that holds the truth and widens with a flat basin."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lmtune.errors import LmtuneError
from lmtune.sweep.strategies.horizon.fit import BudgetLosses, fit_horizon

GRID = [0.001 * 1.5 ** k for k in range(12)]  # 0.001 .. 0.086, 1.5x apart
BETA, C = 0.3, 2.0  # LR*(D) = C * D^-0.3


def budget(tokens: int, curvature: float = 4.0, noise: float = 0.01, seeds: int = 2, seed: int = 0) -> BudgetLosses:
    """A budget whose loss is a parabola in log LR around C * tokens^-BETA, plus seed noise."""
    rng = np.random.default_rng([seed, tokens])
    best = math.log(C * tokens ** -BETA)
    return BudgetLosses(tokens, {lr: [2.0 + curvature * (math.log(lr) - best) ** 2 + rng.normal(0, noise)
                                      for _ in range(seeds)] for lr in GRID})


def test_the_fit_recovers_the_power_law_and_its_prediction_holds_the_truth():
    fit = fit_horizon([budget(t) for t in (40_000, 80_000, 160_000, 320_000)], target_tokens=640_000)
    truth = C * 640_000 ** -BETA
    assert fit.beta_interval[0] <= BETA <= fit.beta_interval[1]
    assert fit.predicted_lr_interval[0] <= truth <= fit.predicted_lr_interval[1]
    assert fit.predicted_lr_interval[1] / fit.predicted_lr_interval[0] < 3  # not an interval of everything


def test_a_flat_basin_widens_the_interval():
    sharp = fit_horizon([budget(t, curvature=4.0) for t in (40_000, 80_000, 160_000)], target_tokens=640_000)
    flat = fit_horizon([budget(t, curvature=0.02, noise=0.02) for t in (40_000, 80_000, 160_000)],
                       target_tokens=640_000)
    width = lambda f: f.predicted_lr_interval[1] / f.predicted_lr_interval[0]  # noqa: E731
    assert width(flat) > width(sharp)


def test_one_budget_is_not_a_fit():
    with pytest.raises(LmtuneError, match="two or more different budgets"):
        fit_horizon([budget(40_000), budget(40_000, seed=1)], target_tokens=640_000)


def test_a_non_finite_loss_never_wins():
    b = BudgetLosses(1000, {0.01: [2.0, 2.1], 1.0: [float("nan"), 1.0]})
    assert b.best_lr() == 0.01
