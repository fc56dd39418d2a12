"""Divergence as failure to recover, and spikes: lmtune.training.divergence on loss curves, synthetic and
measured (the quick model on the built-in corpus, quick_edge settings, trained without early stopping)."""

from __future__ import annotations

import math

import pytest

from lmtune.errors import LmtuneError
from lmtune.training.divergence import DivergenceRule, LossWatch, describe_spikes, judge

ELL0 = math.log(3801)  # the built-in corpus's vocabulary
STEPS = 162  # quick_edge's budget; rows every 6 steps
RULE = DivergenceRule(recovery_window=0.75)  # a window of 122 steps, for the rule's mechanics

# Train losses logged every 6 steps by the quick model at lr 1.478, seed 0 (benchmarks/lr_truth.py, quick_edge):
# above ℓ₀ from the start until step 108, then down to the unigram level.
MEASURED_1_478 = [12.7, 19.5, 35.1, 45.8, 49.5, 49.8, 49.8, 51.9, 41.0, 40.6, 38.1, 35.8, 28.1, 22.8, 20.2, 13.8,
                  10.6, 8.0, 8.4, 6.8, 6.3, 6.1, 5.9, 6.1, 5.9, 5.9, 5.8]
# The 4-layer d_model-256 model at lr 1.5, seed 0 (the same settings): above ℓ₀ until step 150 of 162, then back.
MEASURED_DEEP_1_5 = [18.4, 76.9, 135.1, 176.2, 189.5, 135.0, 140.2, 193.9, 166.1, 186.8, 136.2, 129.4, 75.8, 63.8,
                     73.5, 63.0, 46.0, 36.8, 52.5, 40.6, 33.0, 18.7, 11.3, 9.3, 6.9, 6.7, 6.2]
# ... and the quick model at lr 2.217, seed 1: above ℓ₀ for the whole budget.
MEASURED_2_217 = [18.8, 69.2, 115.3, 117.9, 183.1, 149.5, 169.0, 115.6, 133.8, 106.1, 125.6, 104.5, 138.6, 123.0,
                  264.7, 139.5, 136.5, 83.7, 74.1, 54.9, 79.0, 47.5, 31.6, 49.6, 56.5, 32.6, 19.7]


def rows(losses: list[float], every: int = 6) -> list[tuple[int, float]]:
    return [(every * (i + 1), loss) for i, loss in enumerate(losses)]


def healthy(n: int = 27) -> list[float]:
    """A loss falling from ℓ₀ to 2 with ±4% batch noise (the most healthy runs rose above their minimum)."""
    return [(2 + (ELL0 - 2) * math.exp(-i / 5)) * (1 + 0.04 * (-1) ** i) for i in range(n)]


def test_a_healthy_noisy_curve_neither_spikes_nor_diverges():
    watch = judge(rows(healthy()), ELL0, STEPS, STEPS, RULE)
    assert not watch.verdict.diverged and watch.all_spikes() == []


def test_the_measured_run_that_recovers_after_108_steps_above_the_initial_loss_is_spiked_not_diverged():
    watch = judge(rows(MEASURED_1_478), ELL0, STEPS, STEPS, RULE)
    assert not watch.verdict.diverged and not watch.verdict.stop
    (spike,) = watch.all_spikes()
    assert spike.step == 6 and spike.peak_step == 48 and spike.height == pytest.approx(51.9 / ELL0)
    assert spike.recovered_after == 108 - 6  # back within 10% of ℓ₀, its running minimum then


def test_the_measured_run_above_the_initial_loss_for_the_whole_window_diverges_where_the_window_ends():
    watch = LossWatch(ELL0, STEPS, RULE)
    verdicts = [watch.see(step, loss) for step, loss in rows(MEASURED_2_217)]
    fired = next(i for i, v in enumerate(verdicts) if v.stop)
    assert rows(MEASURED_2_217)[fired][0] == 126 and RULE.window_steps(STEPS) == 122
    assert verdicts[fired].diverged and verdicts[fired].step == 126
    assert "not back within the recovery window of 122 steps" in verdicts[fired].reason
    assert not any(v.diverged for v in verdicts[:fired])


def test_by_default_a_run_that_comes_back_after_89_percent_of_its_budget_is_spiked_not_diverged():
    """Why the default window is the whole budget: the deepest measured recovery came after 144 of 162 steps
    above ℓ₀, so every shorter window, 0.75 included, would have called a run that recovers diverged."""
    assert not judge(rows(MEASURED_DEEP_1_5), ELL0, STEPS, STEPS).verdict.diverged
    assert judge(rows(MEASURED_DEEP_1_5), ELL0, STEPS, STEPS, RULE).verdict.diverged
    assert judge(rows(MEASURED_1_478), ELL0, STEPS, STEPS, DivergenceRule(recovery_window=0.6)).verdict.diverged


def test_by_default_the_stopper_ends_a_finite_run_only_at_its_last_row():
    watch = LossWatch(ELL0, STEPS)
    verdicts = [watch.see(step, loss) for step, loss in rows(MEASURED_2_217)]
    assert not any(v.stop for v in verdicts[:-1]) and verdicts[-1].stop and verdicts[-1].step == STEPS


