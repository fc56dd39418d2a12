"""The edge search's decisions, as pure functions and as a whole search driven without Ray against a
simulated sweep whose divergence threshold and best LR are known by construction."""

from __future__ import annotations

import json
import math
import random

import pytest
from conftest import drive_search

from lmtune.analysis.bracket import bisect_lrs, bracket
from lmtune.analysis.conclusion import conclude
from lmtune.analysis.runs import Budget, LrResult, Run, crown, equal_token_losses, full_budget_ranking, loss_at_tokens
from lmtune.searches.deciding import FINISHED, WAIT
from lmtune.searches.edge.search import EdgeSearch
from lmtune.searches.edge.settings import EdgeSettings, coarse_lrs, refine_lrs, rerun_lrs

# The quick_edge budget: 162 steps of 1,024 tokens, warm-up 18, ASHA rungs at 1/9, 1/3 and all of it.
BUDGET = Budget(steps=162, warmup_steps=18, tokens_per_step=1024, seed=0, rungs=(18432, 55296, 165888))
THRESHOLD = 0.37   # every run at lr >= THRESHOLD fails to recover, every run below trains through
OPTIMUM = 0.01     # the full-budget loss is lowest here
WINDOW_STEPS = 122  # where the stopper's rule ends a run that stays above its initial loss


class SimulatedSweep:
    """Trains the search's trials instantly: a val loss at every rung that falls with tokens and is
    lowest at OPTIMUM (plus a small per-seed offset), the range test's finding given. A run at lr >=
    THRESHOLD never recovers; a run at lr >= ``rule_stops_from`` stays above its initial loss for the
    whole recovery window, so the stopper ends it there (unless it runs without early stopping: then
    it trains through, recovering below THRESHOLD). ``cut`` (lr -> rung index) plays ASHA for coarse
    trials; a run continuing another starts where that one stopped."""

    def __init__(self, cut: dict[float, int] | None = None, rule_stops_from: float = THRESHOLD,
                 seed_offset: float = 0.002, seed_thresholds: dict[int, float] | None = None):
        self.cut = cut or {}
        self.rule_stops_from, self.seed_offset = rule_stops_from, seed_offset
        self.seed_thresholds = seed_thresholds or {}
        self.trials: list[dict] = []
        self.tokens: dict[str, int] = {}

    def loss(self, lr: float, tokens: int, seed: int) -> float:
        early = 3.0 * math.exp(-tokens * lr ** 0.5 / 2000)  # a larger LR learns faster early on
        return 2.0 + 0.05 * math.log(lr / OPTIMUM) ** 2 + early + self.seed_offset * seed

    def run(self, search: EdgeSearch, trial_id: str, config: dict) -> None:
        self.trials.append({"trial_id": trial_id, **config})
        if config["stage"] == "range":
            search.complete(trial_id, "range_test", {"tokens": 100 * 1024, "steepest_lr": 0.012,
                                                     "min_loss_lr": 0.3, "blowup_lr": 1.9})
            return
        lr, seed, start = config["lr"], config["seed"], self.tokens.get(config.get("continue_from"), 0)
        last = self.cut.get(round(lr, 6)) if config["stage"] == "coarse" else None
        if last is not None and lr >= THRESHOLD:  # ASHA cut it before its failure showed: far above ℓ₀ so far
            self._cut_high(search, trial_id, BUDGET.rungs[last])
            return
        if lr >= min(self.rule_stops_from, self.seed_thresholds.get(seed, THRESHOLD)):
            self._fail_or_recover(search, trial_id, config, lr, seed)
            return
        rungs = [r for r in BUDGET.rungs if r > start]
        if last is not None:
            rungs = rungs[: last + 1]
        for tokens in rungs:
            search.observe(trial_id, {"tokens": tokens, "val_loss": self.loss(lr, tokens, seed)})
        self.tokens[trial_id] = rungs[-1]
        search.complete(trial_id, "stopped_early" if last is not None else "completed", {"tokens": rungs[-1]})

    def _cut_high(self, search: EdgeSearch, trial_id: str, tokens: int) -> None:
        search.observe(trial_id, {"tokens": tokens, "val_loss": 40.0})
        self.tokens[trial_id] = tokens
        search.complete(trial_id, "stopped_early", {"tokens": tokens})

    def _fail_or_recover(self, search: EdgeSearch, trial_id: str, config: dict, lr: float, seed: int) -> None:
        if config.get("early_stop", True):
            search.observe(trial_id, {"tokens": WINDOW_STEPS * 1024})
            search.complete(trial_id, "diverged", {"tokens": WINDOW_STEPS * 1024, "diverged_step": WINDOW_STEPS})
        elif lr >= self.seed_thresholds.get(seed, THRESHOLD):
            search.observe(trial_id, {"tokens": BUDGET.full_tokens})
            search.complete(trial_id, "diverged", {"tokens": BUDGET.full_tokens, "divergence": "whole run",
                                                   "diverged_step": WINDOW_STEPS})
        else:  # left alone, it recovers
            search.observe(trial_id, {"tokens": BUDGET.full_tokens, "val_loss": 5.5 + seed * self.seed_offset})
            search.complete(trial_id, "completed", {"tokens": BUDGET.full_tokens})


