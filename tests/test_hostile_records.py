"""What a hostile tester did to a finished sweep's records (part four), each written against the behaviour before its
fix: a deleted trial folder is said, never silently left out of the conclusion; a report folder that is not the
sweep's own is refused; a value out of range in a record is warned about and its row skipped; an edited sweep.json
is refused in one line before anything starts; a damaged search state is warned about and ignored; a destination
that cannot take the report is refused before any report work."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import ray
from conftest import assert_refused, disk_sweep, read_only, snapshot

from lmtune import diagnose
from lmtune import run as run_cli
from lmtune.analyze import main as analyze_main
from lmtune.searches.state import search_state_path
from lmtune.sweep.plan import SweepPlan
from lmtune.sweep.spaces import load_space
from lmtune.training.config import budget_config

# Three LRs that each trained their whole budget: b (0.003) is the best, c (0.01) the next.
TRIALS = {"a": (0.001, "completed", {10: 5.0, 20: 4.5, 30: 4.0}),
          "b": (0.003, "completed", {10: 4.8, 20: 4.2, 30: 3.5}),
          "c": (0.01, "completed", {10: 4.9, 20: 4.4, 30: 3.9})}


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    """A finished synthetic sweep (no training): three completed trials, b the best."""
    return disk_sweep(tmp_path, TRIALS)


def sweep_in(root: Path) -> Path:
    """The synthetic sweep in a folder of its own (root/disk)."""
    root.mkdir(parents=True)
    return disk_sweep(root, TRIALS)


def trial_dir(sweep: Path, trial_id: str) -> Path:
    return next(sweep.glob(f"{trial_id}_lr=*"))


def edit_sweep_json(sweep: Path, edit) -> None:
    record = json.loads((sweep / "sweep.json").read_text())
    edit(record)
    (sweep / "sweep.json").write_text(json.dumps(record))


def edit_metrics_row(sweep: Path, trial_id: str, line: int, column: str, value: str) -> None:
    """Set one cell of a trial's metrics.csv (``line`` 1 is the header)."""
    path = trial_dir(sweep, trial_id) / "metrics.csv"
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    cells = lines[line - 1].split(",")
    cells[header.index(column)] = value
    lines[line - 1] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n")


def analyze_ok(sweep: Path, capsys, *args: str) -> str:
    """analyze in this process, exit 0; returns its stdout (its warnings are log records: caplog)."""
    code = analyze_main([str(sweep), *args])
    out, err = capsys.readouterr()
    assert code == 0, err[-3000:]
    return out


# sweep.json edits a reader cannot use, and the key each refusal must name.
EDITS = {
    "space null": (lambda r: r.update(space=None), "space is null"),
    "space a list": (lambda r: r.update(space=[1, 2]), "space is [1, 2]"),
    "recovery_window text": (lambda r: r["space"].update(stopper={"recovery_window": "x"}),
                             "space.stopper.recovery_window"),
    "horizon budgets text": (lambda r: r["space"].update(search="horizon", horizon={"budgets": "x"}),
                             "space.horizon.budgets"),
}


# =============================================================================================
# analyze


def test_analyze_says_which_ledger_trials_have_no_folder_and_that_the_best_lr_was_chosen_without_them(
        sweep, capsys):
    shutil.rmtree(trial_dir(sweep, "b"))  # the best trial's folder
    out = analyze_ok(sweep, capsys)
    warning = next(line for line in out.splitlines() if line.startswith("warning:"))
    assert "b (completed)" in warning and "the best LR was chosen without it" in warning


def test_summary_json_lists_the_missing_trials_beside_its_usual_keys(sweep, tmp_path, capsys):
    analyze_ok(sweep, capsys, "--out", str(tmp_path / "whole"))
    whole = json.loads((tmp_path / "whole" / "summary.json").read_text())
    shutil.rmtree(trial_dir(sweep, "b"))
    analyze_ok(sweep, capsys, "--out", str(tmp_path / "without_b"))
    without = json.loads((tmp_path / "without_b" / "summary.json").read_text())
    assert whole["missing_trials"] == []
    assert without["missing_trials"] == [{"trial_id": "b", "outcome": "completed", "reason": "completed"}]
    assert set(without) == set(whole)


def test_the_markdown_report_says_the_best_lr_was_chosen_without_the_missing_trials(sweep, capsys):
    shutil.rmtree(trial_dir(sweep, "b"))
    analyze_ok(sweep, capsys)
    text = (sweep / "report" / "lr_sweep_analysis.md").read_text()
    assert "`b` (completed)" in text and "The best LR and every conclusion below were chosen without it" in text


def test_analyze_refuses_a_report_folder_linked_to_another_sweeps_report_and_leaves_that_report(tmp_path, capsys):
    a, b = sweep_in(tmp_path / "A"), sweep_in(tmp_path / "B")
    analyze_ok(b, capsys)
    (a / "report").symlink_to(b / "report", target_is_directory=True)
    before = snapshot(b)
    assert_refused(analyze_main, [str(a)], capsys, f"{a / 'report'} is a link to", "not a folder of the sweep's own",
                   "--out")
    assert snapshot(b) == before