def test_a_non_finite_loss_diverges_and_stops_at_once():
    watch = judge(rows([7.0, 6.0, math.nan]), ELL0, STEPS, STEPS, RULE)
    assert watch.verdict.diverged and watch.verdict.stop and watch.verdict.step == 18
    assert watch.verdict.reason == "non-finite loss at step 18"


def test_a_budget_that_ends_above_the_initial_loss_has_diverged_even_inside_the_window():
    late = healthy(20) + [9.0, 12.0, 15.0, 14.0, 13.0, 12.0, 11.0]  # rises above ℓ₀ at step 126 and stays
    watch = judge(rows(late), ELL0, STEPS, STEPS, RULE)
    assert watch.verdict.diverged and not watch.verdict.stop
    assert "budget ended with the loss 11 still above" in watch.verdict.reason


def test_a_run_stopped_above_the_initial_loss_before_its_window_ran_out_is_undecided():
    watch = judge(rows([12.0, 20.0, 15.0]), ELL0, STEPS, steps_trained=18, rule=RULE)
    assert not watch.verdict.diverged and watch.verdict.undecided


def test_with_a_stop_factor_the_stopper_waits_for_the_loss_to_stay_above_that_multiple():
    rule = DivergenceRule(recovery_window=0.25, stop_factor=2.0)  # 41 steps
    losses = [1.5 * ELL0] * 10 + [3 * ELL0] * 17  # above ℓ₀ throughout, above 2 ℓ₀ from step 66
    watch = LossWatch(ELL0, STEPS, rule)
    verdicts = [watch.see(step, loss) for step, loss in rows(losses)]
    first_diverged = next(rows(losses)[i][0] for i, v in enumerate(verdicts) if v.diverged)
    first_stop = next(rows(losses)[i][0] for i, v in enumerate(verdicts) if v.stop)
    assert first_diverged == 42 and first_stop == 102  # 60 + 42: above 2 ℓ₀ since step 60, its last row below


def test_a_resumed_watch_caught_up_on_the_kept_rows_judges_as_one_that_saw_them_all():
    whole = judge(rows(MEASURED_2_217), ELL0, STEPS, STEPS, RULE)
    resumed = LossWatch(ELL0, STEPS, RULE)
    for step, loss in rows(MEASURED_2_217)[:9]:  # the rows before a checkpoint at step 54
        resumed.see(step, loss)
    for step, loss in rows(MEASURED_2_217)[9:]:
        if resumed.see(step, loss).diverged:
            break
    resumed.finish(STEPS)
    assert resumed.verdict == whole.verdict and resumed.record() == whole.record()


def test_row_fields_show_a_spike_as_a_rise_over_the_running_minimum():
    watch = LossWatch(ELL0, STEPS, RULE)
    watch.see(6, 4.0)
    watch.see(12, 6.0)
    fields = watch.row_fields()
    assert fields["loss_over_min"] == pytest.approx(1.5) and fields["above_init_steps"] == 0
    watch.see(18, 10.0)
    assert watch.row_fields()["above_init_steps"] == 6  # above ℓ₀ since its last row below (step 12)


def test_spikes_are_described_in_one_line():
    watch = judge(rows(MEASURED_1_478), ELL0, STEPS, STEPS, RULE)
    assert describe_spikes(watch.all_spikes()) == "spiked once (step 6: 6.3x its running minimum, back after 102 steps)"


@pytest.mark.parametrize("key, value, fragment", [
    ("recovery_window", 0.0, "stopper.recovery_window: must be a fraction"),
    ("recovery_window", 1.5, "stopper.recovery_window: must be a fraction"),
    ("stop_factor", 0.5, "stopper.stop_factor: must be >= 1"),
    ("spike_threshold", -0.1, "stopper.spike_threshold: must be > 0"),
])
def test_rules_no_judgement_could_use_are_refused_naming_the_key(key, value, fragment):
    with pytest.raises(LmtuneError, match=fragment):
        DivergenceRule(**{key: value}).validate()


def test_a_run_that_ends_its_budget_above_the_initial_loss_ends_as_diverged_over_its_whole_budget():
    from lmtune.training.divergence import WHOLE_RUN
    from lmtune.training.loop import RunEnd, judged_end

    watch = LossWatch(ELL0, STEPS)
    for step, loss in rows(MEASURED_2_217):
        watch.see(step, loss)
    end = judged_end(RunEnd(), watch, STEPS)
    assert (end.status, end.divergence, end.diverged_step) == ("diverged", WHOLE_RUN, STEPS)
    assert "above ℓ₀" in end.reason


def test_an_interrupted_run_is_not_judged_by_the_part_it_trained():
    from lmtune.training.loop import RunEnd, judged_end

    watch = LossWatch(ELL0, STEPS)
    for step, loss in rows(MEASURED_2_217)[:10]:
        watch.see(step, loss)
    stopped = RunEnd("stopped", "interrupted at step 60")
    assert judged_end(stopped, watch, 60) is stopped
