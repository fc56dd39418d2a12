"""A user's model's FLOPs are counted by torch's FlopCounterMode over one forward and backward (issue 56 item 5),
the 6N formula kept as the labelled fallback where the count fails."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import TINY_MODEL

from lmtune.findings.summary import ModelFacts
from lmtune.report.markdown.model import model_overview
from lmtune.training.config import budget_config
from lmtune.training.lm import formula_flops_per_token
from lmtune.usercode.config import UserCode
from lmtune.usercode.spec import model_size

EXAMPLE = str(Path(__file__).resolve().parents[1] / "examples" / "cs336_model.py") + ":TransformerLM"
BROKEN_FORWARD = '''
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)

    def forward(self, idx):
        raise RuntimeError("this model only runs inside its author's harness")
'''


def user_config(spec: str):
    return budget_config("quick", {**TINY_MODEL, "vocab_size": 256}, code=UserCode(spec))


def test_the_cs336_example_is_counted_and_agrees_with_the_formula_within_a_percent():
    config = user_config(EXAMPLE)
    size = model_size(config)
    assert size.counted and not size.estimated
    assert size.flops_per_token == pytest.approx(formula_flops_per_token(config, size.non_embedding), rel=0.01)


def test_a_model_whose_count_fails_falls_back_to_the_formula_and_says_so(tmp_path: Path):
    (tmp_path / "broken_forward.py").write_text(BROKEN_FORWARD)
    config = user_config(f"{tmp_path / 'broken_forward.py'}:Model")
    size = model_size(config)
    assert size.estimated and not size.counted
    assert size.flops_per_token == formula_flops_per_token(config, size.non_embedding)


def test_counting_leaves_the_random_state_as_it_was():
    config = budget_config("quick", {**TINY_MODEL, "vocab_size": 256, "d_model": 48, "n_heads": 3},
                           code=UserCode(EXAMPLE))  # a shape of its own: not a count cached by another test
    model_size(config, count_flops=False)  # the parameter shapes (one build, cached) first
    before = torch.get_rng_state()
    assert model_size(config).counted
    assert torch.equal(torch.get_rng_state(), before)


def test_the_report_says_a_user_models_flops_were_counted():
    facts = ModelFacts("examples/cs336_model.py:TransformerLM", True, 1000, 2000, 5e6, False, True)
    assert "counted by torch's FlopCounterMode" in "\n".join(model_overview_of(facts))


def model_overview_of(model: ModelFacts) -> list[str]:
    class Facts:  # the one field model_overview reads
        pass

    facts = Facts()
    facts.model = model
    return model_overview(facts)
