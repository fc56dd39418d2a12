"""Issue 5: faults, bad input, security and load, with real processes, real Ray and real torch.

Every process test is bounded by subprocess timeouts; Ray sweeps run in their own session
(start_new_session=True) so a test kills only the processes it started. Numbers the issue's closing
table needs (redone steps, attempts, durations) are printed with a ``FAULTS:`` prefix (pytest -s).
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import io
import ipaddress
import json
import logging
import math
import os
import pickle
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import ray
import torch
from conftest import (
    TEST_ASHA,
    TINY_TRIAL,
    assert_one_line_error,
    assert_real_picture,
    assert_refused,
    command_line,
    finish,
    kill_session,
    processes_with_env,
    read_wandb_runs,
    run_lmtune,
    session_pids,
    sigkill,
    snapshot,
    start_lmtune,
    trial_dirs,
    wait_until,
    write_grid_space,
)
from faults import CRASH_STEP, FAULT_SWEEP_LRS, FAULTS_ENV, FIRED, MEET_STEP, MEETING_ENV, OOM_STEP, note

from lmtune import run as run_cli
from lmtune import train as train_cli
from lmtune.errors import LmtuneError
from lmtune.report.reader import load_sweep
from lmtune.sweep.ray_state import backup_dir
from lmtune.sweep.record import asha_state_path, read_outcomes, sole_writer
from lmtune.sweep.runner import preflight_write_check
from lmtune.training import checkpoint as ckpt
from lmtune.training.config import RunConfig
from lmtune.training.metrics import read_metrics

REPO = Path(__file__).resolve().parent.parent
TERMINAL = {"completed", "stopped_early", "diverged", "too_slow", "error"}
# A fault test's trial: the tiny trial over 60 steps (unless a test says otherwise).
STEPS = 60


def write_grid(path: Path, lrs: list[float], asha: bool = True, **settings) -> Path:
    """The tests' tiny grid over ``lrs``: STEPS steps, under the tests' ASHA unless ``asha`` is False."""
    return write_grid_space(path, lrs, TEST_ASHA if asha else None, **{"steps": STEPS, **settings})


def start_sweep(*args: str, env: dict[str, str] | None = None, **popen) -> subprocess.Popen:
    return start_lmtune("run", *args, env=env, **popen)


def has_checkpoint(trial_dir: Path) -> bool:
    """A periodic checkpoint of the trial, complete (its checksum written): in Tune's keeping, as a sweep's trial
    hands them over, or in the run's own checkpoints/ (a run outside Tune)."""
    return any(p for pattern in ("checkpoint_*/step_*.pt.sha256", "checkpoints/step_*.pt.sha256")
               for p in trial_dir.glob(pattern))


# =============================================================================================
# 1. SIGKILL of the sweep driver, then --resume