def test_analyze_refuses_a_report_folder_holding_another_existing_sweeps_report(tmp_path, capsys):
    a, b = sweep_in(tmp_path / "A"), sweep_in(tmp_path / "B")
    analyze_ok(b, capsys)
    shutil.copytree(b / "report", a / "report")
    before = snapshot(a)
    assert_refused(analyze_main, [str(a)], capsys, "holds the report of another sweep", str(b.resolve()))
    assert snapshot(a) == before


def test_a_metrics_row_with_infinite_tokens_is_left_out_with_a_warning(sweep, capsys, caplog):
    edit_metrics_row(sweep, "a", 3, "tokens", "inf")
    analyze_ok(sweep, capsys)
    assert "metrics.csv: 1 row(s) with a count out of range left out (line 3: tokens inf)" in caplog.text


def test_a_metrics_row_with_1e300_tokens_is_not_counted_as_spent(sweep, tmp_path, capsys, caplog):
    edit_metrics_row(sweep, "c", 4, "tokens", "1e300")
    analyze_ok(sweep, capsys)
    assert "tokens 1e300" in caplog.text
    spent = json.loads((sweep / "report" / "summary.json").read_text())["compute"]["tokens_spent"]
    assert spent == 15_000 + 15_000 + 10_000  # c's rows up to its 20th step


def test_a_negative_step_leaves_a_completed_trial_completed(sweep, capsys, caplog):
    edit_metrics_row(sweep, "b", 3, "step", "-6")
    analyze_ok(sweep, capsys)
    assert "step -6" in caplog.text
    summary = json.loads((sweep / "report" / "summary.json").read_text())
    assert summary["status_counts"] == {"completed": 3}


@pytest.mark.parametrize("edit", EDITS, ids=list(EDITS))
def test_analyze_refuses_an_edited_sweep_json_naming_the_file_and_the_field(edit, sweep, capsys):
    change, field = EDITS[edit]
    edit_sweep_json(sweep, change)
    before = snapshot(sweep)
    assert_refused(analyze_main, [str(sweep)], capsys, f"{sweep / 'sweep.json'}: {field}", "restore the file")
    assert snapshot(sweep) == before


@pytest.mark.slow
@pytest.mark.parametrize("state", [("horizon", {"interrupted": ["t1"]}), ("edge", {"interrupted": "x"}),
                                   ("edge", {"decisions": [{"stage": 1}]})], ids=["horizon-list", "edge-text",
                                                                                  "edge-decisions"])
def test_an_unusable_search_state_is_warned_about_and_ignored(state, sweep, tmp_path, capsys, caplog):
    analyze_ok(sweep, capsys, "--out", str(tmp_path / "before"))
    kind, value = state
    path = search_state_path(sweep, kind)
    path.write_text(json.dumps(value))
    analyze_ok(sweep, capsys, "--out", str(tmp_path / "after"))
    assert f"ignoring {path}" in caplog.text
    before, after = (json.loads((tmp_path / n / "summary.json").read_text()) for n in ("before", "after"))
    assert after["best_lr"] == before["best_lr"] and after["status_counts"] == before["status_counts"]


def test_analyze_refuses_a_read_only_sweep_in_one_line_suggesting_out(sweep, capsys):
    with read_only(sweep):
        before = snapshot(sweep)
        assert_refused(analyze_main, [str(sweep)], capsys, "cannot write to", "give --out FOLDER")
        assert snapshot(sweep) == before


