"""The width search's report, Ray-free from a sweep folder written by hand (as tests/conftest.py's disk_sweep
writes a grid's): proxies at d_model 32 and 64 whose loss is a parabola in ln LR around a best LR that falls with
width, and the confirmation at the target d_model 128; then what summary.json, the markdown, width.png and the
CLIs' lines say of it, and the words the fit is given in under SP and μP."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import DISK_CONFIG, TINY_MODEL, assert_confirmation_follows_its_rule, assert_real_picture

from lmtune.analysis.locate import LocatedLr
from lmtune.analysis.runs import Budget
from lmtune.findings.comparison import record_runs
from lmtune.report.headline import summary_lines
from lmtune.report.reader import load_sweep
from lmtune.report.sections import section_for
from lmtune.report.writer import summarize_sweep, write_report
from lmtune.searches.textbook import agrees, rule_sentence, width_rule
from lmtune.searches.width import report_coord
from lmtune.searches.width.conclusion import WidthFit, conclude_widths
from lmtune.searches.width.report import (
    MU_FAILED,
    MU_TRANSFER,
    NOT_RESOLVED,
    coord_check_lines,
    fit_sentences,
    gamma_text,
)
from lmtune.searches.width.report_conclusion import WidthResult
from lmtune.searches.width.report_coord import SweepCoordCheck, sweep_coord_check
from lmtune.searches.width.settings import WidthSettings, proxy_shape
from lmtune.sweep.plan import SweepPlan
from lmtune.sweep.record import ledger_path, write_trial_file
from lmtune.sweep.spaces import parse_space
from lmtune.sweep.sweep_file import SweepRecord
from lmtune.training.config import apply_overrides, budget_config
from lmtune.training.coord_check import FLAT_TOLERANCE, read_checks
from lmtune.training.metrics import write_metrics
from lmtune.training.model import flops_per_token

BASE = apply_overrides(DISK_CONFIG, {"d_model": 128, "d_ff": 384, "n_heads": 4, "warmup_steps": 3})  # heads of 32
TARGET = Budget.of_run(BASE, None)
WIDTH = {"widths": [32, 64], "lr_min": 0.005, "lr_max": 0.1, "seeds": 2, "edge_probes": 0, "confirm_seeds": 2}
GAMMA = 0.7  # the best LR falls as width^-0.7


def best_lr(width: int) -> float:
    return 0.02 * (width / 32) ** -GAMMA


def width_sweep(root: Path, widths: tuple[int, ...] = (32, 64), confirm: bool = True, base=BASE) -> Path:
    """A width search's folder: sweep.json, the ledger, and per trial its trial.json, config.json and metrics.csv
    (val loss a parabola in ln LR about best_lr(width), 7 LRs 1.5x apart, 2 seeds, seed noise of 0.003 nats); with
    ``confirm``, the target's confirmation runs at the prediction the proxies' folders give, and 2x either side;
    ``base``: the target's config."""
    space = parse_space({"search": "width", "width": WIDTH, "scheduler": {"name": "none"}}, Path("w.yaml"))
    sweep_dir = root / "width-sweep"
    sweep_dir.mkdir()
    SweepRecord(name="width-sweep", plan=SweepPlan.create(space, base)).write(sweep_dir)
    ledger_path(sweep_dir).parent.mkdir()
    rng, ledger = np.random.default_rng(0), {}

    def trial(width: int, stage: str, lr: float, seed: int) -> None:
        trial_id = f"{len(ledger):08d}"
        loss = (3.5 - 0.2 * math.log2(width / 32) + 0.4 * math.log(lr / best_lr(width)) ** 2
                + rng.normal(0, 0.003))
        shape = proxy_shape(TARGET, width)
        folder = sweep_dir / f"{trial_id}_d_model={width}_lr={lr:.4g}_seed={seed}"
        folder.mkdir()
        write_trial_file(folder, trial_id, {"stage": stage, "lr": lr, "seed": seed, **shape})
        config = apply_overrides(base, {**shape, "lr": lr}).to_dict()
        (folder / "config.json").write_text(json.dumps(config))
        write_metrics(folder / "metrics.csv", [{"step": step, "tokens": step * 500, "train_loss": 6.0 - step / 10,
                                                "val_loss": loss + (30 - step) / 10} for step in (10, 20, 30)])
        ledger[trial_id] = {"outcome": "completed", "reason": "completed its budget"}
        ledger_path(sweep_dir).write_text(json.dumps(ledger))

    for width in widths:
        for k in range(-3, 4):
            for seed in range(2):
                trial(width, "grid" if seed == 0 else "seeds", round(best_lr(width) * 1.5 ** k, 6), seed)
    if confirm:
        record, trials = load_sweep(sweep_dir)
        fit = conclude_widths([run for run, _ in record_runs(trials, TARGET)], WidthSettings(**WIDTH), TARGET).fit
        for lr in WidthSettings(**WIDTH).confirmation_lrs(fit.predicted_lr):
            for seed in range(2):
                trial(TARGET.d_model, "target", lr, seed)
    return sweep_dir


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return width_sweep(tmp_path_factory.mktemp("width"))


