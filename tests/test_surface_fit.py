"""The loss surface fitted to every budget's runs at once (lmtune.analysis.surface): it recovers a known optimum
and exponent, says when one power law does not hold, and is no fit where a budget has too few runs near its best."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lmtune.analysis.runs import Run
from lmtune.analysis.surface import fit_surface

TARGET = 1_600_000
BETA, AT_TARGET, SKEW = 0.3, 0.005, 0.3


def runs_at(tokens: int, best: float, rng: np.random.Generator, noise: float = 0.005, seeds: int = 2,
            ratio: float = 1.5, side: int = 3) -> list[Run]:
    """A grid ``ratio`` apart around ``best``, ``seeds`` seeds each, on loss = 2 + 0.1 x^2 exp(SKEW x)."""
    runs = []
    for k in range(-side, side + 1):
        lr = best * ratio ** k * math.exp(0.1)  # (the grid does not fall on the optimum)
        x = math.log(lr / best)
        for seed in range(seeds):
            loss = 2.0 + 0.1 * x * x * math.exp(SKEW * x) + noise * rng.standard_normal()
            runs.append(Run(lr, seed, "grid", tokens, tokens, "completed", tokens, {tokens: loss}))
    return runs


def law(tokens: int) -> float:
    return AT_TARGET * (tokens / TARGET) ** -BETA


def test_it_recovers_the_optimum_at_the_target_and_the_exponent_from_smaller_budgets():
    rng = np.random.default_rng(0)
    budgets = (100_000, 200_000, 400_000)
    fit = fit_surface([(t, runs_at(t, law(t), rng)) for t in budgets], TARGET)
    assert fit.predicted_lr == pytest.approx(AT_TARGET, rel=0.1)
    assert fit.predicted_lr_interval[0] <= AT_TARGET <= fit.predicted_lr_interval[1]
    assert fit.exponent == pytest.approx(BETA, abs=0.05) and fit.resolved
    assert fit.law_holds


def test_optima_that_fall_then_rise_across_budgets_are_no_power_law():
    rng = np.random.default_rng(1)
    v_shape = {100_000: 0.02, 200_000: 0.005, 400_000: 0.02}
    fit = fit_surface([(t, runs_at(t, best, rng, noise=0.002)) for t, best in v_shape.items()], TARGET)
    assert fit.law_holds is False and fit.lack_of_fit_p < 0.05


def test_two_budgets_fit_a_law_they_cannot_test():
    rng = np.random.default_rng(2)
    fit = fit_surface([(t, runs_at(t, law(t), rng)) for t in (100_000, 400_000)], TARGET)
    assert fit.dof == 0 and fit.lack_of_fit_p is None


def test_a_budget_with_too_few_runs_near_its_best_leaves_too_few_budgets_to_fit():
    rng = np.random.default_rng(3)
    sparse = runs_at(200_000, law(200_000), rng, seeds=1, side=0)  # one run
    assert fit_surface([(100_000, runs_at(100_000, law(100_000), rng)), (200_000, sparse)], TARGET) is None


def test_runs_far_from_their_budgets_best_do_not_enter_the_fit():
    rng = np.random.default_rng(4)
    budgets = (100_000, 200_000, 400_000)
    near = [(t, runs_at(t, law(t), rng)) for t in budgets]
    far = [(t, runs + [Run(law(t) * 30, 0, "grid", t, t, "completed", t, {t: 9.0})]) for t, runs in near]
    assert fit_surface(far, TARGET).predicted_lr == pytest.approx(fit_surface(near, TARGET).predicted_lr)
