import math

import numpy as np
import pandas as pd
import pytest

from lmtune.analysis.named_lrs import UsefulRange
from lmtune.errors import LmtuneError
from lmtune.findings.comparison import SENSITIVITY_LRS, first_growth
from lmtune.findings.stability import (
    TrialRecord,
    candidate_token_range,
    classify,
    divergence_lr,
    edge_ratio,
    edge_reading,
    edge_reading_range,
    spikes_of,
    tokens_to_reach,
)
from lmtune.findings.summary import sweep_summary


def best_trial_id(records):
    return sweep_summary(records).best_trial

ROWS = 60
STEP = 20
TOKENS_PER_STEP = 100
WARMUP_ROWS = 3
VOCAB = 245  # ℓ₀ = ln 245 = 5.50, just above where the synthetic curves start (5.0)
CONFIG = {"model": {"vocab_size": VOCAB, "context_length": TOKENS_PER_STEP},
          "train": {"steps": ROWS * STEP, "batch_size": 1}}


def smooth_loss(n=ROWS):
    return 2.0 + 3.0 * np.exp(-np.arange(n) / 12.0)


def make_record(trial_id, lr, outcome="completed", train=None, val=None, probes=None, **kwargs):
    """A metrics.csv-like curve: train loss every row, val loss at the rows given in ``val`` ({row: loss})."""
    train = smooth_loss() if train is None else np.asarray(train, dtype=float)
    n = len(train)
    steps = STEP * (np.arange(n) + 1)
    lr_col = np.where(np.arange(n) < WARMUP_ROWS, lr * (np.arange(n) + 1) / WARMUP_ROWS,
                      lr * (0.55 + 0.45 * np.cos(np.pi * (np.arange(n) - WARMUP_ROWS) / max(n - WARMUP_ROWS, 1))))
    val_col = np.full(n, np.nan)
    if val is None:  # evaluate every 10th row, val = train + 0.05
        val = {i: train[i] + 0.05 for i in range(9, n, 10)}
    for i, v in val.items():
        val_col[i] = v
    curve = pd.DataFrame({
        "step": steps, "tokens": steps * TOKENS_PER_STEP, "train_loss": train, "val_loss": val_col, "lr": lr_col,
        "grad_norm": np.ones(n), "tokens_per_s": np.full(n, 1000.0), "attn_logit_max": np.full(n, 5.0),
        "output_logit_max": np.full(n, 10.0), "output_logz_mean": np.full(n, 3.0), "elapsed_s": steps / 10.0,
    })
    for name, values in (probes or {}).items():
        curve[name] = values
    kwargs.setdefault("config", CONFIG)
    return TrialRecord(trial_id=trial_id, lr=lr, params={"lr": lr}, outcome=outcome, curve=curve, **kwargs)


# ---------------------------------------------------------------------------------------------
# classify on synthetic curves: diverged (failed to recover), spiked (came back), or the outcome


def test_smooth_decreasing_curve_is_completed():
    rec = make_record("smooth", 1e-3)
    assert spikes_of(rec) == [] and classify(rec) == "completed"


def test_small_noise_stays_completed():
    rng = np.random.default_rng(0)
    train = smooth_loss() * (1 + 0.02 * rng.standard_normal(ROWS))
    assert classify(make_record("noisy", 1e-3, train=train)) == "completed"


def test_a_30_percent_rise_that_comes_back_is_spiked_with_its_step_height_and_recovery():
    train = smooth_loss()
    train[30:38] *= 1.3
    rec = make_record("spiky", 3e-3, train=train)
    (spike,) = spikes_of(rec)
    assert spike.step == 31 * STEP and spike.recovered_after == 8 * STEP
    assert spike.height == pytest.approx(1.3 * smooth_loss()[30] / smooth_loss()[29])  # over the minimum before it
    assert classify(rec) == "spiked"
    # A run ASHA cut keeps its outcome; its spike stays in its row.
    cut = make_record("spiky-asha", 3e-3, outcome="stopped_early", train=train)
    assert classify(cut) == "stopped_early" and len(spikes_of(cut)) == 1


def test_oscillating_curve_is_spiked():
    i = np.arange(ROWS)
    train = smooth_loss() * (1 + 0.25 * np.sin(2 * np.pi * i / 12))
    assert classify(make_record("osc", 3e-3, train=train)) == "spiked"


