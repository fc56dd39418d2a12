"""benchmarks/lr_truth.py, the ground-truth LR grid: every argument is checked before anything is written, and
a truth holds one setting (model, budget, schedule, data): a second train of another setting into it is
refused, and so is a comparison with a sweep of another setting."""

from __future__ import annotations

import importlib
import json
import math
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import TINY_MODEL, assert_refused, grid_sweep_record, run_python, set_args, snapshot

from benchmarks.truth import (
    NaiveAnswer,
    TruthRun,
    cannot_tell,
    compare,
    compare_horizon,
    direct_centre,
    direct_local_search,
    naive_answers,
    naive_candidates,
    naive_pass_rate,
    truth_conclusion,
)
from benchmarks.truth_setting import Setting, TruthData
from lmtune.data.dataset import read_meta
from lmtune.errors import LmtuneError
from lmtune.searches.textbook import PRIOR_BETA
from lmtune.sweep.sweep_file import DataRecord
from lmtune.training.config import run_config_of

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
            {"best_lr": 0.01, "failing_lr_low": 0.01, "failing_lr": None, "basin": None, "degraded": None}))
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


@pytest.mark.slow
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


@pytest.mark.slow
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


def test_compare_takes_a_sweep_of_the_same_setting_whatever_its_lr_seed_and_bookkeeping_to_the_checks(truth, tmp_path,
                                                                                                      capsys):
    """Past the setting check, the checks themselves refuse this truth of one seed in their one line."""
    sweep = sweep_of(tmp_path / "sweep", truth, lr=0.003, seed=7, log_interval=2, eval_interval=4,
                     checkpoint_interval=2)
    assert_refused(lr_truth.main, ["compare", str(truth), str(sweep)], capsys,
                   "the truth has 1 seed at lr 0.01: a check needs 3; train it with --seeds 0,1,2")


# ---------------------------------------------------------------------------------------------
# The checks can fail: the search's best inside the truth's 2-SE basin, brackets that share an edge, a
# prediction within 2 SE of the truth's best; every tolerance from the constructed truth, none from a search

SD = 0.01  # every constructed LR's seeds: mean - SD, mean, mean + SD (sample standard deviation exactly SD)
TWO_SE = 2 * SD * math.sqrt(1 / 3 + 1 / 3)  # of a difference of two 3-seed means


def constructed_truth(means: dict[float, float], failing: dict[float, int] | None = None,
                      seeds: int = 3) -> dict:
    """truth_conclusion of a grid of ``seeds`` seeds (at most 3) per LR, each LR's losses spread SD about its mean;
    ``failing``: LR -> how many of its seeds failed (the first ones)."""
    return truth_conclusion(constructed_runs(means, failing, seeds))


def constructed_runs(means: dict[float, float], failing: dict[float, int] | None = None,
                     seeds: int = 3) -> list[TruthRun]:
    """The runs of ``constructed_truth``."""
    offsets, full, runs = [-SD, 0.0, SD][:seeds], 100 * 64, []
    for lr in sorted({*means, *(failing or {})}):
        for seed in range(seeds):
            failed = seed < (failing or {}).get(lr, 0)
            loss = None if failed else means[lr] + offsets[seed]
            runs.append(TruthRun(lr, seed, 100, 64, math.log(256), {} if failed else {full: loss}, loss, failed,
                                 failed, 0, None, Setting({}, TruthData())))
    return runs


# 0.004-0.016 lie within 2 SE of the best (0.008); 0.002 and 0.032, the LRs clearly worse, bound it 16x apart.
# At 0.128 one seed of three fails; at 0.256 all do.
MEANS = {0.001: 2.30, 0.002: 2.10, 0.004: 2.005, 0.008: 2.00, 0.016: 2.01, 0.032: 2.20, 0.064: 2.60, 0.128: 3.0}
FAILING = {0.128: 1, 0.256: 3}


def edge_summary(best_lr: float, edge: tuple[float | None, float | None] = (0.064, 0.128)) -> dict:
    return {"best_lr": best_lr, "failing_lr_low": edge[0], "failing_lr": edge[1], "basin": None, "degraded": None}


def test_the_constructed_truths_basin_is_the_lrs_within_two_standard_errors_of_its_best():
    checks = compare(constructed_truth(MEANS, FAILING), edge_summary(0.008))
    assert checks.truth_basin_lrs == (0.004, 0.016) and checks.truth_edge_band == (0.064, 0.256)


