"""One training spec (issue 58 item 3): training asks a TrainSpec how a run builds its model, optimizer and schedule,
imports nothing of lmtune.usercode, and never asks whose model it trains."""

from __future__ import annotations

import ast

import pytest
from conftest import user_model
from test_layout import PACKAGE, REPO, import_graph

from lmtune.errors import LmtuneError
from lmtune.training.config import RunConfig
from lmtune.training.spec import LMTUNE, lmtune_spec
from lmtune.usercode.checks import builds_share_state
from lmtune.usercode.config import UserCode
from lmtune.usercode.spec import UserModel, UserSchedule, spec_for

# Where "is it the user's code?" may be asked: the code record that defines it, the spec modules and the user's side.
MAY_ASK = ("lmtune/training/code.py", "lmtune/training/spec.py", "lmtune/usercode/")
# Issue 58 item 3's leftovers: modules outside training that still ask, each to go (not to grow). The report words a
# user's model as "your ..." from a recorded fact (sweep.json's --model, summary.json's ModelFacts.user_model); what
# it measured (the attention-logit probe) it reads from the trials' metrics, and the sweep asks the user's code's
# checks whether a worker may run the next trial (lmtune.usercode.checks.builds_share_state).
STILL_ASK = {"lmtune/report/markdown/model.py", "lmtune/report/sweep_facts.py", "lmtune/report/summary.py"}
ASKING = {"user_model", "is_lmtune_model"}


def test_training_imports_nothing_of_usercode():
    found = sorted(f"{module} -> {target}" for module, targets in import_graph().items()
                   if module.startswith("lmtune.training") for target in targets
                   if target.startswith("lmtune.usercode"))
    assert not found, found


def _asking_modules() -> set[str]:
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        names = {node.attr if isinstance(node, ast.Attribute) else node.id
                 for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, ast.Attribute | ast.Name)}
        if names & ASKING:
            found.add(path.relative_to(REPO).as_posix())
    return found


def test_no_module_but_the_spec_modules_asks_whose_model_it_trains():
    asking = _asking_modules()
    assert "lmtune/training/code.py" in asking  # (the check sees the record's own property)
    outside = {m for m in asking if not m.startswith(MAY_ASK)}
    assert not any(m.startswith(("lmtune/training/", "lmtune/fused/")) for m in outside), outside
    assert outside <= STILL_ASK, sorted(outside - STILL_ASK)


def test_a_run_naming_no_code_trains_with_lmtunes_spec_and_each_named_part_is_the_users(make_tiny_config):
    assert spec_for(RunConfig()) == LMTUNE
    config = make_tiny_config(code=UserCode(schedule="m:f"))
    spec = spec_for(config)
    assert spec.model is LMTUNE.model and spec.optimizer is LMTUNE.optimizer
    assert spec.schedule == UserSchedule("m:f")
    assert isinstance(spec_for(make_tiny_config(code=user_model("example"))).model, UserModel)


def test_training_given_no_spec_refuses_a_run_that_names_the_users_code(make_tiny_config):
    with pytest.raises(LmtuneError, match="given lmtune's training spec; resolve it with .*spec_for"):
        lmtune_spec(make_tiny_config(code=user_model("example")))
    assert lmtune_spec(make_tiny_config()) is LMTUNE


def test_the_fingerprint_a_resume_checks_is_the_users_models_parameters_and_none_for_lmtunes(make_tiny_config):
    config = make_tiny_config(code=user_model("example"))
    fingerprint = spec_for(config).model.fingerprint(config)
    assert len(fingerprint) == 16
    wider = make_tiny_config(code=user_model("example"), d_model=64, d_ff=128)
    assert spec_for(wider).model.fingerprint(wider) != fingerprint
    assert LMTUNE.model.fingerprint(make_tiny_config()) == ""


def test_whether_a_worker_may_run_the_next_trial_is_the_user_codes_finding(make_tiny_config):
    assert not builds_share_state(make_tiny_config())
    assert not builds_share_state(make_tiny_config(code=user_model("example")))
    assert builds_share_state(make_tiny_config(code=user_model("shared_rope.py:CachedRopeLM")))