def test_a_loss_far_above_its_initial_value_that_comes_back_is_spiked_not_diverged():
    train = smooth_loss()
    train[5:20] = 4 * math.log(VOCAB)  # four times ℓ₀ for 15 of 60 rows, then back down
    assert classify(make_record("recovers", 1e-2, train=train)) == "spiked"


def test_nan_loss_is_diverged_whatever_the_outcome():
    train = smooth_loss()
    train[45:] = np.nan
    assert classify(make_record("nan", 1e-2, outcome="diverged", train=train)) == "diverged"
    assert classify(make_record("nan2", 1e-2, outcome="completed", train=train)) == "diverged"
    inf_val = make_record("infval", 1e-2, val={9: 3.0, 19: math.inf})
    assert classify(inf_val) == "diverged"


def test_nan_val_loss_only_means_not_evaluated():
    rec = make_record("sparse-val", 1e-3)
    assert rec.curve["val_loss"].isna().sum() > 0
    assert classify(rec) == "completed"


def test_a_finite_loss_that_never_comes_back_below_its_initial_value_is_diverged():
    train = smooth_loss()
    train[30:] = train[30] * np.exp(np.arange(ROWS - 30) / 8.0)  # finite, far above the start
    assert train[-1] > 3 * train[0]
    assert classify(make_record("boom", 1e-2, outcome="diverged", train=train)) == "diverged"
    assert classify(make_record("boom2", 1e-2, outcome="completed", train=train)) == "diverged"


def test_other_outcomes_pass_through():
    for outcome in ("too_slow", "error", "running", "stopped_early"):
        assert classify(make_record(outcome, 1e-3, outcome=outcome)) == outcome


def test_unknown_outcome_is_rejected():
    with pytest.raises(LmtuneError, match="unknown outcome"):
        make_record("x", 1e-3, outcome="exploded")


# ---------------------------------------------------------------------------------------------
# Sweep-level numbers on a hand-built sweep


def val_at(final, best=None):
    """Val evaluations at rows 19, 39, 59 ending at ``final`` with minimum ``best`` (default: final)."""
    best = final if best is None else best
    return {19: final + 1.0, 39: best, 59: final}


def sweep():
    spiky = smooth_loss()
    spiky[30:38] *= 1.3
    nan_train = smooth_loss()
    nan_train[25:] = np.nan
    boom = smooth_loss()
    boom[20:] = boom[20] * np.exp(np.arange(ROWS - 20) / 6.0)
    return [
        make_record("t1", 1e-4, val=val_at(3.0)),
        make_record("t2", 3e-4, val=val_at(2.5)),
        make_record("t3", 1e-3, val=val_at(2.25, best=2.2)),
        make_record("t4", 3e-3, train=spiky, val=val_at(2.6)),
        make_record("t5", 1e-2, outcome="diverged", train=nan_train, val={19: 3.5}, stop_step=520,
                    reason="diverged at step 520, loss nan"),
        make_record("t6", 3e-2, outcome="diverged", train=boom, val={19: 6.0}),
    ]


def test_best_and_divergence_lr_and_edge():
    records = sweep()
    assert [classify(r) for r in records] == ["completed", "completed", "completed", "spiked", "diverged",
                                              "diverged"]
    assert best_trial_id(records) == "t3"
    assert divergence_lr(records) == 1e-2
    assert edge_ratio(1e-3, 1e-2) == pytest.approx(10.0)
    assert edge_ratio(1e-3, None) is None


def test_a_diverged_trial_is_never_best_even_with_a_lower_early_val():
    records = sweep() + [make_record("t7", 6e-3, outcome="diverged", val={9: 1.0})]
    assert best_trial_id(records) == "t3"
    assert divergence_lr(records) == 6e-3


def test_an_errored_trial_is_never_best_even_with_the_lowest_val():
    # A trial killed mid-run (no retries left) stopped a third of the way in: its loss says nothing of its LR.
    records = sweep() + [make_record("t8", 2e-3, outcome="error", train=smooth_loss()[:20], val={9: 1.0})]
    assert best_trial_id(records) == "t3"