@pytest.mark.slow
def test_sigkilled_sweep_driver_resumes_with_every_trial_ending_once(builtin_data, tmp_path):
    """Kill -9 the whole sweep (driver, GCS, raylet, trial workers) once a trial has ended and a running one has a
    checkpoint, in the worst state a kill can leave (lmtune.sweep.ray_state; CI met it): Ray's newest experiment
    snapshot cut short, and the whole copy lmtune kept an older one, naming a checkpoint Tune has deleted since (as
    when the kill lands while Ray writes a snapshot, after Tune deleted the trial's older checkpoint). The test
    keeps lmtune's copy from a moment when a running trial had its checkpoint, and puts it back after the kill.
    Then --resume: every trial ends once, none in error, each decision made before the kill stands.

    Tokens: an interrupted trial continues from the checkpoint the kept snapshot names (one it does not name, started
    after it, from the start), or from a newer one of its own that its killed attempt wrote before Tune's report
    returned (the run's staging copy: lmtune.sweep.reporting), never from an older one. Redone steps (steps executed
    twice: highest step the killed attempt logged in training.log, minus the checkpoint step the next attempt logged
    "resuming from") are printed.

    Records: each trial's metrics.csv holds every step its run logs exactly once, none missing, up to
    where it ended (the killed attempt's rows past its checkpoint were replaced, not kept twice or lost),
    each with its tokens counted once (step x tokens per step: the time ASHA judges on).
    """
    lrs = [3e-3, 3.0, 1e-3, 1e-4, 3e-5, 1e-5]
    space = write_grid(tmp_path / "grid.yaml", lrs, steps=120)
    results = tmp_path / "results"
    sweep_dir = results / "kd"
    kept, early = backup_dir(sweep_dir), tmp_path / "kept-early"
    args = ["--space", str(space), "--name", "kd", "--results", str(results), "--data", str(builtin_data),
            "--max-concurrent", "2", "--num-cpus", "2", "--no-dashboard", "--quiet"]
    started = time.monotonic()
    proc = start_sweep(*args)

    def copied_early() -> bool:
        """lmtune's copy, taken while it links a checkpoint of the first trial's (the best LR: it runs to its end)."""
        if not list(kept.glob("snapshot-*/checkpoints/*/checkpoint_*/*.pt")):
            return False
        shutil.rmtree(early, ignore_errors=True)
        try:
            shutil.copytree(kept, early, copy_function=os.link)  # (a set is never changed, only replaced)
        except (shutil.Error, OSError):  # (the driver rewrote it meanwhile: try again)
            return False
        return any(name.endswith(f"_lr={lrs[0]:.3g}") for name in early_checkpoints())  # (the LR that trains on)

    def early_checkpoints() -> dict[str, tuple[str, int]]:
        """Trial folder -> (Tune checkpoint, its step) of the running trials in the early copy."""
        return {c.parent.name: (c.name, ckpt.checkpoint_step(next(c.glob("step_*.pt"))))
                for c in early.glob("snapshot-*/checkpoints/*/checkpoint_*") if list(c.glob("step_*.pt"))}

    def decided_and_running_past_early() -> bool:
        """A decided trial, and a running one that the early copy names a checkpoint of Tune has deleted since."""
        if not sweep_dir.exists():
            return False
        ledger = read_outcomes(sweep_dir)
        moved_on = [d for t, d in trial_dirs(sweep_dir).items() if t not in ledger and d.name in named
                    and not (d / named[d.name][0]).exists() and has_checkpoint(d)]
        return bool(moved_on and ledger)

    try:
        wait_until(copied_early, proc, 600, "copy of lmtune's kept snapshot with a running trial's checkpoint",
                   poll_s=0.1)
        named = early_checkpoints()
        note(f"lmtune's kept copy taken after {time.monotonic() - started:.0f} s, naming {named}; ledger then "
             f"{sorted(read_outcomes(sweep_dir))}")
        wait_until(decided_and_running_past_early, proc, 600, "moment with a finished trial and a running one past "
                   "the checkpoint the early copy names", poll_s=0.1)
        killed = kill_session(proc.pid)
    finally:
        kill_session(proc.pid)
        proc.stdout.close()
    kill_at = time.monotonic() - started
    assert not session_pids(proc.pid)
    shutil.rmtree(kept)
    shutil.copytree(early, kept)  # lmtune's copy as it was before Ray's last writes
    snapshot_file_of_ray = max(sweep_dir.glob("experiment_state-*.json"))
    snapshot_file_of_ray.write_bytes(snapshot_file_of_ray.read_bytes()[:100])
    ledger_before = read_outcomes(sweep_dir)  # the newest decisions written before the processes died
    asha_before = json.loads(asha_state_path(sweep_dir).read_text()) if asha_state_path(sweep_dir).exists() else None
    dirs_before = trial_dirs(sweep_dir)
    metrics_before = {t: snapshot_file(d / "metrics.csv") for t, d in dirs_before.items()}
    note(f"driver SIGKILL after {kill_at:.0f} s ({killed} processes in its session); ledger then: "
         f"{ {t: e['outcome'] for t, e in ledger_before.items()} }; lmtune's kept copy put back as it was when it "
         f"named {named}")

    resumed_start = time.monotonic()
    proc = start_sweep(*args[:6], "--resume", "--num-cpus", "2", "--no-dashboard", "--quiet")
    out = finish(proc, 600)
    resume_s = time.monotonic() - resumed_start
    assert proc.returncode == 0, out[-4000:]
    assert "Failed to restore" not in out, out[-4000:]
    assert json.loads(snapshot_file_of_ray.read_text())  # put back whole

    # Every trial ends exactly once: one ledger entry per trial folder, all terminal, none in error.
    dirs = trial_dirs(sweep_dir)
    ledger = read_outcomes(sweep_dir)
    assert len(dirs) == len(lrs), sorted(p.name for p in sweep_dir.iterdir())
    assert set(ledger) == set(dirs), (sorted(ledger), sorted(dirs))
    assert all(e["outcome"] in TERMINAL - {"error"} for e in ledger.values()), ledger
    assert f"{len(lrs)} trials:" in out, out[-3000:]
    # Decisions made before the kill stand: same ledger entry, and the trial was not run again.
    for trial_id, entry in ledger_before.items():
        assert ledger[trial_id] == entry, (trial_id, entry, ledger[trial_id])
        assert snapshot_file(dirs[trial_id] / "metrics.csv") == metrics_before[trial_id], \
            f"trial {trial_id} ({entry['outcome']} before the kill) was run again"
    if asha_before is not None:
        asha_after = json.loads(asha_state_path(sweep_dir).read_text())
        assert asha_after["num_stopped"] >= asha_before["num_stopped"]
        for bracket_b, bracket_a in zip(asha_before["brackets"], asha_after["brackets"], strict=True):
            for rung_b, rung_a in zip(bracket_b, bracket_a, strict=True):
                for trial_id, value in rung_b["recorded"].items():
                    assert trial_id in rung_a["recorded"] and _same(rung_a["recorded"][trial_id], value)

    # Tokens: each interrupted trial continues from the checkpoint the kept snapshot names (none: the start).
    attempts = {t: attempts_in(d / "training.log") for t, d in dirs.items() if t not in ledger_before}
    interrupted = {t: a for t, a in attempts.items() if len(a) > 1}
    assert any(dirs[t].name in named for t in interrupted), (named, attempts)
    for trial_id, runs in interrupted.items():
        (_, killed_at), (resumed, _) = runs[:2]
        # (the killed attempt may have written a checkpoint before logging its step: up to log_interval past it)
        newest = killed_at + TINY_TRIAL["log_interval"]
        assert named.get(dirs[trial_id].name, (None, 0))[1] <= (resumed or 0) <= newest, (trial_id, named, runs)
    # Records: every logged step once, none missing, its tokens counted once.
    tokens_per_step = TINY_TRIAL["batch_size"] * TINY_TRIAL["context_length"]
    for trial_id, trial_dir in dirs.items():
        rows = read_metrics(trial_dir / "metrics.csv")
        steps = [r["step"] for r in rows]
        run = RunConfig.from_dict(json.loads((trial_dir / "config.json").read_text())).train
        last = steps[-1] if steps else 0
        assert steps == [s for s in range(1, last) if run.logs_at(s)] + steps[-1:], f"{trial_id}: {steps}"
        assert [r["tokens"] for r in rows] == [s * tokens_per_step for s in steps], trial_id
    outcomes = sorted(e["outcome"] for e in ledger.values())
    redone = {t: redone_steps(dirs[t] / "training.log") for t in interrupted}
    note(f"driver SIGKILL + --resume from an older kept snapshot: {len(interrupted)} interrupted trials resumed "
         f"from steps {[runs[1][0] for runs in interrupted.values()]} and redid {list(redone.values())} steps "
         f"(checkpoint_interval {TINY_TRIAL['checkpoint_interval']}); outcomes {outcomes}; resume run {resume_s:.0f} s")


@pytest.mark.slow
def test_a_second_writer_of_a_sweep_is_refused_in_one_line_naming_the_holder(builtin_data, tmp_path, capsys):
    results = tmp_path / "results"
    sweep = results / "held"
    sweep.mkdir(parents=True)
    (sweep / "sweep.json").write_text(json.dumps({"name": "held"}))
    argv = ["--space", str(_good_grid(tmp_path)), "--name", "held", "--resume", "--results", str(results), "--data",
            str(builtin_data)]
    with sole_writer(sweep, new=False):
        before = snapshot(sweep)
        _refused_sweep(argv, capsys, "being written by another lmtune run", f"(pid {os.getpid()})")
        assert snapshot(sweep) == before
    with sole_writer(sweep, new=False):  # released with its holder
        pass


