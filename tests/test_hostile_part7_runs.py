"""``analyze --runs`` against hostile logs (issue 68, items 3, 6, 8, 9, 11 and 13): runs sharing a name are kept
apart, a repeated header is refused, a log is read in memory proportional to its numbers (not 28x its text), counts
that go down within a run, a FIFO, a JSONL row nested 100k deep, an LR of 1e300, flags that do nothing with --runs and
a negative loss are each one line."""

from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path

import pytest
from conftest import assert_refused, snapshot, write_csv

from lmtune.analyze import main
from lmtune.report.external_runs import read_runs


def curve(lr: float, seed: int = 0, steps: int = 6) -> list[dict]:
    """One run's rows: its loss falls from 6 towards 2, faster the larger its LR (up to 0.01), a little lower for
    seed 1."""
    return [{"lr": lr, "seed": seed, "step": step, "tokens": step * 1024,
             "val_loss": round(2.0 + 4.0 * 0.9 ** (min(lr, 0.01) * 100 * step) - seed * 0.01, 4)}
            for step in range(1, steps + 1)]


def refused(tmp_path: Path, capsys, argv: list[str], *fragments: str) -> None:
    """analyze refuses argv in one line naming each fragment, and writes nothing under tmp_path."""
    before = snapshot(tmp_path)
    assert_refused(main, argv, capsys, *fragments)
    assert snapshot(tmp_path) == before


# ---------------------------------------------------------------------------------------------
# Item 3: runs sharing a name are kept apart; a repeated header is refused; the count read is said


def test_runs_sharing_a_name_at_two_lrs_are_kept_apart_by_lr_and_seed_and_the_count_read_is_printed(tmp_path,
                                                                                                  capsys):
    rows = [{"run": "baseline" if lr < 0.01 else f"big{lr}", **row}
            for lr in (0.001, 0.003, 0.01, 0.03) for seed in (0, 1) for row in curve(lr, seed)]
    log = write_csv(tmp_path / "runs.csv", rows)
    assert main(["--runs", str(log)]) == 0
    assert "8 runs" in capsys.readouterr().out
    summary = json.loads((tmp_path / "runs.csv_report" / "summary.json").read_text())
    assert sorted((row["lr"], row["seed"]) for row in summary["trials"]) == [
        (lr, seed) for lr in (0.001, 0.003, 0.01, 0.03) for seed in (0, 1)]


def test_a_run_whose_lr_follows_a_schedule_stays_one_run_at_its_peak_lr(tmp_path):
    rows = [{**row, "run": "warm", "lr": min(0.01, 0.002 * row["step"])} for row in curve(0.01)]
    rows += [{**row, "run": "flat"} for row in curve(0.001)]
    found = read_runs(write_csv(tmp_path / "runs.csv", rows))
    assert sorted((run.name, run.lr) for run in found.runs) == [("flat", 0.001), ("warm", 0.01)]


def test_a_wandb_export_whose_header_names_a_column_twice_is_refused(tmp_path, capsys):
    export = tmp_path / "wandb.csv"
    export.write_text("Step,lr=0.001 seed=0 - val_loss,lr=0.001 seed=0 - val_loss\n10,4.0,3.0\n20,3.8,2.9\n")
    refused(tmp_path, capsys, ["--runs", str(export)], "wandb.csv", "'lr=0.001 seed=0 - val_loss'", "twice",
            "columns 2 and 3")


def test_a_jsonl_row_naming_a_key_twice_is_refused(tmp_path, capsys):
    log = tmp_path / "runs.jsonl"
    log.write_text('{"lr": 0.01, "step": 1, "val_loss": 4.0}\n{"lr": 0.01, "step": 2, "val_loss": 3.9, '
                   '"val_loss": 3.1}\n')
    refused(tmp_path, capsys, ["--runs", str(log)], "runs.jsonl, line 2", "'val_loss'", "twice")


# ---------------------------------------------------------------------------------------------
# Item 6: a log is held as its numbers, not as 28x its text


def test_reading_a_log_holds_less_memory_than_twice_its_size(tmp_path):
    rows = [{**row, "train_loss": row["val_loss"] + 0.1, "wall_time": row["step"] * 0.5, "note": "x" * 8}
            for lr in (0.001, 0.01) for seed in (0, 1) for row in curve(lr, seed, steps=5000)]
    log = write_csv(tmp_path / "runs.csv", rows)
    tracemalloc.start()
    try:
        found = read_runs(log)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(found.runs) == 4 and sum(len(run.points) for run in found.runs) == len(rows)
    assert peak < 2 * log.stat().st_size, (peak, log.stat().st_size)


def test_logs_whose_report_would_not_fit_in_the_memory_available_are_refused_before_reading(tmp_path, capsys,
                                                                                             monkeypatch):
    from lmtune.report import run_tables

    log = write_csv(tmp_path / "runs.csv", curve(0.001) + curve(0.01))
    size = log.stat().st_size
    monkeypatch.setattr(run_tables, "available_memory", lambda: 4 * size - 1)  # (the measured 4x: one byte short)
    refused(tmp_path, capsys, ["--runs", str(log)], "of memory to report", "is available", "fewer runs at a time")
    monkeypatch.setattr(run_tables, "available_memory", lambda: 4 * size)
    assert len(read_runs(log).runs) == 2