def test_the_best_lr_is_decided_at_the_full_budget_not_on_an_early_loss():
    # ASHA cut "cut" at a third of the budget with a loss no full run reaches this early; it is not compared.
    full = make_record("full", 1e-3, val=val_at(2.2))
    cut = make_record("cut", 1e-4, outcome="stopped_early", train=smooth_loss()[:20], val={9: 4.0, 19: 1.5})
    summary = sweep_summary([full, cut])
    assert summary.best_trial == "full" and summary.candidate_tokens is None
    assert summary.best_tokens == summary.compared_at_tokens == ROWS * STEP * TOKENS_PER_STEP


def test_without_a_full_budget_trial_the_best_says_its_tokens_are_unequal():
    a = make_record("a", 1e-3, outcome="stopped_early", train=smooth_loss()[:20], val={9: 4.0, 19: 3.5})
    b = make_record("b", 1e-4, outcome="running", train=smooth_loss()[:40], val={9: 4.2, 39: 3.0})
    summary = sweep_summary([a, b])
    assert summary.best_trial == "b"
    assert summary.candidate_tokens == candidate_token_range([a, b])
    assert summary.candidate_tokens == (20 * STEP * TOKENS_PER_STEP, 40 * STEP * TOKENS_PER_STEP)
    assert summary.to_json()["candidate_tokens"] == [20 * STEP * TOKENS_PER_STEP, 40 * STEP * TOKENS_PER_STEP]


AS_GOOD_ABOVE = UsefulRange(top_lr=2e-3, best_lr=1e-3, next_lr=4e-3, margin=0.05, cost_at=((2, 0.01), (4, 0.3)),
                            top_seeds=3)
AS_GOOD_ON_ONE_SEED = UsefulRange(top_lr=2e-3, best_lr=1e-3, next_lr=4e-3, margin=0.05, cost_at=((2, 0.01), (4, 0.3)))
NOTHING_AS_GOOD_ABOVE = UsefulRange(top_lr=1e-3, best_lr=1e-3, next_lr=2e-3, margin=0.05, cost_at=((2, 0.07), (4, 0.8)))


@pytest.mark.parametrize("ratio, reading", [
    (4.0, "moderately below"), (3.0, "moderately below"),
    (2.0, "moderately below"), (1.5, "near the edge"), (1.3, "near the edge"), (1.25, "at the edge"),
    (1.0, "at the edge"), (0.8, "at the edge"), (0.5, "below 1"), (None, "no run diverged"),
])
def test_edge_reading(ratio, reading):
    assert edge_reading(ratio).startswith(reading)


def test_a_ratio_above_4_reads_conservative_only_where_a_larger_lr_was_measured_as_good():
    assert edge_reading(10.0, AS_GOOD_ABOVE).startswith("conservative")
    assert edge_reading(4.5, AS_GOOD_ABOVE).startswith("conservative")


def test_a_ratio_above_4_without_a_larger_lr_as_good_reads_not_conservative_with_the_measured_costs():
    reading = edge_reading(10.0, NOTHING_AS_GOOD_ABOVE)
    assert reading.startswith("far below divergence, yet not conservative")
    assert "2x the best LR costs +0.07 nats" in reading and "4x the best LR costs +0.80 nats" in reading


def test_a_larger_lr_as_good_on_one_seed_does_not_make_the_best_conservative():
    reading = edge_reading(10.0, AS_GOOD_ON_ONE_SEED)
    assert not reading.startswith("conservative") and "on one seed" in reading


def test_a_ratio_above_4_with_no_loss_measured_above_the_best_is_not_called_conservative():
    assert not edge_reading(10.0).startswith("conservative")


def test_an_edge_ratio_range_is_read_only_when_both_ends_read_the_same():
    assert edge_reading_range(20.0, 230.0, AS_GOOD_ABOVE).startswith("conservative")
    assert edge_reading_range(3.0, 30.0) is None
    assert edge_reading_range(20.0, None) is None


def test_lr_sensitivity_matches_the_hand_formula_on_the_fixed_grid():
    records = sweep()
    ell0 = 5.0
    # Full-budget losses 3.0, 2.5, 2.25, 2.6 at 1e-4, 3e-4, 1e-3, 3e-3; 1e-2 and up diverged (l0); l* = 2.25. On the
    # grid 1e-4, 10^-3.5, ..., 1: 10^-3.5 interpolated in log LR between 3e-4 and 1e-3; 10^-2.5 lies past the last LR
    # that trained and below the first that diverged: not measured, left out.
    between = 2.5 + (2.25 - 2.5) * math.log(10 ** -3.5 / 3e-4) / math.log(1e-3 / 3e-4)
    expected = np.mean([v - 2.25 for v in [3.0, between, 2.25, ell0, ell0, ell0, ell0, ell0]])
    found = sweep_summary(records, ell0=ell0).sensitivity
    assert found.value == pytest.approx(expected) and (found.lrs, found.points) == (8, 9)
    # Default l0: median first train loss = 5.0 (every synthetic curve starts at 2 + 3).
    assert sweep_summary(records).sensitivity.value == pytest.approx(expected)


