"""benchmarks/lr_truth.py, the ground-truth LR grid: every argument is checked before anything is written, and
a truth holds one setting (model, budget, schedule, data): a second train of another setting into it is
refused, and so is a comparison with a sweep of another setting."""

from __future__ import annotations

import importlib
import json
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import TINY_MODEL, assert_refused, grid_sweep_record, run_python, set_args, snapshot

from lmtune.data.dataset import read_meta
from lmtune.sweep.record import run_config_of
from lmtune.sweep.sweep_file import DataRecord

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _benchmark():
    """benchmarks/lr_truth.py as a module, importable by name (a spawned pool worker imports it too)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    return importlib.import_module("lr_truth")


lr_truth = _benchmark()

# The truth's runs: the tiny model, 4 steps of 4 windows (a second or two each).
TINY_TRUTH = {**TINY_MODEL, "batch_size": 4, "steps": 4, "warmup_steps": 1, "log_interval": 1, "eval_interval": 2,
              "eval_batches": 1, "checkpoint_interval": 4, "device": "cpu", "compile": "off"}


def train_args(data: Path | str, out: Path | str, *extra: str, **settings) -> list[str]:
    return ["train", "--data", str(data), "--out", str(out), "--workers", "1",
            *set_args({**TINY_TRUTH, **settings}), *extra]


@pytest.fixture(scope="module")
def truth(builtin_data, tmp_path_factory) -> Path:
    """A finished truth of one run (lr 0.01, seed 0), trained by the benchmark as a user would run it."""
    out = tmp_path_factory.mktemp("truth") / "truth"
    proc = run_python(str(BENCHMARKS / "lr_truth.py"), *train_args(builtin_data, out, "--lrs", "0.01", "--seeds", "0"),
                      timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return out


def copy_truth(truth: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(truth, tmp_path / "truth"))


def sweep_of(folder: Path, truth: Path, params: dict | None = None, content_hash: str | None = None,
             report: bool = True, **changes) -> Path:
    """A sweep folder as compare reads it (sweep.json, report/summary.json), with no training: its base config the
    truth's run's with ``changes`` (field names), on the truth's data (or data of ``content_hash``)."""
    config = run_config_of(json.loads((truth / "lr=0.01_seed=0" / "config.json").read_text()))
    for key, value in changes.items():
        setattr(config.model if hasattr(config.model, key) else config.train, key, value)
    meta = read_meta(Path(config.data_dir))
    data = DataRecord(config.data_dir, replace(meta, content_hash=content_hash or meta.content_hash))
    folder.mkdir(parents=True)
    grid_sweep_record(folder.name, [0.003, 0.01], config, params=params, data=data).write(folder)
    if report:
        (folder / "report").mkdir()
        (folder / "report" / "summary.json").write_text(json.dumps(
            {"best_lr": 0.01, "edge_lr_low": 0.01, "divergence_lr": None, "basin": None, "degraded": None}))
    return folder


# ---------------------------------------------------------------------------------------------
# Every argument checked before anything is written


def _train(*extra: str) -> list[str]:
    return train_args("{data}", "{out}", *extra)


