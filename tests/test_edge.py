"""The edge search's decisions, as pure functions and as a whole search driven without Ray against a
simulated sweep whose divergence threshold and best LR are known by construction."""

from __future__ import annotations

import json
import math
import random

import pytest

from lmtune.sweep.edge import (
    FINISHED,
    WAIT,
    Budget,
    EdgeSearch,
    EdgeSettings,
    Run,
    bisect_lrs,
    bracket,
    coarse_lrs,
    conclude,
    equal_token_losses,
    full_budget_ranking,
    loss_at_tokens,
    refine_lrs,
    rerun_lrs,
)

# The quick_edge budget: 162 steps of 1,024 tokens, warm-up 18, ASHA rungs at 1/9, 1/3 and all of it.
BUDGET = Budget(steps=162, warmup_steps=18, tokens_per_step=1024, seed=0, rungs=(18432, 55296, 165888))
THRESHOLD = 0.37   # every run at lr >= THRESHOLD diverges, every run below trains
OPTIMUM = 0.01     # the full-budget loss is lowest here


class SimulatedSweep:
    """Trains the search's trials instantly: a val loss at every rung that falls with tokens and is
    lowest at OPTIMUM (plus a small per-seed offset), divergence at THRESHOLD within warm-up, the
    range test's finding given. ``cut`` (lr -> rung index) plays ASHA for coarse trials."""

    def __init__(self, cut: dict[float, int] | None = None):
        self.cut = cut or {}
        self.trials: list[dict] = []

    @staticmethod
    def loss(lr: float, tokens: int, seed: int) -> float:
        early = 3.0 * math.exp(-tokens * lr ** 0.5 / 2000)  # a larger LR learns faster early on
        return 2.0 + 0.05 * math.log(lr / OPTIMUM) ** 2 + early + 0.002 * seed

    def run(self, search: EdgeSearch, trial_id: str, config: dict) -> None:
        self.trials.append({"trial_id": trial_id, **config})
        if config["stage"] == "range":
            search.complete(trial_id, "range_test", {"tokens": 100 * 1024, "steepest_lr": 0.012,
                                                     "min_loss_lr": 0.3, "blowup_lr": 1.9})
            return
        lr, seed = config["lr"], config["seed"]
        if lr >= THRESHOLD:
            search.observe(trial_id, {"tokens": 10 * 1024})
            search.complete(trial_id, "diverged", {"tokens": 12 * 1024})
            return
        steps = config.get("run_steps", BUDGET.steps)
        last = self.cut.get(round(lr, 6)) if config["stage"] == "coarse" else None
        rungs = [r for r in BUDGET.rungs if r <= steps * 1024]
        if last is not None:
            rungs = rungs[: last + 1]
        for tokens in rungs:
            search.observe(trial_id, {"tokens": tokens, "val_loss": self.loss(lr, tokens, seed)})
        tokens = rungs[-1] if last is not None else steps * 1024
        search.observe(trial_id, {"tokens": tokens})
        outcome = "stopped_early" if last is not None else "completed" if steps == BUDGET.steps else "probed"
        search.complete(trial_id, outcome, {"tokens": tokens})


def drive(search: EdgeSearch, sweep: SimulatedSweep, max_trials: int = 200, stop_after: int | None = None) -> int:
    """Ask for trials and run them until the search is finished (or ``stop_after`` trials ran)."""
    count = len(search.runs)
    while count < max_trials and (stop_after is None or count < stop_after):
        config = search.suggest(f"t{count:03d}")
        if config == FINISHED:
            return count
        assert config != WAIT, "a search with no trial running must always have something to do"
        sweep.run(search, f"t{count:03d}", config)
        count += 1
    return count


def finished_search(settings: EdgeSettings | None = None, cut: dict | None = None) -> tuple[EdgeSearch, SimulatedSweep]:
    search, sweep = EdgeSearch(settings or EdgeSettings(), BUDGET), SimulatedSweep(cut)
    drive(search, sweep)
    assert search.finished
    return search, sweep


def test_bisection_brackets_the_known_threshold_within_the_tolerance():
    search, _ = finished_search()
    c = conclude(search.runs.values(), BUDGET, search.settings)
    assert c["edge_lr_low"] < THRESHOLD <= c["divergence_lr"]
    assert c["bracket_ratio"] <= 1.25


