"""``python -m lmtune.analyze --runs PATH``: the report of runs lmtune did not make (docs/analyze-runs.md), from a
plain training loop's CSV, a Tune experiment folder made without lmtune and a W&B export; bad files refused in one
line, with nothing written."""

from __future__ import annotations

import csv
import json
import math
import time
from pathlib import Path

import pytest
import torch
from conftest import assert_real_picture, assert_refused, run_python, snapshot, write_csv

from lmtune.analyze import main

LRS = (0.3, 3.0, 30.0)
SEEDS = (0, 1)
VOCAB = 16


# ---------------------------------------------------------------------------------------------
# (a) A plain training loop's own CSV


def bigram_data() -> tuple[torch.Tensor, torch.Tensor]:
    """Token pairs whose next token is a fixed function of the current one, 20% of the time a random one."""
    g = torch.Generator().manual_seed(0)
    following = torch.randint(0, VOCAB, (VOCAB,), generator=g)
    current = torch.randint(0, VOCAB, (4096,), generator=g)
    noise = torch.rand(4096, generator=g) < 0.2
    return current, torch.where(noise, torch.randint(0, VOCAB, (4096,), generator=g), following[current])


def train_loop(lr: float, seed: int, steps: int = 20, batch: int = 64) -> list[dict]:
    """A student's own loop: a 2-layer MLP on the bigram data, SGD, val loss every 5 steps; one row per step."""
    current, following = bigram_data()
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 32), torch.nn.ReLU(), torch.nn.Linear(32, VOCAB))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    sampler = torch.Generator().manual_seed(seed)
    start, rows = time.perf_counter(), []
    for step in range(1, steps + 1):
        batch_ids = torch.randint(0, 3072, (batch,), generator=sampler)
        loss = torch.nn.functional.cross_entropy(model(current[batch_ids]), following[batch_ids])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        val = ""
        if step % 5 == 0:
            with torch.no_grad():
                val = torch.nn.functional.cross_entropy(model(current[3072:]), following[3072:]).item()
        rows.append({"lr": lr, "seed": seed, "step": step, "tokens": step * batch, "train_loss": loss.item(),
                     "val_loss": val, "wall_time": time.perf_counter() - start})
    return rows


@pytest.fixture(scope="module")
def loop_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """runs.csv: 3 LRs x 2 seeds x 20 steps of the plain loop."""
    folder = tmp_path_factory.mktemp("loop")
    return write_csv(folder / "runs.csv", [row for lr in LRS for seed in SEEDS for row in train_loop(lr, seed)])


@pytest.fixture(scope="module")
def loop_report(loop_log: Path) -> Path:
    """The report of runs.csv, in its default folder."""
    assert main(["--runs", str(loop_log)]) == 0
    return loop_log.with_name("runs.csv_report")


def final_val_losses(log: Path) -> dict[float, list[float]]:
    """The test's own reading of the log: each run's last val loss, by LR."""
    with log.open() as handle:
        rows = [row for row in csv.DictReader(handle) if row["val_loss"] and int(row["step"]) == 20]
    found: dict[float, list[float]] = {}
    for row in rows:
        found.setdefault(float(row["lr"]), []).append(float(row["val_loss"]))
    return found


def test_a_plain_loops_csv_gives_the_lr_with_the_lowest_mean_final_val_loss_as_best(loop_log, loop_report):
    finals = final_val_losses(loop_log)
    expected = min(finals, key=lambda lr: sum(finals[lr]) / len(finals[lr]))
    summary = json.loads((loop_report / "summary.json").read_text())
    assert summary["best_lr"] == expected
    assert summary["best_lr_seeds"] == [0, 1]
    assert summary["best_lr_spread"] == pytest.approx(abs(finals[expected][0] - finals[expected][1]) / 2 ** 0.5)


def test_a_plain_loops_csv_gives_the_learning_curves_and_loss_against_lr(loop_report):
    for figure in ("lr_sweep_comparison.png", "lr_sweep_comparison_wall.png", "lr_vs_loss.png"):
        assert_real_picture(loop_report / figure)
    text = (loop_report / "lr_sweep_analysis.md").read_text()
    assert "## Loss against LR at equal token counts" in text and "1.3k tokens (full)" in text


def test_the_report_of_runs_says_where_they_came_from(loop_log, loop_report):
    summary = json.loads((loop_report / "summary.json").read_text())
    assert (summary["source"], summary["input"], summary["judged_on"]) == ("runs", str(loop_log.resolve()),
                                                                          "val_loss")
    assert summary["samples"] == [] and summary["samples_note"].startswith("omitted: runs not made by lmtune")


