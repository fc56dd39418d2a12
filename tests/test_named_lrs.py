"""The four LRs an edge report names (lmtune.analysis.named_lrs): the best LR, the top of the useful range with
the cost of 2x and 4x, the failing LR and the divergence LR, each from runs whose outcome is given."""

from __future__ import annotations

import pytest

from lmtune.analysis.conclusion import conclude
from lmtune.analysis.named_lrs import USEFUL_TOLERANCE, divergence_bracket
from lmtune.analysis.runs import Budget, Run

BUDGET = Budget(steps=100, warmup_steps=10, tokens_per_step=10, seed=0, rungs=(1000,), unigram_loss=5.0)
FULL = BUDGET.full_tokens


def ended(lr: float, loss: float, seed: int = 0) -> Run:
    """A run that trained its whole budget and ended at ``loss``."""
    return Run(lr, seed, "grid", FULL, FULL, outcome="completed", tokens=FULL, val={FULL: loss}, baseline=5.0)


def diverged(lr: float, seed: int = 0) -> Run:
    return Run(lr, seed, "grid", FULL, FULL, outcome="diverged", tokens=FULL // 2, val={}, diverged_tokens=FULL // 2,
               divergence="non_finite", baseline=5.0)


def three_seeds(lr: float, mean: float) -> list[Run]:
    return [ended(lr, mean + d, seed) for seed, d in enumerate((-0.01, 0.0, 0.01))]


def test_an_lr_above_the_best_within_the_margin_tops_the_useful_range():
    runs = [*three_seeds(0.01, 2.0), *three_seeds(0.02, 2.005), *three_seeds(0.04, 2.5), ended(1.0, 6.0)]
    useful = conclude(runs, BUDGET).useful
    assert useful.top_lr == 0.02 and useful.above_best and useful.next_lr == 0.04


def test_the_useful_range_stops_at_the_first_lr_clearly_worse_even_if_one_above_is_as_good():
    runs = [*three_seeds(0.01, 2.0), *three_seeds(0.02, 2.3), *three_seeds(0.04, 2.001)]
    useful = conclude(runs, BUDGET).useful
    # 0.04 beats 0.02 but is not reached through LRs that qualify (and is itself the best if lower: not here)
    assert useful.top_lr == 0.01 and useful.next_lr == 0.02 and not useful.above_best


def test_with_one_seed_each_the_tolerance_alone_decides():
    within, beyond = 2.0 + USEFUL_TOLERANCE / 2, 2.0 + USEFUL_TOLERANCE * 2
    assert conclude([ended(0.01, 2.0), ended(0.02, within)], BUDGET).useful.top_lr == 0.02
    assert conclude([ended(0.01, 2.0), ended(0.02, beyond)], BUDGET).useful.top_lr == 0.01


def test_the_cost_of_2x_and_4x_is_interpolated_in_log_lr_between_the_lrs_tried():
    runs = [ended(0.01, 2.0), ended(0.02, 2.1), ended(0.08, 2.9)]
    costs = dict(conclude(runs, BUDGET).useful.cost_at)
    assert costs[2] == pytest.approx(0.1)
    assert costs[4] == pytest.approx(0.1 + (2.9 - 2.1) / 2)  # halfway from 0.02 to 0.08 in log LR


def test_a_multiple_beyond_the_lrs_tried_has_no_cost():
    costs = dict(conclude([ended(0.01, 2.0), ended(0.03, 2.2)], BUDGET).useful.cost_at)
    assert costs[2] == pytest.approx(0.2 * (1 / 1.584962500721156))  # log 2 / log 3 of the way
    assert costs[4] is None


def test_a_run_that_ends_untrained_fails_but_does_not_diverge():
    runs = [ended(0.01, 2.0), ended(0.3, 4.0), ended(1.0, 5.5), ended(3.0, 5.8), diverged(10.0)]
    c = conclude(runs, BUDGET)
    assert (c.edge.stable_lr, c.edge.diverged_lr) == (0.3, 1.0)
    assert (c.divergence.stable_lr, c.divergence.diverged_lr) == (3.0, 10.0)


def test_the_edge_ratio_is_the_divergence_lr_over_the_best():
    runs = [ended(0.01, 2.0), ended(1.0, 5.5), diverged(3.0)]
    assert conclude(runs, BUDGET).edge_ratio == pytest.approx(300.0)


def test_without_a_diverged_run_the_divergence_lr_is_none_and_its_low_end_the_largest_lr_run():
    bracket = divergence_bracket([ended(0.01, 2.0), ended(1.0, 5.5)])
    assert bracket.diverged_lr is None and bracket.stable_lr == 1.0


def test_summary_keys_name_each_lr_for_what_it_is():
    runs = [*three_seeds(0.01, 2.0), ended(0.02, 2.1), ended(1.0, 5.5), diverged(3.0)]
    keys = conclude(runs, BUDGET).to_json()
    assert (keys["best_lr"], keys["useful_top_lr"], keys["failing_lr"], keys["divergence_lr"]) == (
        0.01, 0.01, 1.0, 3.0)
    assert keys["failing_lr_low"] == 0.02 and keys["divergence_lr_low"] == 1.0
    assert keys["cost_at_2x"] == pytest.approx(0.1) and keys["useful_tolerance"] == USEFUL_TOLERANCE
