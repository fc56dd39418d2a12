"""A trial's order: what a search asks of one trial, read from Tune's config dict once and typed from then on."""

from __future__ import annotations

import pytest

from lmtune.errors import LmtuneError
from lmtune.searches.trial_order import RANGE_STAGE, FusedMembers, TrialOrder
from lmtune.training.config import budget_config


def test_a_grid_trials_config_is_all_settings():
    order = TrialOrder.from_tune({"lr": 0.003, "seed": 1})
    assert order == TrialOrder({"lr": 0.003, "seed": 1})
    assert order.stage is None and order.source is None and order.early_stop and order.members is None


def test_an_edge_confirmation_continues_a_run_without_early_stopping():
    order = TrialOrder.from_tune({"stage": "confirm", "seed": 0, "lr": 0.1, "continue_from": "abc",
                                  "early_stop": False})
    assert order.settings == {"seed": 0, "lr": 0.1}
    assert (order.stage, order.continue_from, order.source, order.early_stop) == ("confirm", "abc", "abc", False)


def test_a_horizon_trial_forks_from_another():
    order = TrialOrder.from_tune({"stage": "fit", "lr": 0.01, "seed": 2, "fork_from": "t1", "steps": 400})
    assert order.fork_from == "t1" and order.source == "t1" and order.settings["steps"] == 400


def test_the_range_test_is_known_by_its_stage():
    assert TrialOrder.from_tune({"stage": RANGE_STAGE, "seed": 0}).is_range_test
    assert not TrialOrder.from_tune({"stage": "coarse", "seed": 0, "lr": 0.01}).is_range_test


def test_a_fused_group_carries_its_lrs_and_what_its_members_share():
    order = TrialOrder.from_tune({"members": {"lr": [0.001, 0.01], "seed": 3}})
    assert order.members == FusedMembers((0.001, 0.01), {"seed": 3}) and order.settings == {}


@pytest.mark.parametrize("params", [
    {"stage": "coarse", "seed": 0, "lr": 0.1, "continue_from": "x", "early_stop": False},
    {"stage": "fit", "lr": 0.01, "seed": 2, "fork_from": "t1"},
    {"members": {"lr": [0.001, 0.01], "seed": 3}},
    {"lr": 0.003},
])
def test_an_order_goes_back_to_tune_as_it_came(params):
    assert TrialOrder.from_tune(params).to_tune() == params


@pytest.mark.parametrize(("params", "named"), [
    ({"stage": 3, "lr": 0.1}, "stage=3"),
    ({"lr": 0.1, "continue_from": ["a"]}, "continue_from=['a']"),
    ({"lr": 0.1, "early_stop": "no"}, "early_stop='no'"),
    ({"members": {"lr": []}}, "members="),
    ({"members": [0.1, 0.2]}, "members="),
])
def test_a_config_a_users_tuner_got_wrong_is_one_line(params, named):
    with pytest.raises(LmtuneError, match="^trial config ") as caught:
        TrialOrder.from_tune(params)
    assert named in str(caught.value) and "\n" not in str(caught.value)


def test_the_run_config_applies_the_settings_of_a_users_tuner_and_validates_them_naming_the_trial():
    base = budget_config("low-resource", data_dir="")
    assert TrialOrder({"lr": "0.02", "seed": 5}).run_config(base, "trial t", checked=False).train.lr == 0.02
    with pytest.raises(LmtuneError, match="^trial t7: lr must be a positive finite number"):
        TrialOrder({"lr": -1.0}).run_config(base, "trial t7", checked=False)


def test_settings_a_space_file_checked_are_put_in_place_as_they_are():
    base = budget_config("low-resource", data_dir="")
    config = TrialOrder({"lr": 0.02, "seed": 5}).run_config(base, "trial t", checked=True)
    assert (config.train.lr, config.train.seed) == (0.02, 5) and base.train.seed != 5


@pytest.mark.parametrize("checked", [True, False])
def test_each_member_of_a_fused_group_gets_its_own_lr(checked):
    base = budget_config("low-resource", data_dir="")
    configs = TrialOrder(members=FusedMembers((0.001, 0.01), {"seed": 4})).member_configs(base, ["g-0", "g-1"],
                                                                                           checked)
    assert [c.train.lr for c in configs] == [0.001, 0.01] and {c.train.seed for c in configs} == {4}


