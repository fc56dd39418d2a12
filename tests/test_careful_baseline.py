"""benchmarks/careful_baseline.py's planning, from hand-made stage results (the Tuner runs are the benchmark's):
the 2x grid, which grid LRs go on to the full budget, the bisections and the further seeds, each as the report's
estimate (lmtune.findings.baselines) counts them."""

from __future__ import annotations

import math

import pytest

from benchmarks.careful_baseline import (
    Point,
    best_point,
    bisections,
    bracket,
    grid_lrs,
    seed_orders,
    to_continue,
)

FULL = 165_888  # quick_edge's rungs: 18, 54 and 162 steps of 1,024 tokens
RUNG0, RUNG1 = 18_432, 55_296
UNIGRAM = 6.0


def after_asha() -> list[Point]:
    """A 2x grid from 0.001 as ASHA leaves it: two LRs at the full budget, three cut at the second rung, the rest at
    the first; from 0.512 up the first rung's loss is no better than the unigram baseline (2.048 went non-finite)."""
    lrs = [0.001 * 2**k for k in range(12)]
    rung_losses = [5.5, 5.0, 4.6, 4.4, 4.5, 4.7, 5.0, 5.4, 5.8, 6.3, 6.8, math.inf]
    tokens = {0.004: RUNG1, 0.008: FULL, 0.016: FULL, 0.032: RUNG1, 0.064: RUNG1}
    final = {0.008: 2.0, 0.016: 2.1}
    return [Point(lr, tokens.get(round(lr, 6), RUNG0), final.get(round(lr, 6), loss), loss, f"t{k}")
            for k, (lr, loss) in enumerate(zip(lrs, rung_losses, strict=True))]


def test_grid_spans_the_searchs_range_as_the_estimate_counts():
    """quick_edge's golden search tried 0.00107 to 3.37: 13 LRs 2x apart, as its careful_baseline says."""
    lrs = grid_lrs(0.00107, 3.37)
    assert len(lrs) == 13
    assert lrs[0] == 0.00107 and lrs[-1] >= 3.37 > lrs[-2]
    assert all(b / a == pytest.approx(2.0) for a, b in zip(lrs, lrs[1:], strict=False))


def test_best_neighbours_and_failing_bracket_are_continued():
    points = after_asha()
    assert best_point(points, FULL, UNIGRAM).lr == pytest.approx(0.008)
    ends = bracket(points, FULL, UNIGRAM)
    assert [p.lr for p in ends] == pytest.approx([0.256, 0.512])  # judged at the first rung: 0.512 no better
    assert [p.lr for p in to_continue(points, FULL, UNIGRAM)] == pytest.approx([0.004, 0.256, 0.512])


def continued(points: list[Point], losses: dict[float, float]) -> list[Point]:
    """``points`` with the LRs of ``losses`` at the full budget, ending at that loss (inf: failed)."""
    ended = {round(lr, 6): loss for lr, loss in losses.items()}
    return [Point(p.lr, FULL, ended[round(p.lr, 6)], p.rung_loss) if round(p.lr, 6) in ended else p for p in points]


def test_a_stable_end_that_fails_at_the_full_budget_moves_the_bracket_down():
    points = continued(after_asha(), {0.004: 3.0, 0.256: math.inf, 0.512: math.inf})
    assert [p.lr for p in bracket(points, FULL, UNIGRAM)] == pytest.approx([0.128, 0.256])
    assert [p.lr for p in to_continue(points, FULL, UNIGRAM)] == pytest.approx([0.128])


def test_a_failing_end_that_trains_through_moves_the_bracket_up():
    points = continued(after_asha(), {0.004: 3.0, 0.256: 4.0, 0.512: 5.5})
    assert [p.lr for p in bracket(points, FULL, UNIGRAM)] == pytest.approx([0.512, 1.024])
    assert [p.lr for p in to_continue(points, FULL, UNIGRAM)] == pytest.approx([1.024])


def test_nothing_more_once_the_best_and_the_bracket_are_at_the_full_budget():
    points = continued(after_asha(), {0.004: 3.0, 0.256: 4.0, 0.512: math.inf})
    assert to_continue(points, FULL, UNIGRAM) == []


def test_a_better_neighbour_at_the_full_budget_becomes_the_best_and_its_own_neighbour_goes_on():
    points = continued(after_asha(), {0.004: 1.9, 0.256: 4.0, 0.512: math.inf})
    assert best_point(points, FULL, UNIGRAM).lr == pytest.approx(0.004)
    assert [p.lr for p in to_continue(points, FULL, UNIGRAM)] == pytest.approx([0.002])


@pytest.mark.parametrize(("resolution", "expected"), [(1.33, 2), (1.5, 1), (1.9, 1), (2.0, 0), (None, 0)])
def test_bisections_as_the_competent_baseline_counts(resolution, expected):
    assert bisections(0.5, 1.0, resolution) == expected


def test_further_seeds_at_the_best_and_the_bracket_ends():
    assert seed_orders([(0.008, 3), (0.128, 2), (0.256, 2)], 0) == [(0.008, 1), (0.008, 2), (0.128, 1), (0.256, 1)]
    assert seed_orders([(0.008, 1), (0.128, 0)], 5) == []
