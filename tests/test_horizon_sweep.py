"""The horizon search as a user runs it: real Ray Tune on a local cluster, real training of a tiny model at
two budgets below a target under a warmup-stable-decay schedule (so a larger budget's run continues the same
LR and seed's smaller one), the refinement around each budget's best, the fit, the confirmation at the target on
two seeds, the report, and a target run and a continued run each trained again from scratch to the same loss; and
(the release tier) the benchmark's check at test size: the predicted LR against a grid trained at the target from
scratch on three seeds with nothing stopping it (the truth, whose own seeds give the check's tolerance), which also
shows each target run ended exactly as from scratch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import (
    TINY_TRIAL,
    assert_confirmation_follows_its_rule,
    assert_real_picture,
    run_space_and_analyze,
    trial_dirs,
)

from benchmarks.truth import TRUTH_SEEDS, compare_horizon, read_truth, truth_conclusion
from lmtune.searches.state import read_search_state
from lmtune.sweep.sweep_file import SweepRecord
from lmtune.training.config import RunConfig, apply_overrides
from lmtune.training.loop import train

pytestmark = pytest.mark.slow

# Target 96 steps of 256 tokens; searched budgets 12 and 24 steps (1/8 and 1/4 of it). Each budget: its grid,
# seeds, refinement (2 LRs x 2 seeds), walls where needed, one edge probe; the confirmation: 3 LRs x 2 seeds.
TINY_HORIZON = f"""\
description: tiny horizon search for the tests
search: horizon
budget: quick
set: {json.dumps({**TINY_TRIAL, "steps": 96, "warmup_steps": 4, "eval_interval": 12, "checkpoint_interval": 96,
                         "schedule": "wsd"})}
scheduler: {{name: none}}
horizon: {{budgets: 2, lr_min: 0.01, lr_max: 0.04, ratio: 2, below: 1, above: 1, max_extensions: 2, seeds: 2,
           edge_probes: 1, edge_ratio: 8, edge_tolerance: 8, confirm_seeds: 2}}
"""


@pytest.fixture(scope="module")
def horizon_sweep(builtin_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run_space_and_analyze(TINY_HORIZON, "horizon", tmp_path_factory.mktemp("horizon"), builtin_data)


def test_the_search_finishes_and_every_trial_trains_its_own_budget_through(horizon_sweep):
    assert horizon_sweep["run"].returncode == 0, horizon_sweep["run"].stderr[-3000:]
    state = read_search_state(horizon_sweep["dir"], "horizon")
    assert state["finished"]
    steps = {}
    for trial_id, folder in trial_dirs(horizon_sweep["dir"]).items():
        config = json.loads((folder / "config.json").read_text())
        steps[trial_id] = config["train"]["steps"]
        assert config["train"]["steps"] == state["plans"][trial_id]["point"]
    assert set(steps.values()) == {12, 24, 96}


def test_the_report_gives_the_fit_the_prediction_and_the_target_runs(horizon_sweep):
    assert horizon_sweep["analyze"].returncode == 0, horizon_sweep["analyze"].stderr[-3000:]
    s = horizon_sweep["summary"]
    assert [b["steps"] for b in s["budgets"]] == [12, 24, 96]
    assert all(len(b["best_lr_seeds"]) == 2 for b in s["budgets"][:-1])
    low, high = s["predicted_lr_interval"]
    assert low <= s["predicted_lr"] <= high
    assert set(s["horizon_fit"]) >= {"beta", "beta_interval", "intercept", "intercept_interval"}
    confirmed = sorted(r["lr"] for r in s["confirmed"]["losses"])
    assert [lr / s["predicted_lr"] for lr in confirmed] == pytest.approx([0.5, 1.0, 2.0], rel=0.02)
    assert all(sorted(r["seeds"]) == [0, 1] for r in s["confirmed"]["losses"])
    assert_confirmation_follows_its_rule(s["confirmed"])
    assert_real_picture(horizon_sweep["dir"] / "report" / "horizon.png")


def test_run_and_analyze_print_the_same_prediction(horizon_sweep):
    predicted = f"predicted best lr at {horizon_sweep['summary']['horizon_target_tokens']:,} tokens (the target): " \
                f"{horizon_sweep['summary']['predicted_lr']:.3g}"
    assert predicted in horizon_sweep["run"].stdout
    assert predicted in horizon_sweep["analyze"].stdout
    line = next(line for line in horizon_sweep["analyze"].stdout.splitlines() if predicted in line)
    assert f"{predicted} (interval " in line, line  # not "90% interval": it held under 85% off its scenarios


def test_the_search_states_fit_made_during_the_sweep_is_the_reports_from_the_trials_files(horizon_sweep):
    """The search fitted from the results Tune handed it, before the confirmation ran; analyze fits again from the
    trials' files on disk: the same LRs crowned and located at each budget, and the same fit."""
    fit, s = read_search_state(horizon_sweep["dir"], "horizon")["fit"], horizon_sweep["summary"]
    budgets = {b["tokens"]: b for b in s["budgets"]}
    for point in fit["points"]:
        assert point["crowned_lr"] == budgets[point["tokens"]]["crowned_lr"]
        assert point["lr"] == pytest.approx(budgets[point["tokens"]]["located_lr"], rel=1e-9)
    # (the surface is fitted iteratively, from Tune's results in the search and from the trials' files in the
    # report: the two agree to far below any digit the report prints)
    assert fit["beta"] == pytest.approx(s["horizon_fit"]["beta"], rel=1e-6, abs=1e-9)
    assert fit["predicted_lr"] == pytest.approx(s["predicted_lr"], rel=1e-6)
    assert fit["predicted_lr_interval"] == pytest.approx(s["predicted_lr_interval"], rel=1e-6)


