"""The edge search as a user runs it: real Ray Tune on a local cluster, real training of a tiny model.
The driver is SIGKILLed in the middle of the bisection and resumed; the search then finishes without
training any finished trial again, brackets the edge within the tolerance, and its stability calls
agree with direct runs of the same LRs outside Ray."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    TINY_TRIAL,
    assert_real_picture,
    finish,
    kill_session,
    run_lmtune,
    session_pids,
    start_lmtune,
    trial_dirs,
    wait_until,
)

from benchmarks.truth import compare, read_truth, truth_conclusion
from lmtune.searches.state import read_search_state
from lmtune.sweep.record import read_outcomes, trial_folders
from lmtune.sweep.sweep_file import SweepRecord
from lmtune.training.config import RunConfig, apply_overrides
from lmtune.training.loop import train
from lmtune.training.metrics import read_metrics

pytestmark = pytest.mark.slow

# The tiny trial over 30 steps of 256 tokens; ASHA rungs at 10 and 30 steps (evaluations and checkpoints
# every 10 steps fall on them, so a cut trial is continued from its rung).
TINY_EDGE = f"""\
description: tiny edge search for the tests
search: edge
budget: quick
set: {json.dumps({**TINY_TRIAL, "steps": 30})}
scheduler: {{name: asha, grace_period: 0.33333333, reduction_factor: 3}}
edge: {{range_steps: 30, seeds: 2, refine_points: 0, tolerance: 2.0}}
"""


def sweep_args(tmp: Path, data: Path) -> list[str]:
    (tmp / "tiny_edge.yaml").write_text(TINY_EDGE)
    return ["--space", str(tmp / "tiny_edge.yaml"), "--name", "edge", "--results", str(tmp / "results"),
            "--data", str(data), "--num-cpus", "1", "--no-dashboard", "--quiet"]


def bisecting(sweep_dir: Path) -> bool:
    """The search has planned bisection probes and at least one of them has started."""
    state = read_search_state(sweep_dir, "edge") if sweep_dir.exists() else None
    return bool(state) and not state["finished"] and any(
        run["stage"] == "bisect" for run in state["runs"].values())


def trial_params(sweep_dir: Path) -> dict[str, dict]:
    return {tid: json.loads((d / "trial.json").read_text())["params"] for tid, d in trial_dirs(sweep_dir).items()}


def coarse_started(sweep_dir: Path) -> bool:
    state = read_search_state(sweep_dir, "edge") if sweep_dir.exists() else None
    return bool(state) and any(run["stage"] == "coarse" for run in state["runs"].values())


@pytest.fixture(scope="module")
def resumed_edge_sweep(builtin_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The tiny edge sweep stopped with Ctrl-C as its coarse trials start and resumed, then SIGKILLed once
    bisection has begun, then run again with --resume."""
    tmp = tmp_path_factory.mktemp("edge")
    args = sweep_args(tmp, builtin_data)
    resume_args = [*args[:6], "--resume", *args[6:]]
    sweep_dir = tmp / "results" / "edge"
    proc = start_lmtune("run", *args)
    wait_until(lambda: coarse_started(sweep_dir), proc, 300, "the coarse trials", poll_s=0.05)
    os.killpg(proc.pid, signal.SIGINT)
    out = finish(proc, 120)
    assert proc.returncode == 130 and "resume it with" in out, out[-3000:]
    proc = start_lmtune("run", *resume_args)
    try:
        wait_until(lambda: bisecting(sweep_dir), proc, 300, "bisection", poll_s=0.1)
        kill_session(proc.pid)
    finally:
        kill_session(proc.pid)
        proc.stdout.close()
    assert not session_pids(proc.pid)
    before = {"ledger": read_outcomes(sweep_dir), "state": read_search_state(sweep_dir, "edge"),
              "metrics": {t: (d / "metrics.csv").read_bytes() for t, d in trial_dirs(sweep_dir).items()
                          if (d / "metrics.csv").exists()}}
    resumed = start_lmtune("run", *resume_args)
    out = finish(resumed, 600)
    assert resumed.returncode == 0, out[-4000:]
    return {"dir": sweep_dir, "before": before, "out": out, "data": builtin_data}


def test_the_resumed_search_finishes_with_every_trial_ending_once(resumed_edge_sweep):
    sweep_dir = resumed_edge_sweep["dir"]
    state, ledger = read_search_state(sweep_dir, "edge"), read_outcomes(sweep_dir)
    assert state["finished"]
    # a trial still running at the kill that Ray had not yet recorded is planned again, and says so
    interrupted = set(state["interrupted"])
    assert set(ledger) == set(state["runs"]) == set(trial_dirs(sweep_dir)) - interrupted
    assert not interrupted & set(resumed_edge_sweep["before"]["ledger"])
    params = trial_params(sweep_dir)
    keys = [(p.get("stage"), p.get("lr"), p.get("seed")) for t, p in params.items() if t not in interrupted]
    assert len(keys) == len(set(keys)), f"a trial was run twice: {sorted(keys, key=str)}"


