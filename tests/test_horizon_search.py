"""The horizon search, Ray-free: driven by a simulated sweep whose best LR falls as a known power of the
budget, it searches the budgets it should, settles each budget's best LR on seeds, refines around it, fits the
law, confirms the prediction at the target on two seeds, finds each budget's edge, and its whole state survives a
JSON round trip. A second simulated sweep draws every run's noise independently, as large as the loss differences
between neighbouring LRs, so that seeds reorder LRs: contenders arise and get their seeds before a budget is
settled, and the LR the fit is centred on is the one the report crowns."""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter

import numpy as np
import pytest
from conftest import drive_search

from lmtune.analysis.runs import Budget, crown, full_budget_ranking
from lmtune.errors import LmtuneError
from lmtune.searches.deciding import WAIT
from lmtune.searches.horizon.search import HorizonSearch
from lmtune.searches.horizon.settings import HorizonSettings
from lmtune.sweep.spaces import load_space

TOKENS_PER_STEP = 1024
TARGET = Budget(steps=648, warmup_steps=18, tokens_per_step=TOKENS_PER_STEP, seed=0, rungs=(648 * TOKENS_PER_STEP,))
BETA = 0.5                       # the simulated best LR falls as tokens^-0.5 ...
LR_AT_TARGET = 0.005             # ... and is this at the target budget
SETTINGS = HorizonSettings(lr_min=0.002, lr_max=0.1, ratio=1.5, seeds=2, edge_probes=5, edge_ratio=4.0,
                           edge_tolerance=2.0)


def best_lr(steps: int) -> float:
    return LR_AT_TARGET * (steps / TARGET.steps) ** -BETA


def edge_lr(steps: int) -> float:
    return 40 * best_lr(steps)  # training fails from 40x the budget's best LR


class SimulatedSweep:
    """Trains each trial instantly: its val loss at the end of its budget is a parabola in ln LR around the
    budget's best LR, plus a small per-seed offset (the same at every LR: seeds never reorder LRs) or, with
    ``noise``, plus noise of that sd drawn for each run on its own (from rng_seed, budget, LR and seed: the same
    run always draws the same); at or above the budget's edge it goes non-finite."""

    def __init__(self, seed_offset: float = 0.002, noise: float = 0.0, rng_seed: int = 0, curvature: float = 0.05,
                 edge: float = 40.0):
        self.seed_offset, self.noise, self.rng_seed, self.curvature = seed_offset, noise, rng_seed, curvature
        self.edge = edge  # training fails from this many times the budget's best LR
        self.trials: list[dict] = []

    def run(self, search: HorizonSearch, trial_id: str, config: dict) -> None:
        self.trials.append({"trial_id": trial_id, **config})
        steps, lr, seed = config["steps"], config["lr"], config["seed"]
        tokens = steps * TOKENS_PER_STEP
        if lr >= self.edge * best_lr(steps):
            search.complete(trial_id, "diverged", {"tokens": tokens // 4, "diverged_step": steps // 4,
                                                   "divergence": "non-finite"})
            return
        loss = 2.0 + self.curvature * math.log(lr / best_lr(steps)) ** 2 + self.seed_offset * seed
        if self.noise:
            loss += np.random.default_rng([self.rng_seed, steps, round(lr * 1e9), seed]).normal(0, self.noise)
        search.observe(trial_id, {"tokens": tokens, "val_loss": loss})
        search.complete(trial_id, "completed", {"tokens": tokens})


def drive(search: HorizonSearch, sweep: SimulatedSweep, max_trials: int = 300, round_trip: bool = False) -> int:
    """Ask for trials and run them until the search has finished; ``round_trip``: the search goes through
    its JSON between every two trials, as a resumed sweep's would."""
    def through_json(s: HorizonSearch) -> HorizonSearch:
        return HorizonSearch.from_json(json.loads(json.dumps(s.to_json())))

    count, search = drive_search(search, sweep, max_trials, round_trip=through_json if round_trip else None)
    assert search.finished, "the search did not finish"
    return count


@pytest.fixture(scope="module")
def finished():
    search, sweep = HorizonSearch(SETTINGS, TARGET), SimulatedSweep()
    drive(search, sweep)
    return search, sweep