LR = 0.00123457  # a value no default holds, so that where it travels can be told by value
# Where the LR travels from a space file to the optimizer's param group (the trainable counted: Tune runs it)...
ROUTE_TO_OPTIMIZER = ("lmtune.searches.grid", "lmtune.searches.grid.settings", "lmtune.training.config",
                      "lmtune.training.handout", "lmtune.searches.trial_order", "lmtune.sweep.trainable",
                      "lmtune.training.code", "lmtune.training.loop", "lmtune.training.schedule",
                      "lmtune.training.step")
# ... and where the run records it on the way (config.json, the schedule's figure, metrics.csv's lr column).
RECORDING = ("lmtune.files", "lmtune.training.figures", "lmtune.training.metrics", "lmtune.training.metric_registry")
ROUTE = ROUTE_TO_OPTIMIZER + RECORDING


def _modules_holding_lr(calls: list[tuple[str, str]], stepped: list[float] | None = None):
    """A tracer recording (module, function) of each lmtune call whose locals hold LR (or a flat list, tuple or
    dict holding it; a schedule's peak may differ from it in the last bit) when it returns, and into ``stepped``
    the first param group's LR after each training step."""
    import math
    import sys

    def holds(value, depth=0) -> bool:
        if isinstance(value, float):
            return math.isclose(value, LR, rel_tol=1e-12)
        if depth == 0 and isinstance(value, (list, tuple)):
            return any(holds(v, 1) for v in value)
        if depth == 0 and isinstance(value, dict):
            return any(holds(v, 1) for v in value.values())
        return False

    def on_call(frame, event, _arg):
        module = frame.f_globals.get("__name__", "")
        if event != "call" or not module.startswith("lmtune"):
            return None

        def on_return(f, e, _a):
            if e == "return" and any(holds(v) for v in f.f_locals.values()):
                calls.append((module, f.f_code.co_name))
            if e == "return" and stepped is not None and f.f_code.co_name == "train_step":
                stepped.append(f.f_locals["state"].optimizer.param_groups[0]["lr"])
            return on_return
        return on_return

    return lambda: sys.settrace(on_call), lambda: sys.settrace(None)


def test_an_lr_from_a_space_file_reaches_the_optimizer_as_train_runs_through_nine_modules_and_four_that_record_it(
        tmp_path, make_tiny_config):
    """The route of lmtune.run, traced as it runs: the space file read and checked, Tune's grid expanded by Tune's own
    variant generator, the trial's order at the trainable's door (lmtune.sweep.trainable, run by Tune in a trial's
    process: counted, not traced here; the rest is what it calls, as it calls it), its run config, the training
    spec, and ``train()`` for a few steps until the optimizer's param group holds the LR: ten modules on the way
    (ROUTE_TO_OPTIMIZER; the handout's names, training/handout.py, among them) and four that record it (RECORDING),
    fourteen in all."""
    from ray.tune.search.variant_generator import generate_variants

    from lmtune.sweep.spaces import load_space
    from lmtune.training.loop import train
    from lmtune.usercode.spec import spec_for

    (tmp_path / "s.yaml").write_text(f"search: grid\nbudget: quick\nparams:\n  lr: [{LR!r}, 0.01]\n")
    parsed, trial, stepped = [], [], []
    start, stop = _modules_holding_lr(parsed)
    start()
    space = load_space(str(tmp_path / "s.yaml"))
    stop()
    _, params = next(generate_variants(space.strategy.param_space(1)))  # (Tune's grid: its first point)
    base = make_tiny_config(**space.fixed, steps=4, warmup_steps=1, log_interval=2, eval_interval=4,
                            checkpoint_interval=4)
    start, stop = _modules_holding_lr(trial, stepped)
    start()
    config = TrialOrder.from_tune(params).run_config(base, "trial t", checked=True)
    train(config, tmp_path / "run", spec=spec_for(config))
    stop()
    assert stepped and max(stepped) == pytest.approx(LR, rel=1e-12)  # the param group at the schedule's peak
    modules = {m for m, _ in parsed + trial} | {"lmtune.sweep.trainable"}
    assert sorted(modules) == sorted(ROUTE)
    assert ("lmtune.training.config", "check_setting") in parsed  # held to its rule where it entered ...
    assert not [f for _, f in trial if f in ("check_setting", "broken_rule", "validate", "apply_overrides")]  # once