def test_two_runs_with_one_name_cannot_both_create_the_sweep(tmp_path):
    sweep = tmp_path / "results" / "same"
    with sole_writer(sweep, new=True):
        with pytest.raises(LmtuneError, match="already exists") as refused:
            with sole_writer(sweep, new=True):
                pass
        assert "\n" not in str(refused.value)
    assert not sweep.exists()  # the first never wrote sweep.json: no half-made sweep is left behind


def _stop(proc: subprocess.Popen, how: str) -> None:
    if how == "ctrl-c again and again, ten times a second":
        # (the second lands while Tune stops the trials, the later ones while Ray shuts down and the driver
        # prints: before, one there cut ray.shutdown short or killed the driver, exit 1 or -2 instead of 130)
        with contextlib.suppress(ProcessLookupError):
            for _ in range(40):
                os.killpg(proc.pid, signal.SIGINT)
                time.sleep(0.1)
    elif how == "SIGTERM to the process group":  # systemd, docker stop, a terminal hang-up
        os.killpg(proc.pid, signal.SIGTERM)
    else:
        os.kill(proc.pid, signal.SIGTERM)


# (One Ctrl-C to the process group is not a case of its own: the sweeps of test_edge_sweep.py and test_cs336_page.py
# are stopped so, exit 130 and print their resume command, and the first of the repeated Ctrl-Cs below is one.)
@pytest.mark.slow
@pytest.mark.parametrize("how", ["ctrl-c again and again, ten times a second", "SIGTERM to the driver",
                                 "SIGTERM to the process group"])
def test_a_stopped_sweep_says_so_names_its_resume_command_and_exits_non_zero(builtin_data, tmp_path, how):
    space = write_grid(tmp_path / "grid.yaml", [1e-3], asha=False, steps=400)  # (one trial is all a stop needs)
    results = tmp_path / "results"
    proc = start_sweep("--space", str(space), "--name", "stop", "--results", str(results), "--data",
                       str(builtin_data), "--num-cpus", "1", "--no-dashboard", "--quiet")
    try:
        wait_until(lambda: any(has_checkpoint(d) for d in trial_dirs(results / "stop").values())
                   if (results / "stop").exists() else False, proc, 300, "a trial's checkpoint", poll_s=0.2)
        stopped = time.monotonic()
        _stop(proc, how)
        out, _ = proc.communicate(timeout=120)
        exit_s = time.monotonic() - stopped
    finally:
        kill_session(proc.pid)
        proc.stdout.close()
    signame = "SIGINT" if how.startswith("ctrl-c") else "SIGTERM"
    assert proc.returncode == (130 if signame == "SIGINT" else 143), out[-3000:]
    assert f"sweep interrupted ({signame}" in out, out[-3000:]
    note(f"{how}: exit {proc.returncode} {exit_s:.1f} s after the signal")
    assert f"resume it with: python -m lmtune.run --name stop --resume --results {results}" in out
    assert "best trial" not in out and "Tuner.restore(" not in out and "received at time" not in out, out[-3000:]
    note(f"{how}: exit {proc.returncode}, resume command printed")


def snapshot_file(path: Path) -> tuple[int, int] | None:
    return (path.stat().st_size, path.stat().st_mtime_ns) if path.exists() else None


def _same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def attempts_in(log_path: Path) -> list[tuple[int | None, int]]:
    """A trial's attempts in its training.log: (checkpoint step it resumed from, None: the start; highest step it
    logged). Attempts are separated by the "device=..." line each run logs; "resuming from" comes just before it."""
    attempts: list[list[int | None]] = []
    pending = None
    for line in log_path.read_text().splitlines():
        if m := re.search(r"resuming from \S*step_(\d+)\.pt", line):
            pending = int(m.group(1))
        elif " device=" in line:
            attempts.append([pending, 0])
            pending = None
        elif attempts and (m := re.search(r" step (\d+)/\d+ loss", line)):
            attempts[-1][1] = max(attempts[-1][1], int(m.group(1)))
    return [(resumed, highest) for resumed, highest in attempts]


def redone_steps(log_path: Path) -> int | None:
    """Steps executed twice in a trial: for each attempt after the first, (highest step the previous attempt
    logged) - (checkpoint step this attempt resumed from). None when the trial never restarted."""
    attempts = attempts_in(log_path)
    if len(attempts) < 2:
        return None
    return sum(max(0, prev[1] - (cur[0] or 0)) for prev, cur in zip(attempts, attempts[1:], strict=False))


# =============================================================================================
# 2. One sweep, four faults (tests/faults.py fault_sweep): two trials at once on a 0.5 share of one logical GPU,
# meeting at step 10; a trial raising a (simulated) CUDA OOM on every attempt; a trial crashing once, retried from
# its checkpoint; Weights & Biases offline; the dashboard's bind address


# Its budget: the crash at step 25 comes after checkpoints at 10 and 20, and the retry trains on to 40.
FAULT_STEPS = 40


def result_rows(trial_dir: Path) -> list[dict]:
    """Tune's results of a trial (its result.json), one dict a report."""
    return [json.loads(line) for line in (trial_dir / "result.json").read_text().splitlines() if line.strip()]


def trial_states(sweep_dir: Path) -> dict[str, tuple[dict, dict]]:
    """Tune's saved trial records (experiment_state-*.json): id -> (trial fields, runtime fields)."""
    state_file = max(sweep_dir.glob("experiment_state-*.json"), key=lambda p: p.stat().st_mtime)
    data = json.loads(state_file.read_text())
    out = {}
    for trial_json, runtime in data["trial_data"]:
        trial = json.loads(trial_json)
        out[trial["trial_id"]] = (trial, json.loads(runtime) if isinstance(runtime, str) else runtime)
    return out


