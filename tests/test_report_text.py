"""What the report and the CLIs' last lines say in words, on small constructed sweeps: a range too wide to be an
answer is called unresolved (with what would resolve it), an end no LR found is said in words, the degraded
region's rate says what it rests on, and each run at the edge's stable end is described as it ended."""

from __future__ import annotations

from lmtune.analysis.bracket import THROUGH, bracket, edge_confirmation
from lmtune.analysis.conclusion import conclude
from lmtune.analysis.runs import Budget, Run
from lmtune.findings.text import interval_line, ratio_range_text
from lmtune.report.headline import region_lines

BUDGET = Budget(steps=150, warmup_steps=15, tokens_per_step=1024, seed=0, rungs=(16896, 50688, 153600))
FULL = BUDGET.full_tokens


def run(lr: float, loss: float | None, outcome: str = "completed", seed: int = 0, tokens: int = FULL) -> Run:
    """A run of the constructed sweep: ``loss`` its val loss where it stopped (None: none, it diverged)."""
    return Run(lr, seed, "grid", FULL, FULL, outcome, tokens, {} if loss is None else {tokens: loss})


def quick_grid_asha_cut() -> list[Run]:
    """`--space quick` as ASHA left it: only 0.003 and the best, 0.01, trained their whole budget; the LRs
    between the best and 300 (which goes non-finite) were cut at the first rung."""
    cut = [run(lr, 4.0, "stopped_early", tokens=BUDGET.rungs[0]) for lr in (1e-4, 1e-3, 1.0)]
    return [*cut, run(0.003, 2.6), run(0.01, 2.4), run(300.0, None, "diverged", tokens=3072)]


def test_a_best_lr_interval_of_ten_decades_reads_not_resolved_and_names_what_would_resolve_it():
    line = interval_line(*conclude(quick_grid_asha_cut(), BUDGET).best_lr_interval)
    assert line.startswith("the best LR is not resolved by this grid (the nearest LRs clearly worse, 0.003 and 300")
    assert "train more seeds at the LRs around the best, or a finer grid without early stopping" in line


def test_an_edge_ratio_range_of_ten_decades_reads_not_resolved():
    text = ratio_range_text(*conclude(quick_grid_asha_cut(), BUDGET).edge_ratio_range)
    assert text.startswith("not resolved by this grid (its ends, 3.33e-05 and 1e+05") and "between" not in text


def test_a_best_lr_between_the_two_neighbours_of_a_decade_grid_is_still_an_answer():
    assert interval_line(0.001, 0.01) == "the best LR lies between 0.001 and 0.01 (the nearest LRs clearly worse)"


def horizon_target_runs() -> list[Run]:
    """The horizon search's target stage on the built-in corpus: three one-seed runs, the best the lowest."""
    return [run(0.003165, 1.6678), run(0.00633, 1.6715), run(0.01266, 1.6682)]


def test_a_basin_end_that_no_lr_found_is_said_in_words_not_as_a_question_mark():
    basin_line = region_lines(conclude(horizon_target_runs(), BUDGET).landscape)[0]
    assert "?" not in basin_line
    assert "its lower end lies below 0.00316 (not found: no LR tried beyond it)" in basin_line


def test_the_rate_from_three_one_seed_lrs_names_them_and_prints_no_plus_minus():
    degraded_line = region_lines(conclude(horizon_target_runs(), BUDGET).landscape)[1]
    assert "±" not in degraded_line
    assert "on average over 3 one-seed LRs (between neighbouring LRs -0.0033 to +0.0037)" in degraded_line


def test_the_rate_from_two_one_seed_lrs_says_it_has_no_error():
    degraded_line = region_lines(conclude(horizon_target_runs()[:2], BUDGET).landscape)[1]
    assert "nats per doubling of the LR (from 2 one-seed LRs: no error)" in degraded_line and "±" not in degraded_line


def test_each_run_at_the_edges_stable_end_is_described_as_it_ended():
    """At 0.3 seed 0 trained through, seed 1 was cut by ASHA and seed 2 is still training: only the first
    proves the LR trains through."""
    runs = [run(0.3, 3.0), run(0.3, 4.0, "stopped_early", seed=1, tokens=BUDGET.rungs[0]),
            run(0.3, 4.2, None, seed=2, tokens=BUDGET.rungs[1]), run(0.6, None, "diverged", tokens=FULL)]
    ends = {end.seed: end.how for end in edge_confirmation(runs, bracket(runs)).stable_end}
    assert ends[0] == THROUGH
    assert ends[1].startswith("stopped early (cut by the scheduler) at 16,896 of 153,600 tokens")
    assert ends[2] == "still training (50,688 tokens so far)"


def test_a_degraded_region_with_no_round_multiple_of_the_best_lr_states_its_rate_without_a_gap():
    """The degraded region holds one LR, 1.5x the best: no multiple of the best (2x, 4x, ...) lies within the LRs
    tried, so only its rate is said (the line once read "loss over the best's  the best LR")."""
    runs = [run(lr, loss, seed=s) for lr, loss in ((0.00425, 1.95), (0.0085, 1.84), (0.0127, 1.89)) for s in (0, 1)]
    degraded = conclude(runs, BUDGET).landscape
    assert degraded.degraded is not None and degraded.degraded.excess_at == ()
    line = region_lines(degraded)[-1]
    assert line.startswith("degraded: +") and "over the best's" not in line


def test_a_basin_of_one_lr_is_named_alone_not_as_a_span_from_it_to_itself():
    """Three seeds at each LR, the best's neighbours clearly worse: the basin holds the best LR only."""
    losses = {0.003: 2.60, 0.01: 2.40, 0.03: 2.62}
    runs = [run(lr, loss + 0.002 * seed, seed=seed) for lr, loss in losses.items() for seed in (0, 1, 2)]
    basin_line = region_lines(conclude(runs, BUDGET).landscape)[0]
    assert basin_line.startswith("basin (within 2 SE of the best): lr 0.01 alone;"), basin_line
