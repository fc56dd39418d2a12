"""Divergence said once, consistently (issue 66 item 5): a run cut while its loss stood far above its initial loss ℓ₀
is "unconfirmed", never counted as "no run diverged" nor listed as a spike that came back; and the report's text, its
table of full-budget losses and lr_vs_loss.png call every LR by the one region the conclusion gives it
(lmtune.analysis.landscape.lr_regions). On a constructed sweep of synthetic trial records, no training."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from conftest import assert_real_picture

from lmtune.analysis.landscape import Region
from lmtune.analysis.runs import Budget
from lmtune.findings.stability import TrialRecord, classify, cut_above_initial, trial_statuses
from lmtune.findings.summary import sweep_summary
from lmtune.report.figures import lr_vs_loss_figure, plot_lr_vs_loss
from lmtune.report.headline import conclusion_lines
from lmtune.report.markdown.edge import edge
from lmtune.report.markdown.landscape import landscape

ROWS, STEP, TOKENS_PER_STEP = 60, 20, 100
VOCAB = 245
ELL0 = math.log(VOCAB)  # 5.50: the curves start at 5.0, below it
CONFIG = {"model": {"vocab_size": VOCAB, "context_length": TOKENS_PER_STEP},
          "train": {"steps": ROWS * STEP, "batch_size": 1}}
FULL = ROWS * STEP * TOKENS_PER_STEP
FIRST_RUNG = 10 * STEP * TOKENS_PER_STEP  # where ASHA cut the runs it cut
UNIGRAM = 4.0  # the data's unigram baseline: a run that ends above it did not train
BUDGET = Budget(steps=ROWS * STEP, warmup_steps=0, tokens_per_step=TOKENS_PER_STEP, seed=0,
                rungs=(FIRST_RUNG, FULL), unigram_loss=UNIGRAM)


def loss_curve(end: float) -> np.ndarray:
    """A train loss falling from 5.0 (below ℓ₀) towards ``end``."""
    return end + (5.0 - end) * np.exp(-np.arange(ROWS) / 12.0)


def record(trial_id: str, lr: float, train: np.ndarray, outcome: str = "completed", **kwargs) -> TrialRecord:
    """A trial of the constructed sweep: its train loss every row, its val loss (train + 0.05) every 10th row."""
    n = len(train)
    steps = STEP * (np.arange(n) + 1)
    val = np.full(n, np.nan)
    val[9::10] = train[9::10] + 0.05
    curve = pd.DataFrame({"step": steps, "tokens": steps * TOKENS_PER_STEP, "train_loss": train, "val_loss": val,
                          "elapsed_s": steps / 10.0})
    return TrialRecord(trial_id, lr, {"lr": lr}, outcome, curve=curve, config=CONFIG, **kwargs)


def cut_at_25x(trial_id: str, lr: float) -> TrialRecord:
    """ASHA cut it at its first rung with its loss 25 times ℓ₀ (it climbed there from step 100 on)."""
    train = loss_curve(2.0)[:10].copy()
    train[4:] = 25 * ELL0
    return record(trial_id, lr, train, "stopped_early", reason="stopped by ASHA at 20.0k tokens (val loss 137.6 "
                  "worse than its rung's cutoff)", stop_step=10 * STEP)


def sweep(diverged: bool = True) -> list[TrialRecord]:
    """The best at 3e-3; 1e-2 and 3e-2 degraded; 0.1 trains its budget but ends above the unigram baseline (it
    failed without diverging); 0.3 goes non-finite (unless ``diverged`` is False); 1.0 was cut at 25x ℓ₀."""
    nan = loss_curve(2.0)[:20].copy()
    nan[19] = np.nan
    runs = [record("a", 1e-3, loss_curve(2.6)), record("b", 3e-3, loss_curve(2.2)), record("c", 1e-2, loss_curve(2.4)),
            record("d", 3e-2, loss_curve(2.9)), record("e", 0.1, loss_curve(4.5)), cut_at_25x("g", 1.0)]
    if diverged:
        runs.append(record("f", 0.3, nan, "diverged", reason="diverged at step 400, loss nan", stop_step=400))
    return runs


# ---------------------------------------------------------------------------------------------
# The run cut at 25x ℓ₀


def test_a_run_asha_cut_at_25_times_its_initial_loss_is_unconfirmed_not_stopped_early():
    cut = cut_at_25x("g", 1.0)
    assert classify(cut) == "unconfirmed"
    assert cut_above_initial(cut) == pytest.approx(25 * ELL0)


def test_a_run_asha_cut_below_its_initial_loss_keeps_its_outcome():
    cut = record("h", 1e-4, loss_curve(2.0)[:10], "stopped_early")
    assert cut_above_initial(cut) is None and classify(cut) == "stopped_early"


def test_a_run_cut_above_its_initial_loss_that_another_continued_keeps_its_outcome():
    """The continuation's rows start with the cut run's: it says whether the loss came back."""
    cut = cut_at_25x("g", 1.0)
    continued = record("g2", 1.0, loss_curve(3.0), continue_from="g", continued_from_tokens=FIRST_RUNG)
    assert trial_statuses([cut, continued]) == {"g": "stopped_early", "g2": "completed"}


def test_a_sweep_whose_only_high_run_was_cut_at_25x_never_says_no_run_diverged():
    summary = sweep_summary(sweep(diverged=False), BUDGET)
    text = "\n".join(edge(summary) + conclusion_lines(summary))
    assert summary.conclusion.divergence.diverged_lr is None
    assert "no run diverged" not in text.lower()
    assert "No run was confirmed to diverge, but a run at lr 1 was cut while its loss stood above ℓ₀" in text
    assert summary.edge_reading.startswith("no run was confirmed to diverge, but a run at lr 1 was cut")
    assert "divergence lr: not known: no run was confirmed to diverge; unconfirmed: lr 1 cut while above ℓ₀" in text


def test_the_run_cut_at_25x_is_unconfirmed_with_its_height_and_not_a_spike_that_came_back():
    summary = sweep_summary(sweep(), BUDGET)
    (unconfirmed,) = summary.unconfirmed
    assert (unconfirmed.trial_id, unconfirmed.over_initial) == ("g", pytest.approx(25.0))
    assert "g" not in {run.trial_id for run in summary.spiked}
    assert summary.trial("g").status == "unconfirmed"


# ---------------------------------------------------------------------------------------------
# One region per LR, said alike by the text, the table and the figure


def table_regions(lines: list[str]) -> dict[float, str]:
    """The landscape table's region column by LR."""
    rows = [line.split("|")[1:-1] for line in lines if line.startswith("| ") and not line.startswith("| lr ")]
    return {float(cells[0]): cells[-1].strip() for cells in rows}