def test_a_search_best_just_outside_the_truths_basin_but_inside_its_clearly_worse_neighbours_fails():
    checks = compare(constructed_truth(MEANS, FAILING), edge_summary(0.025))  # above 0.016, below 0.032
    assert not checks.best_lr_in_truth_basin


def test_a_search_best_inside_the_truths_basin_between_two_of_its_grid_lrs_passes():
    checks = compare(constructed_truth(MEANS, FAILING), edge_summary(0.011))  # between 0.008 and 0.016
    assert checks.best_lr_in_truth_basin


def degraded_region(low: tuple[float, float], high: tuple[float, float | None]) -> dict:
    return {"low": list(low), "high": list(high), "points": [], "excess_at": {}, "per_doubling": 0.1,
            "per_doubling_se": None}


@pytest.mark.parametrize(("degraded", "overlap"), [
    pytest.param(degraded_region((0.016, 0.032), (0.064, 0.128)), True, id="the-same-region"),
    pytest.param(degraded_region((0.05, 0.064), (0.09, 0.128)), True, id="sharing-its-top"),
    pytest.param(degraded_region((0.002, 0.003), (0.003, 0.004)), False, id="below-it"),
    pytest.param(degraded_region((0.2, 0.3), (0.4, None)), False, id="above-its-failing-lr"),
    pytest.param(None, False, id="none-found")])
def test_a_searchs_degraded_region_is_checked_against_the_truths(degraded, overlap):
    """The constructed truth degrades above its basin (0.004-0.016): 0.032 and 0.064 trained through, clearly
    worse, below its first failing LR 0.128; its region lies between 0.016 and 0.128 at its widest."""
    truth = constructed_truth(MEANS, FAILING)
    assert truth["degraded"]["low"] == [0.016, 0.032] and truth["degraded"]["high"] == [0.064, 0.128]
    checks = compare(truth, {**edge_summary(0.008), "degraded": degraded})
    assert checks.truth_degraded == (0.016, 0.128) and checks.degraded_overlap is overlap, checks


def test_a_two_seed_truth_is_refused_in_one_line_naming_the_seeds_to_train():
    with pytest.raises(LmtuneError) as refused:
        compare(constructed_truth(MEANS, FAILING, seeds=2), edge_summary(0.008))
    assert str(refused.value) == "the truth has 2 seeds at lr 0.002: a check needs 3; train it with --seeds 0,1,2"


def test_a_search_bracket_inside_the_lrs_where_the_truths_seeds_disagree_overlaps_its_edge():
    """The truth's first failing LR is 0.128 (one seed), but two seeds of three came through there: a search
    whose seeds all came through at 0.18 and failed at 0.24 agrees with it."""
    checks = compare(constructed_truth(MEANS, FAILING), edge_summary(0.008, (0.18, 0.24)))
    assert checks.edge_brackets_overlap and not checks.bracket_holds_first_failing_lr


@pytest.mark.parametrize("edge", [pytest.param((0.256, 0.4), id="touching-at-the-truths-all-failed-lr"),
                                  pytest.param((None, 0.4), id="no-stable-end"),
                                  pytest.param((0.016, 0.032), id="below-the-truths-last-lr-through")])
def test_a_search_bracket_that_shares_no_edge_with_the_truths_fails(edge):
    assert not compare(constructed_truth(MEANS, FAILING), edge_summary(0.008, edge)).edge_brackets_overlap


# The truth at a horizon search's target: 0.016 lies 2.5 standard errors above the best (0.008).
HORIZON_MEANS = {0.004: 2.10, 0.008: 2.00, 0.016: 2.00 + 1.25 * TWO_SE, 0.032: 2.30}


def test_a_prediction_whose_truth_loss_is_two_and_a_half_standard_errors_above_the_truths_best_fails():
    check = compare_horizon(constructed_truth(HORIZON_MEANS), {"predicted_lr": 0.016}, 1)
    assert check.truth_two_standard_errors == pytest.approx(TWO_SE)
    assert check.predicted_excess_in_truth == pytest.approx(1.25 * TWO_SE) and not check.predicted_lr_in_truth_basin