@pytest.mark.parametrize("tolerance", [1.1, 1.5, 2.0])
def test_the_bracket_meets_any_tolerance_the_user_sets(tolerance: float):
    search, _ = finished_search(EdgeSettings(tolerance=tolerance))
    edge = bracket(search.runs.values(), BUDGET.horizon_tokens(search.settings))
    assert edge.ratio <= tolerance and edge.stable_lr < THRESHOLD <= edge.diverged_lr


def test_no_lr_at_or_above_the_threshold_is_ever_called_stable_or_ranked():
    search, _ = finished_search()
    c = conclude(search.runs.values(), BUDGET, search.settings)
    assert all(row["lr"] < THRESHOLD for row in c["ranking"])
    assert c["stable_above_divergence"] == []


def test_bisection_probes_train_only_to_the_stability_horizon():
    _, sweep = finished_search()
    probes = [t for t in sweep.trials if t["stage"] == "bisect"]
    assert probes and all(t["run_steps"] == BUDGET.horizon_steps(EdgeSettings()) == 35 for t in probes)


def test_the_stages_run_in_order_and_the_best_lr_gets_the_further_seeds():
    search, sweep = finished_search()
    stages = [d["stage"] for d in search.decisions]
    assert stages[:2] == ["range", "coarse"] and "refine" in stages and stages[-1] in ("seeds", "bisect")
    c = conclude(search.runs.values(), BUDGET, search.settings)
    assert len(c["best_lr_seed_losses"]) == 3
    assert {t["seed"] for t in sweep.trials if t.get("lr") == c["best_lr"]} == {0, 1, 2}


def test_the_best_lr_is_found_within_the_refinement_factor_of_the_true_optimum():
    search, _ = finished_search()
    best = conclude(search.runs.values(), BUDGET, search.settings)["best_lr"]
    assert OPTIMUM / 2 <= best <= OPTIMUM * 2


def test_a_search_saved_and_restored_mid_bisection_finishes_the_same_without_repeating_a_trial():
    whole, whole_sweep = finished_search()
    search, sweep = EdgeSearch(EdgeSettings(), BUDGET), SimulatedSweep()
    while not any(d["stage"] == "bisect" for d in search.decisions):
        drive(search, sweep, stop_after=len(search.runs) + 1)
    restored = EdgeSearch.from_json(json.loads(json.dumps(search.to_json())))
    drive(restored, sweep)
    assert restored.finished
    assert [(t["stage"], t.get("lr"), t["seed"]) for t in sweep.trials] == \
           [(t["stage"], t.get("lr"), t["seed"]) for t in whole_sweep.trials]
    assert restored.to_json()["conclusion"] == whole.to_json()["conclusion"]


def test_with_several_trials_in_flight_the_search_waits_instead_of_deciding_on_missing_results():
    search, sweep = EdgeSearch(EdgeSettings(), BUDGET, max_pending=4), SimulatedSweep()
    range_config = search.suggest("t0")
    assert range_config["stage"] == "range" and search.suggest("t1") == WAIT  # coarse waits for the range test
    sweep.run(search, "t0", range_config)
    pending = [search.suggest(f"c{k}") for k in range(4)]
    assert all(isinstance(c, dict) and c["stage"] == "coarse" for c in pending)
    assert search.suggest("c4") == WAIT


def test_trials_run_out_of_order_still_reach_a_resolved_bracket():
    rng = random.Random(0)
    search, sweep = EdgeSearch(EdgeSettings(), BUDGET, max_pending=3), SimulatedSweep()
    running: dict[str, dict] = {}
    for k in range(300):
        config = search.suggest(f"t{k:03d}")
        if config == FINISHED:
            break
        if isinstance(config, dict):
            running[f"t{k:03d}"] = config
        if config == WAIT or len(running) == 3:
            tid = rng.choice(sorted(running))
            sweep.run(search, tid, running.pop(tid))
    assert search.finished
    edge = bracket(search.runs.values(), BUDGET.horizon_tokens(search.settings))
    assert edge.ratio <= 1.25 and edge.stable_lr < THRESHOLD <= edge.diverged_lr


# ---------------------------------------------------------------------------------------------
# The pure pieces


def run(lr: float, val: dict[int, float], outcome: str = "completed", seed: int = 0, stage: str = "coarse") -> Run:
    return Run(lr, seed, stage, BUDGET.full_tokens, BUDGET.full_tokens, outcome, max(val, default=0), val)


def test_a_trial_stopped_at_a_rung_appears_only_at_the_rungs_it_reached():
    cut = run(0.003, {18432: 5.0}, "stopped_early")
    whole = run(0.01, {18432: 4.8, 55296: 4.0, 165888: 3.5})
    table = equal_token_losses([cut, whole], BUDGET.rungs)
    assert table[18432] == {0.003: [5.0], 0.01: [4.8]}
    assert table[55296] == {0.01: [4.0]} and table[165888] == {0.01: [3.5]}