def test_a_report_of_runs_names_each_section_it_cannot_make_with_the_column_it_lacks(tmp_path, loop_log):
    with loop_log.open() as handle:
        rows = [{k: v for k, v in row.items() if k in ("lr", "seed", "step", "train_loss")}
                for row in csv.DictReader(handle)]
    log = write_csv(tmp_path / "train_only.csv", rows)
    assert main(["--runs", str(log), "--out", str(tmp_path / "report")]) == 0
    text = (tmp_path / "report" / "lr_sweep_analysis.md").read_text()
    assert "no val_loss column: the best LR is judged on train_loss" in text
    assert "no tokens column: LRs are compared at equal steps" in text
    assert "no wall_time column" in text
    assert not (tmp_path / "report" / "lr_sweep_comparison_wall.png").exists()


def test_a_run_whose_loss_went_non_finite_counts_as_diverged(tmp_path):
    rows = [{"lr": lr, "step": step, "val_loss": "nan" if lr == 1.0 and step > 2 else 4.0 - lr * step}
            for lr in (0.01, 0.1, 1.0) for step in range(1, 6)]
    assert main(["--runs", str(write_csv(tmp_path / "log.csv", rows))]) == 0
    summary = json.loads((tmp_path / "log.csv_report" / "summary.json").read_text())
    assert (summary["best_lr"], summary["divergence_lr"]) == (0.1, 1.0)


def test_a_folder_of_logs_gets_its_report_in_its_report_folder_and_its_files_stay_as_they_were(tmp_path, loop_log):
    folder = tmp_path / "logs"
    folder.mkdir()
    (folder / "runs.csv").write_bytes(loop_log.read_bytes())
    before = snapshot(folder)
    assert main(["--runs", str(folder)]) == 0
    after = snapshot(folder)
    assert {k: v for k, v in after.items() if not k.startswith("report")} == before
    assert (folder / "report" / "lr_sweep_analysis.md").is_file()


def test_a_folders_report_folder_holding_files_analyze_did_not_write_is_refused(tmp_path, loop_log, capsys):
    folder = tmp_path / "logs"
    (folder / "report").mkdir(parents=True)
    (folder / "runs.csv").write_bytes(loop_log.read_bytes())
    (folder / "report" / "notes.txt").write_text("mine")
    assert_refused(main, ["--runs", str(folder)], capsys, "files analyze did not write", "--out")


# ---------------------------------------------------------------------------------------------
# (b) A Tune experiment folder made without lmtune

_TUNE_DRIVER = """
import math, sys
import ray
from ray import tune

def trainable(config):
    # gradient descent on a quadratic: the loss goes non-finite where the LR is past its edge, as a real loop's does
    w, loss = 1.0, 0.0
    for step in range(1, 9):
        w *= 1 - config["lr"]
        loss = 1 + w * w
        tune.report({"val_loss": loss if loss < 100 else math.nan, "step": step})

ray.init(address="local", num_cpus=1, include_dashboard=False)  # (a new one: never a stray cluster)
tune.Tuner(tune.with_resources(trainable, {"cpu": 0.25}),
           param_space={"lr": tune.grid_search([0.1, 0.5, 3.0])},
           run_config=tune.RunConfig(name="plain_tune", storage_path=sys.argv[1])).fit()
"""


