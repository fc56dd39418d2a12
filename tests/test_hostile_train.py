"""What a hostile tester tried on one training run (part four): a resume continues only the run it resumes, a
fork takes its parent's data by identity and refuses unusable paths in one line, --quiet is quiet, destinations
and settings are refused before any work (the built-in corpus included), lr_find's options are bounded, and a
run that never climbed above its start and ran out of budget did not learn: it did not diverge."""

from __future__ import annotations

import json
import logging
import math
import shutil
from pathlib import Path

import pytest
from conftest import TINY, TINY_MODEL, assert_refused, read_only, run_lmtune, set_args, snapshot

from lmtune import lr_find
from lmtune import train as train_cli
from lmtune.errors import LmtuneError
from lmtune.training.checkpoint import BEST_NAME, STABLE_NAME, periodic_path
from lmtune.training.divergence import LossWatch
from lmtune.training.fork import fork_run
from lmtune.training.loop import train
from lmtune.training.metrics import read_metrics

# A 6-step WSD run of the tiny model: its cooldown is its last step (step 6 trains at lr x min_lr_ratio).
WSD6 = {**TINY_MODEL, "batch_size": 4, "steps": 6, "warmup_steps": 1, "schedule": "wsd", "lr": 3e-3,
        "log_interval": 2, "eval_interval": 2, "eval_batches": 1, "checkpoint_interval": 2, "device": "cpu",
        "compile": "off"}
# The tiny model for 2 steps at an LR too small to move it: seed 3 starts (and stays) above ℓ₀ = ln 3801.
UNLEARNED = {**TINY, "steps": 2, "warmup_steps": 1, "lr": 1e-6, "seed": 3, "eval_batches": 1}


@pytest.fixture(scope="module")
def finished_wsd(builtin_data, tmp_path_factory) -> Path:
    """A finished 6-step WSD run written by `lmtune train` (checkpoints at steps 2, 4, 6; stable.pt at 5)."""
    out = tmp_path_factory.mktemp("wsd") / "run"
    assert train_cli.main(["--data", str(builtin_data), "--out", str(out), "--quiet", *set_args(WSD6)]) == 0
    return out


@pytest.fixture
def wsd_run(finished_wsd, tmp_path) -> Path:
    """A copy of the finished run this test may resume (the module's run stays as it was)."""
    return Path(shutil.copytree(finished_wsd, tmp_path / "run"))


# ---------------------------------------------------------------------------------------------
# 3. --resume continues the run it resumes, or refuses


def test_resume_with_more_steps_refuses_when_the_finished_runs_cooldown_trained_another_lr(wsd_run, capsys):
    before = snapshot(wsd_run)
    line = assert_refused(train_cli.main, ["--out", str(wsd_run), "--resume", "--set", "steps=8"], capsys,
                          "step 6", "lr 0.0003", "0.003", "fork", "another --out")
    assert "stable.pt" in line
    assert snapshot(wsd_run) == before


@pytest.mark.slow
def test_resume_with_more_steps_continues_when_the_schedules_agree_up_to_its_checkpoint(make_tiny_config,
                                                                                        builtin_data, tmp_path):
    """A WSD run cut at step 10 of 30 (still at its peak LR) given 40 steps ends as the 40-step run from scratch."""
    wsd = {**TINY, "schedule": "wsd", "steps": 30, "run_steps": 10}
    cut = tmp_path / "cut"
    assert train_cli.main(["--data", str(builtin_data), "--out", str(cut), "--quiet", *set_args(wsd)]) == 0
    assert train_cli.main(["--out", str(cut), "--resume", "--quiet", "--set", "steps=40", "--set", "run_steps=0"]) == 0
    scratch = train(make_tiny_config(schedule="wsd", steps=40), tmp_path / "scratch")
    resumed = json.loads((cut / "summary.json").read_text())
    assert resumed["status"] == "completed" and resumed["steps"] == 40
    assert resumed["final_val_loss"] == scratch.summary["final_val_loss"]


@pytest.mark.parametrize("pair, named", [
    ("seed=1", "seed 0 -> 1"),
    ("batch_size=8", "batch_size 4 -> 8"),
    ("d_model=64", "d_model 32 -> 64"),
    ("weight_decay=0", "weight_decay 0.1 -> 0.0"),
    ("eval_batches=4", "eval_batches 1 -> 4"),
])
def test_resume_refuses_a_set_that_would_make_the_run_another_run_naming_it(pair, named, wsd_run, capsys):
    before = snapshot(wsd_run)
    assert_refused(train_cli.main, ["--out", str(wsd_run), "--resume", "--set", pair], capsys, named, "another --out")
    assert snapshot(wsd_run) == before