# ---------------------------------------------------------------------------------------------
# Item 8: counts that go down within a run


def test_token_counts_that_go_down_within_a_run_are_refused_naming_the_run_and_the_line(tmp_path, capsys):
    rows = curve(0.001) + [{**row, "tokens": (7 - row["step"]) * 1024} for row in curve(0.01)]
    log = write_csv(tmp_path / "runs.csv", [{k: v for k, v in row.items() if k != "step"} for row in rows])
    refused(tmp_path, capsys, ["--runs", str(log)], "runs.csv, line 9", "lr=0.01", "tokens 5120 after 6144")


def test_a_run_restarted_that_logs_a_step_again_with_another_loss_is_refused(tmp_path, capsys):
    rows = curve(0.001) + curve(0.01)[:4] + [{**row, "val_loss": row["val_loss"] + 0.5} for row in curve(0.01)[3:]]
    refused(tmp_path, capsys, ["--runs", str(write_csv(tmp_path / "runs.csv", rows))], "runs.csv, line 12",
            "lr=0.01", "step 4 again", "val_loss")


def test_a_row_logging_the_val_loss_alone_at_a_step_already_logged_is_the_same_point(tmp_path):
    rows = [{"lr": 0.01, "step": step, "train_loss": 5.0 - step * 0.1, "val_loss": ""} for step in (1, 2, 3)]
    rows.insert(2, {"lr": 0.01, "step": 2, "train_loss": "", "val_loss": 4.85})
    (run,) = read_runs(write_csv(tmp_path / "runs.csv", rows)).runs
    assert run.points["step"].tolist() == [1, 2, 2, 3]


# ---------------------------------------------------------------------------------------------
# Item 9: no traceback


def test_runs_on_a_fifo_is_refused_in_one_line(tmp_path, capsys):
    fifo = tmp_path / "runs.csv"
    os.mkfifo(fifo)
    assert_refused(main, ["--runs", str(fifo)], capsys, "runs.csv is not a file or a folder")


@pytest.mark.skipif(not Path("/dev/null").exists(), reason="no /dev/null")
def test_runs_on_dev_null_is_refused_in_one_line(capsys):
    assert_refused(main, ["--runs", "/dev/null"], capsys, "/dev/null is not a file or a folder")


def test_a_jsonl_row_nested_100k_deep_is_refused_in_one_line(tmp_path, capsys):
    log = tmp_path / "runs.jsonl"
    log.write_text('{"lr": 0.01, "step": 1, "val_loss": 4.0}\n' + '{"a": ' * 100_000 + "1" + "}" * 100_000 + "\n")
    refused(tmp_path, capsys, ["--runs", str(log)], "runs.jsonl, line 2", "nested")


def test_an_lr_of_1e300_is_refused_in_one_line(tmp_path, capsys):
    rows = curve(0.001) + curve(1e300)
    refused(tmp_path, capsys, ["--runs", str(write_csv(tmp_path / "runs.csv", rows))], "runs.csv, line 8",
            "1e+300 is not a learning rate", "at most 1e+06")


# ---------------------------------------------------------------------------------------------
# Item 11: flags that do nothing with --runs


@pytest.mark.parametrize("flag", [["--model", "my_model.py:build"], ["--trust-code"], ["--samples", "3"]])
def test_a_flag_for_a_sweeps_checkpoints_is_refused_with_runs(tmp_path, capsys, flag):
    log = write_csv(tmp_path / "runs.csv", curve(0.001) + curve(0.01))
    refused(tmp_path, capsys, ["--runs", str(log), *flag], f"{flag[0]} does nothing with --runs")


# ---------------------------------------------------------------------------------------------
# Item 13: a negative loss


def test_a_negative_loss_is_refused_naming_the_run_and_the_line(tmp_path, capsys):
    rows = curve(0.001) + [{**row, "val_loss": -1.5 if row["step"] == 3 else row["val_loss"]} for row in curve(0.01)]
    refused(tmp_path, capsys, ["--runs", str(write_csv(tmp_path / "runs.csv", rows))], "runs.csv, line 10",
            "lr=0.01", "-1.5", "negative")


# ---------------------------------------------------------------------------------------------
# Item 9, found on the way: a JSON integer too large for a float


def test_a_jsonl_count_too_large_for_a_float_is_refused_in_one_line(tmp_path, capsys):
    log = tmp_path / "runs.jsonl"
    log.write_text('{"lr": 0.01, "step": 1, "val_loss": 4.0}\n'
                   '{"lr": 0.01, "step": 1' + "0" * 400 + ', "val_loss": 3.0}\n')
    refused(tmp_path, capsys, ["--runs", str(log)], "runs.jsonl, line 2, column step", "is not a step count")
