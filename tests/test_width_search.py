"""The width search, Ray-free: driven by a simulated sweep whose best LR moves as a known power of the width (SP-like,
gamma = 1) or not at all (μP-like, gamma = 0), it searches the proxy widths narrowest first with their shapes,
settles and locates each width's LR*, fits ln LR* against ln width (the line through their LR*s, or with fit:
surface one loss surface through every proxy's runs where one power law holds), confirms the prediction at the
target width, and its state survives a JSON round trip. A space that names no proxies, or proxies the target
cannot have, is refused in one line."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
import yaml
from conftest import drive_search

from lmtune.analysis.fit import LINE, SURFACE
from lmtune.analysis.runs import Budget
from lmtune.errors import LmtuneError
from lmtune.searches.width.conclusion import WidthFit, WidthSearch
from lmtune.searches.width.settings import WidthSettings
from lmtune.sweep.plan import SweepPlan
from lmtune.sweep.spaces import load_space
from lmtune.training.config import budget_config

TOKENS_PER_STEP = 1024
# The target: d_model 256 with d_ff 768 and 8 heads of 32 dimensions.
TARGET = Budget(steps=162, warmup_steps=18, tokens_per_step=TOKENS_PER_STEP, seed=0, rungs=(162 * TOKENS_PER_STEP,),
                d_model=256, d_ff=768, n_heads=8)
LR_AT_TARGET = 0.004
SETTINGS = WidthSettings(widths=(32, 64, 128), lr_min=0.002, lr_max=0.1, ratio=1.5, seeds=2, edge_probes=0)


class SimulatedWidths:
    """Trains each trial instantly: its final val loss is a parabola in ln LR around the width's best LR,
    LR_AT_TARGET * (width / 256)^-gamma, plus noise of sd ``noise`` drawn per run (the same run always draws the
    same)."""

    def __init__(self, gamma: float, noise: float = 0.004, rng_seed: int = 0, curvature: float = 0.1):
        self.gamma, self.noise, self.rng_seed, self.curvature = gamma, noise, rng_seed, curvature
        self.trials: list[dict] = []

    def best_lr(self, width: int) -> float:
        return LR_AT_TARGET * (width / TARGET.d_model) ** -self.gamma

    def run(self, search: WidthSearch, trial_id: str, config: dict) -> None:
        self.trials.append({"trial_id": trial_id, **config})
        width, lr, seed = config["d_model"], config["lr"], config["seed"]
        loss = 3.0 - 0.1 * math.log(width) + self.curvature * math.log(lr / self.best_lr(width)) ** 2
        loss += np.random.default_rng([self.rng_seed, width, round(lr * 1e9), seed]).normal(0, self.noise)
        search.observe(trial_id, {"tokens": TARGET.full_tokens, "val_loss": loss})
        search.complete(trial_id, "completed", {"tokens": TARGET.full_tokens})


def finished_search(gamma: float, round_trip: bool = False) -> tuple[WidthSearch, SimulatedWidths]:
    def through_json(s: WidthSearch) -> WidthSearch:
        return WidthSearch.from_json(json.loads(json.dumps(s.to_json())))

    search, sweep = WidthSearch(SETTINGS, TARGET), SimulatedWidths(gamma)
    _, search = drive_search(search, sweep, 400, round_trip=through_json if round_trip else None)
    assert search.finished, "the search did not finish"
    return search, sweep


@pytest.fixture(scope="module")
def standard():
    return finished_search(gamma=1.0)


@pytest.fixture(scope="module")
def flat():
    return finished_search(gamma=0.0)


def test_each_trial_sets_its_width_with_d_ff_and_heads_in_proportion_and_the_budget_stays_the_space_s(standard):
    _, sweep = standard
    shapes = {(t["d_model"], t["d_ff"], t["n_heads"]) for t in sweep.trials}
    assert shapes == {(32, 96, 1), (64, 192, 2), (128, 384, 4), (256, 768, 8)}
    assert all("steps" not in t for t in sweep.trials)


def test_the_widths_are_searched_narrowest_first_and_only_the_confirmation_trains_the_target(standard):
    _, sweep = standard
    first = [next(i for i, t in enumerate(sweep.trials) if t["d_model"] == w) for w in (32, 64, 128)]
    assert first == sorted(first)
    assert {t["stage"] for t in sweep.trials if t["d_model"] == 256} == {"target"}
    assert all(t["d_model"] != 256 for t in sweep.trials if t["stage"] != "target")


def test_under_sp_the_fit_resolves_the_fall_with_width_and_its_interval_holds_the_true_target_lr(standard):
    search, sweep = standard
    fit = search.fit
    low, high = fit.law.exponent_interval
    assert fit.resolved and low <= 1.0 <= high
    plo, phi = fit.predicted_lr_interval
    assert plo <= sweep.best_lr(256) <= phi


def test_under_a_flat_optimum_the_fit_says_the_lr_does_not_move_and_predicts_the_proxies_lr(flat):
    search, sweep = flat
    fit = search.fit
    low, high = fit.law.exponent_interval
    assert low <= 0.0 <= high and not fit.resolved
    plo, phi = fit.predicted_lr_interval
    assert plo <= LR_AT_TARGET <= phi


def test_by_default_the_fit_is_the_line_through_the_proxies_located_lr_stars(standard):
    search, _ = standard
    assert search.settings.fit == LINE and search.fit.method == LINE


def test_with_fit_surface_the_fit_is_one_loss_surface_through_every_proxys_runs_and_it_survives_json():
    search, sweep = WidthSearch(replace(SETTINGS, fit=SURFACE), TARGET), SimulatedWidths(1.0)
    _, search = drive_search(search, sweep, 400)
    assert search.fit.method == SURFACE
    low, high = search.fit.predicted_lr_interval
    assert low <= sweep.best_lr(256) <= high
    assert WidthFit.from_json(json.loads(json.dumps(search.fit.to_json()))) == search.fit


def test_where_one_power_law_does_not_hold_across_the_widths_a_surface_fit_falls_back_to_the_line():
    """The best LR falls from d_model 32 to 64 and rises again at 128: no surface with one gamma fits those runs."""
    class Broken(SimulatedWidths):
        def best_lr(self, width: int) -> float:
            return {32: 0.02, 64: 0.005, 128: 0.02, 256: 0.01}[width]

    search, sweep = WidthSearch(replace(SETTINGS, fit=SURFACE), TARGET), Broken(gamma=0.0)
    _, search = drive_search(search, sweep, 400)
    assert search.fit is not None and search.fit.method == LINE
    assert search.fit.law.law_holds is False


def test_the_confirmation_trains_the_prediction_and_its_neighbours_on_two_seeds_at_the_target(standard):
    search, sweep = standard
    confirm = [t for t in sweep.trials if t["stage"] == "target"]
    predicted = search.fit.predicted_lr
    lrs = sorted({t["lr"] for t in confirm})
    # (an LR within SAME_LR of one already tried is that LR: one LR is one number across widths)
    assert lrs == pytest.approx([predicted / 2, predicted, predicted * 2], rel=0.02)
    assert sorted(t["seed"] for t in confirm) == [0, 0, 0, 1, 1, 1]


def test_a_search_resumed_from_its_json_between_every_two_trials_runs_the_same_trials(standard):
    _, sweep = standard
    _, resumed = finished_search(gamma=1.0, round_trip=True)
    assert [(t["d_model"], t["lr"], t["seed"], t["stage"]) for t in resumed.trials] == \
           [(t["d_model"], t["lr"], t["seed"], t["stage"]) for t in sweep.trials]


def write_space(tmp_path, width: dict, set_: dict | None = None):
    space = {"search": "width", "budget": "quick", "scheduler": {"name": "none"},
             "set": {"d_model": 256, "d_ff": 768, "n_heads": 8, **(set_ or {})}, "width": width}
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(space))
    return path


def test_a_width_space_without_proxy_widths_is_refused_in_one_line(tmp_path):
    with pytest.raises(LmtuneError, match=r"width\.widths.*e\.g\. widths: \[64, 128, 256\]") as err:
        load_space(str(write_space(tmp_path, {"seeds": 2})))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("widths, problem", [([64, 256], "is not below the target's d_model"),
                                             ([48, 128], "is not a multiple of the head dimension 32")])
def test_a_proxy_width_the_target_cannot_have_is_refused_in_one_line(tmp_path, widths, problem):
    space = load_space(str(write_space(tmp_path, {"widths": widths})))
    with pytest.raises(LmtuneError, match=problem) as err:  # (the base config is checked when a sweep is planned)
        SweepPlan.create(space, budget_config(space.budget, space.fixed))
    assert "\n" not in str(err.value)


def test_a_width_fit_that_is_neither_line_nor_surface_is_refused_in_one_line(tmp_path):
    with pytest.raises(LmtuneError, match=r"width\.fit: must be line or surface \(got 'quadratic'\)") as err:
        load_space(str(write_space(tmp_path, {"widths": [64, 128], "fit": "quadratic"})))
    assert "\n" not in str(err.value)