@pytest.fixture(scope="module")
def report(sweep_dir):
    return summarize_sweep(sweep_dir)


def result_of(report) -> WidthResult:
    assert isinstance(report.summary.search_result, WidthResult)
    return report.summary.search_result


def test_the_summarys_prediction_and_gamma_are_conclude_widths_on_the_trials_own_runs(report):
    runs = [run for run, _ in record_runs(report.trials, TARGET)]
    fit = conclude_widths(runs, WidthSettings(**WIDTH), TARGET).fit
    result = result_of(report)
    assert result.fit is not None and result.fit_problem is None
    assert result.predicted_lr == pytest.approx(fit.predicted_lr)
    assert result.fit.gamma == pytest.approx(fit.gamma)
    assert result.predicted_lr_interval == pytest.approx(fit.predicted_lr_interval)


def test_the_fit_recovers_a_best_lr_that_falls_with_width(report):
    result = result_of(report)
    assert result.fit.gamma == pytest.approx(GAMMA, abs=0.15) and result.fit.resolved
    low, high = result.predicted_lr_interval
    assert low < best_lr(TARGET.d_model) < high


def test_the_common_summary_is_of_the_target_widths_runs(report):
    summary = report.summary
    assert summary.search == "width" and summary.compared_at_tokens == TARGET.full_tokens
    assert summary.best_lr == result_of(report).confirmed.best_lr
    assert len(summary.trials) == len(report.trials) == 34  # every trial's row: 2 x 14 proxies, 6 at the target


def test_summary_json_has_the_width_search_keys(report):
    written = report.summary.to_json()
    assert {"widths", "target_width", "parametrization", "mup_base_width", "width_fit", "predicted_lr",
            "predicted_lr_interval", "fit_problem", "confirmed", "search_flops", "confirmation_flops",
            "target_run_flops"} <= set(written)
    assert [w["d_model"] for w in written["widths"]] == [32, 64, 128] and written["target_width"] == 128
    assert all({"d_model", "params", "flops_per_token", "trials", "crowned_lr", "best_lr_mean_loss", "best_lr_spread",
                "located_lr", "located_lr_se", "located_lr_interval", "located", "located_why"} <= set(w)
               for w in written["widths"])
    assert written["parametrization"] == "sp" and written["mup_base_width"] is None
    assert {"gamma", "gamma_interval", "gamma_resolved", "law_holds", "lack_of_fit_p", "points"} <= set(
        written["width_fit"])
    assert_confirmation_follows_its_rule(written["confirmed"])


def test_the_cost_is_every_runs_tokens_times_its_own_models_flops_per_token(report):
    result = result_of(report)
    per_token = {w: flops_per_token(apply_overrides(BASE, proxy_shape(TARGET, w)).model) for w in (32, 64, 128)}
    assert result.search_flops == pytest.approx(TARGET.full_tokens * (14 * per_token[32] + 14 * per_token[64]
                                                                       + 6 * per_token[128]))
    assert result.confirmation_flops == pytest.approx(6 * TARGET.full_tokens * per_token[128])
    assert result.target_runs_equal == pytest.approx(result.search_flops / (TARGET.full_tokens * per_token[128]))