def test_trials_that_ended_before_the_kill_were_not_trained_again(resumed_edge_sweep):
    sweep_dir, before = resumed_edge_sweep["dir"], resumed_edge_sweep["before"]
    ledger, dirs = read_outcomes(sweep_dir), trial_dirs(sweep_dir)
    assert before["ledger"], "nothing had ended before the kill"
    for trial_id, entry in before["ledger"].items():
        assert ledger[trial_id] == entry
        if trial_id in before["metrics"]:
            assert (dirs[trial_id] / "metrics.csv").read_bytes() == before["metrics"][trial_id], trial_id


def test_the_decisions_made_before_the_kill_stand(resumed_edge_sweep):
    before = resumed_edge_sweep["before"]["state"]["decisions"]
    after = read_search_state(resumed_edge_sweep["dir"], "edge")["decisions"]
    assert after[: len(before)] == before
    assert [d["stage"] for d in after][:3] == ["range", "coarse", "landscape"]


def test_asha_cut_the_coarse_trials_an_uninterrupted_search_would_have_cut(resumed_edge_sweep):
    # Replays Tune's ASHA rule over the coarse trials' own rung losses in the order the search planned them
    # (each judged against the ones before it), and compares with what the interrupted, resumed sweep did.
    sweep_dir = resumed_edge_sweep["dir"]
    state, ledger = read_search_state(sweep_dir, "edge"), read_outcomes(sweep_dir)
    asha = SweepRecord.read(sweep_dir).plan.asha
    planned = next(d["lrs"] for d in state["decisions"] if d["stage"] == "coarse")
    trial_of = {run["lr"]: tid for tid, run in state["runs"].items() if run["stage"] == "coarse"}
    rung, quantile = asha.grace_period, (1 - 1 / asha.reduction_factor) * 100
    rung_losses, expected = [], set()
    for lr in planned:
        rows = read_metrics(trial_dirs(sweep_dir)[trial_of[lr]] / "metrics.csv")
        loss = next(r["val_loss"] for r in rows if r.get("val_loss") is not None and r["tokens"] >= rung)
        if rung_losses and -loss < np.nanpercentile([-v for v in rung_losses], quantile):
            expected.add(trial_of[lr])
        rung_losses.append(loss)
    cut = {trial_of[lr] for lr in planned if ledger[trial_of[lr]]["outcome"] == "stopped_early"}
    assert cut == expected and len(planned) >= 4


def test_the_bracket_is_within_the_tolerance_and_the_best_lr_has_two_seeds(resumed_edge_sweep):
    c = read_search_state(resumed_edge_sweep["dir"], "edge")["conclusion"]
    assert c["bracket_ratio"] <= 2.0 and c["failing_lr_low"] < c["failing_lr"]
    # (a tiny model at 30 steps may learn best at the largest LR that trains through: the bracket's stable end)
    assert len(c["best_lr_seed_losses"]) == 2 and c["best_lr"] <= c["failing_lr_low"]


def test_the_bracket_agrees_with_direct_runs_trained_without_early_stopping(resumed_edge_sweep, tmp_path):
    """The bracket's ends trained again outside Ray with nothing stopping them, each with the seeds the sweep
    judged it on: every seed trains through the stable end, ending below the data's unigram baseline; the failing
    seed fails at the other end: it diverges (the sweep's own rule judging the whole run), or ends no better than
    that baseline."""
    sweep_dir = resumed_edge_sweep["dir"]
    c = read_search_state(sweep_dir, "edge")["conclusion"]
    confirmation = c["edge_confirmation"]
    assert confirmation["confirmed"] and len(confirmation["stable_end"]) == 2  # edge_seeds
    params, dirs, ledger = trial_params(sweep_dir), trial_dirs(sweep_dir), read_outcomes(sweep_dir)
    record = SweepRecord.read(sweep_dir)
    baseline = record.plan.unigram_loss
    ends = [(c["failing_lr_low"], end["seed"], True) for end in confirmation["stable_end"]]
    ends += [(c["failing_lr"], end["seed"], False) for end in confirmation["diverged_end"]]
    for lr, seed, trains in ends:
        # (the trial that ran it: one the driver's stop interrupted before Ray recorded it was run again in another)
        trial_id = next(t for t, p in params.items() if p.get("lr") == lr and p.get("seed") == seed and t in ledger)
        config = RunConfig.from_dict(json.loads((dirs[trial_id] / "config.json").read_text()))
        direct = train(config, tmp_path / f"direct-{lr}-{seed}", divergence=record.divergence_rule)
        final = direct.summary["final_val_loss"]
        trained = direct.status == "completed" and final is not None and final < baseline
        assert trained == trains, (lr, seed, direct.end, final, baseline)
        rows, swept = read_metrics(direct.out_dir / "metrics.csv"), read_metrics(dirs[trial_id] / "metrics.csv")
        # the sweep's trial is the same run: same losses, step for step, as far as it went
        assert [r["train_loss"] for r in swept] == pytest.approx([r["train_loss"] for r in rows[: len(swept)]],
                                                                 rel=1e-5)


