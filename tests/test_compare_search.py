"""The compare search, Ray-free: driven by a simulated sweep in which each variant has its own best LR and its own
edge, it gives every variant an edge search of its own in one sweep (the reference first, a waiting variant's slot to
the next), each trial carrying its variant's name and settings; each variant's search finds that variant's best LR
and edge, and once the reference's has ended, trains the reference's best LR (the loss "at the previous optimal
LR"); a batch-size variant trains the budget's tokens in its own steps; the whole state survives JSON. A space
with fewer than two variants, a variant setting the LR, or a scheduler that cuts runs is refused in one line."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import replace

import pytest
import torch
import yaml
from conftest import drive_search

from lmtune.analysis.runs import Budget, same_lr
from lmtune.errors import LmtuneError
from lmtune.searches.compare.search import AT_REFERENCE, CompareSearch
from lmtune.searches.compare.settings import CompareSettings, Variant
from lmtune.searches.deciding import FINISHED, WAIT
from lmtune.searches.edge.settings import EdgeSettings
from lmtune.sweep.plan import SweepPlan
from lmtune.sweep.spaces import load_space
from lmtune.training.config import budget_config, with_settings
from lmtune.training.memory import run_memory_bytes

BUDGET = Budget(steps=100, warmup_steps=10, tokens_per_step=1024, seed=0, rungs=(100 * 1024,), batch_size=16)
# Each variant's true best LR and the LR from which its runs diverge.
# (no_norm diverges at the reference's best LR: what CS336 asks of removing RMSNorm)
TRUTH = {"reference": (0.01, 0.8), "no_norm": (0.002, 0.008), "big_batch": (0.02, 0.8)}
SETTINGS = CompareSettings((Variant("reference"), Variant("no_norm", {"norm": "none"}),
                            Variant("big_batch", {"batch_size": 64, "steps": 25, "warmup_steps": 3})),
                           edge=EdgeSettings(seeds=2, seed_lrs=1, refine_points=2, tolerance=1.5))


class SimulatedVariants:
    """Trains each trial instantly at its whole budget: a parabola in ln LR around its variant's best LR, a run at
    or above its variant's edge diverging; the range test finds the steepest descent a decade below the edge."""

    def __init__(self):
        self.trials: list[dict] = []

    def run(self, search: CompareSearch, trial_id: str, config: dict) -> None:
        self.trials.append({"trial_id": trial_id, **config})
        best, edge = TRUTH[config["variant"]]
        tokens = config.get("steps", BUDGET.steps) * (1024 * 64 // 16 if config["variant"] == "big_batch" else 1024)
        if config["stage"] == "range":
            search.complete(trial_id, "range_test", {"tokens": 1024, "steepest_lr": best, "min_loss_lr": edge / 3,
                                                     "blowup_lr": edge})
            return
        lr, seed = config["lr"], config["seed"]
        if lr >= edge:
            search.observe(trial_id, {"tokens": tokens})
            search.complete(trial_id, "diverged", {"tokens": tokens, "divergence": "whole run"})
            return
        loss = 2.0 + 0.05 * math.log(lr / best) ** 2 + 0.001 * seed
        search.observe(trial_id, {"tokens": tokens, "val_loss": loss})
        search.complete(trial_id, "completed", {"tokens": tokens})


@pytest.fixture(scope="module")
def finished():
    search, sweep = CompareSearch(SETTINGS, BUDGET), SimulatedVariants()
    _, search = drive_search(search, sweep, 600)
    assert search.finished, "the compare search did not finish"
    return search, sweep


def test_every_variant_gets_an_lr_search_of_its_own_starting_with_the_reference(finished):
    search, sweep = finished
    assert [t["variant"] for t in sweep.trials[:1]] == ["reference"]
    assert {t["variant"] for t in sweep.trials} == set(TRUTH)
    assert all(sum(t["variant"] == v and t["stage"] == "range" for t in sweep.trials) == 1 for v in TRUTH)


def test_each_trial_carries_its_variants_settings_and_only_those(finished):
    _, sweep = finished
    for trial in sweep.trials:
        assert ("norm" in trial) == (trial["variant"] == "no_norm")
        assert ("batch_size" in trial) == (trial["variant"] == "big_batch")
    assert {t["steps"] for t in sweep.trials if t["variant"] == "big_batch"} == {25}


@pytest.mark.parametrize("variant", sorted(TRUTH))
def test_each_variant_finds_its_own_best_lr_and_brackets_its_own_edge(finished, variant):
    search, _ = finished
    conclusion = search.searches[variant].conclusion()
    best, edge = TRUTH[variant]
    assert abs(math.log(conclusion["best_lr"] / best)) <= math.log(1.5)
    assert conclusion["failing_lr_low"] < edge <= conclusion["failing_lr"]


def test_every_other_variant_trains_the_references_best_lr_with_its_seeds_once_both_searches_end(finished):
    search, sweep = finished
    best = search.reference_best()
    assert abs(math.log(best.lr / TRUTH["reference"][0])) <= math.log(1.5) and len(best.seeds) >= 2
    for variant in ("no_norm", "big_batch"):
        at = [r for r in search.runs_of(variant) if r.stage != "range" and same_lr(r.lr, best.lr)]
        assert {r.seed for r in at} >= set(best.seeds)
    no_norm = [r for r in search.runs_of("no_norm") if r.stage == AT_REFERENCE]
    assert no_norm and all(r.diverged for r in no_norm)  # past its edge: it diverges at the reference's optimum
    last = max(i for i, t in enumerate(sweep.trials) if t["stage"] != AT_REFERENCE)
    assert all(t["stage"] == AT_REFERENCE for t in sweep.trials[last + 1:])


def test_a_batch_size_variants_search_compares_its_runs_at_the_budgets_tokens_in_its_own_steps(finished):
    search, _ = finished
    budget = search.searches["big_batch"].budget
    assert (budget.steps, budget.tokens_per_step, budget.batch_size) == (25, 4096, 64)
    assert budget.full_tokens == BUDGET.full_tokens


def test_the_search_state_survives_json_between_every_two_trials():
    def through_json(s: CompareSearch) -> CompareSearch:
        return CompareSearch.from_json(json.loads(json.dumps(s.to_json())))

    first, resumed = SimulatedVariants(), SimulatedVariants()
    drive_search(CompareSearch(SETTINGS, BUDGET), first, 600)
    drive_search(CompareSearch(SETTINGS, BUDGET), resumed, 600, round_trip=through_json)
    assert [(t["variant"], t["stage"], t.get("lr"), t["seed"]) for t in resumed.trials] == \
           [(t["variant"], t["stage"], t.get("lr"), t["seed"]) for t in first.trials]


def test_while_the_reference_waits_on_its_range_test_the_next_variant_gets_the_slot():
    search = CompareSearch(SETTINGS, BUDGET, max_pending=2)
    first, second = search.suggest("a"), search.suggest("b")
    assert (first["variant"], first["stage"]) == ("reference", "range")
    assert (second["variant"], second["stage"]) == ("no_norm", "range")
    assert search.suggest("c") == WAIT  # two in flight: the sweep's concurrency


@pytest.fixture(scope="module")
def warm():
    """The same variants, each later one starting from the reference's answer (start: reference)."""
    search, sweep = CompareSearch(replace(SETTINGS, start="reference"), BUDGET), SimulatedVariants()
    _, search = drive_search(search, sweep, 600)
    assert search.finished, "the compare search did not finish"
    return search, sweep


def test_a_variant_started_from_the_reference_waits_for_its_answer_and_runs_no_range_test(warm):
    search, sweep = warm
    reference_ends = max(i for i, t in enumerate(sweep.trials) if t["variant"] == "reference"
                         and t["stage"] != AT_REFERENCE)
    first_other = min(i for i, t in enumerate(sweep.trials) if t["variant"] != "reference")
    assert first_other > reference_ends
    assert [t for t in sweep.trials if t["variant"] != "reference" and t["stage"] == "range"] == []
    best = search.reference_best().lr
    first_grid = search.searches["no_norm"].decisions[0]
    assert first_grid.stage == "coarse" and any(same_lr(lr, best) for lr in first_grid.lrs)
    assert "started from the reference's answer" in first_grid.why


@pytest.mark.parametrize("variant", ["no_norm", "big_batch"])
def test_a_variant_started_from_the_reference_finds_its_own_best_and_edge_even_where_they_moved(warm, variant):
    search, _ = warm
    conclusion = search.searches[variant].conclusion()
    best, edge = TRUTH[variant]  # no_norm's best 5x below the reference's, its edge 100x below
    assert abs(math.log(conclusion["best_lr"] / best)) <= math.log(1.5)
    assert conclusion["failing_lr_low"] < edge <= conclusion["failing_lr"]


def test_starting_from_the_reference_trains_fewer_tokens_where_the_optimum_stayed(finished, warm):
    def tokens(search, variant):
        return sum(r.tokens for r in search.runs_of(variant))

    assert tokens(warm[0], "big_batch") < tokens(finished[0], "big_batch")


def test_a_warm_started_search_state_survives_json():
    def through_json(s: CompareSearch) -> CompareSearch:
        return CompareSearch.from_json(json.loads(json.dumps(s.to_json())))

    settings = replace(SETTINGS, start="reference")
    first, resumed = SimulatedVariants(), SimulatedVariants()
    drive_search(CompareSearch(settings, BUDGET), first, 600)
    drive_search(CompareSearch(settings, BUDGET), resumed, 600, round_trip=through_json)
    assert [(t["variant"], t["stage"], t.get("lr")) for t in resumed.trials] == \
           [(t["variant"], t["stage"], t.get("lr")) for t in first.trials]


def test_a_finished_search_says_so_to_every_ask(finished):
    search, _ = finished
    assert search.suggest("late") == FINISHED


def write_space(tmp_path, extra: dict):
    space = {"search": "compare", "budget": "quick", "scheduler": {"name": "none"},
             "variants": {"reference": {}, "no_norm": {"set": {"norm": "none"}}}, **extra}
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(space, sort_keys=False))  # (the first variant is the reference)
    return path