def test_the_markdown_names_the_parametrization_the_prediction_and_the_verdict(report):
    summary = report.summary
    text = "\n".join(section_for("width").markdown(summary))
    result = result_of(report)
    assert "## The best LR at the target width, predicted across widths" in text
    assert "SP (the standard parametrization)" in text
    assert f"**Predicted best LR at the target width**: {result.predicted_lr:.3g}" in text
    assert result.confirmed.verdict in text and "full runs at the target width" in text


def test_the_headline_gives_the_prediction_gamma_textbook_rule_verdict_and_cost_in_five_lines(report):
    lines = section_for("width").headline(report.summary)
    result = result_of(report)
    assert len(lines) == 5, lines
    assert f"{result.predicted_lr:.3g}" in lines[0] and "γ" in lines[0]
    assert lines[1].startswith("  textbook rule: the widest proxy's best LR ÷ the width ratio")
    assert result.confirmed.verdict in lines[2] and "full runs at the target width" in lines[3]
    assert summary_lines(report.summary)[:5] == lines  # the CLIs say the search's part first


def test_the_report_holds_the_prediction_against_the_textbook_rule_in_one_line(report):
    """SP: the widest proxy's (d_model 64's) crowned LR ÷ 2, against the prediction's interval."""
    result = result_of(report)
    widest = next(row.point for row in result.widths if row.point.value == 64)
    rule = width_rule(widest.conclusion.best_lr, 64, 128, "sp")
    assert rule.lr == pytest.approx(widest.conclusion.best_lr / 2)
    line = rule_sentence(rule, result.fit.predicted_lr_interval, "the widest proxy")
    assert ("inside" in line) is agrees(rule, result.fit.predicted_lr_interval)
    assert f"**Textbook rule**: {line}." in section_for("width").markdown(report.summary)
    assert f"  textbook rule: {line}" in section_for("width").headline(report.summary)


@pytest.mark.slow
def test_analyze_writes_width_png_and_the_section(sweep_dir, tmp_path):
    written = write_report(sweep_dir, tmp_path / "report")
    assert_real_picture(written.out / "width.png")
    assert "predicted across widths" in written.markdown.read_text()


def test_a_sweep_with_one_proxy_width_trained_says_why_there_is_no_fit(tmp_path):
    report = summarize_sweep(width_sweep(tmp_path, widths=(32,), confirm=False))
    result = result_of(report)
    assert result.fit is None and "two or more widths" in result.fit_problem
    assert report.summary.compared_at_tokens == TARGET.full_tokens and report.summary.best_lr is not None
    assert result.fit_problem in "\n".join(section_for("width").markdown(report.summary))
    assert "no fit" in section_for("width").headline(report.summary)[0]
    assert report.summary.to_json()["width_fit"] is None


def test_a_mup_sweep_states_its_base_width_and_that_its_moving_lr_failed_to_transfer(tmp_path):
    mup = apply_overrides(BASE, {"parametrization": "mup", "mup_base_width": 32})
    report = summarize_sweep(width_sweep(tmp_path, base=mup))
    written = report.summary.to_json()
    assert written["parametrization"] == "mup" and written["mup_base_width"] == 32
    text = "\n".join(section_for("width").markdown(report.summary))
    assert "μP (the maximal-update parametrization) with base width 32" in text and MU_FAILED in text
    assert "μP, base width 32" in section_for("width").headline(report.summary)[0]


def test_without_a_coord_check_the_section_says_why_in_one_line():
    assert coord_check_lines(None) == []
    lines = coord_check_lines(SweepCoordCheck(None, "not measured: the sweep's data dir /x is not here"))
    assert lines == ["**Coord check**: not measured: the sweep's data dir /x is not here."]