@pytest.mark.parametrize("where", ["under-a-file", "dangling-link"])
def test_analyze_refuses_an_out_that_cannot_take_the_report(where, sweep, tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "rep" if where == "under-a-file" else tmp_path / "link"
    if where == "dangling-link":
        out.symlink_to(tmp_path / "nowhere")
    before = snapshot(sweep)
    fragment = "which is a file" if where == "under-a-file" else "which does not exist"
    assert_refused(analyze_main, [str(sweep), "--out", str(out)], capsys, f"--out {out}", fragment)
    assert snapshot(sweep) == before and (tmp_path / "file").read_text() == "x"
    assert not (tmp_path / "nowhere").exists()


def test_analyze_on_a_results_root_reports_the_newest_readable_sweep_and_says_which_it_skipped(tmp_path, capsys,
                                                                                              caplog):
    older, newer = sweep_in(tmp_path / "older"), sweep_in(tmp_path / "newer")
    for folder, stamp in ((older, "2020-01-01T00:00:00+0000"), (newer, "2030-01-01T00:00:00+0000")):
        edit_sweep_json(folder, lambda r, s=stamp: r.update(start_time=s))
    root = tmp_path / "results"
    root.mkdir()
    shutil.move(older, root / "older")
    shutil.move(newer, root / "newer")
    (root / "newer" / "sweep.json").write_text('{"start_time": "2030-01-01T00:00:00+0000", "space": [')
    out = analyze_ok(root, capsys)
    assert f"reporting the newest sweep: {root / 'older'}" in out
    skipped = [line for line in caplog.text.splitlines() if "skipped" in line]
    assert len(skipped) == 1 and str(root / "newer") in skipped[0] and "unreadable" in skipped[0]


def test_analyze_leaves_out_a_trial_folder_without_config_json_with_a_warning_not_as_running(sweep, capsys,
                                                                                             caplog):
    (trial_dir(sweep, "c") / "config.json").unlink()
    analyze_ok(sweep, capsys)
    assert f"{trial_dir(sweep, 'c')}: unreadable trial folder (no config.json)" in caplog.text
    summary = json.loads((sweep / "report" / "summary.json").read_text())
    assert summary["status_counts"] == {"completed": 2}
    assert [m["trial_id"] for m in summary["missing_trials"]] == ["c"]


def test_a_resumed_edge_searcher_with_a_damaged_state_file_continues_from_tunes_snapshot(tmp_path, caplog):
    from lmtune.analysis.runs import Budget
    from lmtune.searches.edge.search import EdgeSearch
    from lmtune.searches.edge.settings import EdgeSettings
    from lmtune.sweep.searcher import DecidingSearcher

    budget = Budget(steps=162, warmup_steps=18, tokens_per_step=1024, seed=0, rungs=(18432, 55296, 165888))
    search = EdgeSearch(EdgeSettings(), budget)
    search.suggest("t000")
    (tmp_path / "snapshot.json").write_text(json.dumps(search.to_json()))
    damaged = {k: v for k, v in search.to_json().items() if k != "plans"}
    search_state_path(tmp_path, "edge").parent.mkdir()
    search_state_path(tmp_path, "edge").write_text(json.dumps(damaged))
    searcher = DecidingSearcher(EdgeSearch(EdgeSettings(), budget), tmp_path)
    with caplog.at_level(logging.WARNING):
        searcher.restore(str(tmp_path / "snapshot.json"))
    assert searcher.search.to_json() == search.to_json()
    assert "resuming from Tune's own snapshot" in caplog.text


# =============================================================================================
# diagnose


def test_diagnose_leaves_out_a_metrics_row_with_infinite_tokens_with_a_warning(sweep, capsys, caplog):
    edit_metrics_row(sweep, "a", 4, "tokens", "inf")
    assert diagnose.main([str(sweep)]) == 0
    out = capsys.readouterr().out
    assert "line 4: tokens inf" in caplog.text and "sweep ETA: done" in out


@pytest.mark.parametrize("edit", EDITS, ids=list(EDITS))
def test_diagnose_refuses_an_edited_sweep_json_naming_the_file_and_the_field(edit, sweep, capsys):
    change, field = EDITS[edit]
    edit_sweep_json(sweep, change)
    assert_refused(diagnose.main, [str(sweep)], capsys, f"{sweep / 'sweep.json'}: {field}", "restore the file")


def test_diagnose_warns_about_a_trial_folder_without_config_json_as_analyze_does(sweep, capsys, caplog):
    (trial_dir(sweep, "c") / "config.json").unlink()
    assert diagnose.main([str(sweep)]) == 0
    out = capsys.readouterr().out
    assert f"{trial_dir(sweep, 'c')}: unreadable trial folder (no config.json)" in caplog.text
    assert "c_lr" not in out and f"sweep {sweep}: 2 trials" in out


def test_diagnose_names_the_benchmarked_budget_with_budget_and_keeps_config_as_a_hidden_alias():
    parser = diagnose.build_parser()
    assert parser.parse_args(["--budget", "quick"]).budget == "quick"
    assert parser.parse_args(["--config", "quick"]).budget == "quick"
    assert "--budget" in parser.format_help() and "--config" not in parser.format_help()


# =============================================================================================
# run --resume


@pytest.fixture
def planned_sweep(sweep: Path) -> Path:
    """The synthetic sweep with the whole plan a real sweep's sweep.json holds (the shipped quick space's), so that
    a resume gets as far as a real one would."""
    space = load_space("quick")
    plan = SweepPlan.create(space, budget_config(space.budget, dict(space.fixed)))
    edit_sweep_json(sweep, lambda record: record.update(plan.to_json()))
    return sweep


@pytest.mark.parametrize("edit", EDITS, ids=list(EDITS))
def test_resume_refuses_an_edited_sweep_json_before_ray_starts(edit, planned_sweep, capsys):
    sweep = planned_sweep
    change, field = EDITS[edit]
    edit_sweep_json(sweep, change)
    before = snapshot(sweep)
    assert_refused(run_cli.main, ["--name", sweep.name, "--resume", "--results", str(sweep.parent),
                                  "--no-dashboard", "--quiet"], capsys, f"sweep.json: {field}", "restore the file")
    assert not ray.is_initialized(), "a Ray instance was started"
    assert snapshot(sweep) == before
