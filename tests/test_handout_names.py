"""The CS336 handout's names for lmtune's settings (num_layers, num_heads: issue 56 item 2; max_learning_rate,
warmup_iters, max_iters, max_l2_norm: issue 66 item 4) are accepted wherever a setting is named, mapped once at the
door to lmtune's own: what lmtune writes carries lmtune's name only. The handout's names no lmtune setting shares the
meaning of (min_learning_rate, cosine_cycle_iters, max_l2_norm=0) are refused in one line naming what to give."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO, assert_refused

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


# The handout's names for the schedule, clipping and loop (issue 66 item 4): each maps to the lmtune setting of the
# same meaning, or is refused in one line naming the setting to give.
SAME_MEANING = [("max_learning_rate", "lr", "0.002"), ("warmup_iters", "warmup_steps", "7"),
                ("max_iters", "steps", "300"), ("max_l2_norm", "grad_clip", "0.5")]


@pytest.mark.parametrize("handout, own, value", SAME_MEANING)
def test_a_schedule_clipping_or_loop_name_of_the_handout_sets_lmtunes_setting(handout: str, own: str, value: str):
    assert budget_config("quick", parse_set_args([f"{handout}={value}"])) == budget_config("quick", {own: value})


def test_the_handouts_schedule_names_give_the_handouts_schedule_step_for_step():
    """get_lr_cosine_schedule(it, max_learning_rate, min_learning_rate, warmup_iters, cosine_cycle_iters), as the
    handout defines it (examples/cs336_model.py's), with the handout's names set: lmtune's LR at every step is its
    LR at cosine_cycle_iters = max_iters - 1 (the cosine reaches the floor on the last step) and min_learning_rate =
    min_lr_ratio x max_learning_rate."""
    from lmtune.training.schedule import scheduled_lr
    from lmtune.usercode.imports import load

    handout = load(f"{REPO / 'examples' / 'cs336_model.py'}:get_lr_cosine_schedule", "--schedule")
    t = budget_config("quick", parse_set_args(["max_learning_rate=0.002", "warmup_iters=7", "max_iters=50"])).train
    expected = [handout(it, 0.002, 0.002 * t.min_lr_ratio, 7, 49) for it in range(50)]
    assert [scheduled_lr(it, t) for it in range(50)] == pytest.approx(expected, rel=1e-12)


def test_max_l2_norm_clips_the_global_gradient_norm_to_it_as_the_handout_does():
    import torch

    from lmtune.training.step import clip_gradients

    model = torch.nn.Linear(4, 3)
    model.weight.grad, model.bias.grad = torch.full((3, 4), 2.0), torch.full((3,), 2.0)
    clip_gradients(model, budget_config("quick", parse_set_args(["max_l2_norm=0.5"])).train.grad_clip)
    norm = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert norm.item() == pytest.approx(0.5, rel=1e-5)


def test_min_learning_rate_is_refused_naming_min_lr_ratio():
    with pytest.raises(LmtuneError, match=r"^--set: min_learning_rate, the handout's floor of the LR, is absolute.*"
                                          r"give min_lr_ratio = min_learning_rate / max_learning_rate instead"):
        parse_set_args(["min_learning_rate=1e-4"])


def test_cosine_cycle_iters_is_refused_naming_steps():
    with pytest.raises(LmtuneError, match=r"^--set: cosine_cycle_iters is no setting of lmtune's: .*cosine_cycle_iters "
                                          r"is steps - 1; give steps \(the handout's max_iters\) instead$"):
        parse_set_args(["cosine_cycle_iters=99"])


def test_max_l2_norm_zero_is_refused_as_grad_clip_zero_would_turn_clipping_off():
    with pytest.raises(LmtuneError, match=r"max_l2_norm=0 would scale every gradient to zero .* give grad_clip=0 for "
                                          r"no clipping"):
        parse_set_args(["max_l2_norm=0.0"])


def test_a_space_files_set_section_refuses_min_learning_rate_in_one_line():
    with pytest.raises(LmtuneError, match=r"space.yaml: set: min_learning_rate, the handout's floor"):
        parse_space({"search": "grid", "budget": "quick", "params": {"lr": [1e-3]},
                     "set": {"min_learning_rate": 1e-4}}, Path("space.yaml"))


def test_the_handouts_batch_size_and_context_length_are_lmtunes_own_names():
    assert parse_set_args(["batch_size=8", "context_length=64"]) == {"batch_size": "8", "context_length": "64"}


def test_run_refuses_max_learning_rate_where_the_space_searches_the_lr(capsys):
    from lmtune.run import main

    assert_refused(main, ["--space", "quick_edge", "--set", "max_learning_rate=0.001"], capsys,
                   "--set max_learning_rate (the handout's name for lr): the space quick_edge searches lr",
                   "drop --set max_learning_rate")


def test_train_refuses_the_peak_lr_given_by_lr_and_by_max_learning_rate(capsys, tmp_path: Path):
    from lmtune.train import main

    assert_refused(main, ["--lr", "0.001", "--set", "max_learning_rate=0.002", "--out", str(tmp_path / "run")], capsys,
                   "--lr and --set max_learning_rate (the handout's name for lr) both give the peak LR; give it once")


def test_lr_find_refuses_max_learning_rate_by_the_name_it_was_given(capsys):
    from lmtune.lr_find import main

    assert_refused(main, ["--set", "max_learning_rate=0.002"], capsys,
                   "lr_find: --set max_learning_rate (the handout's name for lr) has no effect")