def drive(search: EdgeSearch, sweep: SimulatedSweep, max_trials: int = 200, stop_after: int | None = None) -> int:
    """Ask for trials and run them until the search is finished (or ``stop_after`` trials ran)."""
    return drive_search(search, sweep, max_trials, stop_after)[0]


def finished_search(settings: EdgeSettings | None = None, sweep: SimulatedSweep | None = None) -> tuple[
        EdgeSearch, SimulatedSweep]:
    search, sweep = EdgeSearch(settings or EdgeSettings(), BUDGET), sweep or SimulatedSweep()
    drive(search, sweep)
    assert search.finished
    return search, sweep


def test_bisection_brackets_the_known_threshold_within_the_tolerance():
    search, _ = finished_search()
    c = search.conclusion()
    assert c["failing_lr_low"] < THRESHOLD <= c["failing_lr"]
    assert c["bracket_ratio"] <= 1.25


@pytest.mark.parametrize("tolerance", [1.1, 1.5, 2.0])
def test_the_bracket_meets_any_tolerance_the_user_sets(tolerance: float):
    search, _ = finished_search(EdgeSettings(tolerance=tolerance))
    edge = bracket(search.runs.values())
    assert edge.ratio <= tolerance and edge.stable_lr < THRESHOLD <= edge.diverged_lr


def test_no_lr_at_or_above_the_threshold_is_ever_called_stable_or_ranked():
    search, _ = finished_search()
    c = search.conclusion()
    assert all(row["lr"] < THRESHOLD for row in c["ranking"])
    assert c["stable_above_divergence"] == []


def test_bisection_probes_train_the_full_budget_and_only_confirmations_skip_early_stopping():
    _, sweep = finished_search()
    probes = [t for t in sweep.trials if t["stage"] == "bisect"]
    assert probes and all("run_steps" not in t and t.get("early_stop", True) for t in probes)
    assert all(t.get("early_stop", True) == (t["stage"] != "confirm") for t in sweep.trials)


def test_the_coarse_lrs_above_the_best_that_asha_cut_are_continued_from_their_own_runs_never_restarted():
    grid = sorted(float(f"{lr:.4g}") for lr in coarse_lrs(0.012, 1.9, EdgeSettings())[0])  # the range test's
    above = [lr for lr in grid if 0.012 < lr < THRESHOLD]
    search, sweep = finished_search(sweep=SimulatedSweep(cut={round(lr, 6): 0 for lr in above}))
    coarse = {t["trial_id"]: t["lr"] for t in sweep.trials if t["stage"] == "coarse"}
    continued = [t for t in sweep.trials if t["stage"] in ("landscape", "refine") and t.get("continue_from")]
    # the best's coarse neighbour (3.16x) bounds nothing the refinement's 2x and 4x do not: it stays cut
    assert [t["lr"] for t in continued] == [above[1]] and len(above) == 2
    assert all(coarse[t["continue_from"]] == t["lr"] for t in continued)
    restarted = [t for t in sweep.trials if t["stage"] != "coarse" and t.get("lr") in above and t["seed"] == 0
                 and not t.get("continue_from")]
    assert restarted == []


