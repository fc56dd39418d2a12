"""benchmarks/truth_rules.py, the truth's own rules (issue 58 item 5): each pinned on a small hand-built run list
whose answer can be read off it, and benchmarks/truth.py judging by them rather than by lmtune's analysis."""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass
from pathlib import Path

import pytest

from benchmarks import truth_rules as rules
from benchmarks.truth import truth_conclusion

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SD = 0.01  # each hand-built LR's three seeds: mean - SD, mean, mean + SD (sample standard deviation exactly SD)


@dataclass
class Ended:
    """A run as the rules read it."""

    lr: float
    seed: int
    end_val: float | None
    failed: bool = False
    baseline: float | None = None


def three_seeds(means: dict[float, float], baseline: float | None = None) -> list[Ended]:
    return [Ended(lr, seed, mean + offset, baseline=baseline)
            for lr, mean in means.items() for seed, offset in enumerate((-SD, 0.0, SD))]


# ---------------------------------------------------------------------------------------------
# A run: diverged, untrained, failed


@pytest.mark.parametrize(("non_finite", "last", "verdict"), [
    pytest.param(False, 5.0, False, id="ended-below-ell0"),
    pytest.param(False, 5.55, False, id="ended-at-ell0"),
    pytest.param(False, 5.6, True, id="ended-above-ell0"),
    pytest.param(False, math.nan, True, id="last-loss-nan"),
    pytest.param(True, 3.0, True, id="grad-norm-went-non-finite"),
])
def test_a_run_diverged_when_non_finite_or_ending_above_ell0(non_finite, last, verdict):
    assert rules.diverged(non_finite, last, 5.55) is verdict


def test_a_run_ending_no_better_than_the_baseline_fails_only_above_an_lr_that_came_through():
    """0.001 ends above the baseline (too slow), 0.01 comes through, 0.1 ends above it: only 0.1 fails."""
    runs = [Ended(0.001, 0, 6.0, baseline=5.67), Ended(0.01, 0, 4.0, baseline=5.67),
            Ended(0.1, 0, 5.67, baseline=5.67)]
    assert [r.lr for r in rules.failed_runs(runs)] == [0.1]
    assert rules.failing_bracket(runs) == (0.01, 0.1)
    assert rules.divergence_bracket(runs) == (0.1, None)  # (ending untrained is no divergence)


def test_without_a_known_baseline_a_run_fails_only_by_diverging():
    runs = [Ended(0.01, 0, 4.0), Ended(0.1, 0, 9.0), Ended(1.0, 0, None, failed=True)]
    assert [r.lr for r in rules.failed_runs(runs)] == [1.0]
    assert rules.failing_bracket(runs) == rules.divergence_bracket(runs) == (0.1, 1.0)


def test_the_failing_bracket_is_the_first_failing_lr_and_the_largest_lr_below_it_that_came_through():
    """One seed of 0.04 fails, both of 0.16 do; 0.08 came through above the first failure: the bracket is still
    (0.02, 0.04]."""
    runs = [Ended(0.01, 0, 3.0), Ended(0.02, 0, 3.1), Ended(0.04, 0, None, failed=True), Ended(0.04, 1, 3.3),
            Ended(0.08, 0, 3.5), Ended(0.16, 0, None, failed=True), Ended(0.16, 1, None, failed=True)]
    assert rules.failing_bracket(runs) == (0.02, 0.04)
    assert rules.failing_bracket(runs[:2]) == (0.02, None)


# ---------------------------------------------------------------------------------------------
# The best LR and its basin


def test_the_best_lr_is_the_lowest_mean_and_an_lr_where_a_seed_failed_is_no_candidate():
    """0.02's surviving seeds are the lowest of all, but its seed 2 diverged: the best is 0.01."""
    runs = [*three_seeds({0.005: 2.2, 0.01: 2.0, 0.04: 2.3}), Ended(0.02, 0, 1.5), Ended(0.02, 1, 1.6),
            Ended(0.02, 2, None, failed=True)]
    ranked = rules.ranking(runs)
    assert [r.lr for r in ranked] == [0.01, 0.005, 0.04]
    assert ranked[0].losses == pytest.approx((1.99, 2.0, 2.01)) and ranked[0].mean == pytest.approx(2.0)


