"""The ablation switches of lmtune's model (CS336 assignment 1): norm pre | post | none, position rope | nope,
ffn swiglu | silu. Each variant's forward is checked against one computed here by hand from the model's own weights;
the defaults are the model as it was."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import user_model

from lmtune.errors import LmtuneError
from lmtune.training.config import RunConfig, validate
from lmtune.training.model import TransformerLM, count_parameters
from lmtune.training.model_config import ModelConfig

TINY = ModelConfig(vocab_size=50, context_length=8, d_model=16, d_ff=24, n_layers=2, n_heads=2)


def _rms(x: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * gain


def _rotate(x: torch.Tensor) -> torch.Tensor:
    """RoPE by hand: each pair (x_i, x_{i+h}) rotated by position * 10000^(-2i/head_dim)."""
    t, d = x.shape[-2], x.shape[-1]
    angle = torch.arange(t, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(0, d, 2) / d)[None, :]
    cos, sin = angle.cos().float(), angle.sin().float()
    a, b = x[..., : d // 2], x[..., d // 2:]
    return torch.cat((a * cos - b * sin, a * sin + b * cos), -1)


def _attention(block, x: torch.Tensor, rope: bool) -> torch.Tensor:
    b, t, d = x.shape
    heads = block.attn.n_heads
    q, k, v = (x @ block.attn.qkv.weight.T).view(b, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
    if rope:
        q, k = _rotate(q), _rotate(k)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(d // heads)
    scores = scores.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
    return (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d) @ block.attn.out.weight.T


def _ffn(block, x: torch.Tensor, gated: bool) -> torch.Tensor:
    f = block.ffn
    hidden = F.silu(x @ f.gate.weight.T) * (x @ f.up.weight.T) if gated else F.silu(x @ f.up.weight.T)
    return hidden @ f.down.weight.T


def by_hand(model: TransformerLM, idx: torch.Tensor) -> torch.Tensor:
    cfg = model.cfg
    rope, gated = cfg.position == "rope", cfg.ffn == "swiglu"
    x = model.embed.weight[idx]
    for block in model.blocks:
        if cfg.norm == "post":
            x = _rms(x + _attention(block, x, rope), block.attn_norm.weight)
            x = _rms(x + _ffn(block, x, gated), block.ffn_norm.weight)
        elif cfg.norm == "pre":
            x = x + _attention(block, _rms(x, block.attn_norm.weight), rope)
            x = x + _ffn(block, _rms(x, block.ffn_norm.weight), gated)
        else:
            x = x + _attention(block, x, rope)
            x = x + _ffn(block, x, gated)
    if cfg.norm != "none":
        x = _rms(x, model.final_norm.weight)
    return x @ model.lm_head.weight.T


VARIANTS = [{}, {"norm": "post"}, {"norm": "none"}, {"position": "nope"}, {"ffn": "silu"},
            {"ffn": "silu", "d_ff": 0}, {"norm": "none", "position": "nope", "ffn": "silu"}]


@pytest.mark.parametrize("switches", VARIANTS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()) or "default")
def test_each_variants_forward_is_the_one_computed_by_hand(switches):
    torch.manual_seed(0)
    model = TransformerLM(dataclasses.replace(TINY, **switches))
    with torch.no_grad():  # gains away from 1, so that a missing or misplaced norm shows
        for module in model.modules():
            if isinstance(module, torch.nn.RMSNorm):
                module.weight.uniform_(0.5, 1.5)
    idx = torch.randint(0, TINY.vocab_size, (3, TINY.context_length))
    torch.testing.assert_close(model(idx), by_hand(model, idx), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("switches", VARIANTS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()) or "default")
def test_each_variants_parameter_count_is_what_it_holds(switches):
    cfg = dataclasses.replace(TINY, **switches)
    held = sum(p.numel() for p in TransformerLM(cfg).parameters())
    assert count_parameters(cfg)["total"] == held


def test_the_default_switches_build_the_model_as_before_bit_for_bit():
    """The same seed, the same weights and the same logits as a model built without naming any switch."""
    torch.manual_seed(3)
    plain = TransformerLM(TINY)
    torch.manual_seed(3)
    named = TransformerLM(dataclasses.replace(TINY, norm="pre", position="rope", ffn="swiglu"))
    idx = torch.randint(0, TINY.vocab_size, (2, TINY.context_length))
    assert plain.state_dict().keys() == named.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), named.state_dict().values(),
                                                 strict=True))
    assert torch.equal(plain(idx), named(idx))


def test_a_silu_ffn_of_d_ff_0_is_four_times_d_model_wide_and_matches_swiglus_parameters_at_8_3():
    silu = dataclasses.replace(TINY, ffn="silu", d_ff=0)
    assert silu.ffn_width == 64
    swiglu = dataclasses.replace(TINY, d_ff=round(8 / 3 * TINY.d_model))
    assert abs(count_parameters(silu)["non_embedding"] - count_parameters(swiglu)["non_embedding"]) <= 3 * 16 * 2


@pytest.mark.parametrize(("switches", "refused"), [
    ({"norm": "sideways"}, "norm must be one of pre, post, none"),
    ({"position": "alibi"}, "position must be one of rope, nope"),
    ({"ffn": "relu"}, "ffn must be one of swiglu, silu"),
    ({"d_ff": 0}, "d_ff must be a positive integer (got 0; 0, for 4 x d_model, with ffn=silu only)"),
    ({"norm": "post", "parametrization": "mup"}, "parametrization=mup is written and checked for the pre-norm"),
])
def test_a_switch_no_run_could_use_is_one_line(switches, refused):
    with pytest.raises(LmtuneError) as caught:
        validate(RunConfig(model=dataclasses.replace(TINY, **switches)))
    assert refused in str(caught.value) and "\n" not in str(caught.value)


def test_nope_lifts_rope_s_even_head_dimension():
    validate(RunConfig(model=dataclasses.replace(TINY, d_model=18, n_heads=2, position="nope")))


def test_a_users_model_refuses_lmtunes_ablation_switches_naming_model_set():
    config = RunConfig(model=dataclasses.replace(TINY, norm="post"), code=user_model("example"))
    with pytest.raises(LmtuneError, match="norm='post' is a switch of lmtune's model, .* --model-set"):
        validate(config)
