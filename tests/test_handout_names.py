"""The CS336 handout's names for lmtune's settings (num_layers, num_heads) are accepted wherever a setting is named,
mapped once at the door to lmtune's own (issue 56 item 2): what lmtune writes carries lmtune's name only."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmtune.api import Sweep
from lmtune.cli import parse_set_args
from lmtune.errors import LmtuneError
from lmtune.searches.trial_order import TrialOrder
from lmtune.sweep.spaces import parse_space
from lmtune.training.config import budget_config


def test_set_num_layers_is_set_n_layers():
    assert parse_set_args(["num_layers=2", "num_heads=4"]) == {"n_layers": "2", "n_heads": "4"}


def test_a_handout_name_builds_the_same_run_as_lmtunes_name():
    assert budget_config("quick", {"num_layers": 2}) == budget_config("quick", {"n_layers": 2})
    assert budget_config("quick", {"num_layers": 2}).model.n_layers == 2


def test_a_handout_name_and_lmtunes_for_one_setting_are_refused_in_one_line():
    with pytest.raises(LmtuneError, match=r"^--set: n_layers and num_layers name one setting \(n_layers\); give "
                                          r"it once$"):
        parse_set_args(["n_layers=2", "num_layers=3"])


def test_a_setting_given_twice_on_the_command_line_is_refused():
    with pytest.raises(LmtuneError, match="given twice"):
        parse_set_args(["lr=0.1", "lr=0.2"])


def test_a_space_files_set_section_takes_the_handout_names_and_keeps_lmtunes():
    space = parse_space({"search": "grid", "budget": "quick", "params": {"lr": [1e-3]},
                         "set": {"num_layers": 2, "num_heads": 2}}, Path("space.yaml"))
    assert space.fixed == {"n_layers": 2, "n_heads": 2}


def test_a_space_file_naming_one_setting_twice_is_refused_naming_both():
    with pytest.raises(LmtuneError, match=r"space.yaml: set: n_heads and num_heads name one setting"):
        parse_space({"search": "grid", "budget": "quick", "params": {"lr": [1e-3]},
                     "set": {"num_heads": 2, "n_heads": 4}}, Path("space.yaml"))


def test_the_python_api_takes_the_handout_names(builtin_data: Path):
    sweep = Sweep("lr_grid", data=builtin_data, budget="quick", num_layers=1)
    assert sweep.plan.base.model.n_layers == 1


def test_an_unknown_setting_names_the_handout_names_among_the_valid_ones():
    with pytest.raises(LmtuneError, match="num_layers for n_layers"):
        parse_set_args(["layers=2"])


def test_a_trial_whose_tune_config_uses_a_handout_name_trains_lmtunes_setting():
    order = TrialOrder.from_tune({"lr": 1e-3, "num_heads": 2, "stage": "grid"})
    assert order.settings == {"lr": 1e-3, "n_heads": 2}
    assert order.run_config(budget_config("quick"), "trial t", checked=True).model.n_heads == 2
