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
# Outside them the name appears only where summary.json's `user_model` key is carried from sweep.json's code into the
# report's typed summary; nothing there branches on it (the report's words for the model are UserCode.title's).
CARRY_THE_RECORD = {"lmtune/report/sweep_facts.py", "lmtune/findings/summary.py"}
ASKING = {"user_model", "is_lmtune_model"}


def test_training_imports_nothing_of_usercode():
    found = sorted(f"{module} -> {target}" for module, targets in import_graph().items()
                   if module.startswith("lmtune.training") for target in targets
                   if target.startswith("lmtune.usercode"))
    assert not found, found


def _names(tree: ast.AST) -> set[str]:
    return {node.attr if isinstance(node, ast.Attribute) else node.id for node in ast.walk(tree)
            if isinstance(node, ast.Attribute | ast.Name)}


def _conditions(tree: ast.AST) -> list[ast.AST]:
    """Every condition a module decides on: of an if, a conditional expression, a while, an assert, a
    comprehension's filter, and each operand of and/or (``x.user_model or y`` picks by it too)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If | ast.IfExp | ast.While | ast.Assert):
            found.append(node.test)
        elif isinstance(node, ast.comprehension):
            found += node.ifs
        elif isinstance(node, ast.BoolOp):
            found += node.values
    return found


def _modules_naming(branching: bool) -> set[str]:
    """The modules that name whose model it is (``branching``: in a condition they decide on)."""
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        parts = _conditions(tree) if branching else [tree]
        if any(_names(part) & ASKING for part in parts):
            found.add(path.relative_to(REPO).as_posix())
    return found


def test_the_branch_finder_sees_a_branch_on_whose_model_it_is():
    assert _conditions(ast.parse("a = 1 if m.user_model else 2"))
    assert any(_names(c) & ASKING for c in _conditions(ast.parse("name = facts.user_model and 'your'")))
    assert "lmtune/training/code.py" in _modules_naming(branching=True)  # (UserCode.title's own branch)


def test_no_module_but_the_spec_modules_branches_on_whose_model_it_trains():
    outside = {m for m in _modules_naming(branching=True) if not m.startswith(MAY_ASK)}
    assert not outside, sorted(outside)


def test_outside_the_spec_modules_the_name_only_carries_the_record_into_the_summary():
    outside = {m for m in _modules_naming(branching=False) if not m.startswith(MAY_ASK)}
    assert not any(m.startswith(("lmtune/training/", "lmtune/fused/")) for m in outside), outside
    assert outside <= CARRY_THE_RECORD, sorted(outside - CARRY_THE_RECORD)


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


def test_the_report_names_the_users_model_as_theirs_from_the_code_record_and_summary_json_keeps_the_fact():
    from lmtune.findings.summary import ModelFacts
    from lmtune.report.markdown.model import model_overview

    def overview(code: UserCode) -> str:
        facts = type("Facts", (), {"model": ModelFacts(code.describe(), code.user_model, title=code.title())})
        return model_overview(facts)[0]

    users = overview(user_model("example", d_model=64))
    assert users.startswith("**Model**: your `") and "(d_model=64)`" in users
    assert overview(UserCode()) == "**Model**: lmtune's TransformerLM."
    facts = ModelFacts("m.py:M", True, title="your `m.py:M`")
    assert facts.to_json()["user_model"] is True and "title" not in facts.to_json()