def test_the_landscape_bisects_the_cut_lrs_above_the_best_until_the_failing_end_lies_between_two():
    """issue 55: of the cut LRs above the best's coarse neighbour, only those the bisection needs are continued."""
    grid = sorted(float(f"{lr:.4g}") for lr in coarse_lrs(0.012, 1.9, EdgeSettings())[0])
    cut = [lr for lr in grid if lr > 0.012]
    search, sweep = finished_search(sweep=SimulatedSweep(cut={round(lr, 6): 0 for lr in cut}))
    landscape = [t["lr"] for t in sweep.trials if t["stage"] == "landscape"]
    candidates = [lr for lr in cut if lr > 0.012 * EdgeSettings().coarse_ratio * 1.02]
    assert len(candidates) == 4 and landscape == [candidates[2], candidates[1], candidates[0]]
    assert candidates[0] < THRESHOLD <= candidates[1]  # the first bracket: two neighbouring coarse LRs


def test_the_diverged_end_is_retrained_without_early_stopping_and_the_conclusion_says_it_is_confirmed():
    search, sweep = finished_search()
    c = search.conclusion()
    confirms = [t for t in sweep.trials if t["stage"] == "confirm"]
    assert [t["lr"] for t in confirms if t["lr"] != c["failing_lr_low"]] == [c["failing_lr"]]
    assert all(t["early_stop"] is False for t in confirms)
    assert c["edge_confirmation"]["confirmed"]
    (end,) = c["edge_confirmation"]["diverged_end"]
    assert end["stage"] == "confirm" and end["decided_at_tokens"] == WINDOW_STEPS * 1024


def test_a_diverged_end_that_recovers_when_left_alone_moves_the_bracket_up():
    """The stopper's rule ends runs from 0.2 on, but only runs from 0.37 on fail when left alone: the
    confirmation runs show it, and the final bracket holds the true threshold, not the rule's."""
    search, sweep = finished_search(sweep=SimulatedSweep(rule_stops_from=0.2))
    c = search.conclusion()
    recovered = [t["lr"] for t in sweep.trials if t["stage"] == "confirm" and t["lr"] < THRESHOLD]
    assert recovered, "a confirmation run recovered"
    assert c["failing_lr_low"] < THRESHOLD <= c["failing_lr"] and c["edge_confirmation"]["confirmed"]


def test_every_seed_trains_through_the_stable_end_and_a_seed_that_fails_earlier_moves_the_edge_down():
    """Seed 1 fails from 0.3 on, seed 0 only from 0.37: the edge is where any seed fails."""
    search, sweep = finished_search(sweep=SimulatedSweep(seed_thresholds={1: 0.3}))
    c = search.conclusion()
    assert c["failing_lr_low"] < 0.3 <= c["failing_lr"] and c["bracket_ratio"] <= 1.25
    through = {r.seed for r in search.runs.values() if r.lr == c["failing_lr_low"] and r.trained_through()}
    assert through == {0, 1}
    assert all(t["seed"] in (0, 1) for t in sweep.trials if t["stage"] == "bisect")


def test_the_stages_run_in_order_and_the_best_lr_gets_the_further_seeds():
    search, sweep = finished_search()
    stages = [d.stage for d in search.decisions]
    assert stages[:3] == ["range", "coarse", "landscape"] and "refine" in stages and "seeds" in stages
    c = search.conclusion()
    assert len(c["best_lr_seed_losses"]) == 3
    assert {t["seed"] for t in sweep.trials if t.get("lr") == c["best_lr"]} == {0, 1, 2}


def test_the_best_lr_is_found_within_the_refinement_factor_of_the_true_optimum():
    search, _ = finished_search()
    assert OPTIMUM / 2 <= search.conclusion()["best_lr"] <= OPTIMUM * 2


def test_the_conclusion_gives_the_basin_the_degraded_region_and_where_training_fails():
    search, _ = finished_search()
    c = search.conclusion()
    assert c["best_lr"] in c["basin"]["lrs"]
    assert c["basin"]["high"][0] < c["basin"]["high"][1] <= c["degraded"]["low"][1]
    assert c["degraded"]["high"] == [c["degraded"]["points"][-1]["lr"], c["failing_lr"]]
    assert c["degraded"]["per_doubling"] > 0 and c["degraded"]["per_doubling_se"] is not None
    excess = c["degraded"]["excess_at"]  # the simulated loss: 0.05 ln(lr / optimum)^2 above the best
    assert set(excess) >= {"4", "10"} and excess["4"] < excess["10"]
    assert excess["10"] == pytest.approx(0.05 * math.log(10 * c["best_lr"] / OPTIMUM) ** 2
                                         - 0.05 * math.log(c["best_lr"] / OPTIMUM) ** 2, abs=0.05)
    assert c["diverged"]["low"] == [c["failing_lr_low"], c["failing_lr"]]


