"""The compare search's variants of a user's own model, Ray-free: a variant passes arguments to the model's callable
(``model_set:``) or trains another model (``model:``); each trial carries them and trains with them; a variant the
user's model cannot build (an argument it does not take, a switch of lmtune's model) is refused in one line before
any trial starts. The sweep as a user runs it: tests/test_compare_sweep.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import yaml
from conftest import EXAMPLE, TINY_TRIAL, USER_MODELS

from lmtune.errors import LmtuneError
from lmtune.searches.compare.search import CompareSearch
from lmtune.searches.trial_order import TrialOrder
from lmtune.sweep.experiment import trial_dirname
from lmtune.sweep.plan import SweepPlan
from lmtune.sweep.spaces import load_space
from lmtune.training.config import budget_config

GPT_STYLE = f"{USER_MODELS / 'gpt_style.py'}:make"


def plan_of(tmp_path, variants: dict, **space_keys) -> SweepPlan:
    """The plan of a compare space over the example model (its own ``model_set:`` from ``space_keys``)."""
    space = {"search": "compare", "budget": "quick", "scheduler": {"name": "none"}, "model": EXAMPLE,
             "set": TINY_TRIAL, "variants": variants, **space_keys}
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(space, sort_keys=False))
    loaded = load_space(str(path))
    return SweepPlan.create(loaded, budget_config(loaded.budget, loaded.fixed, code=loaded.code))


def variant_config(plan: SweepPlan, name: str):
    return plan.space.strategy.settings.variant(name).config(plan.base)


def test_a_variant_passes_its_arguments_to_the_users_model_and_the_reference_none(tmp_path):
    plan = plan_of(tmp_path, {"reference": {}, "nope": {"model_set": {"use_rope": False}}})
    assert variant_config(plan, "nope").code.model_args == {"use_rope": False}
    assert variant_config(plan, "reference").code.model_args == {}
    assert variant_config(plan, "nope").code.model == plan.base.code.model


def test_a_variants_arguments_update_the_spaces_own(tmp_path):
    plan = plan_of(tmp_path, {"reference": {}, "rope": {"model_set": {"use_rope": True}}},
                   model_set={"use_rope": False})
    assert variant_config(plan, "reference").code.model_args == {"use_rope": False}
    assert variant_config(plan, "rope").code.model_args == {"use_rope": True}


def test_a_variant_naming_another_model_gives_it_only_its_own_arguments(tmp_path):
    plan = plan_of(tmp_path, {"reference": {}, "gpt": {"model": GPT_STYLE, "model_set": {"bias": True}}},
                   model_set={"use_rope": False})
    code = variant_config(plan, "gpt").code
    assert (code.model, code.model_args) == (GPT_STYLE, {"bias": True})
    assert GPT_STYLE in plan.trial_setup().code_path or str(USER_MODELS) in plan.trial_setup().code_path


def test_each_trial_carries_its_variants_arguments_and_trains_with_them(tmp_path):
    plan = plan_of(tmp_path, {"reference": {}, "nope": {"model_set": {"use_rope": False}}})
    search = CompareSearch(plan.space.strategy.settings, plan.budget(), max_pending=2)
    orders = {}
    for trial in ("t1", "t2"):  # the reference's range test, then (it waits on it) the variant's
        order = TrialOrder.from_tune(search.suggest(trial))
        orders[order.variant] = order
    assert orders["nope"].run_config(plan.base, "trial t2", checked=True).code.model_args == {"use_rope": False}
    assert orders["reference"].run_config(plan.base, "trial t1", checked=False).code.model_args == {}


def test_a_trial_folder_names_the_models_argument_not_the_models_path():
    trial = SimpleNamespace(trial_id="abc_00001", config={"model": GPT_STYLE, "model_set.use_rope": False,
                                                          "variant": "nope", "lr": 0.01})
    name = trial_dirname(trial)
    assert "/" not in name and "use_rope=False" in name and "variant=nope" in name


@pytest.mark.parametrize("variant, problem", [
    ({"model_set": {"use_rop": False}}, r"^variants\.nope: --model-set use_rop: .* takes no argument 'use_rop'"),
    ({"set": {"norm": "none"}}, r"^variants\.nope: norm='none' is a switch of lmtune's model"),
    ({"model": f"{USER_MODELS / 'nothing_here.py'}:Model"}, r"variants\.nope\.model: no file"),
    ({"model_set": ["use_rope"]}, r"variants\.nope\.model_set: must be a mapping"),
    ({"model_set": {"use_rope": [1]}}, r"variants\.nope\.model_set\.use_rope: .* not a number, true/false or text"),
    ({"models": {}}, r"variants\.nope\.models: unknown key; valid keys: batch_size, model, model_set, set"),
])
def test_a_variant_the_users_model_cannot_build_is_refused_in_one_line_before_any_trial(tmp_path, variant, problem):
    with pytest.raises(LmtuneError, match=problem) as err:
        plan_of(tmp_path, {"reference": {}, "nope": variant})
    assert "\n" not in str(err.value)


def test_arguments_for_a_model_no_one_names_are_refused_in_one_line(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump({"search": "compare", "budget": "quick", "scheduler": {"name": "none"},
                                    "variants": {"reference": {}, "nope": {"model_set": {"use_rope": False}}}}))
    space = load_space(str(path))  # (--model may still name one on the command line)
    with pytest.raises(LmtuneError, match=r"^variants\.nope: --model-set use_rope: .* no --model names it"):
        SweepPlan.create(space, budget_config(space.budget, space.fixed))


def test_the_variants_arguments_survive_the_search_state_json(tmp_path):
    plan = plan_of(tmp_path, {"reference": {}, "nope": {"model_set": {"use_rope": False}}})
    search = CompareSearch(plan.space.strategy.settings, plan.budget())
    again = CompareSearch.from_json(json.loads(json.dumps(search.to_json())))
    assert again.settings.variant("nope").config(plan.base).code.model_args == {"use_rope": False}