@pytest.fixture(scope="module")
def fault_sweep(builtin_data, tmp_path_factory) -> dict:
    """3 trials (FAULT_SWEEP_LRS: crash, oom, plain) of FAULT_STEPS steps on 1 logical GPU, 2 per GPU and 1 CPU each
    on 2 CPUs, so two at once; --max-failures 2; --step-hook faults:fault_sweep: the two trials that start together
    meet at step 10, the oom trial raises a CUDA OOM at step 15 on every attempt, the crash trial crashes once at step
    25. W&B offline (--wandb lmtune-tests); the dashboard on (default host), to check what it binds to;
    --trial-figures."""
    tmp = tmp_path_factory.mktemp("faults")
    meeting = tmp / "meeting"
    meeting.mkdir()
    space = write_grid(tmp / "grid.yaml", list(FAULT_SWEEP_LRS.values()), asha=False, steps=FAULT_STEPS,
                       batch_size=4, warmup_steps=2)
    results = tmp / "results"
    started = time.monotonic()
    proc = start_sweep("--space", str(space), "--name", "faults", "--results", str(results), "--data",
                       str(builtin_data), "--num-cpus", "2", "--num-gpus", "1", "--gpus-per-trial", "0.5",
                       "--max-failures", "2", "--quiet", "--wandb", "lmtune-tests", "--step-hook", "faults:fault_sweep",
                       "--trial-figures",
                       env={**FAULTS_ENV, MEETING_ENV: str(meeting), "WANDB_MODE": "offline", "WANDB_SILENT": "true"})
    dashboard_cmdlines: set[str] = set()

    def ended_while_watching_dashboards() -> bool:
        for pid in session_pids(proc.pid):
            cmd = command_line(pid)
            if "dashboard/dashboard.py" in cmd:
                dashboard_cmdlines.add(cmd)
        return proc.poll() is not None

    wait_until(ended_while_watching_dashboards, None, 600, "end of the sweep", poll_s=0.5, required=False)
    out = finish(proc, 60)
    sweep_dir = results / "faults"
    dirs = trial_dirs(sweep_dir) if sweep_dir.is_dir() else {}  # (none: its tests fail on its exit status first)
    by_lr = {json.loads((d / "params.json").read_text())["lr"]: t for t, d in dirs.items()}
    trial_of = {fault: by_lr.get(lr) for fault, lr in FAULT_SWEEP_LRS.items()}
    note(f"fault sweep: exit {proc.returncode} after {time.monotonic() - started:.0f} s; met at step "
         f"{MEET_STEP}: {sorted(p.name for p in meeting.iterdir())}")
    return {"out": out, "rc": proc.returncode, "dir": sweep_dir, "dashboard": dashboard_cmdlines, "dirs": dirs,
            "trial": trial_of, "meeting": meeting, "seconds": time.monotonic() - started}


@pytest.mark.slow
def test_trial_raising_cuda_oom_is_retried_then_recorded_as_error_and_the_others_complete(fault_sweep):
    assert fault_sweep["rc"] == 0, fault_sweep["out"][-4000:]
    sweep_dir, dirs = fault_sweep["dir"], fault_sweep["dirs"]
    ledger = read_outcomes(sweep_dir)
    assert len(dirs) == 3 and set(ledger) == set(dirs), (ledger, dirs)
    bad = fault_sweep["trial"]["oom"]
    entry = ledger[bad]
    assert entry["outcome"] == "error", entry
    assert "CUDA out of memory" in entry["reason"], entry
    assert "lower trials per GPU" in entry["reason"] and "--gpus-per-trial 1" in entry["reason"], entry
    attempts = (dirs[bad] / FIRED).read_text().split()
    assert attempts == [str(OOM_STEP)] * 3, f"expected 1 try + --max-failures 2 retries, got {attempts}"
    # Each retry resumed from the step-10 checkpoint (the fault is at step 15).
    log_text = (dirs[bad] / "training.log").read_text()
    assert len(re.findall(r"resuming from \S*step_00000010\.pt", log_text)) == 2, log_text[-3000:]
    for fault in ("crash", "plain"):  # (the crash trial's own retry: test_crashed_trial_is_retried_from_...)
        other = fault_sweep["trial"][fault]
        assert ledger[other]["outcome"] == "completed", ledger[other]
        assert json.loads((dirs[other] / "summary.json").read_text())["steps"] == FAULT_STEPS
    note(f"OOM trial: {len(attempts)} attempts (max_failures 2), ledger reason: {entry['reason']!r}; "
         f"other 2 trials completed; sweep {fault_sweep['seconds']:.0f} s")


@pytest.mark.slow
def test_with_trial_figures_each_trial_that_ended_draws_its_own_curves_and_schedule(fault_sweep):
    assert fault_sweep["rc"] == 0, fault_sweep["out"][-4000:]
    for fault in ("crash", "plain"):  # (the two that completed: the oom trial ended in an error, drawing nothing)
        folder = fault_sweep["dirs"][fault_sweep["trial"][fault]]
        for name in ("loss_curves.png", "lr_schedule.png"):
            assert_real_picture(folder / name)


@pytest.mark.slow
def test_live_dashboard_binds_to_localhost(fault_sweep):
    urls = re.findall(r"Ray dashboard: (\S+)", fault_sweep["out"])
    assert urls, "no dashboard URL printed: " + fault_sweep["out"][-2000:]
    assert all(u.startswith("http://127.0.0.1:") for u in urls), urls
    assert fault_sweep["dashboard"], "no dashboard process seen in the sweep's session"
    for cmd in fault_sweep["dashboard"]:
        assert "--host=127.0.0.1" in cmd, cmd
    note(f"dashboard URL {urls[0]}; dashboard process --host=127.0.0.1")


@pytest.mark.slow
def test_crashed_trial_is_retried_from_its_checkpoint(fault_sweep):
    assert fault_sweep["rc"] == 0, fault_sweep["out"][-4000:]
    steps, interval = FAULT_STEPS, TINY_TRIAL["checkpoint_interval"]
    sweep_dir, dirs = fault_sweep["dir"], fault_sweep["dirs"]
    outcomes = read_outcomes(sweep_dir)
    states = trial_states(sweep_dir)
    crashed, plain = fault_sweep["trial"]["crash"], fault_sweep["trial"]["plain"]
    assert outcomes[crashed]["outcome"] == "completed", outcomes
    trial = dirs[crashed]
    assert (trial / FIRED).read_text().strip() == str(CRASH_STEP)  # the fault really happened
    assert states[crashed][1]["num_failures"] == 1, states[crashed][1]

    csv_steps = pd.read_csv(trial / "metrics.csv")["step"].tolist()
    assert csv_steps == sorted(set(csv_steps)), csv_steps  # strictly increasing, no repeats
    assert csv_steps[-1] == steps
    gaps = [b - a for a, b in zip([0, *csv_steps], csv_steps, strict=False)]
    assert max(gaps) <= TINY_TRIAL["log_interval"], csv_steps
    tune_steps = [r["step"] for r in result_rows(trial)]
    assert tune_steps == sorted(set(tune_steps)) and tune_steps[-1] == steps, tune_steps

    log = (trial / "training.log").read_text()
    resumed = re.findall(r"resuming from \S*step_(\d{8})\.pt", log)
    assert [int(s) for s in resumed] == [20], log  # restarted once, at the last checkpoint before the fault
    trained = (CRASH_STEP - 1) + (steps - int(resumed[0]))
    assert trained <= steps + interval, trained
    # The trial without a fault (its only hook the meeting, which fails no one) never failed or restarted.
    assert not (dirs[plain] / FIRED).exists()
    assert states[plain][1]["num_failures"] == 0, states[plain][1]
    assert "resuming from" not in (dirs[plain] / "training.log").read_text()
    # The sweep ended as one without faults would: its conclusion (at FAULT_STEPS, that nothing trained) and report.
    assert "report: python -m lmtune.analyze" in fault_sweep["out"]