def test_larger_budgets_continued_smaller_ones_and_trained_fewer_tokens_than_their_budgets(horizon_sweep):
    trials = [json.loads((d / "trial.json").read_text()) for d in trial_dirs(horizon_sweep["dir"]).values()]
    forked = [t for t in trials if t["params"].get("fork_from")]
    assert forked and all(t["continued_from_tokens"] > 0 for t in forked)
    compute = horizon_sweep["summary"]["compute"]
    assert compute["tokens_spent"] < compute["full_grid_tokens"]


@pytest.fixture(scope="module")
def truth(horizon_sweep, tmp_path_factory) -> dict:
    """The target runs' own LRs (the prediction and 2x either side) and 2x beyond them each way, TRUTH_SEEDS seeds
    each, trained to the target budget from scratch with nothing stopping it: five LRs 2x apart around the
    prediction, so that the truth's best is found on its own seeds wherever within 4x of the prediction it lies."""
    base = SweepRecord.read(horizon_sweep["dir"]).plan.base
    truth_dir = tmp_path_factory.mktemp("truth")
    targets = sorted({r["lr"] for r in horizon_sweep["summary"]["confirmed"]["losses"]})
    for lr in [targets[0] / 2, *targets, targets[-1] * 2]:
        for seed in range(TRUTH_SEEDS):
            train(apply_overrides(base, {"lr": lr, "seed": seed}), truth_dir / f"lr={lr}_seed={seed}")
    return {"runs": read_truth(truth_dir), "targets": targets}


def test_a_target_run_ends_exactly_as_trained_from_scratch(horizon_sweep, tmp_path):
    """The prediction's run at the target on its first seed, trained again from the plan's base with that LR and
    seed, from scratch with nothing stopping it: the confirmation's loss for it is that run's, exactly. (Each of
    the six target runs against the ground truth's: the release tier's test below.)"""
    base = SweepRecord.read(horizon_sweep["dir"]).plan.base
    s = horizon_sweep["summary"]
    row = next(r for r in s["confirmed"]["losses"] if r["lr"] == pytest.approx(s["predicted_lr"], rel=0.02))
    lr, seed = row["lr"], row["seeds"][0]
    train(apply_overrides(base, {"lr": lr, "seed": seed}), tmp_path / f"lr={lr}_seed={seed}")
    (scratch,) = read_truth(tmp_path)
    assert row["losses"][0] == scratch.end_val, (row, scratch)


def test_a_run_continued_from_a_smaller_budget_ends_exactly_as_from_scratch(horizon_sweep, tmp_path):
    folders = trial_dirs(horizon_sweep["dir"]).values()
    forked = next(d for d in folders if json.loads((d / "trial.json").read_text())["params"].get("fork_from"))
    config = RunConfig.from_dict(json.loads((forked / "config.json").read_text()))
    direct = train(config, tmp_path / "scratch")
    assert json.loads((forked / "summary.json").read_text())["final_val_loss"] == direct.summary["final_val_loss"]


# A benchmark of the search against its ground truth (15 runs at the target): the release tier.
@pytest.mark.release
def test_the_prediction_agrees_with_a_small_ground_truth_grid_at_the_target(horizon_sweep, truth):
    """The benchmark's check at test size: the predicted LR's loss on the truth's curve within 2 standard
    errors of the truth's best, the standard error from the truth's own seeds (none from the sweep under test);
    and each target run ended exactly as the truth's run of its LR and seed, trained from scratch."""
    runs = truth["runs"]
    scratch = {(r.lr, r.seed): r.end_val for r in runs}
    for row in horizon_sweep["summary"]["confirmed"]["losses"]:
        assert row["losses"] == [scratch[row["lr"], seed] for seed in row["seeds"]], row
    conclusion = truth_conclusion(runs)
    assert len(conclusion["best_lr_seed_losses"]) == TRUTH_SEEDS and conclusion["seed_spread"] is not None
    check = compare_horizon(conclusion, horizon_sweep["summary"], sum(r.steps * r.tokens_per_step for r in runs))
    assert check.truth_two_standard_errors is not None
    assert check.predicted_lr_in_truth_basin, check