def test_a_search_saved_and_restored_mid_bisection_finishes_the_same_without_repeating_a_trial():
    whole, whole_sweep = finished_search()
    search, sweep = EdgeSearch(EdgeSettings(), BUDGET), SimulatedSweep()
    while not any(d.stage == "bisect" for d in search.decisions):
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
    edge = bracket(search.runs.values())
    assert edge.ratio <= 1.25 and edge.stable_lr < THRESHOLD <= edge.diverged_lr


# ---------------------------------------------------------------------------------------------
# The best LR is seeded before it is crowned


def result(lr: float, **losses_by_seed: float) -> LrResult:
    seeds = tuple(int(k[1:]) for k in losses_by_seed)
    return LrResult(lr, tuple(losses_by_seed.values()), (), seeds)


def test_a_one_seed_lr_is_compared_seed_for_seed_never_one_draw_against_a_mean():
    """quick_edge with steps=40: 0.0214 (one seed, 3.2836) was crowned over 3-seed means although
    0.0152's own seed 0 was lower (3.2722)."""
    ranking = [result(0.0107, s0=3.2900, s1=3.2950, s2=3.3000), result(0.0152, s0=3.2722, s1=3.2950, s2=3.3010),
               result(0.0214, s0=3.2836)]
    best, contenders = crown(ranking)
    assert best.lr == 0.0152 and contenders == []


def test_an_lr_with_fewer_seeds_that_beats_the_best_seed_for_seed_is_a_contender_not_the_best():
    ranking = [result(0.0152, s0=3.2722, s1=3.2950, s2=3.3010), result(0.0214, s0=3.2600)]
    best, contenders = crown(ranking)
    assert best.lr == 0.0152 and [c.lr for c in contenders] == [0.0214]


def test_a_contender_gets_the_best_lrs_seeds_before_the_search_ends():
    """A refinement LR that only wins after the seeds stage is seeded too, then compared on the mean."""
    sweep = SimulatedSweep(seed_offset=0.05)  # seeds 1 and 2 are worse: a one-seed LR looks better than a mean
    search, _ = finished_search(sweep=sweep)
    c = search.conclusion()
    assert c["best_lr_contenders"] == []
    counts = {}
    for run in search.runs.values():
        if run.full_loss() is not None:
            counts.setdefault(run.lr, set()).add(run.seed)
    assert all(len(seeds) <= len(c["best_lr_seeds"]) for seeds in counts.values())
    assert len(c["best_lr_seeds"]) == 3
    beaten = [r for r in full_budget_ranking(search.runs.values()) if r.lr != c["best_lr"] and len(r.losses) == 1]
    assert all(r.losses[0] >= c["best_lr_seed_losses"][0] for r in beaten)


# ---------------------------------------------------------------------------------------------
# The pure pieces


def run(lr: float, val: dict[int, float], outcome: str = "completed", seed: int = 0, stage: str = "coarse") -> Run:
    tokens = BUDGET.full_tokens if outcome in ("completed", "diverged") and stage != "coarse" or \
        max(val, default=0) == BUDGET.full_tokens else max(val, default=0)
    return Run(lr, seed, stage, BUDGET.full_tokens, BUDGET.full_tokens, outcome, tokens, val)


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


def test_an_lr_counts_as_trained_through_only_with_its_whole_budget():
    early = run(0.3, {18432: 6.0}, "stopped_early")
    assert not early.trained_through()
    assert bracket([early, run(0.5, {}, "diverged")]).stable_lr is None