def test_resume_refuses_data_other_than_the_runs_and_writes_nothing(wsd_run, tmp_path, capsys):
    before = snapshot(wsd_run)
    assert_refused(train_cli.main, ["--out", str(wsd_run), "--resume", "--data", str(tmp_path / "other")], capsys,
                   "trained on", str(tmp_path / "other"), "drop --data")
    assert snapshot(wsd_run) == before


def test_resume_refuses_a_budget_other_than_the_runs(wsd_run, capsys):
    assert_refused(train_cli.main, ["--out", str(wsd_run), "--resume", "--budget", "full"], capsys,
                   "budget quick, not full", "drop --budget")


def test_resume_takes_the_runs_own_data_through_another_path_and_new_bookkeeping(wsd_run, builtin_data, tmp_path):
    link = tmp_path / "same-data"
    link.symlink_to(builtin_data)
    argv = ["--out", str(wsd_run), "--resume", "--quiet", "--data", str(link), "--set", "log_interval=1",
            "--set", "keep_checkpoints=1"]
    assert train_cli.main(argv) == 0
    assert json.loads((wsd_run / "summary.json").read_text())["status"] == "completed"


# ---------------------------------------------------------------------------------------------
# 10. a torn config.json


@pytest.mark.parametrize("text, named", [
    ('{"model": {"d_model": 32', "JSONDecodeError"),
    ("[1, 2]", "TypeError"),
    ('{"model": {}, "train": {"steps": -3}}', "steps must be a positive integer"),
])
def test_resume_of_a_torn_config_json_is_refused_naming_the_file_and_the_fix(text, named, wsd_run, capsys):
    (wsd_run / "config.json").write_text(text)
    before = snapshot(wsd_run)
    assert_refused(train_cli.main, ["--out", str(wsd_run), "--resume"], capsys, str(wsd_run / "config.json"), named,
                   "restore it")
    assert snapshot(wsd_run) == before


# ---------------------------------------------------------------------------------------------
# 5. --quiet