# Run-to-run sd of the noisy sweep: 0.05 * ln(1.5)^2 = 0.008 is the loss difference between the best LR and a
# grid neighbour 1.5x away, so seeds reorder neighbouring LRs. (rng seed 32: at the smallest budget a one-seed LR
# beats the crowned best on seed 0, and once given seed 1 takes the crown; about 1 rng seed in 7 makes one.)
NOISE = 0.008


@pytest.fixture(scope="module")
def noisy():
    search, sweep = HorizonSearch(SETTINGS, TARGET), SimulatedSweep(seed_offset=0.0, noise=NOISE, rng_seed=32)
    drive(search, sweep)
    return search, sweep


def trial_index(sweep: SimulatedSweep, **match) -> list[int]:
    """The positions (in the order they ran) of the trials whose config has these values."""
    return [i for i, t in enumerate(sweep.trials) if all(t[k] == v for k, v in match.items())]


def crown_before(search: HorizonSearch, sweep: SimulatedSweep, steps: int, index: int):
    """The crowned best LR at budget ``steps`` on the runs that ended before trial ``index`` started, and the
    LRs trained through there then (ascending)."""
    earlier = {t["trial_id"] for t in sweep.trials[:index]}
    ranking = full_budget_ranking(r for tid, r in search.runs.items()
                                  if tid in earlier and r.budget_tokens == steps * TOKENS_PER_STEP)
    return crown(ranking)[0].lr, sorted(r.lr for r in ranking)


def assert_refined_around(search: HorizonSearch, sweep: SimulatedSweep, steps: int) -> None:
    """The budget's refine trials: the two LRs halfway (in log) between the crowned best, as it stood when they
    started, and its neighbours, each on seeds 0 and 1."""
    refine = trial_index(sweep, stage="refine", steps=steps)
    best, lrs = crown_before(search, sweep, steps, refine[0])
    i = lrs.index(best)
    halfway = [math.sqrt(best * lrs[i - 1]), math.sqrt(best * lrs[i + 1])]
    seeds = {}
    for k in refine:
        seeds.setdefault(sweep.trials[k]["lr"], set()).add(sweep.trials[k]["seed"])
    assert sorted(seeds) == pytest.approx(halfway, rel=1e-3)  # (an LR is kept to 4 significant digits)
    assert list(seeds.values()) == [{0, 1}, {0, 1}]


def test_it_searches_the_target_over_16_8_and_4_by_default(finished):
    search, sweep = finished
    assert search.axis.points == [40, 81, 162]
    assert {t["steps"] for t in sweep.trials} == {40, 81, 162, 648}


def test_each_budgets_best_lr_is_the_grid_lr_nearest_the_true_one_on_every_seed(finished):
    search, _ = finished
    for steps in search.axis.points:
        c = search.conclusion()["budgets"][str(steps)]
        tried = sorted({r.lr for r in search.runs_at(steps) if not r.diverged})
        nearest = min(tried, key=lambda lr: abs(math.log(lr / best_lr(steps))))
        assert c["best_lr"] == nearest
        assert c["best_lr_seeds"] == [0, 1]


def test_the_fit_recovers_the_power_and_its_interval_holds_the_true_lr_at_the_target(finished):
    search, _ = finished
    fit = search.fit
    assert fit.beta_interval[0] <= BETA <= fit.beta_interval[1]
    low, high = fit.predicted_lr_interval
    assert low <= LR_AT_TARGET <= high
    assert abs(math.log(fit.predicted_lr / LR_AT_TARGET)) < math.log(1.5)


def test_the_confirmation_trains_the_prediction_and_either_side_at_the_target_budget_on_two_seeds(finished):
    search, sweep = finished
    confirm = [t for t in sweep.trials if t["stage"] == "target"]
    seeds: dict[float, set[int]] = {}
    for t in confirm:
        seeds.setdefault(t["lr"], set()).add(t["seed"])
    predicted = search.fit.predicted_lr
    assert {t["steps"] for t in confirm} == {648}
    assert [lr / predicted for lr in sorted(seeds)] == pytest.approx([0.5, 1.0, 2.0], rel=0.02)  # (snapped)
    assert list(seeds.values()) == [{0, 1}] * 3 and len(confirm) == 6