def test_a_coord_check_is_measured_once_kept_in_the_sweep_folder_and_read_back(tmp_path, builtin_data,
                                                                              monkeypatch):
    base = budget_config("quick", {**TINY_MODEL, "batch_size": 4, "parametrization": "mup", "mup_base_width": 32},
                         data_dir=str(builtin_data))
    kept = tmp_path / "coord_check.json"
    first = sweep_coord_check(tmp_path, base, [32, 64])
    assert first.check is not None and read_checks(kept) == [first.check]

    def measured_again(*args, **kwargs):
        raise AssertionError("the coord check was measured again, not read back from coord_check.json")

    # (a seeded measurement repeats itself: only a second measurement refused tells reading back from measuring)
    monkeypatch.setattr(report_coord, "coord_check", measured_again)
    again = sweep_coord_check(tmp_path, base, [32, 64])
    assert again.check == first.check and again.note == f"measured at the first report, kept in {kept}"
    lines = coord_check_lines(again)
    assert "μP at d_model 32, 64" in lines[0] and again.verdict.reason in lines[0]
    # summary.json's verdict is the rule's, worked out here from the slopes kept: flat when every |slope| is under
    # FLAT_TOLERANCE, the verdict naming the largest (at this tiny size, 5 steps: blocks.1.attn's update, -0.39)
    written = json.loads(json.dumps(again.to_json()))
    slopes = {layer.name: {"activation": layer.activation_slope, "update": layer.update_slope}
              for layer in read_checks(kept)[0].layers}
    assert written["slopes"] == slopes and {"embed", "logits"} <= set(slopes)
    name, kind, slope = max(((name, kind, s) for name, by_kind in slopes.items() for kind, s in by_kind.items()),
                            key=lambda row: abs(row[2]))
    flat = abs(slope) < FLAT_TOLERANCE
    assert written["flat"] is flat
    assert written["verdict"] == (f"mup: flat: every |slope| < {FLAT_TOLERANCE:g} (largest: {name} {kind} {slope:+.2f})"
                                  if flat else f"mup: not flat: {name} {kind} scale goes like width^{slope:+.2f} "
                                               f"(|slope| >= {FLAT_TOLERANCE:g})")
    assert {row.split("|")[1].strip() for row in lines[4:]} >= {"embed", "logits"}


def located(lr: float, log_se: float) -> LocatedLr:
    return LocatedLr(tokens=TARGET.full_tokens, crowned_lr=lr, lr=lr, log_se=log_se, located=True,
                     why="a quadratic", fitted_lrs=(lr / 2, lr, lr * 2), seed_sd=0.01)


def fit_through(lrs: dict[int, float], log_se: float) -> WidthFit:
    from lmtune.analysis.fit import fit_power_law

    points = [located(lr, log_se) for lr in lrs.values()]
    law = fit_power_law([float(w) for w in lrs], points, float(TARGET.d_model))
    return WidthFit(tuple(lrs), tuple(points), TARGET.d_model, law)


def test_under_mup_an_unresolved_gamma_is_said_to_be_consistent_with_mu_transfer():
    flat = fit_through({32: 0.010, 64: 0.0095}, 0.3)
    assert not flat.resolved
    text = " ".join(fit_sentences(flat, "mup"))
    assert NOT_RESOLVED in text and MU_TRANSFER in text and MU_TRANSFER in gamma_text(flat, "mup")
    assert MU_TRANSFER not in " ".join(fit_sentences(flat, "sp"))


def test_under_mup_a_resolved_gamma_says_transfer_failed():
    steep = fit_through({32: best_lr(32), 64: best_lr(64)}, 0.02)
    assert steep.resolved
    assert MU_FAILED in " ".join(fit_sentences(steep, "mup")) and MU_FAILED in gamma_text(steep, "mup")
    assert MU_FAILED not in " ".join(fit_sentences(steep, "sp")) + gamma_text(steep, "sp")


def test_the_coverage_the_width_report_states_beside_its_intervals_is_the_held_out_benchmarks_latest():
    """What the width report says its 90% intervals held is the lowest and highest coverage of the last held-out
    run recorded in benchmarks/results.jsonl."""
    from lmtune.searches.width.report import WIDTH_HELD_OUT_COVERAGE

    results = Path(__file__).resolve().parents[1] / "benchmarks" / "results.jsonl"
    rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    held_out = [r for r in rows if r.get("benchmark") == "width coverage held-out"]
    latest = [r for r in held_out if r["commit"] == held_out[-1]["commit"]]
    for key, interval in (("located_coverage", "located"), ("coverage", "predicted")):
        measured = [r[key] for r in latest]
        assert WIDTH_HELD_OUT_COVERAGE[interval] == (min(measured), max(measured)), interval