def test_a_prediction_read_between_two_truth_lrs_within_two_standard_errors_of_the_best_passes():
    check = compare_horizon(constructed_truth(HORIZON_MEANS), {"predicted_lr": 0.008 * 2 ** 0.5}, 1)
    assert check.predicted_excess_in_truth == pytest.approx(0.625 * TWO_SE) and check.predicted_lr_in_truth_basin


def test_the_truths_own_lr_star_is_located_between_its_grid_points_not_read_off_its_grid():
    """Losses an exact parabola in ln LR about 0.006 on a grid 2x apart: the crowned grid LR is 0.004 or 0.008, the
    located LR* the parabola's minimum, within its interval (what a prediction's interval is checked against)."""
    means = {lr: 2.0 + 0.1 * math.log(lr / 0.006) ** 2 for lr in (0.001, 0.002, 0.004, 0.008, 0.016, 0.032)}
    located = lr_truth.truth_located_lr(truth_conclusion(constructed_runs(means)), 100 * 64)
    assert located.located and located.lr == pytest.approx(0.006, rel=1e-6)
    low, high = located.interval()
    assert low < 0.006 < high and high / low < 2


# ---------------------------------------------------------------------------------------------
# The check's power: how often a naive answer passes it against truths redrawn from the truth's curve and noise


def test_a_naive_answer_far_up_a_sharp_truths_curve_almost_never_passes():
    # 0.064 lies 0.60 nats above the best, about 12 of the check's 2 SEs
    (answer,) = naive_answers(constructed_truth(MEANS, FAILING), {"the grid's middle": 0.064})
    assert answer.passes is False and answer.pass_rate < 0.01


def test_a_naive_answer_inside_the_truths_basin_passes_most_redrawn_truths():
    (answer,) = naive_answers(constructed_truth(MEANS, FAILING), {"the largest proxy's best": 0.004})
    assert answer.passes and answer.pass_rate > 0.5


def test_a_truth_whose_check_a_naive_answer_passes_often_says_it_cannot_tell_and_what_would():
    answers = naive_answers(constructed_truth(MEANS, FAILING), {"the largest proxy's best": 0.004,
                                                                "the grid's middle": 0.064})
    why = cannot_tell(answers)
    assert "the largest proxy's best (0.004) passes" in why and "grid's middle" not in why
    assert "more seeds" in why and "larger extrapolation ratio" in why


def test_a_truth_that_fails_every_naive_answer_at_least_four_times_in_five_validates():
    assert cannot_tell(naive_answers(constructed_truth(MEANS, FAILING), {"far": 0.064, "farther": 0.001})) is None


def test_the_pass_rate_is_the_checks_own_rule_on_redrawn_truths():
    # 0.016 sits 0.01 nats above the best, half the check's 2 SE (0.02): it passes unless the draws move the two
    # LRs' means apart by more than about 1.2 of their difference's sds; deterministic at its seed
    truth = constructed_truth(MEANS, FAILING)
    rate = naive_pass_rate(truth, 0.016)
    assert rate == naive_pass_rate(truth, 0.016) and 0.6 < rate < 0.99


HORIZON = {"horizon_target_tokens": 6400, "budgets": [{"tokens": 800, "crowned_lr": 0.02},
                                                     {"tokens": 1600, "crowned_lr": 0.016},
                                                     {"tokens": 6400, "crowned_lr": 0.008}]}


def width_search(parametrization: str) -> dict:
    return {"target_width": 256, "parametrization": parametrization,
            "widths": [{"d_model": 32, "crowned_lr": 0.06}, {"d_model": 64, "crowned_lr": 0.032},
                       {"d_model": 256, "crowned_lr": 0.009}]}


def test_a_horizon_searchs_candidates_are_its_largest_budgets_best_unchanged_and_by_the_textbook_rule_and_the_middle():
    """The textbook rule for a horizon: the largest budget's best x (target / its tokens)^-0.3, a prior beta."""
    assert naive_candidates(HORIZON, (0.001, 0.1)) == {
        "the largest proxy's best LR, unchanged": 0.016,
        f"the textbook rule: the largest budget's best LR × (target / its tokens)^-{PRIOR_BETA:g} (a prior β)":
            pytest.approx(0.016 * 4 ** -0.3),
        "the middle of the first grid": pytest.approx(0.01)}


def test_the_first_grid_is_the_searchs_own_lr_min_and_lr_max():
    settings = SimpleNamespace(lr_min=0.001, lr_max=0.1)
    record = SimpleNamespace(plan=SimpleNamespace(space=SimpleNamespace(strategy=SimpleNamespace(settings=settings))))
    assert lr_truth.first_grid(record) == (0.001, 0.1) and lr_truth.first_grid(SimpleNamespace(plan=None)) is None


