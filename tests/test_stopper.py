"""The trial stopper, the persistent ASHA and the ledger's writer on their own: fed result dicts
directly, no Ray cluster.

PersistentASHA is Ray's own AsyncHyperBandScheduler; the tests call its methods with lmtune-shaped
results and minimal trial objects (it only reads ``trial_id``) — Ray's code runs unmodified.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

import pytest
from ray.tune.schedulers import TrialScheduler

from lmtune.private_apis import asha_rungs
from lmtune.sweep.asha_scheduler import PersistentASHA
from lmtune.sweep.record import asha_state_path, ledger_path, read_outcomes
from lmtune.sweep.stopping import OutcomeRecorder, TrialStopper

UNIFORM = math.log(8192)  # ln(vocab): the loss of an untrained model


def result(step: int, loss: float, *, grad_norm: float = 1.0, warmup: bool = False, rate: float = 50_000.0,
           tokens_per_step: int = 1024, total_steps: int = 1000, **extra) -> dict:
    return {"step": step, "train_loss": loss, "grad_norm": grad_norm, "in_warmup": warmup, "tokens_per_s": rate,
            "tokens": step * tokens_per_step, "total_tokens": total_steps * tokens_per_step,
            "uniform_loss": UNIFORM, **extra}


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    """The ledger of a sweep folder ``tmp_path`` (its parent's parent is the sweep)."""
    return ledger_path(tmp_path)


def stopper_for(ledger: Path, **settings) -> TrialStopper:
    return TrialStopper(OutcomeRecorder(ledger), **settings)


def outcomes(ledger: Path) -> dict[str, dict]:
    return read_outcomes(ledger.parent.parent)


def feed(stopper: TrialStopper, trial_id: str, results: list[dict]) -> int | None:
    """Call the stopper like Tune does; the index of the result that stopped the trial, or None."""
    for i, r in enumerate(results):
        if stopper(trial_id, r):
            return i
    return None


def test_non_finite_loss_is_diverged(ledger: Path):
    stopper = stopper_for(ledger)
    assert feed(stopper, "t1", [result(10, 8.0, warmup=True), result(20, 6.0)]) is None
    assert stopper("t1", result(30, float("nan")))
    entry = outcomes(ledger)["t1"]
    assert entry["outcome"] == "diverged"
    assert entry["step"] == 30
    assert entry["reason"] == "diverged at step 30, loss nan"


def test_infinite_loss_during_warmup_is_diverged(ledger: Path):
    # Non-finite stops at once, even in warm-up.
    stopper = stopper_for(ledger)
    assert stopper("t1", result(5, float("inf"), warmup=True))
    assert outcomes(ledger)["t1"]["outcome"] == "diverged"


def test_non_finite_grad_norm_is_diverged(ledger: Path):
    stopper = stopper_for(ledger)
    assert not stopper("t1", result(10, 7.5))
    assert stopper("t1", result(20, 7.0, grad_norm=float("inf")))
    entry = outcomes(ledger)["t1"]
    assert entry["outcome"] == "diverged" and entry["step"] == 20
    assert "gradient norm inf" in entry["reason"]


def test_diverged_flag_from_the_training_loop_is_diverged(ledger: Path):
    stopper = stopper_for(ledger)
    assert stopper("t1", result(40, 9.0, diverged=True))
    assert outcomes(ledger)["t1"]["outcome"] == "diverged"


def test_the_trials_divergence_rule_firing_is_diverged_with_its_reason(ledger: Path):
    stopper = stopper_for(ledger)
    assert not stopper("t1", result(60, 30.0))
    why = "loss above ℓ₀ = 9.01 from step 0 on: not back within the recovery window of 97 steps (step 100, loss 30)"
    assert stopper("t1", result(100, 30.0, diverged_step=100, divergence_stop=True, divergence_reason=why))
    entry = outcomes(ledger)["t1"]
    assert entry["outcome"] == "diverged" and entry["step"] == 100
    assert entry["reason"] == f"diverged at step 100: {why}"


def test_a_loss_far_above_its_initial_value_is_not_stopped_without_the_rule(ledger: Path):
    """A spike to 5x the initial loss is no evidence of failure: such runs recover (benchmarks/README.md)."""
    stopper = stopper_for(ledger)
    assert feed(stopper, "t1", [result(s, 5 * UNIFORM) for s in range(10, 100, 10)]) is None
    assert not ledger.exists()


def test_a_confirmation_run_is_never_ended_by_the_divergence_rule(ledger: Path):
    stopper = stopper_for(ledger)
    fired = result(100, 30.0, diverged_step=100, divergence_stop=True, divergence_reason="above ℓ₀", no_early_stop=True)
    assert not stopper("t1", fired)
    assert stopper("t1", result(110, float("nan"), no_early_stop=True))  # a non-finite value still ends it


def test_too_slow_against_the_time_budget(ledger: Path):
    # 400 tok/s with ~1M tokens to go: ~0.7 h projected against a 0.5 h budget.
    stopper = stopper_for(ledger, time_budget_s=1800, slow_grace_reports=2)
    slow = [result(s, 7.0, rate=400.0) for s in (10, 20)]
    assert feed(stopper, "t1", slow) is None  # start-up reports are grace
    assert stopper("t1", result(30, 6.9, rate=400.0))
    entry = outcomes(ledger)["t1"]
    assert entry["outcome"] == "too_slow" and entry["step"] == 30
    match = __import__("re").fullmatch(r"too slow: 400 tok/s, projected ([0-9.]+) (h|min) > 30\.0 min budget",
                                       entry["reason"])
    assert match, entry["reason"]
    projected_h = float(match.group(1)) / (1 if match.group(2) == "h" else 60)
    expected_h = (1000 - 30) * 1024 / 400 / 3600
    assert projected_h == pytest.approx(expected_h, abs=0.05)


def test_too_slow_reason_in_hours(ledger: Path):
    stopper = stopper_for(ledger, time_budget_s=4 * 3600, slow_grace_reports=0)
    # 410 tok/s with 75M tokens to go: ~51 h projected > 4 h.
    r = result(10, 7.0, rate=410.0, tokens_per_step=75_000, total_steps=1010)
    assert stopper("t1", r)
    assert outcomes(ledger)["t1"]["reason"] == "too slow: 410 tok/s, projected 50.8 h > 4.0 h budget"


def test_fast_enough_for_the_budget_is_not_stopped(ledger: Path):
    stopper = stopper_for(ledger, time_budget_s=3600, slow_grace_reports=0)
    assert feed(stopper, "t1", [result(s, 7.0, rate=50_000.0) for s in range(10, 200, 10)]) is None


def test_under_the_throughput_floor(ledger: Path):
    stopper = stopper_for(ledger, min_tokens_per_s=1000, slow_grace_reports=1)
    assert not stopper("t1", result(10, 7.0, rate=200.0))  # grace report
    assert stopper("t1", result(20, 7.0, rate=200.0))
    entry = outcomes(ledger)["t1"]
    assert entry["outcome"] == "too_slow" and entry["step"] == 20
    assert entry["reason"] == "too slow: 200 tok/s < floor 1,000 tok/s"


def test_no_false_stop_on_a_healthy_noisy_curve(ledger: Path):
    rng = random.Random(0)
    stopper = stopper_for(ledger, time_budget_s=3600, min_tokens_per_s=1000, slow_grace_reports=2)
    total = 200
    stopped = []
    for trial in ("a", "b", "c"):
        for i in range(1, total + 1):
            clean = 2.0 + (UNIFORM - 2.0) * math.exp(-i / 40)
            loss = clean * (1 + rng.uniform(-0.1, 0.1))
            grad = 1.0 + rng.uniform(-0.5, 3.0)  # spiky but finite
            rate = 20_000 * (1 + rng.uniform(-0.3, 0.3))
            if stopper(trial, result(i * 5, loss, grad_norm=grad, warmup=i <= 10, rate=rate, total_steps=total * 5)):
                stopped.append((trial, i))
    assert stopped == []
    assert not ledger.exists()


def test_ledger_keeps_reason_and_step_per_trial(ledger: Path):
    stopper = stopper_for(ledger, min_tokens_per_s=1000, slow_grace_reports=0)
    stopper("nan-trial", result(12, float("nan")))
    stopper("slow-trial", result(30, 7.0, rate=10.0))
    entries = json.loads(ledger.read_text())
    assert set(entries) == {"nan-trial", "slow-trial"}
    assert entries["nan-trial"]["outcome"] == "diverged" and entries["nan-trial"]["step"] == 12
    assert entries["slow-trial"]["outcome"] == "too_slow" and entries["slow-trial"]["step"] == 30
    assert entries["slow-trial"]["tokens"] == 30 * 1024
    assert all({"outcome", "reason", "time", "step", "tokens"} <= set(e) for e in entries.values())
    assert not stopper.stop_all()


# ---------------------------------------------------------------------------------------------
# PersistentASHA


@dataclass
class FakeTrial:
    """What ASHA reads of a trial: its id."""

    trial_id: str


GRACE, MAX_T, RF = 100, 900, 3  # rungs at 100, 300 (and 900 = max_t) tokens


def make_asha(sweep_dir: Path) -> PersistentASHA:
    return PersistentASHA(OutcomeRecorder(ledger_path(sweep_dir)), asha_state_path(sweep_dir), time_attr="tokens",
                          metric="val_loss", mode="min", max_t=MAX_T, grace_period=GRACE, reduction_factor=RF)


def asha_result(tokens: int, val_loss: float) -> dict:
    return {"tokens": tokens, "val_loss": val_loss, "total_tokens": MAX_T, "step": tokens // 10}


def report(asha: PersistentASHA, trial_id: str, tokens: int, val_loss: float, *, add: bool = False) -> str:
    trial = FakeTrial(trial_id)
    if add:
        asha.on_trial_add(None, trial)
    return asha.on_trial_result(None, trial, asha_result(tokens, val_loss))


def test_asha_stops_a_poor_trial_at_a_rung_and_persists(tmp_path: Path):
    asha = make_asha(tmp_path)
    # Three trials pass the first rung, each better than the ones before it.
    for tid, loss in (("c", 3.2), ("b", 3.1), ("a", 3.0)):
        assert report(asha, tid, 50, loss + 1, add=True) == TrialScheduler.CONTINUE  # before the rung
        assert report(asha, tid, 100, loss) == TrialScheduler.CONTINUE
    # A poor one reaches the rung: below the top 1/3 -> stopped.
    assert report(asha, "poor", 50, 6.0, add=True) == TrialScheduler.CONTINUE
    assert report(asha, "poor", 110, 5.5) == TrialScheduler.STOP
    entry = read_outcomes(tmp_path)["poor"]
    assert entry["outcome"] == "stopped_early"
    assert entry["tokens"] == 110 and entry["step"] == 11
    assert entry["reason"].startswith("stopped by ASHA at 110 tokens (val loss 5.5")
    assert set(read_outcomes(tmp_path)) == {"poor"}

    state = json.loads(asha_state_path(tmp_path).read_text())
    assert state["num_stopped"] == 1
    rung = {r["milestone"]: r["recorded"] for r in state["brackets"][0]}[GRACE]
    assert rung == {"a": -3.0, "b": -3.1, "c": -3.2, "poor": -5.5}  # Ray records -loss for mode=min


def test_asha_never_stops_a_trial_at_its_last_report(tmp_path: Path):
    asha = make_asha(tmp_path)
    for tid, loss in (("a", 3.0), ("b", 3.1), ("c", 3.2)):
        report(asha, tid, 100, loss, add=True)
    # A poor trial whose first report at the rung is also its last: it finishes by itself.
    assert report(asha, "done", MAX_T, 9.0, add=True) == TrialScheduler.CONTINUE
    assert "done" not in read_outcomes(tmp_path)


def test_asha_state_survives_a_restart(tmp_path: Path):
    original = make_asha(tmp_path)
    for tid, loss in (("a", 3.0), ("b", 3.1), ("c", 3.2), ("d", 3.3)):
        report(original, tid, 100, loss, add=True)
    for tid, loss in (("a", 2.5), ("b", 2.6), ("c", 3.0), ("d", 3.1)):
        report(original, tid, 300, loss)
    saved = json.loads(asha_state_path(tmp_path).read_text())

    restarted = make_asha(tmp_path)  # a new driver: Tuner.restore builds a fresh scheduler
    restarted.on_trial_add(None, FakeTrial("a"))  # the first call loads the state
    assert asha_rungs(restarted)["brackets"][0] == saved["brackets"][0]
    assert asha_rungs(restarted)["num_stopped"] == asha_rungs(original)["num_stopped"]

    # The same new results get the same decisions from both: a poor newcomer is cut at the first
    # rung, a good one is not, and at the second rung the cutoff built before the restart applies.
    for asha in (original, restarted):
        assert report(asha, "new-poor", 120, 4.0, add=True) == TrialScheduler.STOP
        assert report(asha, "new-good", 120, 2.9, add=True) == TrialScheduler.CONTINUE
        assert report(asha, "new-good", 310, 2.8) == TrialScheduler.STOP  # worse than a and b at 300 (of 4)
        report(asha, "new-best", 100, 2.0, add=True)
        assert report(asha, "new-best", 300, 2.0) == TrialScheduler.CONTINUE
    assert read_outcomes(tmp_path)["new-poor"]["outcome"] == "stopped_early"


RUNG_LOSSES = {"t0": 3.5, "t1": 3.1, "t2": 3.9, "t3": 3.0, "t4": 3.6, "t5": 3.2, "t6": 3.05}


def _stopped_by_arrival(sweep_dir: Path, arrival: list[str]) -> set[str]:
    """Add t0..t6 in the sweep's order, let them reach the first rung in ``arrival`` order, then report once
    more each (in the sweep's order); the trials ASHA stopped."""
    asha = make_asha(sweep_dir)
    for tid in RUNG_LOSSES:
        asha.on_trial_add(None, FakeTrial(tid))
    stopped = {tid for tid in arrival if report(asha, tid, 100, RUNG_LOSSES[tid]) == TrialScheduler.STOP}
    return stopped | {tid for tid in RUNG_LOSSES if tid not in stopped
                      and report(asha, tid, 150, RUNG_LOSSES[tid] - 0.1) == TrialScheduler.STOP}


def test_asha_cuts_the_same_trials_whatever_order_their_results_arrive_in(tmp_path: Path):
    # (Tune's ASHA alone cut {t2, t4} in the sweep's order and {t0, t2, t4, t5} in the reverse one.)
    in_order = _stopped_by_arrival(tmp_path / "a", list(RUNG_LOSSES))
    reversed_ = _stopped_by_arrival(tmp_path / "b", list(reversed(RUNG_LOSSES)))
    shuffled = _stopped_by_arrival(tmp_path / "c", ["t3", "t6", "t0", "t5", "t2", "t1", "t4"])
    assert in_order == reversed_ == shuffled and in_order


def test_a_held_trial_is_judged_once_the_trials_before_it_reach_the_rung_even_across_a_restart(tmp_path: Path):
    first = make_asha(tmp_path)
    for tid in ("a", "b", "late"):
        first.on_trial_add(None, FakeTrial(tid))
    assert report(first, "late", 120, 9.0) == TrialScheduler.CONTINUE  # held: a and b have not reached 100
    restarted = make_asha(tmp_path)  # the driver restarts; late resumes from a checkpoint past the rung
    for tid in ("a", "b", "late"):  # Tuner.restore adds every restored trial again
        restarted.on_trial_add(None, FakeTrial(tid))
    report(restarted, "a", 100, 3.0)
    report(restarted, "b", 100, 3.1)
    assert report(restarted, "late", 200, 8.0) == TrialScheduler.STOP  # judged at 100 tokens, with 9.0
    entry = read_outcomes(tmp_path)["late"]
    assert entry["tokens"] == 120 and entry["reason"].startswith("stopped by ASHA at 120 tokens (val loss 9")


def test_a_fresh_sweep_dir_starts_with_empty_rungs(tmp_path: Path):
    asha = make_asha(tmp_path)
    assert report(asha, "only", 100, 9.0, add=True) == TrialScheduler.CONTINUE  # nothing to compare with
    assert asha_state_path(tmp_path).exists()


def test_tunes_repeated_final_result_decides_nothing(ledger: Path):
    # When a trainable returns, Tune passes its last result again with done=True; after a driver
    # restart that result can predate a decision already in the ledger, which must stand.
    stopper = stopper_for(ledger)
    record = {"outcome": "stopped_early", "reason": "stopped by ASHA", "step": 30}
    ledger.parent.mkdir(parents=True)
    ledger.write_text(json.dumps({"t1": record}))
    assert not stopper("t1", result(20, float("nan"), done=True))
    assert outcomes(ledger)["t1"] == record


# ---------------------------------------------------------------------------------------------
# The ledger's writer


@dataclass
class EndedTrial:
    """What the recorder reads of a trial Tune ended: its id, last result and error."""

    trial_id: str
    last_result: dict
    error_msg: str = ""
    error_file: str = ""


def test_the_training_loops_own_divergence_detail_becomes_the_reason(ledger: Path):
    stopper = stopper_for(ledger)
    assert stopper("t1", result(7, 3.0, diverged=True, diverged_because="non-finite gradient norm"))
    assert outcomes(ledger)["t1"]["reason"] == "diverged at step 7, non-finite gradient norm"


def test_a_trial_tune_completes_is_recorded_unless_a_stop_was_decided_first(ledger: Path):
    recorder = OutcomeRecorder(ledger)
    stopper = TrialStopper(recorder)
    assert stopper("stopped", result(30, float("nan")))
    recorder.on_trial_complete(0, [], EndedTrial("stopped", result(30, float("nan"))))  # Tune ends it
    recorder.on_trial_complete(0, [], EndedTrial("finished", result(1000, 2.0)))
    entries = outcomes(ledger)
    assert entries["stopped"]["outcome"] == "diverged"
    assert entries["finished"]["outcome"] == "completed" and entries["finished"]["reason"] == "completed its budget"
    assert entries["finished"]["step"] == 1000 and entries["finished"]["tokens"] == 1000 * 1024


def test_a_trial_whose_last_result_says_it_diverged_is_recorded_diverged_even_if_tune_completes_it(ledger: Path):
    """Tune can hand the trial's last result over already ``done`` (the trainable returned right after
    reporting it), which the stopper leaves alone: the recorder reads the verdict itself."""
    recorder = OutcomeRecorder(ledger)
    last = result(162, 9.4, diverged=True, diverged_step=162, done=True,
                  diverged_because="its budget ended with the loss 9.35 still above ℓ₀ = 8.24")
    assert not TrialStopper(recorder)("t1", last)
    recorder.on_trial_complete(0, [], EndedTrial("t1", last))
    entry = outcomes(ledger)["t1"]
    assert entry["outcome"] == "diverged" and "still above ℓ₀" in entry["reason"]


def test_a_completed_trials_spikes_are_in_its_ledger_reason(ledger: Path):
    recorder = OutcomeRecorder(ledger)
    spike = "spiked once (step 6: 4.4x its running minimum, back after 66 steps)"
    recorder.on_trial_complete(0, [], EndedTrial("t1", result(1000, 5.5, spike_text=spike)))
    assert outcomes(ledger)["t1"]["reason"] == f"completed its budget; {spike}"


def test_an_error_is_recorded_with_advice_and_a_retry_that_completes_replaces_it(ledger: Path):
    recorder = OutcomeRecorder(ledger, gpus_per_trial=0.5)
    oom = "Traceback (most recent call last):\nRuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
    recorder.on_trial_error(0, [], EndedTrial("t1", result(15, 3.0), error_msg=oom))
    entry = outcomes(ledger)["t1"]
    assert entry["outcome"] == "error" and entry["step"] == 15
    assert entry["reason"].startswith("error: RuntimeError: CUDA out of memory")
    assert "GPU shared by 2 trials" in entry["reason"] and "--gpus-per-trial 1" in entry["reason"]
    recorder.on_trial_complete(0, [], EndedTrial("t1", result(1000, 2.0)))  # retried by --resume
    assert outcomes(ledger)["t1"]["outcome"] == "completed"


def test_a_long_error_is_kept_whole(ledger: Path):
    recorder = OutcomeRecorder(ledger)
    message = "RuntimeError: " + "the actor died because its node ran out of memory; " * 12
    recorder.on_trial_error(0, [], EndedTrial("t1", result(5, 3.0), error_msg=f"Traceback...\n{message}"))
    assert outcomes(ledger)["t1"]["reason"] == f"error: {message.strip()}"