def test_confirmation_waits_until_every_budgets_best_lr_is_settled_and_refined(finished):
    _, sweep = finished
    first_confirm = trial_index(sweep, stage="target")[0]
    settling = [i for i, t in enumerate(sweep.trials) if t["stage"] in ("grid", "extend", "seeds", "refine", "wall")]
    assert max(settling) < first_confirm


def test_refine_trains_the_two_lrs_halfway_between_the_best_and_its_neighbours_on_every_seed(finished):
    search, sweep = finished
    for steps in search.axis.points:
        assert_refined_around(search, sweep, steps)


def test_each_budgets_edge_is_bracketed_around_where_training_fails(finished):
    search, _ = finished
    for steps in search.axis.points:
        c = search.conclusion()["budgets"][str(steps)]
        assert c["failing_lr_low"] < edge_lr(steps) <= c["failing_lr"]
        assert c["bracket_ratio"] <= SETTINGS.edge_tolerance


def test_seed_noise_makes_contenders_which_get_the_crowned_bests_seeds_before_their_budget_is_settled(noisy):
    search, sweep = noisy
    reseeded = [d for d in search.decisions if d.stage == "seeds" and "beat the best" in d.why]
    assert reseeded, "the noisy sweep was meant to make contenders"
    for decision in reseeded:
        settled = min(trial_index(sweep, stage="refine", steps=decision.point) + trial_index(sweep, stage="target"))
        for lr in decision.lrs:
            runs = trial_index(sweep, steps=decision.point, lr=lr)
            assert {sweep.trials[i]["seed"] for i in runs} == {0, 1}  # the crowned best's seeds
            assert max(runs) < settled


def test_with_noise_refine_is_planned_around_the_crown_the_contenders_left(noisy):
    search, sweep = noisy
    for steps in search.axis.points:
        assert_refined_around(search, sweep, steps)


def test_no_run_is_trained_twice(noisy):
    _, sweep = noisy
    trained = Counter((t["steps"], t["lr"], t["seed"]) for t in sweep.trials)
    assert [run for run, times in trained.items() if times > 1] == []


def test_the_fit_is_centred_at_each_budget_on_the_lr_the_report_crowns(noisy):
    search, _ = noisy
    assert len(search.fit.points) == len(search.axis.points)
    for point, steps in zip(search.fit.points, search.axis.points, strict=True):
        assert point.crowned_lr == crown(full_budget_ranking(search.runs_at(steps)))[0].lr


def test_a_wall_is_never_trained_past_an_lr_that_failed_or_an_edge_probe():
    # a flat curve (no LR clearly worse above the best for a while) under an edge 6x above the best: walls step
    # up towards where training fails, and must stop short of it
    search = HorizonSearch(SETTINGS, TARGET)
    sweep = SimulatedSweep(seed_offset=0.0, noise=0.01, rng_seed=3, curvature=0.002, edge=6.0)
    drive(search, sweep)
    walls = trial_index(sweep, stage="wall")
    assert walls, "the flat sweep was meant to need walls"
    for i in walls:
        wall = sweep.trials[i]
        earlier = [t for t in sweep.trials[:i] if t["steps"] == wall["steps"] and t["lr"] != wall["lr"]]  # (its seeds)
        beyond = [t["lr"] for t in earlier if t["stage"] == "edge" or t["lr"] >= 6.0 * best_lr(t["steps"])]
        assert not beyond or wall["lr"] < min(beyond), wall


def test_a_larger_budgets_grid_lies_around_the_smaller_budgets_best_once_its_grid_is_settled(finished):
    search, sweep = finished
    grid = sorted(sweep.trials[i]["lr"] for i in trial_index(sweep, stage="grid", steps=81))
    first, _ = crown_before(search, sweep, 40, trial_index(sweep, stage="grid", steps=81)[0])
    assert [lr / first for lr in grid] == pytest.approx([1.5 ** k for k in (-2, -1, 0, 1)], rel=0.02)


