"""A compare search's batch-size variants read together, Ray-free, from runs written by hand whose best LR follows
LR* ∝ B^k: the fitted k and its interval, the rules it allows, the loss and throughput per batch; an ablation is
left out of the batch reading, and fewer than two batch sizes give none."""

from __future__ import annotations

import math

import pytest

from lmtune.analysis.runs import Budget, Run
from lmtune.searches.compare.comparison import compare_variants, with_batches
from lmtune.searches.compare.settings import CompareSettings, Variant

BUDGET = Budget(steps=64, warmup_steps=8, tokens_per_step=16 * 64, seed=0, rungs=(64 * 16 * 64,), batch_size=16)
TOKENS = BUDGET.full_tokens
NOISE = (-0.004, 0.0, 0.004)  # three seeds' offsets
GRID = tuple(0.001 * 2 ** (i / 2) for i in range(14))  # 0.001 to 0.09, √2 apart


def batch_reading(result, speeds):
    return with_batches(result, speeds).batch


def runs(best_lr: float, floor: float = 2.0) -> list[Run]:
    """Three seeds at each grid LR of a parabola in ln LR around ``best_lr`` (the same tokens at every batch)."""
    return [Run(lr, seed, "coarse", TOKENS, TOKENS, "completed", TOKENS,
                {TOKENS: floor + 0.1 * math.log(lr / best_lr) ** 2 + offset})
            for lr in GRID for seed, offset in enumerate(NOISE)]


def batches(k: float, sizes=(8, 16, 64), ablation: bool = False):
    """A compare result of batch-size variants (16 the reference) whose best LR is 0.01 x (B/16)^k."""
    variants = [Variant("reference")] + [Variant(f"b{b}", {"batch_size": b}) for b in sizes if b != 16]
    by_name = {"reference": runs(0.01)} | {f"b{b}": runs(0.01 * (b / 16) ** k, 2.0 + 0.01 * math.log2(b / 16))
                                           for b in sizes if b != 16}
    if ablation:
        variants.append(Variant("no_norm", {"norm": "none"}))
        by_name["no_norm"] = runs(0.003)
    return compare_variants(by_name, CompareSettings(tuple(variants)), BUDGET)


@pytest.mark.parametrize("k", [0.5, 1.0])
def test_the_fitted_exponent_is_the_one_the_best_lrs_follow_and_its_interval_holds_it(k):
    scaling = batch_reading(batches(k), {})
    assert scaling.exponent == pytest.approx(k, abs=0.1)
    low, high = scaling.exponent_interval
    assert low < k < high


def test_the_rules_allowed_are_those_inside_the_exponents_interval():
    scaling = batch_reading(batches(0.5, sizes=(4, 16, 64, 256)), {})
    assert scaling.rules_allowed() == {"square-root": True, "linear": False}


def test_each_batch_size_carries_its_loss_at_its_best_lr_and_its_throughput():
    scaling = batch_reading(batches(0.5), {"reference": 900.0, "b8": 500.0, "b64": 2000.0})
    assert [p.batch_size for p in scaling.points] == [8, 16, 64]
    assert [p.tokens_per_s for p in scaling.points] == [500.0, 900.0, 2000.0]
    assert [p.seeds for p in scaling.points] == [3, 3, 3]
    assert scaling.points[2].loss > scaling.points[0].loss  # the floors rise with the batch


def test_an_ablation_is_left_out_of_the_batch_reading():
    scaling = batch_reading(batches(0.5, ablation=True), {})
    assert "no_norm" not in [p.variant for p in scaling.points]


def test_fewer_than_two_batch_sizes_give_no_batch_reading():
    result = compare_variants({"reference": runs(0.01), "no_norm": runs(0.003)},
                              CompareSettings((Variant("reference"), Variant("no_norm", {"norm": "none"}))), BUDGET)
    assert batch_reading(result, {}) is None


def test_a_batch_whose_best_lr_is_at_the_end_of_its_lrs_is_shown_but_not_fitted():
    cut = [r for r in runs(0.02 * 4) if r.lr <= 0.02]  # its best beyond its largest LR: not bounded
    result = compare_variants({"reference": runs(0.01), "b64": cut},
                              CompareSettings((Variant("reference"), Variant("b64", {"batch_size": 64}))), BUDGET)
    scaling = batch_reading(result, {})
    assert len(scaling.points) == 2 and scaling.law is None and "two or more batch sizes" in scaling.why_no_law