@pytest.mark.slow
def test_two_trials_share_one_logical_gpu(fault_sweep):
    assert fault_sweep["rc"] == 0, fault_sweep["out"][-4000:]
    sweep_dir, dirs = fault_sweep["dir"], fault_sweep["dirs"]
    # The two trials that started together were both at step 10 at once, whichever two Ray started first (the third
    # passed step 10 later, without a mark: faults.meet_first).
    met = sorted(p.name for p in fault_sweep["meeting"].iterdir())
    assert len(met) == 2 and set(met) <= {d.name for d in dirs.values()}, met
    assert json.loads((sweep_dir / "sweep.json").read_text())["resources_per_trial"] == {"cpu": 1.0, "gpu": 0.5}
    states = trial_states(sweep_dir)
    intervals = []
    for tid, trial in dirs.items():
        saved = states[tid][0]["placement_group_factory"]
        factory = pickle.loads(bytes.fromhex(saved["value"] if isinstance(saved, dict) else saved))
        assert factory.bundles == [{"CPU": 1.0, "GPU": 0.5}], factory.bundles  # what Ray scheduled it with
        # torch sees no CUDA here: the trial trained on the CPU.
        assert "device=cpu" in (trial / "training.log").read_text()
        if trial.name in met:
            rows = result_rows(trial)
            start = rows[0]["timestamp"] - rows[0]["elapsed_s"]
            intervals.append((start, rows[-1]["timestamp"]))
    assert len(intervals) == 2
    (s1, e1), (s2, e2) = intervals
    overlap = min(e1, e2) - max(s1, s2)
    assert overlap > 0, f"trials did not run at once on the one GPU: {intervals}"
    # Every trial but the one raising an OOM on every attempt (an error by design) completed.
    outcomes = read_outcomes(sweep_dir)
    assert {t: o["outcome"] for t, o in outcomes.items() if t != fault_sweep["trial"]["oom"]} == \
        {fault_sweep["trial"][f]: "completed" for f in ("crash", "plain")}, outcomes


@pytest.mark.slow
def test_wandb_gets_one_run_per_trial_with_every_tune_result(fault_sweep):
    assert fault_sweep["rc"] == 0, fault_sweep["out"][-4000:]
    sweep_dir, dirs = fault_sweep["dir"], fault_sweep["dirs"]
    wandb_runs = read_wandb_runs(sweep_dir)
    # One run per trial, retried ones included: a trial restarted after a failure keeps its W&B run (Tune's
    # WandbLoggerCallback reuses the trial's logging actor), and its history is what Tune's result.json holds.
    runs = {run["config"]["lr"]: run for run in wandb_runs}
    assert len(wandb_runs) == len(runs) == 3, [run["config"].get("lr") for run in wandb_runs]
    folders = {json.loads((d / "trial.json").read_text())["params"]["lr"]: d for d in dirs.values()}
    assert set(runs) == set(folders) == set(FAULT_SWEEP_LRS.values())
    for lr, folder in folders.items():
        reported = result_rows(folder)
        logged = [row for row in runs[lr]["history"] if "train_loss" in row]
        assert [row["step"] for row in logged] == [row["step"] for row in reported]
        assert [row["train_loss"] for row in logged] == pytest.approx([row["train_loss"] for row in reported])
        assert any("val_loss" in row for row in logged)


def test_dashboard_host_defaults_to_localhost_and_is_a_documented_flag():
    parser = run_cli.build_parser()
    assert parser.parse_args([]).dashboard_host == "127.0.0.1"
    assert "--dashboard-host" in parser.format_help()
    assert parser.parse_args(["--dashboard-host", "0.0.0.0"]).dashboard_host == "0.0.0.0"


# =============================================================================================
# 3. A results folder that cannot take writes, or a full disk