def test_an_lr_whose_runs_did_not_reach_the_end_of_their_budget_counts_only_the_runs_that_did():
    runs = [*three_seeds({0.01: 2.0}), Ended(0.02, 0, 1.9), Ended(0.02, 1, None)]
    assert {r.lr: r.seeds for r in rules.ranking(runs)} == {0.01: (0, 1, 2), 0.02: (0,)}


def test_the_seed_spread_is_pooled_over_the_lrs_within_4x_of_the_best():
    """Within 4x of the best (0.01) every LR's seeds differ by SD; at 0.08 (8x) by 10 SD: left out."""
    runs = [*three_seeds({0.0025: 2.2, 0.01: 2.0, 0.04: 2.1}),
            *(Ended(0.08, seed, 2.5 + offset) for seed, offset in enumerate((-10 * SD, 0.0, 10 * SD)))]
    sigma, lrs = rules.pooled_spread(rules.ranking(runs))
    assert sigma == pytest.approx(SD) and sorted(lrs) == [0.0025, 0.01, 0.04]
    assert rules.pooled_spread(rules.ranking([Ended(0.01, 0, 2.0)])) == (None, [])


def test_the_basin_is_the_contiguous_lrs_within_two_standard_errors_of_the_best():
    """2 SE of a difference of two 3-seed means is 2 SD sqrt(2/3) = 0.0163: 0.005 (+0.015) is in, 0.02 (+0.017)
    out, and 0.04 (+0.001) beyond it is out too, the basin being contiguous."""
    two_se = 2 * SD * math.sqrt(2 / 3)
    ranked = rules.ranking(three_seeds({0.0025: 2.1, 0.005: 2.015, 0.01: 2.0, 0.02: 2.017, 0.04: 2.001}))
    sigma, _ = rules.pooled_spread(ranked)
    assert rules.margin(ranked[0], ranked[0], sigma) == pytest.approx(two_se)
    assert [r.lr for r in rules.basin(ranked, sigma)] == [0.005, 0.01]


def test_without_a_seed_spread_the_basin_holds_only_lrs_no_worse_than_the_best():
    ranked = rules.ranking([Ended(0.005, 0, 2.0), Ended(0.01, 0, 2.0), Ended(0.02, 0, 2.0001)])
    assert [r.lr for r in rules.basin(ranked, None)] == [0.005, 0.01]


# ---------------------------------------------------------------------------------------------
# benchmarks/truth.py judges by these rules


def test_the_truths_conclusion_reads_its_best_basin_and_edge_off_the_rules():
    """Seeds ±SD: the best 0.01, its basin 0.005-0.02; 0.16 ends no better than the baseline (2.5), above LRs that
    came through: the first failing LR, so 0.08 is the top of the degraded region."""
    means = {0.0025: 2.2, 0.005: 2.005, 0.01: 2.0, 0.02: 2.01, 0.04: 2.2, 0.08: 2.4, 0.16: 2.6}
    truth = truth_conclusion(three_seeds(means, baseline=2.5))
    assert truth["best_lr"] == 0.01 and truth["best_lr_mean_loss"] == pytest.approx(2.0)
    assert truth["basin"]["lrs"] == [0.005, 0.01, 0.02] and truth["basin"]["high"] == [0.02, 0.04]
    assert (truth["failing_lr_low"], truth["failing_lr"]) == (0.08, 0.16) and truth["divergence_lr"] is None
    assert truth["degraded"]["low"] == [0.02, 0.04] and truth["degraded"]["high"] == [0.08, 0.16]
    assert [row["lr"] for row in truth["ranking"]] == [0.01, 0.005, 0.02, 0.0025, 0.04, 0.08]
    assert truth["grid"][-1] == {"lr": 0.16, "seeds_through": [], "seeds_failed": [0, 1, 2]}


def _imported_modules(path: Path) -> list[str]:
    modules = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Import):
            modules += [alias.name for alias in node.names]
    return modules


def test_the_truth_imports_no_judging_function_from_lmtune():
    """Done when of issue 58 item 5: benchmarks/truth.py imports nothing of lmtune's analysis nor its divergence
    rule (at module level or inside a function), and the rules it judges by import nothing of lmtune at all."""
    judging = ("lmtune.analysis", "lmtune.training.divergence")
    truth = _imported_modules(BENCHMARKS / "truth.py")
    assert "benchmarks.truth_rules" in truth  # (the parse saw its imports)
    assert [m for m in truth if m.startswith(judging)] == []
    assert [m for m in _imported_modules(BENCHMARKS / "truth_rules.py") if m.startswith("lmtune")] == []