def test_the_regions_of_the_constructed_sweep():
    regions = {r.lr: r.region for r in sweep_summary(sweep(), BUDGET).conclusion.regions}
    assert regions == {1e-3: Region.BELOW, 3e-3: Region.BASIN, 1e-2: Region.DEGRADED, 3e-2: Region.DEGRADED,
                       0.1: Region.FAILED, 0.3: Region.FAILED, 1.0: Region.UNCONFIRMED}


def test_the_table_labels_each_lr_by_its_region_an_lr_that_failed_without_diverging_included():
    summary = sweep_summary(sweep(), BUDGET)
    labels = table_regions(landscape(summary))
    assert labels == {r.lr: ("best" if r.lr == summary.best_lr else str(r.region))
                      for r in summary.conclusion.regions}
    assert labels[0.1] == "failed"  # it trained its whole budget; the table once called it "degraded"


def test_the_texts_regions_name_the_lrs_the_table_does():
    summary = sweep_summary(sweep(), BUDGET)
    text = "\n".join(landscape(summary))
    assert "- **Degraded** (trains through its budget without diverging, loss clearly worse): from the basin's upper " \
           "end to the edge, lr 0.01 … 0.03" in text
    assert "it begins between 0.03 and 0.1. LRs with a failed run: 0.1, 0.3 (" in text
    assert "- **Unconfirmed (cut while above ℓ₀)**: lr 1 seed 0 (cut at 20.0k tokens, its train loss 138 = 25× ℓ₀)" \
           in text
    assert "**Diverged**" not in text


def marks(figure, marker: str) -> list[float]:
    """The LRs of the marks drawn with ``marker`` at the top of lr_vs_loss.png."""
    return [float(x) for line in figure.axes[0].get_lines() if line.get_marker() == marker for x in line.get_xdata()]


def test_the_figure_marks_the_failed_and_unconfirmed_lrs_the_table_names():
    summary = sweep_summary(sweep(), BUDGET)
    figure = lr_vs_loss_figure(summary)
    try:
        assert marks(figure, "x") == list(summary.conclusion.lrs_in(Region.FAILED)) == [0.1, 0.3]
        assert marks(figure, "^") == list(summary.conclusion.lrs_in(Region.UNCONFIRMED)) == [1.0]
    finally:
        plt.close(figure)


def bands(figure) -> dict[str, list[tuple[float, float, bool]]]:
    """Each band of lr_vs_loss.png by the color's legend entry: (from, to, hatched) of each span drawn in its color."""
    ax = figure.axes[0]
    spans = [(p.get_x(), p.get_x() + p.get_width(), bool(p.get_hatch()), p.get_facecolor()[:3]) for p in ax.patches]
    found: dict[str, list[tuple[float, float, bool]]] = {}
    for label_patch in ax.get_legend().get_patches():
        label = label_patch.get_label()
        color = label_patch.get_facecolor()[:3]
        found[label] = [(a, b, h) for a, b, h, c in spans if np.allclose(c, color)]
    return found


def test_each_bands_legend_says_the_lrs_and_the_hatched_intervals_it_draws():
    """The basin is the best LR alone, its ends hatched between it and each neighbour: its legend says so (it once
    read "lr 0.003 alone" under a band hatched from 0.001 to 0.01)."""
    summary = sweep_summary(sweep(), BUDGET)
    figure = lr_vs_loss_figure(summary)
    try:
        labels = [text.get_text() for text in figure.axes[0].get_legend().get_texts()]
        basin = next(label for label in labels if label.startswith("basin"))
        assert basin == ("basin: lr 0.003 alone, within 2 SE of the best; its ends lie in the hatched 0.001–0.003 and "
                         "0.003–0.01")
        hatched = sorted((round(a, 6), round(b, 6)) for a, b, h in bands(figure)[basin] if h)
        assert hatched == [(0.001, 0.003), (0.003, 0.01)]
        failed = next(label for label in labels if label.startswith("failed: from"))
        assert failed == "failed: from lr 0.1 up; an end lies in the hatched 0.03–0.1"
    finally:
        plt.close(figure)


def test_the_figure_of_the_constructed_sweep_is_a_real_picture(tmp_path):
    assert_real_picture(plot_lr_vs_loss(tmp_path / "lr_vs_loss.png", sweep_summary(sweep(), BUDGET)))