def test_under_sp_the_textbook_rule_divides_the_widest_proxys_best_by_the_width_ratio():
    candidates = naive_candidates(width_search("sp"))
    assert candidates == {"the largest proxy's best LR, unchanged": 0.032,
                          "the textbook rule: the widest proxy's best LR ÷ the width ratio (SP's rule: LR* ∝ 1/width)":
                              pytest.approx(0.008)}


def test_under_mup_the_widest_proxys_best_unchanged_is_named_as_mups_rule_and_given_once():
    assert naive_candidates(width_search("mup")) == {"μP's rule: the widest proxy's best LR, unchanged": 0.032}


def test_the_direct_local_searchs_answers_are_candidates_seeds_that_agree_named_together():
    # seed 1's search centres low: its LRs 0.001-0.004, its best the highest of them
    found = [direct_local_search(constructed_runs(MEANS), centre=c, count=3, predicted=None, seed=seed)
             for seed, c in ((0, 0.008), (1, 0.0012), (2, 0.008))]
    candidates = naive_candidates(HORIZON, direct=found)
    assert candidates["the direct local search's answer (seeds 0, 2)"] == 0.008
    assert candidates["the direct local search's answer (seed 1)"] == 0.004


def test_a_search_with_no_proxy_below_the_target_has_no_rule_to_carry():
    assert naive_candidates({"horizon_target_tokens": 800, "budgets": [{"tokens": 800, "crowned_lr": 0.01}]}) == {}


def test_a_truth_the_textbook_rule_passes_cannot_tell_though_the_unchanged_proxy_and_the_grids_middle_fail():
    """issue 55: under SP the widest proxy's best unchanged lies far up the truth's curve (a naive answer no careful
    user takes); the textbook rule lands in the basin, so a prediction there is no evidence the search works."""
    truth = constructed_truth(MEANS, FAILING)
    summary = {"target_width": 256, "parametrization": "sp", "widths": [{"d_model": 64, "crowned_lr": 0.032}]}
    answers = {a.name: a for a in naive_answers(truth, naive_candidates(summary, (0.016, 0.256)))}
    assert answers["the largest proxy's best LR, unchanged"].pass_rate < 0.01
    assert answers["the middle of the first grid"].pass_rate < 0.01
    rule = next(a for name, a in answers.items() if name.startswith("the textbook rule"))
    assert rule.lr == pytest.approx(0.008) and rule.pass_rate > 0.9
    assert "the textbook rule" in cannot_tell(list(answers.values()))


@pytest.mark.parametrize(("rate", "validated"), [(0.2, False), (0.19975, True)])
def test_a_candidate_passing_20_percent_of_redrawn_truths_or_more_leaves_the_truth_unable_to_tell(rate, validated):
    assert (cannot_tell([NaiveAnswer("a rule", 0.01, True, rate)]) is None) is validated


# ---------------------------------------------------------------------------------------------
# The direct local search at the target: the baseline a horizon search's cost and answer are held against


def test_the_direct_search_centres_on_the_largest_proxys_best_scaled_down_by_the_ratio_to_the_power_0_3():
    summary = {"horizon_target_tokens": 8000, "budgets": [{"tokens": 500, "crowned_lr": 0.05},
                                                           {"tokens": 1000, "crowned_lr": 0.04},
                                                           {"tokens": 8000, "crowned_lr": 0.01}],
               "confirmed": {"losses": [{"lr": 0.01, "seeds": [0, 1]}, {"lr": 0.02, "seeds": [0, 1]}]}}
    centre, count = direct_centre(summary)
    assert centre == pytest.approx(0.04 * 8 ** -0.3) and count == 4


@pytest.mark.parametrize(("parametrization", "centre"), [("sp", 0.032 / 4), ("mup", 0.032)])
def test_a_width_searchs_direct_search_centres_on_the_widest_proxys_best_by_its_parametrizations_rule(
        parametrization, centre):
    """SP: LR* falls as 1/width (the rule a user would take); μP: it does not move (μP's promise)."""
    summary = {"target_width": 256, "parametrization": parametrization,
               "widths": [{"d_model": 32, "crowned_lr": 0.06}, {"d_model": 64, "crowned_lr": 0.032},
                          {"d_model": 256, "crowned_lr": 0.009}],
               "confirmed": {"losses": [{"lr": 0.01, "seeds": [0, 1]}, {"lr": 0.02, "seeds": [0, 1]},
                                        {"lr": 0.04, "seeds": [0, 1]}]}}
    assert direct_centre(summary) == (pytest.approx(centre), 6)


