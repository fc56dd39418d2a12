"""Issue 68 items 1 and 7: a lowest LR that diverged is data, not the edge (no traceback, and no failing or
divergence LR named below the best); where no run beat the data's unigram baseline, nothing trained and no best LR
is crowned. Each read as ``analyze`` reads a sweep's folder, as ``run`` prints at a sweep's end, and (item 1) as
``analyze --runs`` reads a plain loop's CSV."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
from pathlib import Path

import pytest
from conftest import disk_sweep, run_printout

from lmtune.analysis.bracket import bracket
from lmtune.analysis.conclusion import conclude
from lmtune.analysis.named_lrs import divergence_bracket
from lmtune.analysis.runs import Budget, Run
from lmtune.analyze import main as analyze_main

NAN = math.nan
FULL = 1000
BUDGET = Budget(steps=FULL, warmup_steps=0, tokens_per_step=1, seed=0, rungs=(FULL,))

# A grid [0.001, 0.01, 0.03] whose 0.001 went NaN (the sweep's budget: 30 steps of 500 tokens).
LOWEST_DIVERGED = {"a": (0.001, "diverged", {10: 5.5, 20: NAN}),
                   "b": (0.01, "completed", {10: 5.0, 20: 4.5, 30: 4.2}),
                   "c": (0.03, "completed", {10: 5.1, 20: 4.6, 30: 4.3})}
# Every run ended above the data's unigram baseline (5.67 nats) and below ℓ₀ = ln 500; the largest LR went NaN.
UNIGRAM = 5.67
NOTHING_TRAINED = {"a": (0.5, "completed", {10: 6.0, 20: 5.95, 30: 5.9}),
                   "b": (1.5, "completed", {10: 6.0, 20: 5.9, 30: 5.81}),
                   "c": (5.0, "diverged", {10: 6.1, 20: NAN})}


def ran(lr: float, loss: float | None, seed: int = 0) -> Run:
    """A run of the whole budget ending at ``loss``; None: it went non-finite (diverged)."""
    if loss is None:
        return Run(lr, seed, "grid", FULL, FULL, "diverged", FULL // 2, {FULL // 4: 5.0}, divergence="non-finite")
    return Run(lr, seed, "grid", FULL, FULL, "completed", FULL, {FULL: loss})


def analyzed(sweep: Path) -> tuple[dict, str, str]:
    """analyze's summary.json, lr_sweep_analysis.md and printout of a sweep's folder (it must succeed; its learning
    curves against tokens only, the fewest figures)."""
    return _analyze(sweep.parent / "report", [str(sweep), "--samples", "0", "--x", "tokens"])


def _analyze(out_dir: Path, argv: list[str]) -> tuple[dict, str, str]:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = analyze_main([*argv, "--out", str(out_dir)])
    assert code == 0, printed.getvalue()[-3000:]
    return (json.loads((out_dir / "summary.json").read_text()), (out_dir / "lr_sweep_analysis.md").read_text(),
            printed.getvalue())


def with_unigram_baseline(sweep: Path, baseline: float) -> Path:
    """The sweep as one whose data's unigram baseline sweep.json recorded."""
    record = json.loads((sweep / "sweep.json").read_text())
    (sweep / "sweep.json").write_text(json.dumps({**record, "unigram_loss": baseline}))
    return sweep


def runs_csv(path: Path, columns: tuple[str, ...], finals: dict[float, list[float]]) -> Path:
    """A plain loop's log: per LR, one row per evaluation at steps 10, 20, 30 (train loss 0.1 above val)."""
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        for lr, losses in finals.items():
            for i, loss in enumerate(losses):
                row = {"lr": lr, "step": 10 * (i + 1), "train_loss": loss + 0.1, "val_loss": loss}
                writer.writerow([row[c] for c in columns])
    return path


def analyzed_runs(log: Path) -> tuple[dict, str, str]:
    """analyze --runs's summary.json, lr_sweep_analysis.md and printout of a log (it must succeed)."""
    return _analyze(log.parent / "runs_report", ["--runs", str(log)])


def assert_no_named_lr_below_the_best(summary: dict) -> None:
    for named in ("failing_lr", "divergence_lr"):
        assert summary[named] is None or summary[named] > summary["best_lr"], (named, summary[named])


# ---------------------------------------------------------------------------------------------
# Item 1: a lowest LR that diverged


def test_a_divergence_below_every_lr_that_trained_is_not_the_edge_the_search_brackets():
    runs = [ran(0.001, None), ran(0.01, 4.2), ran(0.03, 4.3)]
    edge = bracket(runs)
    assert (edge.stable_lr, edge.diverged_lr, edge.failed_below) == (0.03, None, (0.001,))
    above = bracket([*runs, ran(0.1, None)])
    assert (above.stable_lr, above.diverged_lr, above.failed_below) == (0.03, 0.1, (0.001,))


