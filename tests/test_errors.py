"""Every exception class lmtune defines survives pickling and copying as it was (Ray copies an error from a trial's
process to the driver by pickling it, and a class that cannot be rebuilt turns one line into a Ray dump)."""

from __future__ import annotations

import ast
import copy
import pickle
from pathlib import Path

import pytest

from lmtune.errors import LmtuneError, UserCodeError
from lmtune.files import DiskFullError
from lmtune.report.run_tables import _RepeatedKey
from lmtune.sweep.hooks import StepHookError
from lmtune.sweep.spaces import _AliasRefused, _DuplicateKey
from lmtune.training.metric_registry import UnregisteredMetric
from lmtune.training.metrics import _OutOfRange
from lmtune.usercode.consent import FolderCodeRefused

PACKAGE = Path(__file__).resolve().parents[1] / "lmtune"
EXAMPLES = [LmtuneError("--fuse must be >= 1"), DiskFullError(Path("/tmp/no/such/folder/ckpt.pt"), 3 << 20),
            UnregisteredMetric("metrics row key 'x'"), _AliasRefused(7), _OutOfRange("step -6"),
            StepHookError("--step-hook 'h:f' raised ValueError: no"), _DuplicateKey("a", 6, 8),
            FolderCodeRefused("the checkpoint's model names trial/payload.py:Model; give --model or --trust-code"),
            UserCodeError("--model m.py:LM: running m.py raised ModuleNotFoundError: No module named 'einops'"),
            _RepeatedKey("val_loss")]


def test_every_exception_class_lmtune_defines_is_among_those_tested():
    defined = {node.name for path in PACKAGE.rglob("*.py") for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.ClassDef) and any(
                   isinstance(base, ast.Name | ast.Attribute) and (getattr(base, "id", None) or base.attr).endswith(
                       ("Error", "Exception", "Refused")) for base in node.bases)}
    assert defined <= {type(e).__name__ for e in EXAMPLES}, defined


@pytest.mark.parametrize("error", EXAMPLES, ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("how", [lambda e: pickle.loads(pickle.dumps(e)), copy.copy, copy.deepcopy],
                         ids=["pickle", "copy", "deepcopy"])
def test_an_exception_comes_back_as_it_was(error, how):
    again = how(error)
    assert type(again) is type(error) and str(again) == str(error) and again.args == error.args
    assert vars(again) == vars(error)