@pytest.mark.slow
def test_train_quiet_shows_the_console_only_warnings_and_the_final_summary(builtin_data, tmp_path):
    proc = run_lmtune("train", "--data", str(builtin_data), "--out", str(tmp_path / "run"), "--quiet",
                      *set_args({**TINY, "steps": 10}), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert " INFO " not in proc.stderr, proc.stderr[-3000:]
    assert proc.stdout.startswith("completed: 10 steps") and len(proc.stdout.splitlines()) == 1, proc.stdout
    assert "step 10/10" in (tmp_path / "run" / "training.log").read_text()  # the log file still has every row


# ---------------------------------------------------------------------------------------------
# 9. destinations, and every refusal before the built-in corpus is built


def test_train_refuses_an_out_in_a_read_only_folder_before_building_the_corpus(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # where the built-in corpus would be built (data/builtin)
    with read_only(tmp_path / "locked") as locked:
        assert_refused(train_cli.main, ["--out", str(locked / "run")], capsys, "cannot write", "--out")
    assert not (tmp_path / "data").exists() and not (tmp_path / "locked" / "run").exists()


def test_train_refuses_an_out_under_a_file(builtin_data, tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine\n")
    assert_refused(train_cli.main, ["--data", str(builtin_data), "--out", str(tmp_path / "notes.txt" / "run")],
                   capsys, "is a file, not a folder", "--out")
    assert (tmp_path / "notes.txt").read_text() == "mine\n"


def test_train_refuses_a_bad_setting_before_building_the_corpus(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert_refused(train_cli.main, ["--set", "steps=0"], capsys, "steps must be a positive integer")
    assert list(tmp_path.iterdir()) == []


def test_lr_find_refuses_an_out_in_a_read_only_folder_before_building_the_corpus(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with read_only(tmp_path / "locked") as locked:
        assert_refused(lr_find.main, ["--out", str(locked / "find")], capsys, "cannot write", "--out")
    assert not (tmp_path / "data").exists()


# ---------------------------------------------------------------------------------------------
# 12. lr_find's bounds


@pytest.mark.parametrize("flags, named", [
    (["--steps", "1000000000"], "steps must be a whole number from 10 to 10,000"),
    (["--max-lr", "1e9"], "at most 1e+06"),
])
def test_lr_find_refuses_options_beyond_what_a_range_test_takes(flags, named, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    # (--data: a folder that is not there, so that a tree without the bound refuses at the data, not runs for days)
    assert_refused(lr_find.main, [*flags, "--data", str(tmp_path / "none")], capsys, named)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# A run that never climbed and ran out of budget did not learn: it did not diverge


def test_a_budget_that_ends_near_its_initial_loss_without_ever_climbing_did_not_learn():
    ell0 = math.log(3801)
    watch = LossWatch(ell0, budget_steps=2)
    assert not watch.see(2, ell0 + 0.03).diverged  # the whole window above ℓ₀, but within noise of the start
    verdict = watch.finish(2)
    assert not verdict.diverged and not verdict.stop and verdict.did_not_learn
    assert "did not learn within its budget" in verdict.reason


def test_a_budget_that_climbed_and_ended_above_its_initial_loss_still_diverged():
    ell0 = math.log(3801)
    watch = LossWatch(ell0, budget_steps=4)
    watch.see(2, 6.0)
    watch.see(4, 9.0)  # climbed from 6 to 9: above ℓ₀ at the budget's end
    verdict = watch.finish(4)
    assert verdict.diverged and not verdict.did_not_learn


def test_a_two_step_smoke_run_still_at_its_initial_loss_completes_saying_it_did_not_learn(builtin_data, tmp_path,
                                                                                          capsys, caplog):
    out = tmp_path / "smoke"
    with caplog.at_level(logging.WARNING, logger="lmtune"):
        code = train_cli.main(["--data", str(builtin_data), "--out", str(out), "--quiet", *set_args(UNLEARNED)])
    summary = json.loads((out / "summary.json").read_text())
    # The case itself: above ℓ₀ (ln 3801) where the budget ended, nothing climbed.
    assert read_metrics(out / "metrics.csv")[-1]["train_loss"] > summary["divergence"]["initial_loss"]
    assert summary["divergence"]["spikes"] == []
    assert code == 0 and summary["status"] == "completed" and summary["divergence"]["did_not_learn"]
    assert "did not learn within its budget" in summary["reason"]
    assert capsys.readouterr().out.startswith("completed, did not learn: 2 steps")
    assert any("did not learn" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


# ---------------------------------------------------------------------------------------------
# fork_run: paths refused in one line, the data by identity

FORK = {**TINY, "schedule": "wsd", "steps": 20, "checkpoint_interval": 5, "keep_checkpoints": 10}


@pytest.fixture(scope="module")
def parent_run(make_tiny_config, tmp_path_factory) -> Path:
    """A 20-step WSD run (its stable phase ends at step 16) trained on the built-in corpus by a relative path."""
    out = tmp_path_factory.mktemp("parent") / "run"
    config = make_tiny_config(**FORK)
    data = Path(config.data_dir)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(data.parent)
        config.data_dir = data.name
        train(config, out)
    return out


@pytest.mark.parametrize("where, named", [
    (lambda run, tmp: tmp / "missing.pt", "does not exist"),
    (lambda run, tmp: run / "checkpoints", "is a folder"),
    (lambda run, tmp: run / "checkpoints" / BEST_NAME, "holds no run state"),
], ids=["missing", "folder", "best.pt"])
def test_fork_from_a_path_that_is_no_checkpoint_is_refused_in_one_line(where, named, parent_run, make_tiny_config,
                                                                       tmp_path):
    with pytest.raises(LmtuneError, match=named) as refused:
        fork_run(where(parent_run, tmp_path), make_tiny_config(**{**FORK, "steps": 10}), tmp_path / "fork")
    assert "\n" not in str(refused.value) and not (tmp_path / "fork").exists()


def test_fork_into_a_file_is_refused_in_one_line(parent_run, make_tiny_config, tmp_path):
    (tmp_path / "notes.txt").write_text("mine\n")
    with pytest.raises(LmtuneError, match="is a file, not a folder"):
        fork_run(parent_run / "checkpoints" / STABLE_NAME, make_tiny_config(**{**FORK, "steps": 30}),
                 tmp_path / "notes.txt")
    assert (tmp_path / "notes.txt").read_text() == "mine\n"


def test_fork_takes_the_parents_data_given_by_an_absolute_path_as_the_same_data(parent_run, make_tiny_config,
                                                                                tmp_path, monkeypatch):
    child = make_tiny_config(**{**FORK, "steps": 10})  # data_dir: the absolute path of what the parent named relatively
    monkeypatch.chdir(Path(child.data_dir).parent)  # where the parent's relative path names it
    forked = fork_run(periodic_path(parent_run / "checkpoints", 5), child, tmp_path / "fork")
    assert forked.status == "completed" and forked.summary["steps"] == 10