def test_a_best_lr_at_the_grids_end_extends_the_grid():
    settings = HorizonSettings(lr_min=0.03, lr_max=0.1, ratio=1.5, seeds=1, edge_probes=0)
    search, sweep = HorizonSearch(settings, TARGET), SimulatedSweep()
    drive(search, sweep)
    extended = sorted(t["lr"] for t in sweep.trials if t["stage"] == "extend" and t["steps"] == 40)
    assert extended and max(extended) < 0.03  # the true best at 40 steps is 0.02: the grid grew down to it


def test_the_state_survives_a_json_round_trip_between_any_two_trials():
    plain, resumed = HorizonSearch(SETTINGS, TARGET), HorizonSearch(SETTINGS, TARGET)
    plain_sweep, resumed_sweep = SimulatedSweep(), SimulatedSweep()
    drive(plain, plain_sweep)
    drive(resumed, resumed_sweep, round_trip=True)
    assert [t for t in resumed_sweep.trials] == [t for t in plain_sweep.trials]


def test_a_trial_that_never_reported_is_planned_again_first():
    search = HorizonSearch(SETTINGS, TARGET)
    first = search.suggest("a")
    search.requeue("a", "interrupted")
    assert search.suggest("b") == first
    assert search.interrupted == {"a": "interrupted"}


def test_it_waits_while_as_many_trials_run_as_it_may_start():
    search = HorizonSearch(SETTINGS, TARGET, max_pending=2)
    assert search.suggest("a") != WAIT and search.suggest("b") != WAIT
    assert search.suggest("c") == WAIT


@pytest.mark.parametrize(("key", "value", "words"), [
    ("largest_fraction", 1.0, "between 0 and 1"),
    ("budgets", 1, "at least 2"),
    ("lr_max", 1e-5, "above lr_min"),
    ("edge_tolerance", 8.0, "at most edge_ratio"),
    ("confirm_seeds", 0, "at least 1"),
])
def test_a_setting_no_search_could_use_is_named_with_its_fix(key, value, words):
    problems = dict(HorizonSettings(**{key: value}).problems())
    assert words in problems[key]


def test_a_space_may_turn_refine_off_and_a_number_for_it_is_refused_in_one_line(tmp_path):
    off, number = tmp_path / "off.yaml", tmp_path / "number.yaml"
    off.write_text("search: horizon\nbudget: quick\nhorizon: {refine: false}\n")
    number.write_text("search: horizon\nbudget: quick\nhorizon: {refine: 0}\n")
    assert load_space(str(off)).strategy.settings.refine is False
    with pytest.raises(LmtuneError, match=r"horizon.refine: must be true or false \(got 0\)$"):
        load_space(str(number))


def test_a_target_whose_smallest_budget_cannot_hold_the_warm_up_is_refused_in_one_line():
    with pytest.raises(Exception, match=r"smallest budget, 10 steps .* does not outlast the 18 warm-up steps"):
        HorizonSettings().check_target(160, 18)


def test_under_wsd_a_larger_budgets_run_continues_the_same_lr_and_seeds_run_at_the_smaller_budget():
    search = HorizonSearch(SETTINGS, dataclasses.replace(TARGET, schedule="wsd"))
    sweep = SimulatedSweep()
    drive(search, sweep)
    trials = {t["trial_id"]: t for t in sweep.trials}
    forked = [t for t in sweep.trials if "fork_from" in t]
    assert forked
    for t in forked:
        source = trials[t["fork_from"]]
        assert (source["lr"], source["seed"]) == (t["lr"], t["seed"]) and source["steps"] < t["steps"]
        assert source["lr"] < edge_lr(source["steps"])  # never a run that failed
    # every run that could continue a smaller budget's run of its LR and seed does (from the largest)
    for t in sweep.trials:
        smaller = [s for s in sweep.trials[: sweep.trials.index(t)]
                   if (s["lr"], s["seed"]) == (t["lr"], t["seed"]) and s["steps"] < t["steps"]
                   and s["lr"] < edge_lr(s["steps"])]
        assert t.get("fork_from") == (max(smaller, key=lambda s: s["steps"])["trial_id"] if smaller else None)


def test_under_cosine_no_run_continues_another():
    _, sweep = HorizonSearch(SETTINGS, TARGET), SimulatedSweep()
    search = HorizonSearch(SETTINGS, TARGET)
    drive(search, sweep)
    assert not any("fork_from" in t for t in sweep.trials)
