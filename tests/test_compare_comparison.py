"""How a compare search's report judges a variant against the reference, Ray-free, from runs written by hand: the
difference of the two best means against Student's t at the 2-SE level (better, worse, or not distinguishable, with
the seeds that would resolve it), the variant's loss at the reference's best LR (diverged runs counted apart), and
whether the optimum moved."""

from __future__ import annotations

import math

import pytest

from lmtune.analysis.locate import t_quantile
from lmtune.analysis.runs import Budget, Run, spread_lrs
from lmtune.searches.compare.comparison import BETTER, NO_SPREAD, UNRESOLVED, WORSE, compare_variants
from lmtune.searches.compare.settings import CompareSettings, Variant

BUDGET = Budget(steps=100, warmup_steps=10, tokens_per_step=1000, seed=0, rungs=(100_000,), batch_size=10)
SETTINGS = CompareSettings((Variant("reference"), Variant("change", {"norm": "none"})))
NOISE = (-0.01, 0.0, 0.01)  # three seeds' offsets: sd 0.01


def runs(best_lr: float, floor: float, lrs=(0.0025, 0.005, 0.01, 0.02, 0.04), diverge_from: float = 1.0) -> list[Run]:
    out = []
    for lr in lrs:
        for seed, offset in enumerate(NOISE):
            diverged = lr >= diverge_from
            loss = floor + 0.2 * math.log(lr / best_lr) ** 2 + offset
            out.append(Run(lr, seed, "coarse", 100_000, 100_000, "diverged" if diverged else "completed", 100_000,
                           {} if diverged else {100_000: loss}))
    return out


def result(change: list[Run]):
    return compare_variants({"reference": runs(0.01, 2.0), "change": change}, SETTINGS, BUDGET)


def test_a_variant_clearly_lower_at_its_own_best_is_better_whatever_its_loss_at_the_references_lr():
    compared = result(runs(0.0025, 1.9))
    compared, reference = compared.variants[1], compared.reference
    assert compared.difference.verdict == BETTER and compared.difference.value == pytest.approx(-0.1)
    assert compared.at_reference.mean == pytest.approx(1.9 + 0.2 * math.log(4) ** 2)
    assert compared.optimum_moved(reference) is True  # basins 0.0025 and 0.01: apart


def test_a_variant_clearly_higher_is_worse():
    assert result(runs(0.01, 2.1)).variants[1].difference.verdict == WORSE


def test_a_difference_within_the_threshold_is_not_distinguishable_and_says_how_many_seeds_would_resolve_it():
    difference = result(runs(0.01, 2.012)).variants[1].difference
    assert difference.verdict == UNRESOLVED
    # t(dof) * sqrt((0.01^2 + 0.01^2) / n) < 0.012, each seed a degree of freedom more: from n = 7 (at 2 SE flat: 6)
    assert difference.seeds_to_resolve == 7


def test_the_threshold_is_students_t_at_the_2_se_level_for_the_spreads_degrees_of_freedom():
    compared = result(runs(0.01, 2.012))
    difference = compared.variants[1].difference
    # the degrees of freedom of each side's pooled spread: 2 per 3-seed LR it pools
    dof = sum(len(r.losses) - 1 for v in compared.variants for r in spread_lrs(list(v.conclusion.ranking)))
    assert dof >= 4 and dof % 2 == 0
    assert difference.threshold == pytest.approx(t_quantile(dof, 2.0) * difference.se)
    assert difference.threshold > 2 * difference.se
    same = result(runs(0.01, 2.012))
    assert same.variants[1].optimum_moved(same.reference) is False


def test_without_a_seed_spread_no_verdict_is_given():
    single = [r for r in runs(0.01, 2.1) if r.seed == 0]
    assert result(single).variants[1].difference.verdict == NO_SPREAD


def test_runs_that_diverge_at_the_references_lr_are_counted_apart_from_the_losses():
    compared = result(runs(0.0025, 2.0, diverge_from=0.01)).variants[1]
    assert compared.at_reference.losses == () and compared.at_reference.diverged == 3
    assert compared.conclusion.edge.diverged_lr == 0.01


def test_the_reference_is_judged_against_nothing():
    reference = result(runs(0.01, 2.1)).reference
    assert reference.difference is None and reference.at_reference is None


def test_the_reports_row_of_a_largest_batch_variant_says_its_batch_and_what_it_fitted():
    from lmtune.searches.compare.report import _row

    settings = CompareSettings((Variant("reference"), Variant("big", {"batch_size": 20, "steps": 50}, ("steps",),
                                                              "the largest that fits this cuda's 71.4 GiB usable")))
    big = compare_variants({"reference": runs(0.01, 2.0), "big": runs(0.01, 2.0)}, settings, BUDGET).variants[1]
    assert _row(big, is_reference=False)[1] == ("batch_size 20 (50 steps) (the largest that fits this cuda's "
                                                "71.4 GiB usable)")