def test_a_confirmation_run_that_recovers_replaces_the_stopped_run_it_retrained():
    stopped = Run(0.5, 0, "bisect", BUDGET.full_tokens, BUDGET.full_tokens, "diverged", 122 * 1024, {},
                  divergence="rule")
    recovered = Run(0.5, 0, "confirm", BUDGET.full_tokens, BUDGET.full_tokens, "completed", BUDGET.full_tokens,
                    {BUDGET.full_tokens: 5.5})
    below = run(0.3, {BUDGET.full_tokens: 4.0}, stage="bisect")
    assert bracket([below, stopped]).diverged_lr == 0.5
    assert bracket([below, stopped, recovered]) == bracket([below, recovered])
    assert bracket([below, stopped, recovered]).diverged_lr is None


def test_an_lr_where_any_seed_diverged_is_not_ranked():
    ranking = full_budget_ranking([run(0.1, {165888: 3.0}), run(0.1, {}, "diverged", seed=1),
                                   run(0.03, {165888: 3.2})])
    assert [r.lr for r in ranking] == [0.03]


def test_geometric_bisection_cuts_the_bracket_into_equal_log_parts():
    edge = bracket([run(0.1, {165888: 3.0}), run(0.4, {}, "diverged")])
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


def test_refinement_bounds_the_best_within_its_factor_and_measures_the_costs_at_2x_and_4x():
    best = run(0.01, {18432: 6.13, 165888: 5.60})
    lrs = refine_lrs(full_budget_ranking([best])[0], [best], None, EdgeSettings(refine_points=2), BUDGET)
    assert lrs == pytest.approx([0.005, 0.02, 0.04])


def test_refinement_uses_a_cut_coarse_lr_it_lands_on_exactly_so_that_its_run_is_continued():
    best = run(0.01, {18432: 6.13, 165888: 5.60})
    near_4x = run(0.03981, {18432: 6.0}, "stopped_early")
    lrs = refine_lrs(full_budget_ranking([best])[0], [best, near_4x], None, EdgeSettings(refine_points=2), BUDGET)
    assert 0.03981 in lrs and not any(lr == pytest.approx(0.04) for lr in lrs)  # the rungs line up


def test_refinement_leaves_out_lrs_another_stage_already_queued():
    best = run(0.01, {18432: 6.13, 165888: 5.60})
    above = run(0.03162, {18432: 6.0}, "stopped_early")
    lrs = refine_lrs(full_budget_ranking([best])[0], [best, above], None, EdgeSettings(), BUDGET, queued=(0.03162,))
    assert 0.03162 not in lrs


def test_an_lr_above_the_best_is_never_rerun():
    best = full_budget_ranking([run(0.01, {165888: 3.0})])[0]
    cut_above = run(0.03, {18432: 4.0}, "stopped_early")
    assert rerun_lrs(best, [cut_above, run(0.01, {18432: 4.1, 165888: 3.0})], EdgeSettings(), BUDGET) == []


def test_the_conclusion_of_no_runs_names_nothing():
    c = conclude([], BUDGET)
    assert c.best is None and c.landscape.basin is None and c.edge.diverged_lr is None
    assert c.to_json()["best_lr"] is None and c.to_json()["basin"] is None


@pytest.mark.parametrize("key, value, fragment", [
    ("tolerance", 1.0, "edge.tolerance: must be above 1"),
    ("refine_points", 3, "edge.refine_points: must be an even number"),
    ("seed_rounds", -1, "edge.seed_rounds: must be >= 0"),
    ("seeds", 0, "edge.seeds: must be at least 1"),
])
def test_settings_no_search_could_use_are_refused_naming_the_key(key, value, fragment):
    with pytest.raises(Exception, match=fragment):
        EdgeSettings(**{key: value}).validate()


def test_with_two_trials_at_a_time_the_landscape_continues_only_the_middle_cut_lr_and_the_refinement_fills_the_other():
    grid = sorted(float(f"{lr:.4g}") for lr in coarse_lrs(0.012, 1.9, EdgeSettings())[0])
    cut = [lr for lr in grid if lr > 0.012]
    search = EdgeSearch(EdgeSettings(), BUDGET, max_pending=2)
    sweep = SimulatedSweep(cut={round(lr, 6): 0 for lr in cut})
    drive(search, sweep)
    assert search.finished
    candidates = [lr for lr in cut if lr > 0.012 * EdgeSettings().coarse_ratio * 1.02]
    first = next(d for d in search.decisions if d.stage == "landscape")
    assert first.lrs == [candidates[2]]
    after_coarse = [t["stage"] for t in sweep.trials if t["stage"] not in ("range", "coarse")]
    assert after_coarse[:2] == ["landscape", "refine"]


