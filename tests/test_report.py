import csv
import json
import re

import numpy as np
import pandas as pd
import pytest
from conftest import assert_real_picture

from lmtune.findings.sharpness import Sharpness, SharpnessRow
from lmtune.findings.stability import TrialRecord, classify
from lmtune.findings.summary import SweepFacts, sweep_summary
from lmtune.report.figures import (
    plot_instability,
    plot_lr_vs_loss,
    plot_sharpness,
    plot_sweep_comparison,
    sweep_comparison_figure,
)
from lmtune.report.markdown import HEADINGS, write_markdown
from lmtune.report.writer import write_tables
from lmtune.training.figures import wall_unit

N = 40
# 40 rows 25 steps apart, 512 tokens per step; ℓ₀ = ln 10000 = 9.21, where the curves start.
CONFIG = {"model": {"vocab_size": 10000, "context_length": 256}, "train": {"steps": 25 * N, "batch_size": 2}}


def curve(train, val_rows, grad=1.0, attn=5.0, out=10.0):
    n = len(train)
    steps = 25 * (np.arange(n) + 1)
    val = np.full(n, np.nan)
    for i, v in val_rows.items():
        val[i] = v
    return pd.DataFrame({
        "step": steps, "tokens": steps * 512, "train_loss": train, "val_loss": val,
        "lr": np.minimum(1.0, (np.arange(n) + 1) / 3), "grad_norm": np.broadcast_to(grad, n).astype(float),
        "tokens_per_s": np.full(n, 2000.0), "attn_logit_max": np.broadcast_to(attn, n).astype(float),
        "output_logit_max": np.broadcast_to(out, n).astype(float), "output_logz_mean": np.full(n, 4.0),
        "elapsed_s": steps * 0.25,
    })


def sweep():
    base = 2.0 + 7.2 * np.exp(-np.arange(N) / 8.0)  # starts near ln(10000)
    spiky = base.copy()
    spiky[20:27] *= 1.35
    # Diverged runs stop logging where the stopper ended them.
    nan_train = base[:16].copy()
    nan_train[15] = np.nan
    boom = base[:26].copy()
    boom[10:] = boom[10] * np.exp(np.arange(16) / 2.0)  # finite but thousands of times the start
    grow = np.where(np.arange(N) >= 8, 30.0, 5.0)
    asha = base[:20] + 0.3

    def val(train, rows=(9, 19, 29, 39)):
        return {i: train[i] + 0.05 for i in rows if i < len(train) and np.isfinite(train[i])}

    def rec(tid, lr, outcome, train, seq_len=256, **kw):
        c = curve(train, val(train), **kw.pop("probes", {}))
        return TrialRecord(tid, lr, {"lr": lr, "context_length": seq_len}, outcome, curve=c,
                           wall_time_s=float(c["elapsed_s"].iloc[-1]), config=CONFIG, **kw)

    return [
        rec("lr1e-4", 1e-4, "completed", base + 0.6),
        rec("lr3e-4", 3e-4, "stopped_early", asha, reason="stopped by ASHA at 0.26M tokens", stop_step=500),
        rec("lr1e-3", 1e-3, "completed", base),
        rec("lr3e-3", 3e-3, "completed", spiky, probes={"grad": 2.5}),
        rec("lr1e-2", 1e-2, "diverged", nan_train, reason="diverged at step 400, loss nan", stop_step=400,
            probes={"attn": grow[:16]}),
        rec("lr3e-2", 3e-2, "diverged", boom, reason="diverged at step 300, loss 1e9", stop_step=300),
    ]


@pytest.fixture
def records():
    return sweep()


def test_statuses_of_the_synthetic_sweep(records):
    assert [classify(r) for r in records] == ["completed", "stopped_early", "completed", "spiked", "diverged",
                                              "diverged"]


@pytest.mark.slow
def test_figures_are_real_pictures(records, tmp_path):
    summary = sweep_summary(records, target=2.5)
    best = next(r for r in records if r.trial_id == summary.best_trial)
    paths = [
        plot_sweep_comparison(records, tmp_path / "lr_sweep_comparison.png", target=2.5),
        plot_lr_vs_loss(tmp_path / "lr_vs_loss.png", summary),
        plot_instability(records, best, tmp_path / "instability.png"),
        plot_sharpness([
            SharpnessRow(None, None, Sharpness(s, 1e-3, 50.0 * (1 + s / 100), 9e3 + s, 2e3, 3.8e4))
            for s in (100, 200, 300, 400)
        ], tmp_path / "sharpness.png"),
    ]
    for path in paths:
        assert path.exists()
        assert_real_picture(path)
    assert not list(tmp_path.glob(".*tmp*"))  # atomic writes leave no temp files behind