def test_a_divergence_below_every_lr_that_trained_is_not_the_divergence_lr():
    runs = [ran(0.001, None), ran(0.01, 4.2), ran(0.03, 4.3)]
    assert (divergence_bracket(runs).diverged_lr, divergence_bracket(runs).failed_below) == (None, (0.001,))
    assert divergence_bracket([*runs, ran(0.1, None)]).diverged_lr == 0.1


def test_a_failure_between_lrs_that_trained_but_below_the_best_is_neither_the_failing_nor_the_divergence_lr():
    conclusion = conclude([ran(0.001, 4.0), ran(0.003, None), ran(0.01, 3.5), ran(0.1, None)], BUDGET)
    assert conclusion.best_lr == 0.01
    assert (conclusion.edge.diverged_lr, conclusion.divergence.diverged_lr) == (0.1, 0.1)
    assert conclusion.edge.stable_lr == 0.01 and conclusion.edge.failed_below == (0.003,)


def test_analyze_of_a_sweep_whose_lowest_lr_went_non_finite_names_the_best_and_says_that_lr_is_not_the_edge(
        tmp_path):
    summary, text, out = analyzed(disk_sweep(tmp_path, LOWEST_DIVERGED))
    assert summary["best_lr"] == 0.01
    assert (summary["failing_lr"], summary["divergence_lr"]) == (None, None)
    sentence = "lr 0.001 diverged where no smaller LR trained"
    assert sentence in text and sentence in out


def test_the_end_of_a_sweep_whose_lowest_lr_went_non_finite_prints_the_best_lr_not_a_traceback(tmp_path, capsys):
    code, out = run_printout(disk_sweep(tmp_path, LOWEST_DIVERGED), 3, capsys)
    assert code == 0
    assert "best lr 0.01:" in out and "lr 0.001 diverged where no smaller LR trained" in out


def test_analyze_runs_of_a_loop_whose_lowest_lr_goes_nan_reports_it_as_data(tmp_path):
    log = runs_csv(tmp_path / "runs.csv", ("lr", "step", "train_loss", "val_loss"),
                   {0.001: [5.5, NAN, NAN], 0.01: [5.0, 4.5, 4.2], 0.03: [5.1, 4.6, 4.3]})
    summary, text, out = analyzed_runs(log)
    assert summary["best_lr"] == 0.01 and summary["lr_sensitivity_lrs"] >= 1
    assert_no_named_lr_below_the_best(summary)
    assert "lr 0.001 diverged where no smaller LR trained" in text


def test_analyze_runs_without_train_loss_names_no_lr_below_the_best_and_counts_the_lr_that_trained_above_it(
        tmp_path):
    log = runs_csv(tmp_path / "runs.csv", ("lr", "step", "val_loss"),
                   {0.001: [5.5, NAN, NAN], 0.003: [5.0, 4.2, 3.9], 0.01: [5.1, 4.6, 4.5]})
    summary, text, out = analyzed_runs(log)
    assert summary["best_lr"] == 0.003
    assert_no_named_lr_below_the_best(summary)
    assert "failing lr 0.001" not in out and "divergence lr 0.001" not in out
    assert "no LR between the basin and the edge trained" not in text
    assert "lr 0.001 diverged where no smaller LR trained" in out


# ---------------------------------------------------------------------------------------------
# Item 7: nothing beat the unigram baseline


@pytest.fixture(scope="module")
def nothing_trained_analyzed(tmp_path_factory) -> tuple[dict, str, str]:
    """analyze of the sweep where no run beat the unigram baseline (read by two tests)."""
    return analyzed(with_unigram_baseline(disk_sweep(tmp_path_factory.mktemp("untrained"), NOTHING_TRAINED), UNIGRAM))


def test_analyze_of_a_sweep_where_no_run_beat_the_unigram_baseline_crowns_no_best_lr_and_says_why(
        nothing_trained_analyzed):
    summary, text, out = nothing_trained_analyzed
    assert (summary["best_lr"], summary["best_trial"], summary["best_val_loss"]) == (None, None, None)
    for said in (text, out):
        assert "nothing trained" in said.lower() and "5.81" in said and "5.67" in said
    assert "best lr 1.5" not in out


def test_the_end_of_a_sweep_where_nothing_trained_says_so_with_the_best_loss_and_the_baseline(tmp_path, capsys):
    code, out = run_printout(with_unigram_baseline(disk_sweep(tmp_path, NOTHING_TRAINED), UNIGRAM), 3, capsys)
    assert code == 0  # (the sweep ran as asked: what it found is that nothing trained)
    assert "nothing trained" in out and "5.81" in out and "5.67" in out
    assert "best lr 1.5" not in out


def test_a_failing_lr_above_lrs_that_ran_their_budget_untrained_does_not_say_none_below_it_ran_its_budget(
        nothing_trained_analyzed):
    summary, text, out = nothing_trained_analyzed
    assert "no LR below it trained its whole budget" not in out + text
    assert "0.5 and 1.5 ran their whole budget but ended no better than the data's unigram baseline" in out