def test_a_finished_edge_search_keeps_each_trials_best_pt_only_having_continued_cut_lrs_from_their_checkpoints(
        resumed_edge_sweep):
    # --keep best (the default): an ASHA-cut run's newest checkpoint is held while the search may continue it,
    # and every checkpoint but best.pt is gone once the search has finished.
    sweep_dir = resumed_edge_sweep["dir"]
    for trial in trial_dirs(sweep_dir).values():
        kept = sorted(str(p.relative_to(trial)) for p in trial.rglob("*.pt"))
        assert kept in ([], ["checkpoints/best.pt"]), (trial.name, kept)
    assert not (sweep_dir / ".staging").exists()
    continued = [f for f in trial_folders(sweep_dir) if f.params.get("continue_from")]
    assert continued and all(f.continued_from_tokens > 0 for f in continued), \
        [(f.trial_id, f.continued_from_tokens) for f in continued]


def test_the_report_of_the_edge_search_is_written(resumed_edge_sweep):
    sweep_dir = resumed_edge_sweep["dir"]
    proc = run_lmtune("analyze", str(sweep_dir), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((sweep_dir / "report" / "summary.json").read_text())
    assert {"best_lr", "best_lr_seed_losses", "failing_lr", "failing_lr_low", "edge_ratio", "equal_token_losses",
            "stages", "basin", "degraded", "spiked", "edge_confirmation"} <= set(summary)
    assert [s["name"] for s in summary["stages"]][:3] == ["range", "coarse", "landscape"]
    assert_real_picture(sweep_dir / "report" / "lr_vs_loss.png")
    assert_real_picture(sweep_dir / "report" / "lr_range_test.png")


# A benchmark of the search against its ground truth (24 runs trained in full): the release tier.
@pytest.mark.release
def test_the_search_agrees_with_a_small_ground_truth_grid_trained_without_early_stopping(resumed_edge_sweep,
                                                                                         tmp_path):
    """The benchmark's comparison (benchmarks/lr_truth.py) at test size: the tiny model's LRs 3.16x apart and the
    search's own best LR (whether an LR is in the truth's basin is measured at that LR, not read off a grid whose
    basin may be one LR wide), three seeds each (what a check needs), every run to its full budget with nothing
    stopping it. Every tolerance is the truth's: its 2-SE basin from its own seeds."""
    sweep_dir = resumed_edge_sweep["dir"]
    proc = run_lmtune("analyze", str(sweep_dir), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    base = SweepRecord.read(sweep_dir).plan.base
    search = json.loads((sweep_dir / "report" / "summary.json").read_text())
    truth_dir = tmp_path / "truth"
    for lr in sorted({0.01, 0.0316, 0.1, 0.316, 1.0, 3.16, 10.0, search["best_lr"]}):
        for seed in (0, 1, 2):
            # (no checkpoint but the last: the truth only needs each run's losses)
            config = apply_overrides(base, {"lr": lr, "seed": seed, "checkpoint_interval": base.train.steps})
            train(config, truth_dir / f"lr={lr}_seed={seed}")
    truth = truth_conclusion(read_truth(truth_dir))
    checks = compare(truth, search)
    assert truth["failing_lr"] is not None, "the grid reaches past the first LR that fails"
    assert checks.best_lr_in_truth_basin, checks
    assert checks.edge_brackets_overlap, checks
    assert checks.basins_overlap, checks
    # No degraded region at this size, in the truth or the search: the runs above the basin end no better than the
    # unigram baseline, so they fail rather than degrade. A degraded region needs two LRs trained through from the
    # basin's top up, below the failing LR: the truth's basin ends at its last LR through, whose next LR fails; the
    # search's basin (its seeds spread widely) reaches past its failing LR. (compare's overlap of two degraded
    # regions: tests/test_lr_truth.py, on a constructed truth that has one.)
    assert truth["degraded"] is None and truth["basin"]["high"] == [truth["failing_lr_low"], truth["failing_lr"]], \
        truth["basin"]
    top, failing = search["basin"]["lrs"][-1], search["failing_lr"]
    assert search["degraded"] is None and len([r for r in search["ranking"] if top <= r["lr"] < failing]) < 2, \
        (search["degraded"], search["basin"], search["ranking"])
    assert checks.truth_degraded == checks.search_degraded == (None, None) and not checks.degraded_overlap, checks
