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


def test_the_run_config_applies_the_settings_and_validates_them_naming_the_trial():
    base = budget_config("low-resource", data_dir="")
    assert TrialOrder({"lr": 0.02, "seed": 5}).run_config(base, "trial t").train.lr == 0.02
    with pytest.raises(LmtuneError, match="^trial t7: lr must be a positive finite number"):
        TrialOrder({"lr": -1.0}).run_config(base, "trial t7")


def test_each_member_of_a_fused_group_gets_its_own_lr():
    base = budget_config("low-resource", data_dir="")
    configs = TrialOrder(members=FusedMembers((0.001, 0.01), {"seed": 4})).member_configs(base, ["g-0", "g-1"])
    assert [c.train.lr for c in configs] == [0.001, 0.01] and {c.train.seed for c in configs} == {4}