def test_lr_sensitivity_averages_the_seeds_of_an_lr_and_caps_bad_losses_at_l0():
    records = [make_record("a", 1e-3, val=val_at(2.0)), make_record("b", 1e-3, val=val_at(2.4)),
               make_record("c", 1e-1, val=val_at(9.0))]
    # 1e-3 -> 2.2 (the mean of two seeds), 1e-1 -> min(9, 5) = 5; the grid's 1e-3 ... 1e-1 (five LRs) interpolated
    # between: 0, 0.7, 1.4, 2.1, 2.8 over the best; 10^-0.5 and 1 lie past what was measured.
    summary = sweep_summary(records, ell0=5.0)
    assert summary.sensitivity.value == pytest.approx(1.4)
    assert summary.sensitivity.lrs == 5


def test_lr_sensitivity_is_read_on_the_same_grid_whichever_lrs_were_trained():
    """issue 55: two sweeps of one loss curve, at different LRs, give one sensitivity (the curve is linear in log LR
    between the LRs both tried)."""
    def curve(lr: float) -> float:
        return 2.0 + 0.5 * abs(math.log10(lr / 1e-3))

    coarse = [make_record(f"c{i}", lr, val=val_at(curve(lr))) for i, lr in enumerate((1e-4, 1e-3, 1e-2))]
    fine = [make_record(f"f{i}", lr, val=val_at(curve(lr))) for i, lr in enumerate((1e-4, 3e-4, 1e-3, 2e-3, 1e-2))]
    one, other = (sweep_summary(r, ell0=5.0).sensitivity for r in (coarse, fine))
    assert one.lrs == other.lrs == 5 and one.value == pytest.approx(other.value, abs=0.02)
    assert sweep_summary(coarse, ell0=5.0).to_json()["lr_sensitivity_grid"] == list(SENSITIVITY_LRS)


def test_lr_sensitivity_leaves_out_trials_stopped_before_the_full_budget():
    records = sweep() + [make_record("cut", 5e-4, outcome="stopped_early", train=smooth_loss()[:20], val={19: 9.9})]
    assert sweep_summary(records, ell0=5.0).sensitivity.value == sweep_summary(sweep(), ell0=5.0).sensitivity.value


def test_tokens_to_reach_interpolates_linearly():
    rec = make_record("v", 1e-3, val={9: 4.0, 19: 3.0, 29: 2.0})
    t9, t19, t29 = (STEP * (i + 1) * TOKENS_PER_STEP for i in (9, 19, 29))
    assert tokens_to_reach(rec, 2.5) == pytest.approx((t19 + t29) / 2)
    assert tokens_to_reach(rec, 3.75) == pytest.approx(t9 + 0.25 * (t19 - t9))
    assert tokens_to_reach(rec, 3.0) == pytest.approx(t19)
    assert tokens_to_reach(rec, 4.5) == pytest.approx(t9)
    assert tokens_to_reach(rec, 1.0) is None


def test_convergence_compares_only_trials_that_trained_the_full_budget_at_the_basins_level():
    records = sweep() + [make_record("t3b", 1e-3, val={19: 3.0, 39: 2.3, 59: 2.28})]  # a second seed of the best
    table = sweep_summary(records).convergence
    assert table.level == pytest.approx(2.28)  # the basin (lr 1e-3, two seeds): its worse final loss
    by_id = {row.trial_id: row.tokens for row in table.rows}
    # val_at(final): rows 19 (final + 1), 39 (best), 59 (final); t3 = 3.25 -> 2.2 crosses 2.28 before row 39.
    t19, t39, t59 = (STEP * (i + 1) * TOKENS_PER_STEP for i in (19, 39, 59))
    assert by_id["t3"] == pytest.approx(t19 + (3.25 - 2.28) / (3.25 - 2.2) * (t39 - t19))
    assert by_id["t3b"] == pytest.approx(t59) and by_id["t1"] is None and by_id["t2"] is None
    assert set(by_id) == {"t1", "t2", "t3", "t3b", "t4"}  # the diverged ones never trained the whole budget
    assert [row.lr for row in table.rows] == sorted(row.lr for row in table.rows)