def test_preflight_refuses_a_full_disk_with_one_line(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    with pytest.raises(LmtuneError) as err:
        preflight_write_check(tmp_path / "results", min_free=free + 2**40)
    message = str(err.value)
    assert "\n" not in message and "MiB free" in message and "--results" in message
    assert not list((tmp_path / "results").glob(".lmtune-write-test-*"))


def test_preflight_refuses_an_unwritable_folder(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(LmtuneError, match="cannot write to"):
        preflight_write_check(blocker / "results")
    if os.geteuid() != 0:  # root writes through permission bits
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o555)
        try:
            with pytest.raises(LmtuneError, match="cannot write to"):
                preflight_write_check(locked)
        finally:
            locked.chmod(0o755)


def _unwritable_root(tmp_path: Path) -> Path:
    """A results root no one (root included) can write: its parent is a regular file. Without root, a
    chmod 0o555 folder is used as well (see the test)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    return blocker / "results"


@pytest.mark.parametrize("kind", ["parent-is-a-file", "read-only-folder"])
def test_cli_refuses_an_unwritable_results_folder_before_starting_ray(builtin_data, tmp_path, kind, capsys):
    if kind == "parent-is-a-file":
        results = _unwritable_root(tmp_path)
    else:
        if os.geteuid() == 0:
            pytest.skip("running as root: permission bits do not stop writes (parent-is-a-file covers root)")
        results = tmp_path / "ro"
        results.mkdir(mode=0o555)
    space = write_grid(tmp_path / "grid.yaml", [1e-3])
    try:
        line = _refused_sweep(["--space", str(space), "--name", "x", "--results", str(results), "--data",
                               str(builtin_data)], capsys, "cannot write to")
    finally:
        if kind == "read-only-folder":
            results.chmod(0o755)
    note(f"unwritable results ({kind}): exit 2: {line}")


def _refused_sweep(argv: list[str], capsys, *fragments: str) -> str:
    """python -m lmtune.run ARGV, in this process: one ``error:`` line, exit 2, no Ray started, no table."""
    line = assert_refused(run_cli.main, [*argv, "--no-dashboard", "--quiet"], capsys, *fragments)
    assert not ray.is_initialized(), "a Ray instance was started"
    return line


# =============================================================================================
# 4. Bad input: one line, exit 2, no Ray, nothing written into existing results


def _good_grid(tmp: Path) -> Path:
    return write_grid(tmp / "good.yaml", [1e-3])


def _yaml_case(text: str):
    def make(tmp: Path, data: Path) -> list[str]:
        path = tmp / "space.yaml"
        path.write_text(text)
        return ["--space", str(path), "--data", str(data)]
    return make


def _args_case(*args: str, data: str = "builtin", space: str | None = None):
    def make(tmp: Path, data_dir: Path) -> list[str]:
        chosen = {"builtin": data_dir, "tiny": _tiny_data(tmp), "missing-val": _missing_val(tmp, data_dir)}[data]
        return ["--space", space or str(_good_grid(tmp)), "--data", str(chosen), *args]
    return make


def _tiny_data(tmp: Path) -> Path:
    from lmtune.data.prepare import prepare_tokens

    tokens = np.arange(50, dtype=np.int64) % 20
    src = tmp / "tiny.npy"
    np.save(src, tokens)
    out = tmp / "tiny-data"
    prepare_tokens(src, out) if not out.exists() else None
    return out


def _missing_val(tmp: Path, data_dir: Path) -> Path:
    copy = tmp / "no-val"
    if not copy.exists():
        shutil.copytree(data_dir, copy)
        (copy / "val.bin").unlink()
    return copy


GRID_HEAD = "search: grid\nbudget: quick\n"
BAD_SWEEP_INPUTS = {
    "malformed-yaml": (_yaml_case(GRID_HEAD + "params:\n  lr: [1.0e-3, 3.0e-3\n"), ["malformed YAML"]),
    "unknown-space-name": (lambda tmp, data: ["--space", "no_such_space", "--data", str(data)],
                           ["unknown search space", "lr_grid", "quick"]),
    "wrong-type-in-yaml": (_yaml_case(GRID_HEAD + "params:\n  lr: [fast]\n"), ["lr", "not a valid float"]),
    "wrong-type-set": (_args_case("--set", "batch_size=eight"), ["batch_size", "not a valid int"]),
    "lr-zero": (_yaml_case(GRID_HEAD + "params:\n  lr: [0.0]\n"), ["lr must be a positive finite number"]),
    "lr-negative": (_yaml_case(GRID_HEAD + "params:\n  lr: [-1.0e-3]\n"), ["lr must be a positive finite number"]),
    "lr-nan": (_yaml_case(GRID_HEAD + "params:\n  lr: [.nan]\n"), ["lr must be a positive finite number"]),
    "lr-inf": (_yaml_case(GRID_HEAD + "params:\n  lr: [.inf]\n"), ["lr must be a positive finite number"]),
    "lr-nan-set": (_args_case("--set", "lr=nan", space="quick"), ["lr"]),
    "batch-size-0-set": (_args_case("--set", "batch_size=0"), ["batch_size"]),
    "batch-size-0-yaml": (_yaml_case(GRID_HEAD + "params:\n  lr: [1.0e-3]\nset: {batch_size: 0}\n"),
                          ["batch_size"]),
    "context-longer-than-data": (_args_case("--set", "context_length=128", data="tiny"),
                                 ["fewer than context_length + 1", "context_length"]),
    "vocab-below-max-token-id": (_args_case("--set", "vocab_size=10"), ["vocab_size"]),
    "data-missing-val-bin": (_args_case(data="missing-val"), ["val.bin is missing"]),
    "steps-not-a-whole-number": (_args_case("--set", "steps=2.9"), ["steps='2.9' is not a valid int",
                                                                    "a whole number"]),
    "duplicate-lrs-in-grid": (_yaml_case(GRID_HEAD + "params:\n  lr: [1.0e-3, 1.0e-3, 0.001]\n"),
                              ["params.lr", "0.001 listed more than once"]),
    "set-of-a-swept-param": (_args_case("--set", "lr=0.5"), ["--set lr", "the space sweeps lr"]),
    "step-hook-not-module-function": (_args_case("--step-hook", "faults"), ["--step-hook", "MODULE:FUNCTION"]),
    "step-hook-module-missing": (_args_case("--step-hook", "no_such_module_here:hook"),
                                 ["--step-hook", "cannot import no_such_module_here"]),
    "step-hook-function-missing": (_args_case("--step-hook", "faults:no_such_fault"),
                                   ["--step-hook", "faults has no function no_such_fault"]),
    "yaml-alias-bomb": (_yaml_case(GRID_HEAD + "params:\n  lr: [1.0e-3]\n" + "".join(
        f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9) if i else '1.5'}]\n" for i in range(8))
        + "stopper: {explode_factor: *l7}\n"), ["YAML aliases (*name) are not allowed"]),
}


@pytest.fixture
def existing_results(tmp_path) -> Path:
    """A results root holding an existing sweep folder (with a sweep.json) and a non-sweep folder."""
    results = tmp_path / "results"
    (results / "old").mkdir(parents=True)
    (results / "old" / "sweep.json").write_text(json.dumps({"name": "old"}))
    (results / "old" / "trial_outcomes.json").write_text("{}")
    (results / "not-a-sweep").mkdir()
    (results / "not-a-sweep" / "notes.txt").write_text("hello")
    return results


def _run_refused(args: list[str], results: Path, capsys, *fragments: str) -> None:
    """The sweep CLI must refuse in one line, start no Ray instance, print no table and write nothing."""
    before = snapshot(results)
    _refused_sweep([*args, "--results", str(results)], capsys, *fragments)
    assert snapshot(results) == before, "the refused command wrote into the results folder"


@pytest.mark.parametrize("case", list(BAD_SWEEP_INPUTS), ids=list(BAD_SWEEP_INPUTS))
def test_bad_sweep_input_is_one_line_exit_2_nothing_started_or_written(case, builtin_data, tmp_path,
                                                                       existing_results, capsys):
    make, fragments = BAD_SWEEP_INPUTS[case]
    args = make(tmp_path, builtin_data)
    _run_refused([*args, "--name", "new"], existing_results, capsys, *fragments)
    assert not (existing_results / "new").exists()


BAD_NAMES = {
    "existing-name-without-resume": (["--name", "old"], ["already exists", "--resume"]),
    "resume-of-a-non-sweep": (["--name", "not-a-sweep", "--resume"], ["not an lmtune sweep"]),
    "resume-of-a-missing-sweep": (["--name", "nothing-here", "--resume"], ["no sweep at", "old"]),
    "name-dot-dot": (["--name", "../x"], ["not a plain folder name"]),
    "name-absolute": (["--name", "/abs"], ["not a plain folder name"]),
    "name-nested": (["--name", "a/../../x"], ["not a plain folder name"]),
}


@pytest.mark.parametrize("case", list(BAD_NAMES), ids=list(BAD_NAMES))
def test_bad_name_or_resume_is_one_line_exit_2_nothing_started_or_written(case, builtin_data, tmp_path,
                                                                          existing_results, capsys):
    extra, fragments = BAD_NAMES[case]
    _run_refused(["--space", str(_good_grid(tmp_path)), "--data", str(builtin_data), *extra], existing_results,
                 capsys, *fragments)
    assert not (tmp_path / "x").exists() and not Path("/abs").exists()


BAD_TRAIN_DATA = {
    "context-longer-than-data": (["--set", "context_length=128"], "tiny", ["fewer than context_length + 1"]),
    "vocab-below-max-token-id": (["--set", "vocab_size=10"], "builtin", ["vocab_size"]),
    "data-missing-val-bin": ([], "missing-val", ["val.bin is missing"]),
    "batch-size-0": (["--set", "batch_size=0"], "builtin", ["batch_size"]),
    "lr-nan": (["--lr", "nan"], "builtin", ["lr"]),
    "batch-size-not-a-whole-number": (["--set", "batch_size=4.7"], "builtin", ["batch_size='4.7' is not a valid int"]),
}


@pytest.mark.parametrize("case", list(BAD_TRAIN_DATA), ids=list(BAD_TRAIN_DATA))
def test_train_cli_refuses_bad_data_and_settings_with_one_line(case, builtin_data, tmp_path, capsys):
    extra, data, fragments = BAD_TRAIN_DATA[case]
    data_dir = {"builtin": builtin_data, "tiny": _tiny_data(tmp_path),
                "missing-val": _missing_val(tmp_path, builtin_data)}[data]
    out = tmp_path / "out"
    assert_refused(train_cli.main, ["--data", str(data_dir), "--out", str(out), "--set", "steps=5", "--set",
                                    "warmup_steps=1", *extra], capsys, *fragments)
    assert not out.exists(), sorted(out.rglob("*"))  # a refused run leaves no (empty) folder behind


# =============================================================================================
# 5. Security


class _Exploit:
    """Unpickling this would create the marker file."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def test_checkpoint_with_a_pickled_code_object_is_refused_and_never_executed(tmp_path, caplog):
    marker = tmp_path / "pwned"
    cdir = tmp_path / "checkpoints"
    good = ckpt.save_checkpoint({"step": 10, "model": {"w": torch.zeros(2)}}, ckpt.periodic_path(cdir, 10))
    evil = ckpt.periodic_path(cdir, 20)
    buffer = io.BytesIO()
    torch.save({"step": 20, "model": {"w": torch.zeros(2)}, "payload": _Exploit(str(marker))}, buffer)
    data = buffer.getvalue()
    evil.write_bytes(data)
    ckpt.checksum_path(evil).write_text(hashlib.sha256(data).hexdigest() + "\n")  # a valid checksum

    with pytest.raises(Exception) as err:
        ckpt.load_checkpoint(evil)
    assert "weights" in str(err.value).lower() or "unpickl" in str(err.value).lower(), err.value
    assert not marker.exists()
    caplog.set_level(logging.INFO, logger="lmtune")
    found = ckpt.load_latest(cdir)
    assert found is not None and found[1] == good and found[0]["step"] == 10
    assert not marker.exists()


def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            owner = getattr(func.value, "id", "") if isinstance(func, ast.Attribute) else ""
            yield node, owner, name


def test_lmtune_source_never_unpickles_evaluates_or_executes_user_data():
    problems = []
    for path in sorted((REPO / "lmtune").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node, owner, name in _calls(tree):
            where = f"{path.relative_to(REPO)}:{node.lineno}"
            if owner in ("pickle", "cPickle", "dill", "cloudpickle", "marshal", "shelve") and name in (
                    "load", "loads", "Unpickler", "open"):
                problems.append(f"{where}: {owner}.{name}")
            if owner == "yaml" and name in ("load", "load_all", "unsafe_load", "full_load", "full_load_all"):
                problems.append(f"{where}: yaml.{name} (use yaml.safe_load)")
            if owner == "" and name in ("eval", "exec", "compile", "__import__"):
                problems.append(f"{where}: {name}(")
            if name == "load" and owner == "torch":
                weights_only = [k for k in node.keywords if k.arg == "weights_only"]
                if not weights_only or not (isinstance(weights_only[0].value, ast.Constant)
                                            and weights_only[0].value.value is True):
                    problems.append(f"{where}: torch.load without weights_only=True")
            if owner == "np" and name == "load":
                allow = [k for k in node.keywords if k.arg == "allow_pickle"]
                if allow and not (isinstance(allow[0].value, ast.Constant) and allow[0].value.value is False):
                    problems.append(f"{where}: np.load(allow_pickle=...)")
    assert not problems, problems


def listening_sockets(pids: set[int]) -> list[tuple[str, int, str]]:
    """(address, port, protocol) of every TCP listener and bound UDP socket the processes ``pids`` own,
    read from /proc/net/{tcp,tcp6,udp,udp6} and each process's open file descriptors."""
    inodes: dict[str, int] = {}
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes[target[8:-1]] = pid
        except OSError:
            continue  # the process ended meanwhile
    found = []
    for proto in ("tcp", "tcp6", "udp", "udp6"):
        for line in Path(f"/proc/net/{proto}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if inode not in inodes or (proto.startswith("tcp") and state != "0A"):  # 0A: LISTEN
                continue
            hex_ip, hex_port = local.split(":")
            raw = bytes.fromhex(hex_ip)
            # /proc prints the address as 32-bit words in host (little-endian) order.
            ip = ipaddress.ip_address(b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4)))
            found.append((str(ip), int(hex_port, 16), proto))
    return found


def _loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


# =============================================================================================
# 6. Load: 10 quick trials at full concurrency on 2 cores (two at once, the limit: trials starting, writing the
# ledger and ending side by side; 10 trials reach that limit as 50 did, at a fifth of the cost)


@pytest.mark.slow
def test_ten_quick_trials_at_full_concurrency_all_end_and_the_report_reads_them(builtin_data, tmp_path):
    trials = 10
    lrs = [float(v) for v in np.logspace(-4, 0.5, trials)]
    space = write_grid(tmp_path / "ten.yaml", lrs, steps=20, eval_interval=10, checkpoint_interval=10)
    results = tmp_path / "results"
    started = time.monotonic()
    proc = start_sweep("--space", str(space), "--name", "ten", "--results", str(results), "--data",
                       str(builtin_data), "--num-cpus", "2", "--no-dashboard", "--quiet")
    out = finish(proc, 900)
    seconds = time.monotonic() - started
    assert proc.returncode == 0, out[-4000:]
    sweep_dir = results / "ten"
    ledger = read_outcomes(sweep_dir)
    dirs = trial_dirs(sweep_dir)
    # (read_outcomes parses the ledger whole: after concurrent writes, a torn one would leave no entries.)
    assert len(dirs) == trials and set(ledger) == set(dirs), (len(dirs), len(ledger))
    assert all(e["outcome"] in TERMINAL for e in ledger.values())
    assert all((d / "metrics.csv").is_file() for d in dirs.values())
    counts: dict[str, int] = {}
    for entry in ledger.values():
        counts[entry["outcome"]] = counts.get(entry["outcome"], 0) + 1
    _record, records = load_sweep(sweep_dir)
    assert {r.trial_id for r in records} == set(dirs)
    note(f"load: {trials} trials at 2 concurrent on 2 cores in {seconds:.0f} s; outcomes {counts}; the report read "
         f"{len(records)}")


# =============================================================================================
# 7. A running sweep: what listens, a second writer, and what is left once its driver is killed
# (last in the module: the sweep these tests share runs until they are done, beside no other test's)

SWEEP_MARK = "LMTUNE_TEST_SWEEP"  # in a shared sweep's environment: its processes carry it wherever they go


class LiveSweep:
    """A sweep left running for the tests that watch one, started on first use (again after a test killed it):
    2 trials too long to end meanwhile, both trained past a checkpoint; the dashboard on, at its default host;
    SWEEP_MARK=<its name> in its environment."""

    def __init__(self, root: Path, data: Path):
        self.root, self.data, self.started = root, data, 0
        self.space = write_grid(root / "grid.yaml", [1e-3, 3e-3], asha=False, steps=4000)
        self.proc: subprocess.Popen | None = None

    def running(self) -> subprocess.Popen:
        if self.proc is None or self.proc.poll() is not None:
            self.close()
            self.started += 1
            self.name = f"live{self.started}"
            self.args = ["--space", str(self.space), "--name", self.name, "--results", str(self.root / "results"),
                         "--data", str(self.data), "--num-cpus", "2", "--quiet"]
            log = open(self.root / f"{self.name}.log", "w")  # (read by no one while it runs: a pipe could fill)
            self.proc = start_sweep(*self.args, env={SWEEP_MARK: self.name}, stdout=log)
            log.close()
            sweep_dir = self.root / "results" / self.name
            wait_until(lambda: sweep_dir.exists() and sum(map(has_checkpoint, trial_dirs(sweep_dir).values())) == 2,
                       self.proc, 300, "two running trials with a checkpoint each", poll_s=0.2)
        return self.proc

    def processes(self) -> dict[int, str]:
        """Its live processes (pid -> command line): those of its session (the driver and what it started there:
        Ray's GCS, raylet, dashboard and its modules, agents, trial workers) and those gone to a session of their
        own with its mark (Ray's reaper)."""
        pids = set(session_pids(self.proc.pid)) | processes_with_env(SWEEP_MARK, self.name)
        return {pid: command_line(pid) for pid in sorted(pids)}

    def close(self) -> None:
        if self.proc is not None:
            kill_session(self.proc.pid)
            self.proc.wait()


@pytest.fixture(scope="module")
def live_sweep(builtin_data, tmp_path_factory):
    sweep = LiveSweep(tmp_path_factory.mktemp("live"), builtin_data)
    yield sweep
    sweep.close()


@pytest.mark.slow
def test_a_local_sweep_listens_on_loopback_only(live_sweep):
    live_sweep.running()
    sockets = listening_sockets(set(live_sweep.processes()))
    assert len(sockets) >= 8, sockets  # GCS, raylet, workers, agents, dashboard, metrics: all of them seen
    exposed = [s for s in sockets if not _loopback(s[0])]
    assert not exposed, exposed
    note(f"local sweep: {len(sockets)} listeners, all on loopback")


@pytest.mark.slow
def test_resume_while_the_sweep_runs_is_refused_and_the_running_sweep_is_untouched(live_sweep):
    proc = live_sweep.running()
    second = run_lmtune("run", *live_sweep.args, "--resume", timeout=120)
    assert_one_line_error(second.returncode, second.stderr, "being written by another lmtune run",
                          f"(pid {proc.pid})")
    assert proc.poll() is None  # the first run goes on


@pytest.mark.slow
def test_nothing_of_a_sweep_keeps_running_once_its_driver_is_killed(live_sweep):
    proc = live_sweep.running()
    before = live_sweep.processes()
    # What could outlive the driver, each seen: Ray's servers, the dashboard and its agent, the trials' workers, and
    # the reaper that ends them (lmtune.sweep.session.RayReaper, in a session of its own).
    for part in ("gcs_server", "raylet", "dashboard.py", "DashboardAgent", "ray::ImplicitFunc", "signal.SIG_IGN"):
        assert any(part in cmd for cmd in before.values()), (part, before)
    sigkill(proc)
    killed = time.monotonic()
    # Before: the dashboard and runtime-env agents kept listening for about two minutes.
    wait_until(lambda: not live_sweep.processes(), None, 60, "every process of the sweep gone", required=False)
    left = live_sweep.processes()
    assert not left, left
    note(f"driver SIGKILLed with {len(before) - 1} other processes of its sweep: all gone "
         f"{time.monotonic() - killed:.1f} s later")