def test_sweep_comparison_ylim_ignores_exploding_losses(records, tmp_path):
    import matplotlib.pyplot as plt

    from lmtune.report import figures as report

    captured = {}
    original = report.save_figure

    def spy(fig, path):
        captured["ylim"] = fig.axes[0].get_ylim()
        return original(fig, path)

    report.save_figure = spy
    try:
        plot_sweep_comparison(records, tmp_path / "c.png")
    finally:
        report.save_figure = original
    low, high = captured["ylim"]
    assert high < 12.0  # the first losses are ~9.2; the exploding run reaches ~1e4
    assert low < 2.1
    plt.close("all")


def test_the_wall_clock_axis_reads_in_one_unit(records):
    """The runs took up to 250 s: every tick is in minutes, the axis label says so once (ticks once mixed "50 s" and
    "2.5 min")."""
    import matplotlib.pyplot as plt

    figure = sweep_comparison_figure(records, x="wall")
    try:
        figure.canvas.draw()
        ax = figure.axes[0]
        ticks = [label.get_text() for label in ax.get_xticklabels() if label.get_text()]
        assert ax.get_xlabel().startswith("wall-clock time (min;")
        assert len(ticks) > 2 and all(re.fullmatch(r"[−-]?\d+(\.\d+)?", tick) for tick in ticks), ticks
        assert max(max(line.get_xdata(), default=0) for line in ax.get_lines()) == pytest.approx(250 / 60)
    finally:
        plt.close(figure)


@pytest.mark.parametrize(("seconds", "unit"), [(90, "s"), (250, "min"), (3 * 3600, "h")])
def test_a_wall_clock_axis_takes_the_unit_its_longest_run_reads_best_in(seconds, unit):
    assert wall_unit(seconds)[0] == unit


def test_markdown_has_every_section_and_the_numbers(records, tmp_path):
    facts = SweepFacts(search_strategy="ASHA over a log grid of 6 LRs.",
                       compute={"tokens_spent": 1_000_000, "full_grid_tokens": 4_000_000, "gpu_hours": 0.5})
    path = write_markdown(sweep_summary(records, target=2.5), facts, records, tmp_path / "lr_sweep_analysis.md")
    text = path.read_text()
    positions = [text.index(h + "\n") for h in HEADINGS]
    assert positions == sorted(positions)
    assert "| trial | lr | context_length | status | final val | best val | tokens |" in text
    for r in records:
        assert f"| {r.trial_id} |" in text
    assert "Best LR **0.001**" in text
    # the bracket: 3e-3 trained through its budget, 1e-2 diverged; the ratio 10 as a point, a range with both ends
    assert "Training fails between **0.003**" in text and "and **0.01**, the smallest LR" in text
    assert "**10** as a point value" in text
    # 0.3 to 100 is too wide to read: said to be unresolved, with what would resolve it
    assert "**not resolved by this grid (its ends, 0.3 and 100, are 333x apart): narrow the best LR's" in text
    assert "saving: 75.0%" in text
    assert "ASHA over a log grid" in text
    assert "attention-logit max grew first" in text  # lr1e-2's probe
    assert "gradient norm grew first" in text  # lr3e-3's probe
    assert "**met**" in text
    assert "stopped by ASHA" in text


def test_markdown_copes_with_no_divergence_and_no_target(tmp_path):
    healthy = sweep()[:3]
    summary = sweep_summary(healthy)
    text = write_markdown(summary, SweepFacts(), healthy, tmp_path / "a.md").read_text()
    for heading in HEADINGS:
        assert heading in text
    assert "No run diverged" in text and "No target loss was given" in text
    assert "No run diverged, was cut while above ℓ₀ (unconfirmed) or spiked." in text


def test_tables_agree_with_the_records(records, tmp_path):
    summary = sweep_summary(records, target=2.5)
    json_path, csv_path = write_tables(summary.to_json(), summary.trials, tmp_path)
    loaded = json.loads(json_path.read_text())
    assert loaded == summary.to_json()
    assert loaded["best_lr"] == 1e-3 and loaded["failing_lr"] == 1e-2 and loaded["failing_lr_low"] == 3e-3
    assert loaded["edge_ratio"] == pytest.approx(10.0)
    assert loaded["best_lr_seed_losses"] == [pytest.approx(loaded["best_val_loss"])]
    assert loaded["target_met"] is True
    assert loaded["lr_sensitivity"] is not None
    by_id = {t["trial_id"]: t for t in loaded["trials"]}
    for r in records:
        assert by_id[r.trial_id]["status"] == classify(r)
        assert by_id[r.trial_id]["lr"] == r.lr
    with open(csv_path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["trial_id"] for row in rows] == [t["trial_id"] for t in loaded["trials"]]
    assert rows[0]["context_length"] == "256"
    assert {row["status"] for row in rows} == {"completed", "stopped_early", "spiked", "diverged"}