@pytest.fixture(scope="module")
def tune_experiment(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tune")
    (folder / "driver.py").write_text(_TUNE_DRIVER)
    proc = run_python(str(folder / "driver.py"), str(folder / "results"), cwd=folder, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return folder / "results" / "plain_tune"


@pytest.mark.slow
def test_a_tune_experiment_made_without_lmtune_gives_its_best_lr_and_curves(tune_experiment, tmp_path):
    assert main(["--runs", str(tune_experiment), "--out", str(tmp_path / "report")]) == 0
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert (summary["best_lr"], summary["divergence_lr"], summary["input_shape"]) == (0.5, 3.0, "tune")
    assert_real_picture(tmp_path / "report" / "lr_sweep_comparison.png")


# ---------------------------------------------------------------------------------------------
# (c) A W&B panel export


def wandb_export(path: Path) -> Path:
    """A line plot's "Export CSV": Step, then '<run> - val_loss' with its __MIN and __MAX per run."""
    runs = {"lr=0.001 seed=0": [4.0, 3.8, 3.7], "lr=0.01 seed=0": [3.5, 3.0, 2.8], "wide": [3.0, 3.4, 3.6]}
    header = ["Step", *[f"{run} - val_loss{end}" for run in runs for end in ("", "__MIN", "__MAX")]]
    rows = [[step, *[v for losses in runs.values() for v in [losses[i]] * 3]] for i, step in enumerate((10, 20, 30))]
    with path.open("w", newline="") as handle:
        csv.writer(handle).writerows([header, *rows])
    return path


def test_a_wandb_export_gives_its_best_lr_from_run_names_and_lr_of(tmp_path):
    export = wandb_export(tmp_path / "wandb.csv")
    assert main(["--runs", str(export), "--lr-of", "wide=0.1"]) == 0
    summary = json.loads((tmp_path / "wandb.csv_report" / "summary.json").read_text())
    assert (summary["best_lr"], summary["input_shape"]) == (0.01, "wandb")
    assert sorted(row["lr"] for row in summary["trials"]) == [0.001, 0.01, 0.1]


def test_a_wandb_run_without_an_lr_is_refused_naming_lr_of(tmp_path, capsys):
    refused(tmp_path, capsys, wandb_export(tmp_path / "wandb.csv"), "run 'wide' has no LR", "--lr-of 'wide=LR'")


# ---------------------------------------------------------------------------------------------
# Bad input: one line each, exit 2, nothing written


def refused(tmp_path: Path, capsys, path: Path, *fragments: str) -> None:
    before = snapshot(tmp_path)
    assert_refused(main, ["--runs", str(path)], capsys, *fragments)
    assert snapshot(tmp_path) == before


def test_a_log_without_a_loss_column_is_refused_naming_the_names_accepted(tmp_path, capsys):
    log = tmp_path / "log.csv"
    log.write_text("lr,step,accuracy\n0.1,1,0.5\n")
    refused(tmp_path, capsys, log, "log.csv has no train_loss or val_loss column", "eval_loss")


def test_a_log_without_an_lr_column_is_refused(tmp_path, capsys):
    log = tmp_path / "log.csv"
    log.write_text("step,val_loss\n1,3.2\n")
    refused(tmp_path, capsys, log, "log.csv has no lr column", "learning_rate")


def test_a_non_numeric_value_is_refused_naming_its_file_line_and_column(tmp_path, capsys):
    log = tmp_path / "log.csv"
    log.write_text("lr,step,val_loss\n0.1,1,3.2\n0.1,2,oops\n")
    refused(tmp_path, capsys, log, "log.csv, line 3, column val_loss: 'oops' is not a number")


def test_an_empty_file_is_refused(tmp_path, capsys):
    log = tmp_path / "log.csv"
    log.write_text("")
    refused(tmp_path, capsys, log, "log.csv is empty")


def test_a_json_object_is_refused_as_not_a_run_log(tmp_path, capsys):
    log = tmp_path / "runs.json"
    log.write_text('{"lr": 0.1, "val_loss": [3.2, 3.0]}\n')
    refused(tmp_path, capsys, log, "runs.json is a JSON file, not a run log", ".jsonl")


def test_a_json_document_named_jsonl_is_refused(tmp_path, capsys):
    log = tmp_path / "runs.jsonl"
    log.write_text('{\n  "lr": 0.1,\n  "val_loss": 3.2\n}\n')
    refused(tmp_path, capsys, log, "runs.jsonl holds one JSON document, not JSON Lines")


def test_an_image_is_refused(tmp_path, capsys):
    image = tmp_path / "curves.png"
    image.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    refused(tmp_path, capsys, image, "curves.png is not a CSV or JSONL file")


def test_an_image_named_csv_is_refused_as_not_text(tmp_path, capsys):
    image = tmp_path / "curves.csv"
    image.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    refused(tmp_path, capsys, image, "curves.csv is not a text file")


def test_a_tune_trial_without_params_json_is_refused(tmp_path, capsys):
    trial = tmp_path / "exp" / "trainable_00000"
    trial.mkdir(parents=True)
    (trial / "progress.csv").write_text("val_loss,training_iteration\n3.2,1\n")
    refused(tmp_path, capsys, tmp_path / "exp", "has a progress.csv but no params.json")


def test_a_sweep_and_runs_together_are_refused(tmp_path, capsys):
    assert_refused(main, [str(tmp_path), "--runs", str(tmp_path)], capsys, "not both")


def test_the_docs_example_log_is_read_as_documented(tmp_path):
    text = (Path(__file__).parents[1] / "docs" / "analyze-runs.md").read_text()
    example = text.split("```csv\n", 1)[1].split("```", 1)[0]
    (tmp_path / "runs.csv").write_text(example)
    assert main(["--runs", str(tmp_path / "runs.csv")]) == 0
    summary = json.loads((tmp_path / "runs.csv_report" / "summary.json").read_text())
    assert (summary["best_lr"], summary["compared_at"], summary["compared_at_tokens"]) == (0.003, "tokens", 819200)


def test_wandb_history_rows_with_a_run_column_are_a_long_format_log(tmp_path):
    rows = [{"run": f"lr={lr}", "_step": step, "_runtime": step * 2.0, "eval/loss": 4.0 - 10 * lr * step}
            for lr in (0.01, 0.05) for step in (1, 2, 3)]
    log = tmp_path / "history.jsonl"
    log.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert main(["--runs", str(log)]) == 0
    summary = json.loads((tmp_path / "history.jsonl_report" / "summary.json").read_text())
    assert (summary["best_lr"], summary["judged_on"], summary["compared_at"]) == (0.05, "val_loss", "step")


def test_a_tune_trial_that_reported_nothing_is_skipped(tmp_path):
    for index, (lr, losses) in enumerate({0.1: [3.0, 2.5], 0.3: [3.0, 2.0], 1.0: None}.items()):
        trial = tmp_path / "exp" / f"trainable_0000{index}"
        trial.mkdir(parents=True)
        (trial / "params.json").write_text(json.dumps({"learning_rate": lr}))
        rows = "".join(f"{loss},{step}\n" for step, loss in enumerate(losses or [], start=1))
        (trial / "progress.csv").write_text("" if losses is None else "eval_loss,training_iteration\n" + rows)
    assert main(["--runs", str(tmp_path / "exp")]) == 0
    summary = json.loads((tmp_path / "exp" / "report" / "summary.json").read_text())
    assert (summary["best_lr"], [row["lr"] for row in summary["trials"]]) == (0.3, [0.1, 0.3])


def test_an_lr_of_naming_no_run_is_refused(tmp_path, capsys):
    export = wandb_export(tmp_path / "wandb.csv")
    before = snapshot(tmp_path)
    assert_refused(main, ["--runs", str(export), "--lr-of", "wide=0.1", "--lr-of", "wdie=0.1"], capsys,
                   "--lr-of 'wdie': no run of that name")
    assert snapshot(tmp_path) == before


# ---------------------------------------------------------------------------------------------
# What the report knows of the runs: ℓ₀ from their vocabulary (or said to be an estimate), rungs only where they had
# them, a run whose log ends far above ℓ₀ unconfirmed


LOG_VOCAB = 1000  # ℓ₀ = ln 1000 = 6.91; the synthetic runs start at 6.0, below it


def synthetic_rows(vocab_column: int | None = None, cut: bool = False) -> list[dict]:
    """Four LRs trained 100 steps (val loss every 20), the best 0.01; ``cut``: lr 1.0 too, its loss 25x ln 1000
    from step 20 on and its log ending at step 40; ``vocab_column``: a vocab_size column saying it."""
    ends = {0.001: 3.0, 0.003: 2.6, 0.01: 2.4, 0.1: 2.9}
    rows = []
    for lr, end in ends.items():
        for step in range(10, 101, 10):
            loss = end + (6.0 - end) * 2.718281828 ** (-step / 25)
            rows.append({"lr": lr, "step": step, "tokens": step * 4096, "train_loss": loss,
                         "val_loss": loss + 0.05 if step % 20 == 0 else "", "wall_time": step * 1.7})
    if cut:
        for step in range(10, 41, 10):
            loss = 25 * math.log(LOG_VOCAB) if step >= 20 else 5.0
            rows.append({"lr": 1.0, "step": step, "tokens": step * 4096, "train_loss": loss,
                         "val_loss": loss + 0.05 if step % 20 == 0 else "", "wall_time": step * 1.7})
    return [{**row, "vocab_size": vocab_column} for row in rows] if vocab_column else rows


def runs_report(tmp_path: Path, rows: list[dict], *flags: str) -> tuple[dict, str]:
    """analyze --runs of ``rows``: its summary.json and lr_sweep_analysis.md."""
    log = write_csv(tmp_path / "runs.csv", rows)
    assert main(["--runs", str(log), *flags]) == 0
    out = tmp_path / "runs.csv_report"
    return json.loads((out / "summary.json").read_text()), (out / "lr_sweep_analysis.md").read_text()


def test_vocab_size_gives_the_initial_loss_as_ln_vocab(tmp_path):
    summary, text = runs_report(tmp_path, synthetic_rows(), "--vocab-size", str(LOG_VOCAB))
    assert (summary["initial_loss"], summary["initial_loss_from"]) == (pytest.approx(math.log(LOG_VOCAB)),
                                                                       "ln(vocab)")
    assert "- **ℓ₀**: the loss at initialisation, ℓ₀ = ln(vocab) = 6.908" in text


def test_a_vocab_size_column_gives_the_initial_loss_as_ln_vocab(tmp_path):
    summary, text = runs_report(tmp_path, synthetic_rows(vocab_column=LOG_VOCAB))
    assert (summary["initial_loss"], summary["initial_loss_from"]) == (pytest.approx(math.log(LOG_VOCAB)),
                                                                       "ln(vocab)")
    assert "no vocabulary size" not in text


def test_without_a_vocabulary_the_initial_loss_is_called_the_estimate_it_is_never_ln_vocab(tmp_path):
    summary, text = runs_report(tmp_path, synthetic_rows())
    assert summary["initial_loss_from"] == "median first train loss"
    assert "ln(vocab) =" not in text
    assert (f"- **ℓ₀**: the loss at initialisation: ℓ₀ ≈ {summary['initial_loss']:.4g}, estimated as the median over "
            "the runs of the first train loss each logged") in text


def test_without_a_vocabulary_the_figures_initial_loss_line_is_labelled_an_estimate(tmp_path):
    import matplotlib.pyplot as plt

    from lmtune.report.figures import lr_vs_loss_figure
    from lmtune.report.runs_report import summarize_runs_input

    report = summarize_runs_input(write_csv(tmp_path / "runs.csv", synthetic_rows()))
    figure = lr_vs_loss_figure(report.summary)
    try:
        labels = [text.get_text() for text in figure.axes[0].get_legend().get_texts()]
    finally:
        plt.close(figure)
    ell0 = next(label for label in labels if label.startswith("ℓ₀"))
    assert ell0 == f"ℓ₀ ≈ {report.summary.initial_loss:.3g}, an estimate: the median first train loss"


def test_runs_without_asha_get_no_rung_wording_in_the_figure_or_the_text(tmp_path):
    import matplotlib.pyplot as plt

    from lmtune.report.figures import lr_vs_loss_figure
    from lmtune.report.runs_report import summarize_runs_input

    report = summarize_runs_input(write_csv(tmp_path / "runs.csv", synthetic_rows()))
    figure = lr_vs_loss_figure(report.summary)
    try:
        title = figure.axes[0].get_title()
    finally:
        plt.close(figure)
    assert "rung" not in title.replace("these runs had no rungs", "") and "ASHA" not in title
    _, text = runs_report(tmp_path, synthetic_rows())
    section = text.split("## Loss against LR at equal token counts", 1)[1].split("\n## ", 1)[0]
    assert "ASHA" not in section and "these runs had no rungs" in section
    assert_real_picture(tmp_path / "runs.csv_report" / "lr_vs_loss.png")


def test_a_run_whose_log_ends_at_25x_ln_vocab_is_unconfirmed_and_no_run_diverged_is_not_said(tmp_path):
    summary, text = runs_report(tmp_path, synthetic_rows(cut=True), "--vocab-size", str(LOG_VOCAB))
    status = {row["lr"]: row["status"] for row in summary["trials"]}
    assert status[1.0] == "unconfirmed" and summary["unconfirmed"][0]["over_initial"] == pytest.approx(25.0)
    assert "no run diverged" not in text.lower()
    assert "| divergence LR | none confirmed up to 0.1; not known at 1, where a run was cut while above ℓ₀" in text


def test_a_vocab_size_that_contradicts_the_runs_column_is_refused(tmp_path, capsys):
    log = write_csv(tmp_path / "runs.csv", synthetic_rows(vocab_column=LOG_VOCAB))
    before = snapshot(tmp_path)
    assert_refused(main, ["--runs", str(log), "--vocab-size", "50257"], capsys,
                   "--vocab-size 50257, but the runs' vocab_size says 1000")
    assert snapshot(tmp_path) == before


def test_runs_naming_two_vocabulary_sizes_are_refused(tmp_path, capsys):
    rows = [{**row, "vocab_size": 1000 if row["lr"] < 0.01 else 2000} for row in synthetic_rows()]
    refused(tmp_path, capsys, write_csv(tmp_path / "runs.csv", rows), "the runs name 2 vocabulary sizes (1000, 2000)")


def test_a_vocab_size_that_is_no_vocabulary_size_is_refused(tmp_path, capsys):
    log = write_csv(tmp_path / "runs.csv", synthetic_rows())
    assert_refused(main, ["--runs", str(log), "--vocab-size", "1"], capsys,
                   "--vocab-size must be the runs' vocabulary size, a whole number from 2")


def test_a_vocab_size_without_runs_is_refused(tmp_path, capsys):
    assert_refused(main, [str(tmp_path), "--vocab-size", "1000"], capsys, "--vocab-size is for --runs")