BAD_ARGUMENTS = [
    pytest.param(_train("--ratio", "1"), "--ratio", id="train-ratio-1"),
    pytest.param(_train("--lr-min", "0"), "--lr-min", id="train-lr-min-0"),
    pytest.param(_train("--lr-min", "1", "--lr-max", "0.001"), "--lr-max", id="train-lr-min-above-lr-max"),
    pytest.param(_train("--lr-max", "inf"), "--lr-max", id="train-lr-max-inf"),
    pytest.param(_train("--lr-min", "1e-6", "--ratio", "1.01", "--seeds", "0"), "over 1000 LRs",
                 id="train-grid-of-thousands"),
    pytest.param(_train("--lrs", "abc"), "--lrs", id="train-lrs-abc"),
    pytest.param(_train("--lrs", "nan", "--seeds", "0"), "LR nan", id="train-lrs-nan"),
    pytest.param(_train("--lrs", "0.1,0.10001", "--seeds", "0"), "names a run twice", id="train-lrs-one-folder-twice"),
    pytest.param(_train("--lrs", "0.01", "--ratio", "2", "--seeds", "0"), "not both", id="train-lrs-and-ratio"),
    pytest.param(_train("--lrs", "0.01", "--seeds", "0,x"), "--seeds", id="train-seeds-0-x"),
    pytest.param(_train("--lrs", "0.01", "--seeds", "-1"), "--seeds", id="train-seeds-negative"),
    pytest.param(_train("--lrs", "0.01", "--seeds", "0", "--workers", "0"), "--workers", id="train-workers-0"),
    pytest.param(_train("--lrs", "0.01", "--seeds", "0", "--space", "nope"), "nope", id="train-space-nope"),
    pytest.param(_train("--lrs", "0.01", "--seeds", "0", "--set", "lr=0.1"), "--set lr", id="train-set-lr"),
    pytest.param(_train("--lrs", "0.01", "--seeds", "0", "--set", "run_steps=2"), "run_steps",
                 id="train-set-run-steps"),
    pytest.param(_train("--lrs", "0.01", "--seeds", "0", "--data", "{missing}"), "does not exist",
                 id="train-data-missing"),
    pytest.param(_train("--lrs", "0.01", "--seeds", "0", "--out", "{file}"), "--out", id="train-out-is-a-file"),
    pytest.param(_train("--lrs", "0.01", "--seeds", "0", "--out", "{file}/truth"), "--out",
                 id="train-out-under-a-file"),
    pytest.param(_train("--lrs", "0.01", "--seeds", "0", "--out", "{other}"), "no truth",
                 id="train-out-holds-other-files"),
    pytest.param(["table", "{missing}"], "does not exist", id="table-missing-folder"),
    pytest.param(["table", "{empty}"], "no finished run", id="table-empty-folder"),
    pytest.param(["table", "{file}"], "is a file", id="table-a-file"),
    pytest.param(["table", "{truth}", "--window", "nan"], "--window", id="table-window-nan"),
    pytest.param(["table", "{truth}", "--window", "-1"], "--window", id="table-window-negative"),
    pytest.param(["table", "{truth}", "--window", "2"], "--window", id="table-window-above-1"),
    pytest.param(["compare", "{empty}", "{sweep}"], "no finished run", id="compare-empty-truth"),
    pytest.param(["compare", "{truth}", "{empty}"], "not an lmtune sweep", id="compare-not-a-sweep"),
    pytest.param(["compare", "{truth}", "{unreported}"], "analyze", id="compare-sweep-not-analyzed"),
]


@pytest.mark.parametrize(("argv", "fragment"), BAD_ARGUMENTS)
def test_a_bad_argument_is_refused_in_one_line_and_nothing_is_written(argv, fragment, truth, builtin_data, tmp_path,
                                                                       capsys):
    given = tmp_path / "given"
    places = {"data": builtin_data, "out": tmp_path / "out", "missing": given / "missing", "file": given / "file",
              "empty": given / "empty", "other": given / "other", "truth": truth,
              "sweep": sweep_of(given / "sweep", truth), "unreported": sweep_of(given / "bare", truth, report=False)}
    places["file"].write_text("a file\n")
    places["empty"].mkdir()
    places["other"].mkdir()
    (places["other"] / "notes.txt").write_text("mine\n")
    before, truth_before = snapshot(tmp_path), snapshot(truth)
    assert_refused(lr_truth.main, [arg.format(**places) for arg in argv], capsys, fragment)
    assert snapshot(tmp_path) == before and snapshot(truth) == truth_before


# ---------------------------------------------------------------------------------------------
# A truth holds one setting


@pytest.mark.parametrize(("settings", "fragments"), [
    pytest.param({"steps": 8}, ("budget", "steps 4 vs 8"), id="budget"),
    pytest.param({"d_model": 64}, ("model", "d_model 32 vs 64"), id="model"),
    pytest.param({"warmup_steps": 2}, ("schedule", "warmup_steps 1 vs 2"), id="schedule"),
])
def test_a_second_train_of_another_setting_into_a_truth_is_refused_and_leaves_it_untouched(settings, fragments, truth,
                                                                                          builtin_data, tmp_path,
                                                                                          capsys):
    out = copy_truth(truth, tmp_path)
    before = snapshot(out)
    argv = train_args(builtin_data, out, "--lrs", "0.01", "--seeds", "0", **settings)
    assert_refused(lr_truth.main, argv, capsys, "another setting", *fragments)
    assert snapshot(out) == before