def test_a_bisection_probe_trains_one_seed_and_only_the_stable_end_gets_the_edge_seeds():
    search, sweep = finished_search()
    c = search.conclusion()
    probes = [(t["lr"], t["seed"]) for t in sweep.trials if t["stage"] == "bisect"]
    assert probes and all(seed == 0 for _, seed in probes)
    stable_seeds = {r.seed for r in search.runs.values() if r.lr == c["failing_lr_low"] and r.trained_through()}
    assert stable_seeds == {0, 1}
    failed_seeds = {r.seed for r in search.runs.values() if r.lr == c["failing_lr"]}
    assert failed_seeds == {0}


def test_while_nothing_failed_the_highest_cut_coarse_lr_is_probed_below_not_continued():
    """The top coarse LR's cut run is continued only if every probe below it trains through: here the first
    probe between the largest LR that trained and it fails, so that run is never continued."""
    grid = sorted(float(f"{lr:.4g}") for lr in coarse_lrs(0.012, 1.9, EdgeSettings())[0])
    cut = [lr for lr in grid if lr > 0.012]
    search, sweep = finished_search(sweep=SimulatedSweep(cut={round(lr, 6): 0 for lr in cut}))
    continued = {t["lr"] for t in sweep.trials if t.get("continue_from")}
    assert max(cut) not in continued
    c = search.conclusion()
    assert c["failing_lr_low"] < THRESHOLD <= c["failing_lr"] < max(cut)


def test_a_best_lr_at_the_bottom_of_the_full_budget_runs_gets_one_below_it_before_the_seeds():
    """The optimum below the refinement (ASHA let only the range test's guess train through, and cut the coarse
    LRs below it early, when larger LRs lead): the refinement's lowest LR wins, so one more LR below bounds it."""
    grid = sorted(float(f"{lr:.4g}") for lr in coarse_lrs(0.012, 1.9, EdgeSettings())[0])
    sweep = SimulatedSweep(cut={round(lr, 6): 0 for lr in grid if not 0.01 < lr < 0.013})
    sweep.loss = lambda lr, tokens, seed: (2.0 + 0.5 * math.log(lr / 0.003) ** 2 + seed * 0.002
                                           + 3.0 * math.exp(-tokens * lr ** 0.5 / 2000))
    search, _ = finished_search(sweep=sweep)
    bounds = [d for d in search.decisions if d.stage == "refine" and "bounds it" in d.why]
    assert bounds and bounds[0].why.startswith("no full-budget LR below the best")
    ranking = full_budget_ranking(list(search.runs.values()))
    best = search.conclusion()["best_lr"]
    assert any(r.lr < best for r in ranking) and any(r.lr > best for r in ranking)


def test_a_best_lr_interval_open_below_is_closed_by_continuing_the_cut_coarse_lr_between():
    """0.005 (one seed) is within the best's noise, so nothing below the best is clearly worse: the coarse LR ASHA cut
    between 0.005 / 2 and 0.005 is continued to close the interval; with a clearly worse LR below, nothing is."""
    from lmtune.analysis.bracket import Bracket
    from lmtune.searches.edge.settings import bound_lr

    best = [run(0.01, {165888: v}, stage="seeds", seed=s) for s, v in enumerate((3.00, 3.02, 2.98))]
    near = run(0.005, {165888: 3.01}, stage="refine")
    worse_above = run(0.04, {165888: 3.5}, stage="refine")
    ranking = full_budget_ranking(best + [near, worse_above])
    bound = bound_lr(ranking[0], ranking, Bracket(1.0, 1.4), (0.003162,), EdgeSettings())
    assert bound is not None and bound.lr == 0.003162 and "below" in bound.why
    clearly_worse = run(0.003162, {165888: 3.6}, stage="refine")
    ranking = full_budget_ranking(best + [near, worse_above, clearly_worse])
    assert bound_lr(ranking[0], ranking, Bracket(1.0, 1.4), (), EdgeSettings()) is None