def test_the_direct_search_takes_its_best_run_of_one_seed_and_both_answers_are_judged_on_the_other_seeds():
    """Seed 0's losses put the direct search's best at 0.016 (its noise: -SD there); the other seeds' curve has its
    best at 0.008, where the search predicted."""
    runs = constructed_runs(MEANS)
    for run in runs:
        if run.seed == 0 and run.lr == 0.016:
            run.end_val = MEANS[0.008] - 5 * SD
    found = direct_local_search(runs, centre=0.01, count=3, predicted=0.008)
    assert found.lrs == [0.004, 0.008, 0.016] and found.answer == 0.016
    assert found.tokens == 3 * 100 * 64
    assert found.prediction_excess == pytest.approx(0.0) and found.answer_excess == pytest.approx(0.01)


def test_a_direct_search_near_the_grids_end_keeps_its_number_of_runs():
    found = direct_local_search(constructed_runs(MEANS), centre=0.0009, count=3, predicted=None)
    assert found.lrs == [0.001, 0.002, 0.004] and found.prediction_excess is None


def test_the_recorded_truths_reproduce_the_checks_recorded_beside_their_tables():
    """benchmarks/recorded_truths.py transcribes truths whose folders are gone: read by the check, they give the
    predictions' distances to the best recorded in benchmarks/README.md (cosine 0.0035, WSD 0.0018, real text
    0.004, SP 0.012, μP 0.002 nats, real-text width beyond the truth's LRs; the tables round each loss to 3
    decimals) and the direct local search's answers recorded there."""
    from benchmarks.recorded_truths import TRUTHS, study

    rows = [study(truth) for truth in TRUTHS]
    assert [r["prediction_excess"] for r in rows] == [pytest.approx(x, abs=0.001) if x is not None else None
                                                      for x in (0.0035, 0.0018, 0.004, 0.012, 0.002, None)]
    direct = [{a["lr"] for a in r["naive_answers"] if a["name"].startswith("the direct")} for r in rows]
    assert direct == [{0.005063, 0.007594}, {0.005063, 0.007594}, {0.00225}, {0.005063}, {0.007594, 0.01139},
                      {0.003375}]


def test_no_recorded_truth_is_validated_where_a_textbook_rule_passes_20_percent_of_redrawn_truths():
    from benchmarks.recorded_truths import TRUTHS, study

    for row in map(study, TRUTHS):
        rates = [a["pass_rate"] for a in row["naive_answers"]]
        assert not (row["validated"] and any(r is None or r >= 0.2 for r in rates)), row["truth"]


def test_the_sp_width_truth_is_matched_by_the_textbook_rule_and_so_cannot_tell():
    """issue 55: the SP truth at d_model 256 was called validated; the widest proxy's best ÷ 2 (0.0045) passes it."""
    from benchmarks.recorded_truths import TRUTHS, study

    row = study(next(t for t in TRUTHS if t.name.startswith("width SP, built-in")))
    rule = next(a for a in row["naive_answers"] if a["name"].startswith("the textbook rule"))
    assert rule["lr"] == pytest.approx(0.0045) and rule["pass_rate"] > 0.99
    assert row["prediction_passes"] and not row["validated"] and row["textbook_rule_in_interval"]


def test_the_real_text_width_space_is_quick_width_with_the_given_proxies_and_head_dimension(tmp_path):
    """benchmarks/real_text.py --search width: quick_width's target (d_model 256) from narrower proxies, every model
    with heads of --head-dim (d_model 16 has one head of 16): a space lmtune loads, 4x the widest proxy."""
    from benchmarks.real_text import width_space
    from lmtune.sweep.spaces import load_space

    space = load_space(str(width_space(tmp_path, [16, 32, 64], head_dim=16, lr_max=0.12)))
    assert space.fixed["d_model"] == 256 and space.fixed["n_heads"] == 16
    assert space.strategy.settings.widths == (16, 32, 64) and space.strategy.settings.lr_max == 0.12
