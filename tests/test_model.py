import math

import pytest
import torch
from conftest import TINY_MODEL

from lmtune.training.model import TransformerLM, apply_rope, count_parameters, flops_per_token, rope_tables
from lmtune.training.model_config import ModelConfig

# The tiny model with 4 heads, a context of 16 and a vocabulary of 97.
SMALL = ModelConfig(**{**TINY_MODEL, "vocab_size": 97, "context_length": 16, "n_heads": 4})


def small_model(**changes) -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM(ModelConfig(**{**SMALL.__dict__, **changes}))


def test_logits_have_shape_batch_by_time_by_vocab():
    idx = torch.randint(0, 97, (3, 16))
    assert small_model()(idx).shape == (3, 16, 97)


def test_loss_with_targets_is_a_scalar_near_log_vocab_at_init():
    idx = torch.randint(0, 97, (4, 16))
    loss = small_model()(idx, idx)
    assert loss.ndim == 0
    assert abs(loss.item() - math.log(97)) < 1.5


def test_changing_a_later_token_never_changes_earlier_logits():
    model = small_model().eval()
    idx = torch.randint(0, 97, (2, 16))
    changed = idx.clone()
    changed[:, 10] = (changed[:, 10] + 1) % 97
    a, b = model(idx), model(changed)
    torch.testing.assert_close(a[:, :10], b[:, :10])
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_rope_attention_scores_depend_only_on_relative_position():
    head_dim, context = 8, 32
    cos, sin = rope_tables(head_dim, context, 10000.0)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, 1, head_dim, generator=gen, dtype=torch.float64)
    k = torch.randn(1, 1, 1, head_dim, generator=gen, dtype=torch.float64)

    def score(pos_q: int, pos_k: int) -> float:
        qs = q.expand(1, 1, context, head_dim)
        ks = k.expand(1, 1, context, head_dim)
        rq = apply_rope(qs, cos.double(), sin.double())[0, 0, pos_q]
        rk = apply_rope(ks, cos.double(), sin.double())[0, 0, pos_k]
        return float(rq @ rk)

    for shift in (1, 5, 17):
        assert score(7 + shift, 3 + shift) == pytest.approx(score(7, 3), rel=1e-6)  # float32 tables
    assert score(7, 3) != pytest.approx(score(7, 4), rel=1e-3)


def test_sdpa_path_matches_plain_masked_softmax_in_float64():
    model = small_model().double().eval()
    idx = torch.randint(0, 97, (2, 16))
    fast = model(idx)
    for block in model.blocks:
        block.attn.use_sdpa = False
    slow = model(idx)
    torch.testing.assert_close(fast, slow, rtol=1e-10, atol=1e-10)


def test_default_config_has_the_cs336_parameter_counts():
    counts = count_parameters(ModelConfig())
    assert counts["non_embedding"] == 12_456_448  # blocks + final norm
    assert counts["non_embedding"] + counts["output"] == 17_576_448  # the CS336 "17M"
    model = TransformerLM(ModelConfig())
    assert sum(p.numel() for p in model.parameters()) == counts["total"]


def test_default_config_costs_about_112_mflop_per_token():
    assert flops_per_token(ModelConfig()) == pytest.approx(112e6, rel=0.02)


def test_qk_norm_and_z_loss_switches_change_the_model():
    idx = torch.randint(0, 97, (2, 16))
    base = small_model()(idx, idx)
    with_z = small_model(z_loss=1e-2)(idx, idx)
    assert with_z.item() > base.item()
    qk = small_model(qk_norm=True)
    assert qk.blocks[0].attn.q_norm is not None
    assert count_parameters(qk.cfg)["total"] == sum(p.numel() for p in qk.parameters())


def test_stability_probes_report_finite_attention_and_output_logits():
    probes = small_model().stability_probes(torch.randint(0, 97, (2, 16)))
    assert set(probes) == {"attn_logit_max", "output_logit_max", "output_logz_mean"}
    assert all(math.isfinite(v) for v in probes.values())


def test_every_rmsnorm_is_the_formula_with_eps_1e_minus_5():
    # An input whose mean square (1e-6) is far below the default 1.19e-7-eps regime's scale: the eps shows.
    model = small_model(qk_norm=True)
    x = torch.randn(3, 5, model.cfg.d_model, dtype=torch.float64) * 1e-3
    norms = [m for m in model.modules() if isinstance(m, torch.nn.RMSNorm)]
    assert len(norms) == 2 * len(model.blocks) + 1 + 2 * len(model.blocks)  # pre-norms, final, q/k norms
    for norm in norms:
        assert norm.eps == 1e-5
        data = x[..., : norm.normalized_shape[0]]
        gain = torch.linspace(0.5, 1.5, norm.normalized_shape[0], dtype=torch.float64)
        with torch.no_grad():
            norm.weight.copy_(gain.float())
        expected = data / torch.sqrt(data.pow(2).mean(-1, keepdim=True) + 1e-5) * gain
        torch.testing.assert_close(norm.double()(data), expected, rtol=1e-6, atol=1e-9)