@pytest.mark.parametrize("extra, problem", [
    ({"variants": {"reference": {}}}, r"variants: list at least two variants"),
    ({"variants": {"reference": {}, "hot": {"set": {"lr": 0.1}}}}, r"variants\.hot\.set\.lr: the compare search "
                                                                    r"sets it per trial"),
    ({"variants": {"reference": {}, "odd": {"set": {"norm": "sideways"}}}}, r"variants\.odd: norm must be one of"),
    ({"variants": {"reference": {}, "mine": {"model_set": "use_rope=false"}}}, r"variants\.mine\.model_set: must be "
                                                                             r"a mapping"),
    ({"per_variant": "optuna"}, r"per_variant: unknown LR search"),
    ({"start": "middle"}, r"start: 'middle': where a later variant's LR search starts; use own .* or reference"),
])
def test_a_space_the_compare_search_cannot_run_is_refused_in_one_line(tmp_path, extra, problem):
    with pytest.raises(LmtuneError, match=problem) as err:
        load_space(str(write_space(tmp_path, extra)))
    assert "\n" not in str(err.value)


def test_under_asha_each_variant_is_cut_at_the_references_rungs_in_tokens(tmp_path):
    """A compare space under ASHA: ASHA may cut each variant's coarse grid only (the edge search's stages), and a
    batch-size variant's budget is compared at the reference's rungs in tokens, its own steps to the same end."""
    space = load_space(str(write_space(tmp_path, {"scheduler": {"name": "asha", "grace_period": 0.25},
                                                  "variants": {"reference": {}, "big": {"batch_size": 64}}})))
    plan = SweepPlan.create(space, budget_config(space.budget, space.fixed))
    assert space.strategy.asha_stages() == frozenset({"coarse"})
    reference = plan.budget()
    big = next(v for v in space.strategy.settings.variants if v.name == "big").budget(reference)
    assert len(reference.rungs) > 1 and big.rungs == reference.rungs
    assert big.steps * big.tokens_per_step == reference.full_tokens and big.steps < reference.steps


