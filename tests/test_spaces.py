"""Search spaces: validation of bad spaces (one line naming the file and the key, nothing launched),
the shipped spaces, --list-spaces, and the Optuna space (bounds, log-uniformity, sample count)."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import textwrap
from pathlib import Path

import numpy as np
import pytest
import ray
import torch
from conftest import TINY_TRIAL, assert_refused, run_lmtune

from lmtune import run as run_cli
from lmtune.errors import LmtuneError
from lmtune.searches.optuna.settings import Distribution
from lmtune.sweep.plan import SweepPlan
from lmtune.sweep.spaces import available_spaces, load_space
from lmtune.training.config import budget_config

GOOD_GRID = """\
description: a valid grid
search: grid
budget: quick
params:
  lr: [1.0e-3, 3.0e-3]
"""

# (case id, YAML text, key the message must name, a fragment of the message)
BAD_SPACES = [
    ("malformed-yaml", "search: grid\nparams:\n  lr: [1.0e-3, 3.0e-3\n", None, r"malformed YAML"),
    ("unknown-top-key", GOOD_GRID + "learning_rate: 1.0e-3\n", "learning_rate", r"unknown key; valid keys"),
    ("unknown-param", "search: grid\nparams:\n  lrr: [1.0e-3]\n", "params.lrr", r"unknown setting"),
    ("wrong-type", "search: grid\nparams:\n  lr: [\"abc\"]\n", "params.lr", r"'abc' is not a valid float"),
    ("lr-zero", "search: grid\nparams:\n  lr: [0.0, 1.0e-3]\n", "params.lr", r"lr must be a positive finite number"),
    ("lr-negative", "search: grid\nparams:\n  lr: [-1.0e-3]\n", "params.lr", r"lr must be a positive finite number"),
    ("lr-nan", "search: grid\nparams:\n  lr: [.nan]\n", "params.lr", r"lr must be a positive finite number"),
    ("lr-inf", "search: grid\nparams:\n  lr: [1.0e-3, .inf]\n", "params.lr", r"lr must be a positive finite number"),
    ("lr-nan-optuna", "search: optuna\nparams:\n  lr: {loguniform: [.nan, 1.0e-2]}\n", "params.lr",
     r"lr must be a positive finite number"),
    ("empty-grid", "search: grid\nparams:\n  lr: []\n", "params.lr", r"empty grid"),
    ("bounds-wrong-order", "search: optuna\nnum_samples: 4\nparams:\n  lr: {loguniform: [1.0e-2, 1.0e-4]}\n",
     "params.lr", r"bounds in the wrong order"),
    ("unknown-search", "search: bayes\nparams:\n  lr: [1.0e-3]\n", "search", r"unknown search 'bayes'"),
    ("unknown-scheduler", GOOD_GRID + "scheduler: {name: hyperband}\n", "scheduler.name",
     r"unknown scheduler 'hyperband'"),
    ("unknown-sampler", "search: optuna\nsampler: grid_sampler\nparams:\n  lr: {loguniform: [1.0e-4, 1.0e-2]}\n",
     "sampler", r"unknown sampler 'grid_sampler'"),
    ("unknown-budget", "search: grid\nbudget: huge\nparams:\n  lr: [1.0e-3]\n", "budget", r"unknown budget 'huge'"),
    ("unknown-distribution", "search: optuna\nparams:\n  lr: {normal: [1.0e-4, 1.0e-2]}\n", "params.lr",
     r"unknown distribution 'normal'"),
    ("no-params", "search: grid\nbudget: quick\n", "params", r"non-empty mapping"),
    ("unknown-scheduler-key", GOOD_GRID + "scheduler: {name: asha, grace: 3}\n", "scheduler.grace",
     r"unknown key"),
    ("fuse-zero", GOOD_GRID + "fuse: 0\n", "fuse", r"must be a positive integer"),
    ("fuse-optuna", "search: optuna\nfuse: 3\nparams:\n  lr: {loguniform: [1.0e-4, 1.0e-2]}\n", "fuse",
     r"fusing needs search: grid"),
    ("fuse-without-lr", "search: grid\nfuse: 2\nparams:\n  batch_size: [8, 16]\n", "fuse", r"does not sweep"),
    ("retired-explode-factor", GOOD_GRID + "stopper: {explode_factor: 1.5}\n", "stopper.explode_factor",
     r"often recover.*use stopper.recovery_window"),
    ("retired-horizon", "search: edge\nbudget: quick\nedge: {horizon: 0.1}\n", "edge.horizon",
     r"probes now train the full budget"),
    ("recovery-window-above-1", GOOD_GRID + "stopper: {recovery_window: 1.5}\n", "stopper.recovery_window",
     r"must be a fraction of the budget's steps"),
    ("stop-factor-below-1", GOOD_GRID + "stopper: {stop_factor: 0.5}\n", "stopper.stop_factor", r"must be >= 1"),
    ("horizon-with-params", "search: horizon\nparams:\n  lr: [1.0e-3]\n", "params", r"chooses the learning rates"),
    ("horizon-with-asha", "search: horizon\nscheduler: {name: asha}\n", "scheduler.name",
     r"trains every run to its whole budget"),
    ("horizon-one-budget", "search: horizon\nhorizon: {budgets: 1}\n", "horizon.budgets", r"at least 2"),
    ("horizon-unknown-key", "search: horizon\nhorizon: {target: 1000}\n", "horizon.target", r"unknown key"),
]


@pytest.mark.parametrize("text,key,fragment", [c[1:] for c in BAD_SPACES], ids=[c[0] for c in BAD_SPACES])
def test_bad_space_is_one_line_naming_file_and_key(tmp_path: Path, text: str, key: str | None, fragment: str):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(LmtuneError, match=fragment) as info:
        load_space(str(path))
    message = str(info.value)
    assert "\n" not in message, message
    assert message.startswith(str(path)), message  # names the file
    if key is not None:
        assert f": {key}: " in message, message  # names the key
    else:
        assert re.search(r"line \d+", message), message  # malformed YAML: names the line


def test_a_fused_grid_cuts_each_combination_of_other_settings_into_groups_of_lrs(tmp_path: Path):
    path = tmp_path / "g.yaml"
    path.write_text("search: grid\nfuse: 2\nparams:\n  lr: [1.0e-3, 2.0e-3, 4.0e-3]\n  batch_size: [8, 16]\n")
    space = load_space(str(path))
    groups = space.strategy.param_space(space.fuse)["members"]["grid_search"]
    assert groups == [{"lr": [1e-3, 2e-3], "batch_size": 8}, {"lr": [4e-3], "batch_size": 8},
                      {"lr": [1e-3, 2e-3], "batch_size": 16}, {"lr": [4e-3], "batch_size": 16}]


def test_unknown_space_name_lists_the_available_ones():
    with pytest.raises(LmtuneError, match=r"unknown search space 'no_such_space'; available: ") as info:
        load_space("no_such_space")
    for name in ("lr_grid", "lr_optuna", "lr_batch", "quick"):
        assert name in str(info.value)


def test_missing_space_file_is_refused(tmp_path: Path):
    with pytest.raises(LmtuneError, match=r"not found"):
        load_space(str(tmp_path / "absent.yaml"))


def test_cli_refuses_bad_space_and_launches_nothing(tmp_path: Path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("search: grid\nparams:\n  lr: [1.0e-3, -1.0]\n")
    results = tmp_path / "results"
    assert_refused(run_cli.main, ["--space", str(bad), "--name", "x", "--results", str(results), "--no-dashboard"],
                   capsys, str(bad), "params.lr")
    assert not ray.is_initialized()
    assert not results.exists() or not any(results.iterdir())


def test_shipped_spaces_load():
    names = available_spaces()
    assert {"lr_grid", "lr_optuna", "lr_batch", "quick"} <= set(names)
    for name in names:
        space = load_space(name)
        assert space.description and "\n" not in space.description
        # an edge, horizon, width or compare search decides its trials as it goes
        assert space.num_trials is None if space.search in ("edge", "horizon", "width", "compare") \
            else space.num_trials >= 1
    grid = load_space("lr_grid")
    assert grid.search == "grid"
    assert grid.strategy.params["lr"] == [1e-4, 3e-4, 6e-4, 1e-3, 3e-3, 6e-3, 1e-2]
    optuna_space = load_space("lr_optuna")
    assert optuna_space.search == "optuna" and optuna_space.strategy.sampler == "tpe"
    assert optuna_space.strategy.params["lr"] == Distribution("loguniform", (1e-4, 1e-2))
    batch = load_space("lr_batch")
    assert set(batch.strategy.params) == {"lr", "batch_size"} and batch.num_trials == 9
    quick = load_space("quick")
    assert quick.budget == "quick" and max(quick.strategy.params["lr"]) >= 1.0  # includes diverging LRs


@pytest.mark.parametrize("name", ["quick_horizon", "lr_horizon"])
def test_the_shipped_horizon_spaces_plan_budgets_below_their_target_that_outlast_the_warm_up(name: str):
    space = load_space(name)
    base = budget_config(space.budget, space.fixed)
    plan = SweepPlan.create(space, base)  # check_base passes
    budgets = space.strategy.settings.budget_steps(base.train.steps)
    assert plan.asha is None and len(budgets) == 3 and max(budgets) <= base.train.steps / 4
    assert min(budgets) > base.train.warmup_steps


def test_a_horizon_target_too_short_for_its_budgets_is_refused_in_one_line():
    space = load_space("quick_horizon")
    base = budget_config(space.budget, {**space.fixed, "steps": 100})
    with pytest.raises(LmtuneError, match=r"the smallest budget, 6 steps .* give a larger steps") as info:
        SweepPlan.create(space, base)
    assert "\n" not in str(info.value)


def test_list_spaces_prints_each_with_its_description(capsys):
    assert run_cli.main(["--list-spaces"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    for name in available_spaces():
        assert name in lines, out
        assert load_space(name).description in lines[name]


# ---------------------------------------------------------------------------------------------
# The Optuna space


def test_optuna_space_param_space_and_searcher_sample_loguniform():
    """The sampler path without training: Tune's loguniform domain and a fresh OptunaSearch (TPE,
    whose first samples are independent draws) both give log10(lr) ~ U(-4, -2)."""
    from ray import tune

    space = load_space("lr_optuna")
    param_space = space.strategy.param_space(space.fuse)
    domain = param_space["lr"]
    assert isinstance(domain, tune.search.sample.Float)
    assert (domain.lower, domain.upper) == (1e-4, 1e-2)

    def check_log_uniform(values: np.ndarray, n: int) -> None:
        assert values.min() >= 1e-4 and values.max() <= 1e-2
        logs = np.log10(values)
        assert abs(logs.mean() - (-3.0)) < 0.1, logs.mean()
        quartiles = np.histogram(logs, bins=[-4, -3.5, -3, -2.5, -2])[0] / n
        assert np.all(np.abs(quartiles - 0.25) < 0.06), quartiles  # ~0.25 each; a uniform lr would put 0.9 in one

    n = 2000
    check_log_uniform(np.array(domain.sample(size=n, random_state=np.random.default_rng(0))), n)

    searcher = space.strategy.optuna_searcher(metric="objective", seed=123)
    assert searcher.set_search_properties(None, None, param_space)
    n_opt = 400
    samples = [searcher.suggest(f"t{i}") for i in range(n_opt)]
    check_log_uniform(np.array([s["lr"] for s in samples]), n_opt)


def test_optuna_sampler_choices_build(tmp_path: Path):
    for sampler in ("tpe", "random", "cmaes"):
        strategy = dataclasses.replace(load_space("lr_optuna").strategy, sampler=sampler)
        searcher = strategy.optuna_searcher()
        assert type(searcher).__name__ == "OptunaSearch" and searcher._sampler.__class__.__name__.lower().startswith(
            {"tpe": "tpe", "random": "random", "cmaes": "cmaes"}[sampler])
    assert load_space("lr_grid").strategy.searcher(None, tmp_path) == (None, 1)  # Tune's own grid


@pytest.mark.slow
def test_optuna_sweep_end_to_end_respects_count_and_bounds(tmp_path: Path, builtin_data: Path):
    """Four samples within the bounds. At 20 steps no run gets near the data's unigram baseline (8.0 nats against
    5.67), so the sweep also shows, from the CLI, that nothing is crowned where nothing trained (issue 68 item 7):
    it says so and why, names no best trial, and exits 0 (the sweep ran as asked)."""
    space = tmp_path / "tiny_optuna.yaml"
    settings = {**TINY_TRIAL, "batch_size": 4, "steps": 20, "warmup_steps": 2}
    space.write_text(textwrap.dedent(f"""\
        description: tiny Optuna sweep for the tests
        search: optuna
        sampler: tpe
        num_samples: 4
        budget: quick
        params:
          lr: {{loguniform: [1.0e-4, 1.0e-2]}}
        set: {json.dumps(settings)}
        scheduler: {{name: none}}
        """))
    results = tmp_path / "results"
    proc = run_lmtune("run", "--space", str(space), "--name", "opt", "--results", str(results), "--data",
                      str(builtin_data), "--no-dashboard", "--quiet", "--num-cpus", "1", timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    sweep = results / "opt"
    params = sorted(sweep.glob("*/params.json"))
    assert len(params) == 4, [p.parent.name for p in params]
    lrs = [json.loads(p.read_text())["lr"] for p in params]
    assert all(1e-4 <= lr <= 1e-2 for lr in lrs), lrs
    assert len({round(math.log10(lr), 6) for lr in lrs}) == 4, lrs  # four distinct samples
    record = json.loads((sweep / "sweep.json").read_text())
    assert record["space"]["search"] == "optuna" and record["space"]["num_samples"] == 4
    assert "4 trials: 4 completed" in proc.stdout
    assert "nothing trained: no run ended better than the data's unigram baseline" in proc.stdout
    assert "best trial" not in proc.stdout


# ---------------------------------------------------------------------------------------------
# Advice: where lmtune's measurements say a horizon or width search, as configured, does not pay


def test_a_horizon_search_at_4x_is_told_a_direct_search_at_the_target_did_as_well_for_less():
    space = load_space("quick_horizon")
    advice = space.strategy.advice(budget_config(space.budget, space.fixed))
    assert advice.startswith("horizon: the target is 4x the largest searched budget")
    assert "(search: grid) instead" in advice


def test_a_horizon_search_beyond_the_measured_ratios_gets_no_advice(tmp_path):
    from lmtune.searches.horizon.settings import NO_GAIN_UP_TO_RATIO

    path = tmp_path / "far.yaml"
    fraction = 1 / (2 * NO_GAIN_UP_TO_RATIO)
    path.write_text(f"search: horizon\nbudget: quick\nset:\n  steps: 4096\nhorizon:\n  largest_fraction: {fraction}\n")
    space = load_space(str(path))
    assert space.strategy.advice(budget_config(space.budget, space.fixed)) is None


@pytest.mark.parametrize(("d_model", "n_heads", "widths", "advised"), [
    (256, 8, [32, 64, 128], "2x"), (256, 16, [16, 32, 64], "4x"), (512, 16, [32, 64], None)])
def test_a_width_search_is_advised_only_up_to_the_measured_ratio(tmp_path, d_model, n_heads, widths, advised):
    path = tmp_path / "w.yaml"
    path.write_text(f"search: width\nbudget: quick\nset:\n  d_model: {d_model}\n  d_ff: {3 * d_model}\n"
                    f"  n_heads: {n_heads}\nwidth:\n  widths: {widths}\n")
    space = load_space(str(path))
    advice = space.strategy.advice(budget_config(space.budget, space.fixed))
    assert (advice is not None) == (advised is not None)
    if advised:
        assert advice.startswith(f"width: the target is {advised} the widest proxy; up to 4x a direct local")


@pytest.mark.parametrize("name", ["quick_ablations", "quick_batch", "cs336_ablations", "cs336_batch"])
def test_the_shipped_compare_spaces_plan_every_variant_at_the_budgets_tokens(name: str):
    from lmtune.sweep.plan import SweepPlan

    space = load_space(name)
    base = budget_config(space.budget, space.fixed)
    fitted = space.strategy.fitted_to_device(base, lambda: torch.device("cpu"))  # (batch_size: largest: this host's)
    variants = SweepPlan.create(dataclasses.replace(space, strategy=fitted), base).space.strategy.settings.variants
    assert len(variants) >= 3
    assert {v.config(base).total_tokens for v in variants} == {base.total_tokens}


def test_cs336_ablations_silu_variant_matches_the_references_parameters_within_2_percent():
    """CS336: SiLU with d_ff = 4 d_model against SwiGLU's d_ff 1344 (two matrices against three)."""
    from lmtune.training.model import count_parameters

    space = load_space("cs336_ablations")
    base = budget_config(space.budget, space.fixed)
    silu = space.strategy.settings.variant("silu").config(base)
    reference, ablated = count_parameters(base.model)["non_embedding"], count_parameters(silu.model)["non_embedding"]
    assert abs(ablated / reference - 1) < 0.02
