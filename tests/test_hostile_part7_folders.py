"""What a hostile tester tried (part seven) on the folders lmtune writes and reads: ``train --resume`` on a sweep's
trial trained it again from step 0 over its records (and while the sweep ran); a sweep stored inside another sweep,
and links inside a sweep, made ``diagnose`` and ``analyze`` count trials that are not the sweep's own, or one twice;
a bare ``lmtune run`` on a CPU started days of work without saying so, and its Ctrl-C count did not add up."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import ray
from conftest import assert_refused, disk_sweep, grid_sweep_record, snapshot

from lmtune import diagnose, run, train
from lmtune.sweep.record import sole_writer, write_trial_file
from lmtune.sweep.runner import SweepResult
from lmtune.training.config import budget_config
from lmtune.training.metrics import write_metrics

TINY_MODEL = {"d_model": 16, "d_ff": 32, "n_layers": 1, "n_heads": 2, "context_length": 16, "batch_size": 2}
TRIAL_STEPS = {"steps": 20, "warmup_steps": 2, "log_interval": 10, "eval_interval": 10, "eval_batches": 1,
               "checkpoint_interval": 10}
THREE_TRIALS = {f"t{i}": (lr, "completed", {10: 5.0 - i / 10, 30: 4.5 - i / 10})
                for i, lr in enumerate([1e-3, 3e-3, 1e-2])}


@pytest.fixture(scope="module")
def small_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prepared data folder of 4,000 token ids (vocabulary 50): enough for TINY_MODEL's windows, made in
    milliseconds."""
    from lmtune.data.prepare import prepare_tokens

    root = tmp_path_factory.mktemp("small-data")
    np.save(root / "ids.npy", (np.arange(4000, dtype=np.int64) * 7919) % 50)
    return prepare_tokens(root / "ids.npy", root / "data")


def ended_trial(folder: Path, data: Path, lr: float, trial_id: str = "t0") -> Path:
    """A sweep trial as the default ``--keep best`` leaves it: config.json, trial.json, metrics.csv, summary.json
    and checkpoints/best.pt; no step checkpoint."""
    config = budget_config("quick", {**TINY_MODEL, **TRIAL_STEPS, "lr": lr}, data_dir=str(data))
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(config.to_json())
    write_trial_file(folder, trial_id, {"lr": lr})
    write_metrics(folder / "metrics.csv", [{"step": 20, "tokens": 640, "train_loss": 3.5, "val_loss": 3.6}])
    (folder / "summary.json").write_text(json.dumps({"status": "completed", "steps": 20, "best_val_loss": 3.6}))
    (folder / "checkpoints").mkdir()
    (folder / "checkpoints" / "best.pt").write_bytes(b"the weights at the best val loss")
    return folder