def test_under_asha_a_cut_coarse_trials_newest_checkpoint_is_held_for_its_continuation(tmp_path):
    """The sweep's pruner keeps what the search may still use: a variant's LR its ASHA cut is continued to the full
    budget from its newest checkpoint, as in an edge search (without it the continuation trains from step 0)."""
    from lmtune.analysis.runs import Outcome

    space = load_space(str(write_space(tmp_path, {"scheduler": {"name": "asha", "grace_period": 0.25}})))
    assert space.strategy.held_checkpoints(Outcome.STOPPED_EARLY) == frozenset({"periodic"})
    assert space.strategy.held_checkpoints(Outcome.COMPLETED) == frozenset()


def test_a_batch_size_that_does_not_divide_the_budgets_tokens_is_refused_before_any_trial(tmp_path):
    with pytest.raises(LmtuneError, match=r"variants\.odd\.batch_size: the budget's .* give a batch_size that divides"):
        load_space(str(write_space(tmp_path, {"variants": {"reference": {}, "odd": {"batch_size": 7}}})))
    space = load_space(str(write_space(tmp_path, {"variants": {"reference": {}, "odd": {"batch_size": 64}}})))
    with pytest.raises(LmtuneError, match=r"variants\.odd\.batch_size 64: .* divides") as err:  # with --set steps=
        SweepPlan.create(space, budget_config(space.budget, {**space.fixed, "steps": 201}))
    assert "\n" not in str(err.value)