def test_first_growth_names_the_earliest_probe():
    best = make_record("best", 1e-3)
    grad = np.ones(ROWS)
    grad[19:] = 3.0  # > 2x from row 19 (step 400)
    attn = np.full(ROWS, 5.0)
    attn[9:] = 12.5  # > 2x from row 9 (step 200)
    broken = make_record("bad", 1e-2, probes={"grad_norm": grad, "attn_logit_max": attn})
    sentence = first_growth(broken, best)
    assert "attention-logit max grew first" in sentence and "step 200" in sentence
    assert "gradient norm at step 400" in sentence
    assert "output-logit max stayed within" in sentence
    assert "is the best trial" in first_growth(best, best)


def test_first_growth_does_not_claim_an_order_for_probes_crossing_at_the_same_logged_step():
    best = make_record("best", 1e-3)
    grad = np.ones(ROWS)
    grad[9:] = 3.0  # 3x from row 9 (step 200)
    attn = np.full(ROWS, 5.0)
    attn[9:] = 50.0  # 10x from the same row
    broken = make_record("bad", 1e-2, probes={"grad_norm": grad, "attn_logit_max": attn})
    sentence = first_growth(broken, best)
    assert "grew first" not in sentence
    assert "all exceeded 2x at the same logged step 200" in sentence
    assert "attention-logit max grew most, 10.0x" in sentence
    assert "gradient norm stayed within" not in sentence  # it crossed too, at the same step


def test_first_growth_handles_missing_and_quiet_probes():
    best = make_record("best", 1e-3)
    quiet = make_record("quiet", 3e-3)
    assert "none of" in first_growth(quiet, best)
    bare = make_record("bare", 1e-2)
    bare.curve = bare.curve.drop(columns=["attn_logit_max", "output_logit_max"])
    bare.curve["grad_norm"] = 5.0
    sentence = first_growth(bare, best)
    assert "gradient norm grew first" in sentence and "not logged" in sentence
    nothing = make_record("nothing", 1e-2)
    nothing.curve = nothing.curve.drop(columns=["attn_logit_max", "output_logit_max", "grad_norm"])
    assert "no stability probes" in first_growth(nothing, best)


def test_sweep_summary_headline_numbers_and_rows():
    records = sweep()
    summary = sweep_summary(records, target=2.3, ell0=5.0)
    assert summary.best_lr == 1e-3 and summary.best_trial == "t3"
    assert summary.best_val_loss == pytest.approx(2.25)  # at the full budget (its lowest, 2.2, came earlier)
    edge = summary.conclusion.edge
    assert edge.diverged_lr == 1e-2
    assert summary.edge_ratio == pytest.approx(10.0)
    assert summary.edge_reading.startswith("far below divergence, yet not conservative")
    assert summary.target.met is True and summary.target.trial == "t3"
    assert edge.stable_lr == 3e-3 and edge.ratio == pytest.approx(1e-2 / 3e-3)
    rows = {r.trial_id: r for r in summary.trials}
    assert rows["t4"].status == "spiked" and rows["t4"].max_spike_height == pytest.approx(1.3, rel=0.05)
    assert [s.trial_id for s in summary.spiked] == ["t4"]
    assert rows["t5"].status == "diverged" and rows["t5"].final_val_loss is None
    assert rows["t5"].stop_step == 520 and "nan" in rows["t5"].reason
    assert rows["t3"].final_val_loss == pytest.approx(2.25)
    assert rows["t1"].tokens == STEP * ROWS * TOKENS_PER_STEP
    assert rows["t1"].tokens_per_s == pytest.approx(1000.0)
    assert summary.status_counts == {"completed": 3, "spiked": 1, "diverged": 2}
    assert sweep_summary(records, target=2.25).target.met is True
    assert sweep_summary(records, target=2.2).target.met is False  # its best 2.2 came before the end
    assert sweep_summary(records).target.met is None


def test_sweep_summary_without_trials_is_a_user_error():
    with pytest.raises(LmtuneError):
        sweep_summary([])