def test_equal_token_losses_interpolate_between_evaluations_and_never_extrapolate():
    assert loss_at_tokens({1000: 5.0, 3000: 3.0}, 2000) == pytest.approx(4.0)
    assert loss_at_tokens({1000: 5.0, 3000: 3.0}, 3001) is None
    assert loss_at_tokens({1000: 5.0}, 999) is None


def test_a_diverged_run_is_left_out_of_the_equal_token_losses():
    table = equal_token_losses([run(1.0, {18432: 4.0}, "diverged")], BUDGET.rungs)
    assert table[18432] == {}


def test_an_lr_counts_as_stable_only_past_the_horizon():
    horizon = BUDGET.horizon_tokens(EdgeSettings())
    early = run(0.3, {10240: 6.0}, "stopped_early")
    early.tokens = 10240
    assert not early.stable(horizon)
    assert bracket([early, run(0.5, {}, "diverged")], horizon).stable_lr is None


def test_an_lr_where_any_seed_diverged_is_not_ranked():
    ranking = full_budget_ranking([run(0.1, {165888: 3.0}), run(0.1, {}, "diverged", seed=1),
                                   run(0.03, {165888: 3.2})])
    assert [r.lr for r in ranking] == [0.03]


def test_geometric_bisection_cuts_the_bracket_into_equal_log_parts():
    edge = bracket([run(0.1, {165888: 3.0}), run(0.4, {}, "diverged")], 0)
    assert bisect_lrs(edge, 1) == pytest.approx([0.2])
    assert bisect_lrs(edge, 3) == pytest.approx([0.1 * 4 ** 0.25, 0.2, 0.1 * 4 ** 0.75])


def test_the_coarse_grid_spans_the_range_test_and_starts_nearest_its_steepest_descent():
    lrs, why = coarse_lrs(0.01, 1.0, EdgeSettings())
    assert min(lrs) == pytest.approx(0.001) and max(lrs) >= 1.0 and lrs[0] == pytest.approx(0.01, rel=0.01)
    assert "steepest descent" in why


def test_a_lower_lr_that_asha_cut_within_the_margin_of_its_rungs_leader_is_rerun_and_one_outside_is_not():
    best = run(0.01, {18432: 6.13, 165888: 5.60})
    close = run(0.003, {18432: 6.31}, "stopped_early")      # 2.9% behind the leader: the issue's own case
    far = run(0.001, {18432: 6.50}, "stopped_early")        # 6.0% behind
    chosen = rerun_lrs(full_budget_ranking([best])[0], [best, close, far], EdgeSettings(), BUDGET)
    assert [lr for lr, _ in chosen] == [0.003] and "within 2.9%" in chosen[0][1]


def test_refinement_reruns_the_best_lrs_coarse_neighbours_that_asha_cut_since_they_bound_the_best():
    best = run(0.01, {18432: 6.13, 165888: 5.60})
    below, above = run(0.003162, {18432: 6.4}, "stopped_early"), run(0.03162, {18432: 6.0}, "stopped_early")
    runs = [best, below, above]
    lrs = refine_lrs(full_budget_ranking(runs)[0], runs, bracket(runs, 0), EdgeSettings(), BUDGET)
    assert 0.003162 in lrs and 0.03162 in lrs  # the same LRs exactly, so their rungs line up
    assert all(0.003 <= lr <= 0.032 for lr in lrs) and 0.01 not in lrs


def test_an_lr_above_the_best_is_never_rerun():
    best = full_budget_ranking([run(0.01, {165888: 3.0})])[0]
    cut_above = run(0.03, {18432: 4.0}, "stopped_early")
    assert rerun_lrs(best, [cut_above, run(0.01, {18432: 4.1, 165888: 3.0})], EdgeSettings(), BUDGET) == []


@pytest.mark.parametrize("key, value, fragment", [
    ("tolerance", 1.0, "edge.tolerance: must be above 1"),
    ("refine_points", 3, "edge.refine_points: must be an even number"),
    ("horizon", 1.5, "edge.horizon: must be a fraction"),
    ("seeds", 0, "edge.seeds: must be at least 1"),
])
def test_settings_no_search_could_use_are_refused_naming_the_key(key, value, fragment):
    with pytest.raises(Exception, match=fragment):
        EdgeSettings(**{key: value}).validate()
