"""What a hostile tester tried (part four, defect 11): the settings of an edge or horizon space get the bounds a
grid space has, derived from what their trials accept (lmtune.training.config: MAX_LR, MAX_SEED). A space beyond
them is refused in one line naming the file, the key, the value and the fix when it is loaded, before Ray starts;
every trial a space within them suggests passes the trial check; every shipped space still loads."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import ray
from conftest import assert_refused, drive_search

from lmtune import run as run_cli
from lmtune.analysis.runs import Budget
from lmtune.errors import LmtuneError
from lmtune.searches.edge.search import EdgeSearch
from lmtune.searches.edge.settings import EdgeSettings
from lmtune.searches.horizon.search import HorizonSearch
from lmtune.searches.horizon.settings import HorizonSettings
from lmtune.sweep.spaces import available_spaces, load_space
from lmtune.training.config import MAX_LR, MAX_SEED, budget_config

TOKENS_PER_STEP = 1024


def horizon_space(tmp_path: Path, horizon: str, extra: str = "") -> Path:
    path = tmp_path / "horizon.yaml"
    path.write_text(f"search: horizon\nbudget: quick\nset: {{steps: 648, warmup_steps: 18{extra}}}\n"
                    f"scheduler: {{name: none}}\nhorizon: {{{horizon}}}\n")
    return path


def edge_space(tmp_path: Path, edge: str, extra: str = "") -> Path:
    path = tmp_path / "edge.yaml"
    path.write_text(f"search: edge\nbudget: quick\nset: {{steps: 162, warmup_steps: 18{extra}}}\nedge: {{{edge}}}\n")
    return path


def refused_on_loading(path: Path, *fragments: str) -> str:
    """load_space(path) refuses in one line naming the file and each fragment."""
    with pytest.raises(LmtuneError) as refused:
        load_space(str(path))
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"{path}: "), message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


# ---------------------------------------------------------------------------------------------
# Horizon: each case of the issue, refused when the space is loaded


def test_a_horizon_space_of_a_million_budgets_is_refused_on_loading_naming_the_cap(tmp_path):
    refused_on_loading(horizon_space(tmp_path, "budgets: 1000000"), "horizon.budgets:", "at most 10", "1000000")


def test_a_horizon_budget_ratio_that_makes_the_smallest_budget_vanish_is_refused_on_loading(tmp_path):
    refused_on_loading(horizon_space(tmp_path, "budget_ratio: 1.0e+30"), "horizon.budget_ratio:",
                       "smallest of 3 budgets", "fewer budgets")


def test_a_horizon_lr_max_above_the_largest_lr_a_trial_accepts_is_refused_on_loading(tmp_path):
    refused_on_loading(horizon_space(tmp_path, "lr_max: 1.0e+7"), "horizon.lr_max:", f"({MAX_LR:g})",
                       "give an lr_max of at most", "10000000.0")


def test_a_horizon_grid_of_hundreds_of_millions_of_lrs_is_refused_with_its_size_before_any_lr_is_built(
        tmp_path, monkeypatch):
    def built(*args):
        raise AssertionError("the grid was built")

    monkeypatch.setattr(HorizonSettings, "first_grid", built)
    refused_on_loading(horizon_space(tmp_path, "lr_min: 1.0e-150, lr_max: 1.0e+150, ratio: 1.000001"),
                       "horizon.ratio:", "690,775,875 LRs", "at most 10,000", "give a larger ratio", "1.000001")


def test_horizon_extensions_that_would_step_past_the_largest_lr_a_trial_accepts_are_refused_on_loading(tmp_path):
    refused_on_loading(horizon_space(tmp_path, "max_extensions: 30"), "horizon.max_extensions:",
                       "give max_extensions at most 23", "(got 30)")


def test_horizon_edge_probes_that_would_step_past_the_largest_lr_a_trial_accepts_are_refused_on_loading(tmp_path):
    refused_on_loading(horizon_space(tmp_path, "edge_probes: 20"), "horizon.edge_probes:",
                       "give edge_probes at most 10", "(got 20)")


def test_a_horizon_base_seed_whose_further_seeds_pass_the_largest_a_trial_accepts_is_refused_on_loading(tmp_path):
    # seeds: 3 adds base + 1 and base + 2: from 2**32 - 1 they would be 2**32 and 2**32 + 1.
    refused_on_loading(horizon_space(tmp_path, "seeds: 3", extra=f", seed: {MAX_SEED}"), "set.seed:",
                       f"{MAX_SEED} plus the 2 further seeds", f"at most {MAX_SEED - 2}")


def test_horizon_walls_past_the_cap_are_refused_on_loading_naming_the_cap(tmp_path):
    refused_on_loading(horizon_space(tmp_path, "walls: 1.0e+12"), "horizon.walls:", "at most 10", "1000000000000")


def test_horizon_seeds_past_the_cap_are_refused_on_loading_naming_the_cap(tmp_path):
    refused_on_loading(horizon_space(tmp_path, "seeds: 1.0e+9"), "horizon.seeds:", "at most 100", "1000000000")


def test_a_horizon_space_refused_on_loading_starts_no_ray_and_exits_2_with_one_line(tmp_path, capsys):
    path = horizon_space(tmp_path, "budgets: 1000000")
    assert_refused(run_cli.main, ["--space", str(path), "--name", "x", "--results", str(tmp_path / "results"),
                                  "--no-dashboard", "--quiet"], capsys, f"{path}: horizon.budgets:", "at most 10")
    assert not ray.is_initialized(), "a Ray instance was started"
    assert not (tmp_path / "results").exists()


# ---------------------------------------------------------------------------------------------
# Edge: the same bounds


def test_an_edge_range_test_past_the_largest_lr_a_trial_accepts_is_refused_on_loading(tmp_path):
    refused_on_loading(edge_space(tmp_path, "range_max_lr: 1.0e+7"), "edge.range_max_lr:", f"at most {MAX_LR:g}",
                       "10000000.0")


def test_an_edge_coarse_grid_of_hundreds_of_thousands_of_lrs_is_refused_with_its_size(tmp_path):
    refused_on_loading(edge_space(tmp_path, "coarse_ratio: 1.0001, tolerance: 1.00001"), "edge.coarse_ratio:",
                       "161,191 LRs", "at most 10,000", "1.0001")


def test_edge_extensions_that_would_step_past_the_largest_lr_a_trial_accepts_are_refused_on_loading(tmp_path):
    refused_on_loading(edge_space(tmp_path, "max_extensions: 10"), "edge.max_extensions:",
                       "give max_extensions at most 4", "(got 10)")


def test_edge_seeds_past_the_cap_are_refused_on_loading_naming_the_cap(tmp_path):
    refused_on_loading(edge_space(tmp_path, "seeds: 1.0e+9"), "edge.seeds:", "at most 100", "1000000000")


def test_an_edge_base_seed_whose_bisection_seeds_pass_the_largest_a_trial_accepts_is_refused_on_loading(tmp_path):
    refused_on_loading(edge_space(tmp_path, "seeds: 1, edge_seeds: 2", extra=f", seed: {MAX_SEED}"), "set.seed:",
                       f"{MAX_SEED} plus the 1 further seeds the edge search adds", f"at most {MAX_SEED - 1}")


def test_a_base_seed_from_set_whose_further_seeds_do_not_fit_is_refused_before_ray_starts(
        tmp_path, builtin_data, capsys):
    path = edge_space(tmp_path, "seeds: 3")
    assert_refused(run_cli.main, ["--space", str(path), "--name", "x", "--results", str(tmp_path / "results"),
                                  "--data", str(builtin_data), "--set", f"seed={MAX_SEED - 1}", "--no-dashboard",
                                  "--quiet"], capsys, f"seed {MAX_SEED - 1} plus the 2 further seeds",
                   f"at most {MAX_SEED - 2}")
    assert not ray.is_initialized(), "a Ray instance was started"


def test_an_optuna_space_asking_for_more_samples_than_a_grid_may_have_trials_is_refused_on_loading(tmp_path):
    path = tmp_path / "optuna.yaml"
    path.write_text("search: optuna\nnum_samples: 1000000000000\nparams: {lr: {loguniform: [1.0e-4, 1.0e-2]}}\n")
    refused_on_loading(path, "num_samples:", "at most 10,000", "1000000000000")


# ---------------------------------------------------------------------------------------------
# Within the bounds: every trial suggested passes the trial check; the shipped spaces load


def passes_the_trial_check(config: dict) -> None:
    """The trial's own settings applied to a run config, validated as a trial's are."""
    budget_config("quick", {k: config[k] for k in ("lr", "seed", "steps") if k in config})


class RisingSweep:
    """Trains each trial instantly, never diverging, the larger LR always the better: every stage of a search
    steps upwards as far as its settings let it."""

    def __init__(self, steps: int):
        self.steps, self.trials = steps, []

    def run(self, search, trial_id: str, config: dict) -> None:
        self.trials.append(config)
        if config["stage"] == "range":  # no steepest descent, no blow-up: the coarse grid spans the range test's
            search.complete(trial_id, "range_test", {"tokens": 100 * TOKENS_PER_STEP})
            return
        tokens = config.get("steps", self.steps) * TOKENS_PER_STEP
        search.observe(trial_id, {"tokens": tokens, "val_loss": 3.0 - 0.01 * math.log(config["lr"])})
        search.complete(trial_id, "completed", {"tokens": tokens})


@pytest.mark.slow
def test_a_horizon_search_leaves_out_the_lrs_past_the_largest_a_trial_accepts_that_its_results_lead_to():
    # Valid settings (the smallest budget's grid, extensions and probes fit); the larger budgets' grids, around a
    # best LR at the top each time, would step past MAX_LR.
    settings = HorizonSettings(lr_min=1e3, lr_max=1e5, ratio=2, max_extensions=2, edge_probes=0, seeds=2,
                               confirm_seeds=1)
    assert settings.problems() == []
    target = Budget(steps=648, warmup_steps=18, tokens_per_step=TOKENS_PER_STEP, seed=MAX_SEED - 1,
                    rungs=(648 * TOKENS_PER_STEP,))
    sweep = RisingSweep(648)
    trials, search = drive_search(HorizonSearch(settings, target), sweep, max_trials=200)
    assert search.finished and trials == len(sweep.trials)
    for config in sweep.trials:
        passes_the_trial_check(config)
    assert any("left out" in d.why and f"at most {MAX_LR:g}" in d.why for d in search.decisions)


def test_an_edge_search_at_its_bounds_suggests_only_trials_that_pass_the_trial_check():
    settings = EdgeSettings(range_max_lr=100.0, max_extensions=3, seeds=3, edge_seeds=2)
    assert settings.problems() == []
    budget = Budget(steps=162, warmup_steps=18, tokens_per_step=TOKENS_PER_STEP, seed=MAX_SEED - 2,
                    rungs=(162 * TOKENS_PER_STEP,))
    sweep = RisingSweep(162)
    trials, search = drive_search(EdgeSearch(settings, budget), sweep, max_trials=200)
    assert search.finished
    for config in sweep.trials:
        passes_the_trial_check(config)
    assert max(c["lr"] for c in sweep.trials if "lr" in c) > 100 * 3.16 ** 6  # it did step up to its bounds
    assert max(c["seed"] for c in sweep.trials) == MAX_SEED


@pytest.mark.parametrize("name", available_spaces())
def test_every_shipped_space_loads_within_the_bounds(name):
    assert load_space(name).name == name


def test_an_edge_range_test_longer_than_a_range_test_may_train_is_refused_on_loading(tmp_path):
    refused_on_loading(edge_space(tmp_path, "range_steps: 1000000"), "edge.range_steps:", "10,000", "1000000")