def files(root: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime) of every file under ``root`` (a refused command's write probe touches its folder's mtime)."""
    return {name: stat for name, stat in snapshot(root).items() if (root / name).is_file()}


def ended_sweep(root: Path, data: Path) -> Path:
    """A sweep folder (sweep.json) holding one ended trial."""
    sweep = root / "sweep"
    sweep.mkdir()
    base = budget_config("quick", {**TINY_MODEL, **TRIAL_STEPS}, data_dir=str(data))
    grid_sweep_record("sweep", [1e-3], base).write(sweep)
    ended_trial(sweep / "t0_lr=0.001", data, 1e-3)
    return sweep


# ---------------------------------------------------------------------------------------------
# Item 5: train --resume of a run with nothing to resume, or of a trial of a running sweep


def test_train_resume_of_a_run_that_kept_best_pt_only_is_refused_and_leaves_its_records(small_data, tmp_path,
                                                                                         capsys):
    trial = ended_sweep(tmp_path, small_data) / "t0_lr=0.001"
    before = files(tmp_path)
    assert_refused(train.main, ["--out", str(trial), "--resume", "--quiet"], capsys,
                   "nothing to resume", "best.pt only", "no step checkpoint", "metrics.csv", "summary.json",
                   "config.json")
    assert files(tmp_path) == before


def test_train_resume_of_a_folder_of_records_without_any_checkpoint_is_refused_too(small_data, tmp_path, capsys):
    run_folder = ended_trial(tmp_path / "run", small_data, 1e-3)
    for path in (run_folder / "checkpoints" / "best.pt", run_folder / "summary.json"):
        path.unlink()
    before = files(tmp_path)
    assert_refused(train.main, ["--out", str(run_folder), "--resume", "--quiet"], capsys,
                   "nothing to resume", "no step checkpoint", "metrics.csv")
    assert files(tmp_path) == before


def test_train_resume_of_a_sweeps_trial_holding_its_config_alone_trains_it_from_step_0(small_data, tmp_path,
                                                                                         capsys):
    trial = ended_sweep(tmp_path, small_data) / "t0_lr=0.001"
    for path in (trial / "metrics.csv", trial / "summary.json", trial / "checkpoints" / "best.pt"):
        path.unlink()
    assert train.main(["--out", str(trial), "--resume", "--quiet"]) == 0
    summary = json.loads((trial / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == TRIAL_STEPS["steps"]
    assert "20 steps" in capsys.readouterr().out


def test_train_resume_of_a_trial_of_a_sweep_whose_lock_is_held_is_refused_naming_the_holder(small_data, tmp_path,
                                                                                            capsys):
    sweep = ended_sweep(tmp_path, small_data)
    trial = sweep / "t0_lr=0.001"
    (trial / "summary.json").unlink()  # (a trial the sweep has not ended: it would be resumable but for the lock)
    with sole_writer(sweep, new=False):
        before = files(tmp_path)
        assert_refused(train.main, ["--out", str(trial), "--resume", "--quiet"], capsys,
                       f"{sweep} is being written by a running lmtune sweep (pid {os.getpid()})",
                       "wait for it to end")
        assert files(tmp_path) == before


# ---------------------------------------------------------------------------------------------
# Item 10: a sweep inside a sweep, and links inside a sweep


@pytest.mark.parametrize("flag", ["--storage", "--results"])
def test_a_new_sweep_whose_folder_would_be_inside_another_sweep_is_refused_in_one_line(flag, tmp_path, capsys,
                                                                                       monkeypatch):
    monkeypatch.chdir(tmp_path)
    outer = disk_sweep(tmp_path, THREE_TRIALS)
    before = snapshot(tmp_path)
    assert_refused(run.main, ["--space", "quick", "--name", "inner", flag, str(outer / "trials"), "--no-dashboard",
                              "--quiet"], capsys,
                   f"{flag} {outer / 'trials'}", f"inside the sweep {outer}", "outside any sweep")
    assert not ray.is_initialized()
    assert snapshot(tmp_path) == before


def sweep_with_strangers(tmp_path: Path) -> Path:
    """disk_sweep's three trials, beside which: a sweep of two trials nested in it (outer/disk, as
    ``--storage outer`` made it), a link up -> .. (whose folder beside the sweep holds a run), and a link to one of
    its own trial folders."""
    outer = disk_sweep(tmp_path, THREE_TRIALS)
    disk_sweep(outer, dict(list(THREE_TRIALS.items())[:2]))
    stranger = tmp_path / "a-run-outside"
    stranger.mkdir()
    (stranger / "config.json").write_text((outer / "t0_lr=0.001" / "config.json").read_text())
    write_metrics(stranger / "metrics.csv", [{"step": 10, "tokens": 100, "train_loss": 5.0, "val_loss": 5.0}])
    (outer / "up").symlink_to("..")
    (outer / "copy-of-t0").symlink_to(outer / "t0_lr=0.001")
    return outer


def test_diagnose_shows_a_sweeps_own_trials_only_not_a_nested_sweeps_nor_any_through_a_link(tmp_path, capsys):
    sweep = sweep_with_strangers(tmp_path)
    assert diagnose.main([str(sweep)]) == 0
    out = capsys.readouterr().out
    assert f"sweep {sweep}: 3 trials" in out
    for stranger in ("disk/", "up/", "a-run-outside", "copy-of-t0"):
        assert stranger not in out


def test_the_reports_reader_reads_a_sweeps_own_trial_folders_once_each(tmp_path):
    from lmtune.report.reader import load_sweep

    sweep = sweep_with_strangers(tmp_path)
    _, trials = load_sweep(sweep)
    assert sorted(t.trial_id for t in trials) == ["t0", "t1", "t2"]


# ---------------------------------------------------------------------------------------------
# Item 12: a bare `lmtune run` on a CPU, and the count an interrupted sweep prints


BARE_RUN_SETS = [a for k, v in {**TINY_MODEL, "device": "cpu"}.items() for a in ("--set", f"{k}={v}")]


def test_a_bare_run_on_a_cpu_is_refused_without_yes_telling_its_measured_time_and_quick_edge(small_data, tmp_path,
                                                                                           capsys):
    argv = ["--data", str(small_data), "--results", str(tmp_path / "results"), "--name", "bare", *BARE_RUN_SETS,
            "--no-dashboard", "--quiet"]
    line = assert_refused(run.main, argv, capsys, "lr_grid", "7 trials", "measured here", "on this CPU", "--yes",
                          "--space quick_edge")
    assert "expected time" in line
    assert not ray.is_initialized()
    assert not (tmp_path / "results").exists()


def test_with_yes_a_bare_run_on_a_cpu_prints_its_expected_time_and_goes_on(small_data, tmp_path, capsys):
    argv = ["--data", str(small_data), "--results", str(tmp_path / "results"), "--name", "bare", *BARE_RUN_SETS,
            "--yes"]
    args = run.build_parser().parse_args(argv)
    run.check_cpu_time(args, run.sweep_options(args, argv))
    out = capsys.readouterr().out
    assert out.startswith("expected time on this CPU:") and "7 trials" in out and "measured here" in out


def test_an_interrupted_sweeps_count_adds_its_running_and_unstarted_trials_up_to_its_planned_trials(tmp_path,
                                                                                                    capsys):
    from lmtune.sweep.options import SweepOptions
    from lmtune.sweep.record import ledger_path

    sweep = disk_sweep(tmp_path, dict(list(THREE_TRIALS.items())[:2]))
    ledger_path(sweep).write_text("{}")  # both still running: the ledger has not ended either
    code = run.print_result(SweepResult(sweep, 7, {}, stopped_by="SIGINT"), SweepOptions(space="lr_grid", name="d"))
    out = capsys.readouterr().out
    assert code != 0
    assert "\n7 trials: 2 running; 5 not started\n" in out
