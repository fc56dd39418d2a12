"""What an adaptive search's tokens are compared with: the baseline a competent user would run by hand for the
same answer (a grid 2x apart over the same LRs, bisection to the same edge bracket, the same seeds at the best LR
and at the bracket's ends), not only a grid as fine as the search's bracket everywhere."""

from __future__ import annotations

import pytest

from lmtune.analysis.runs import Budget, Run
from lmtune.findings.baselines import bracket_walk, careful_baseline, competent_baseline

BUDGET = Budget(steps=100, warmup_steps=10, tokens_per_step=64, seed=0, rungs=(6400,))


def tried(*lrs: float, stage: str = "coarse") -> list[tuple[Run, None]]:
    return [(Run(lr, 0, stage, 6400, 6400, "completed", 6400), None) for lr in lrs]


def test_the_grid_is_two_x_apart_over_the_lrs_tried_and_bisection_reaches_the_searchs_bracket():
    # 0.001 to 1.024: 11 LRs 2x apart; a 1.33x bracket is two halvings (in log LR) of a 2x one (2 -> 1.41 -> 1.19)
    cost = competent_baseline(tried(0.001, 0.03, 1.024), best_seeds=3, edge_seeds=(2, 2), resolution=1.33,
                              budget=BUDGET)
    assert (cost.grid_points, cost.bisections, cost.extra_seeds) == (11, 2, 4)
    assert cost.runs == 17 and cost.tokens == 17 * BUDGET.full_tokens


def test_a_bracket_already_as_coarse_as_the_grid_needs_no_bisection():
    cost = competent_baseline(tried(0.01, 0.04), best_seeds=1, edge_seeds=(1, 1), resolution=2.0, budget=BUDGET)
    assert (cost.grid_points, cost.bisections, cost.extra_seeds) == (3, 0, 0)


def test_the_range_test_is_no_lr_the_baseline_grid_must_cover():
    pairs = tried(0.01, 0.02) + tried(1e-6, 10.0, stage="range")
    assert competent_baseline(pairs, 1, (0, 0), None, BUDGET).grid_points == 2


@pytest.mark.parametrize("pairs", [[], tried(0.0)])
def test_no_positive_lr_tried_has_no_baseline(pairs):
    assert competent_baseline(pairs, 1, (0, 0), None, BUDGET) is None


# quick_edge's budget: 162 steps of 1,024 tokens, ASHA's rungs at 1/9, 1/3 and all of it (reduction factor 3).
ASHA_BUDGET = Budget(steps=162, warmup_steps=18, tokens_per_step=1024, seed=0, rungs=(18432, 55296, 165888))


def test_the_careful_baseline_runs_the_same_grid_under_asha_and_continues_the_best_and_the_brackets_ends():
    """issue 55: 13 LRs -> 5 -> 2 through the rungs, one more near the best and the grid's two bracket ends continued
    to the full budget, then the competent baseline's 2 bisections and 3 seeds at the full budget."""
    competent = competent_baseline(tried(0.001072, 3.374), best_seeds=3, edge_seeds=(1, 2), resolution=1.33,
                                   budget=ASHA_BUDGET)
    cost = careful_baseline(competent, ASHA_BUDGET, bracket_ends=2)
    assert (cost.grid_points, cost.at_rungs, cost.continued, cost.bracket_ends) == (13, (13, 5, 2), 1, 2)
    assert (cost.bisections, cost.extra_seeds) == (2, 3)
    grid = 13 * 18432 + 5 * (55296 - 18432) + 2 * (165888 - 55296)
    assert cost.tokens == grid + (165888 - 55296) + 2 * (165888 - 18432) + 5 * 165888


def test_without_a_failing_bracket_no_bracket_end_is_continued():
    competent = competent_baseline(tried(0.01, 0.04), best_seeds=1, edge_seeds=(0, 0), resolution=None,
                                   budget=ASHA_BUDGET)
    assert careful_baseline(competent, ASHA_BUDGET, bracket_ends=0).bracket_ends == 0


def test_a_sweep_compared_at_one_rung_ran_no_asha_and_has_no_careful_baseline():
    competent = competent_baseline(tried(0.01, 0.04), best_seeds=1, edge_seeds=(1, 1), resolution=2.0, budget=BUDGET)
    assert careful_baseline(competent, BUDGET, bracket_ends=2) is None


WALK_BUDGET = Budget(steps=162, warmup_steps=18, tokens_per_step=1024, seed=0, rungs=(18432, 55296, 165888),
                     unigram_loss=5.67)


def at_first_rung(lr: float, loss: float) -> tuple[Run, None]:
    return (Run(lr, 0, "coarse", 165888, 165888, "stopped_early", 18432, {18432: loss}), None)


def test_the_careful_bracket_walks_up_from_the_first_grid_lr_above_the_baseline_at_the_first_rung():
    """quick_edge's record: above the unigram baseline at 18k tokens from about 0.06 up, failing at the full budget
    only at 1.42: a careful user continues 0.0686, 0.137, ..., 2.19 (each trains through until 2.19) and 0.0343 below
    them, 7 grid LRs; the benchmark measured the same 7."""
    pairs = [at_first_rung(lr, loss) for lr, loss in
             [(0.00107, 7.5), (0.0107, 4.3), (0.0338, 5.5), (0.0428, 4.7), (0.107, 6.9), (0.338, 6.2), (1.07, 23.0),
              (3.37, 200.0)]]
    assert bracket_walk(pairs, WALK_BUDGET, failing_lr=1.424) == 7


def test_a_first_rung_already_right_about_the_bracket_continues_its_two_ends():
    pairs = [at_first_rung(lr, loss) for lr, loss in [(0.001, 5.0), (0.01, 4.0), (0.1, 4.5), (0.5, 4.8), (1.0, 30.0)]]
    assert bracket_walk(pairs, WALK_BUDGET, failing_lr=0.9) == 2


def test_no_failing_lr_means_no_bracket_to_walk():
    assert bracket_walk([at_first_rung(0.01, 4.0)], WALK_BUDGET, failing_lr=None) == 0