def test_a_second_train_on_other_data_into_a_truth_is_refused(truth, builtin_data, tmp_path, capsys):
    other = Path(shutil.copytree(builtin_data, tmp_path / "other-data"))
    meta = json.loads((other / "meta.json").read_text())
    (other / "meta.json").write_text(json.dumps({**meta, "content_hash": "0" * 64}))  # data of other tokens
    out = copy_truth(truth, tmp_path)
    before = snapshot(out)
    assert_refused(lr_truth.main, train_args(other, out, "--lrs", "0.01", "--seeds", "0"), capsys,
                   "another setting", "data")
    assert snapshot(out) == before


def test_a_second_train_of_the_same_setting_trains_only_the_new_runs_and_records_every_run(truth, builtin_data,
                                                                                           tmp_path, capsys):
    out = copy_truth(truth, tmp_path)
    # how often a run logs or checkpoints is bookkeeping, not its setting
    argv = train_args(builtin_data, out, "--lrs", "0.01", "--seeds", "1", checkpoint_interval=2)
    assert lr_truth.main(argv) == 0
    assert "1 runs to train (1 LRs x 1 seeds, 0 done)" in capsys.readouterr().out
    grid = json.loads((out / "grid.json").read_text())
    assert grid["lrs"] == [0.01] and grid["seeds"] == [0, 1]
    assert (out / "lr=0.01_seed=1" / "summary.json").is_file()


def test_table_refuses_a_truth_whose_runs_differ_in_budget(truth, tmp_path, capsys):
    out = copy_truth(truth, tmp_path)
    odd = Path(shutil.copytree(out / "lr=0.01_seed=0", out / "lr=0.02_seed=0"))
    config = json.loads((odd / "config.json").read_text())
    config["train"].update(lr=0.02, steps=8)
    (odd / "config.json").write_text(json.dumps(config))
    assert_refused(lr_truth.main, ["table", str(out)], capsys, "mixes settings", "lr=0.02_seed=0", "steps 4 vs 8")


@pytest.mark.parametrize(("changes", "fragments"), [
    pytest.param({"d_model": 64, "steps": 6}, ("model (d_model 32 vs 64)", "budget (steps 4 vs 6"),
                 id="model-and-budget"),
    pytest.param({"batch_size": 8}, ("budget (batch_size 4 vs 8", "tokens"), id="batch"),
    pytest.param({"context_length": 16}, ("budget (context_length 32 vs 16", "tokens"), id="context"),
    pytest.param({"content_hash": "0" * 64}, ("data",), id="data"),
])
def test_compare_refuses_a_sweep_of_another_model_budget_or_data_naming_what_differs(changes, fragments, truth,
                                                                                      tmp_path, capsys):
    sweep = sweep_of(tmp_path / "sweep", truth, **changes)
    assert_refused(lr_truth.main, ["compare", str(truth), str(sweep)], capsys, "differ in", *fragments)


def test_compare_refuses_a_sweep_that_varies_the_model_from_trial_to_trial(truth, tmp_path, capsys):
    sweep = sweep_of(tmp_path / "sweep", truth, params={"lr": [0.01], "d_model": [32, 64]})
    assert_refused(lr_truth.main, ["compare", str(truth), str(sweep)], capsys, "varies d_model")


def test_compare_checks_a_sweep_of_the_same_setting_whatever_its_lr_seed_and_bookkeeping(truth, tmp_path, capsys):
    sweep = sweep_of(tmp_path / "sweep", truth, lr=0.003, seed=7, log_interval=2, eval_interval=4,
                     checkpoint_interval=2)
    assert lr_truth.main(["compare", str(truth), str(sweep)]) == 0
    checks = json.loads(capsys.readouterr().out)
    assert checks["best_lr_in_truth_basin"] is True and checks["search_best_lr"] == 0.01