def test_a_batch_size_variant_is_planned_with_its_steps_and_intervals_at_the_budgets_tokens(tmp_path):
    space = load_space(str(write_space(tmp_path, {"variants": {"reference": {}, "wide": {"batch_size": 64}}})))
    base = budget_config(space.budget, space.fixed)
    plan = SweepPlan.create(space, base)
    wide = plan.space.strategy.settings.variant("wide")
    ratio = 64 // base.train.batch_size
    assert wide.settings["steps"] * 64 == base.train.steps * base.train.batch_size
    assert wide.settings["warmup_steps"] == max(1, round(base.train.warmup_steps / ratio))
    assert wide.config(base).total_tokens == base.total_tokens
    # resolving again (a resumed sweep's plan) changes nothing
    assert plan.space.strategy.resolved(base) == plan.space.strategy


# ---------------------------------------------------------------------------------------------
# batch_size: largest — the largest batch that fits the trials' device, worked out when the sweep is planned


def largest_space(tmp_path, **variant) -> tuple:
    space = load_space(str(write_space(tmp_path, {"variants": {"reference": {}, "big": {"batch_size": "largest",
                                                                                        **variant}}})))
    return space, budget_config(space.budget, space.fixed)


def test_the_largest_batch_is_the_largest_divisor_of_the_budgets_sequences_whose_run_fits(tmp_path):
    """Fitted to 2 GiB (a limit given, so the answer does not depend on this machine): the batch divides the budget's
    sequences (its tokens held), its run fits by the estimate check_fits uses, and the next larger divisor's does
    not."""
    space, base = largest_space(tmp_path)
    limit = 2 * 2**30
    big = space.strategy.settings.variant("big").with_largest_batch(base, lambda: torch.device("cpu"), limit)
    batch, sequences = big.settings["batch_size"], base.total_tokens // base.model.context_length
    assert sequences % batch == 0 and batch > base.train.batch_size
    need = lambda b: run_memory_bytes(with_settings(base, {"batch_size": b}), amp=False)  # noqa: E731
    assert need(batch) <= limit < need(min(d for d in range(batch + 1, sequences + 1) if sequences % d == 0))
    assert big.largest_batch == "the largest that fits this cpu's 2.0 GiB usable"


def test_a_planned_largest_batch_travels_in_sweep_json_as_a_number_with_its_steps_at_the_budgets_tokens(tmp_path):
    space, base = largest_space(tmp_path)
    fitted = space.strategy.fitted_to_device(base, lambda: torch.device("cpu"))
    plan = SweepPlan.create(dataclasses.replace(space, strategy=fitted), base)
    big = plan.space.strategy.settings.variant("big")
    assert big.config(base).total_tokens == base.total_tokens and "steps" in big.derived
    again = type(plan.space.strategy).from_json(json.loads(json.dumps(plan.space.strategy.to_json())))
    assert again == plan.space.strategy  # (a resumed sweep: the same batch, not fitted again)
    assert again.fitted_to_device(base, None) == again


@pytest.mark.parametrize(("device", "limit", "problem"), [
    (None, None, r"variants\.big\.batch_size largest: the driver cannot see the device its trials run on"),
    ("cpu", 1000, r"variants\.big\.batch_size largest: not even batch 1 fits this cpu"),
])
def test_a_largest_batch_that_cannot_be_fitted_is_refused_in_one_line(tmp_path, device, limit, problem):
    space, base = largest_space(tmp_path)
    variant = space.strategy.settings.variant("big")
    with pytest.raises(LmtuneError, match=problem) as err:
        variant.with_largest_batch(base, device and (lambda: torch.device(device)), limit)
    assert "\n" not in str(err.value)


def test_a_largest_batch_with_its_own_steps_is_refused_when_the_space_loads(tmp_path):
    with pytest.raises(LmtuneError, match=r"variants\.big\.batch_size: largest keeps the budget's tokens"):
        largest_space(tmp_path, set={"steps": 10})


def test_a_largest_batch_leaves_its_runs_at_least_20_steps_and_says_it_was_capped(tmp_path):
    """With memory to spare (1 TiB) the quick model would take the whole budget in a step or two."""
    space, base = largest_space(tmp_path)
    big = space.strategy.settings.variant("big").with_largest_batch(base, lambda: torch.device("cpu"), 2**40)
    assert base.total_tokens // (big.settings["batch_size"] * base.model.context_length) >= 20
    assert big.largest_batch.endswith(", capped at 20 steps")


def test_the_sweeps_plan_fits_a_largest_batch_to_this_machines_device_before_any_trial(builtin_data, tmp_path):
    from lmtune.sweep.experiment import make_plan

    space, _ = largest_space(tmp_path)
    plan = make_plan(space, builtin_data, None, {})
    big = plan.space.strategy.settings.variant("big")
    assert isinstance(big.settings["batch_size"], int) and big.largest_batch.startswith("the largest that fits this ")
    assert plan.space.strategy.to_json()["variants"]["big"]["largest_batch"] == big.largest_batch
