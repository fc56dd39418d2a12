import numpy as np
import pytest
import torch

from lmtune.findings.sharpness import adam_threshold, gd_threshold
from lmtune.report.sharpness import (
    checkpoint_sharpness,
    hessian_top_eigenvalue,
    preconditioned_sharpness,
)
from lmtune.training.checkpoint import save_checkpoint
from lmtune.training.config import RunConfig, TrainConfig
from lmtune.training.model import TransformerLM
from lmtune.training.model_config import ModelConfig


@pytest.fixture(autouse=True)
def one_thread():
    # Tiny tensors gain nothing from intra-op threads, and on a shared 2-core box a busy neighbour
    # turns OpenMP spin-waiting into a 100x slowdown.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def symmetric_with_eigenvalues(eigenvalues, seed=0):
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((len(eigenvalues), len(eigenvalues))))
    return q @ np.diag(eigenvalues) @ q.T


def quadratic(a: np.ndarray):
    a_t = torch.tensor(a, dtype=torch.float64)
    x = torch.randn(a.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(0)).requires_grad_()
    return (lambda: 0.5 * x @ a_t @ x), [x]


@pytest.mark.parametrize("eigenvalues", [[10.0, 4.0, 2.0, 1.0, -0.5, 0.1], [-9.0, 3.0, 1.0, 0.5, 0.2]])
def test_top_eigenvalue_of_a_quadratic_matches_eigvalsh(eigenvalues):
    a = symmetric_with_eigenvalues(eigenvalues)
    loss_fn, params = quadratic(a)
    expected = max(np.linalg.eigvalsh(a), key=abs)
    estimate = hessian_top_eigenvalue(loss_fn, params, iters=100, tol=1e-8)
    assert estimate == pytest.approx(expected, rel=0.01)


def test_top_eigenvalue_of_least_squares_is_that_of_2_xtx_over_n():
    rng = np.random.default_rng(1)
    n, d = 40, 6
    features = rng.standard_normal((n, d)) * np.array([3.0, 1.0, 1.0, 0.5, 0.5, 0.2])
    targets = rng.standard_normal(n)
    x_t, y_t = torch.tensor(features), torch.tensor(targets)
    # Two parameter tensors (weight and bias) to exercise the multi-tensor path.
    w = torch.zeros(d, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    estimate = hessian_top_eigenvalue(lambda: ((x_t @ w + b - y_t) ** 2).mean(), [w, b], iters=200, tol=1e-10)
    design = np.hstack([features, np.ones((n, 1))])
    expected = np.linalg.eigvalsh(2 * design.T @ design / n).max()
    assert estimate == pytest.approx(expected, rel=0.01)


def test_linear_loss_has_zero_sharpness():
    w = torch.ones(3, requires_grad=True)
    assert hessian_top_eigenvalue(lambda: w.sum() * 2.0, [w]) == 0.0


def test_preconditioned_sharpness_matches_scaled_hessian():
    a = symmetric_with_eigenvalues([8.0, 3.0, 1.0, 0.5, 0.25], seed=3)
    loss_fn, params = quadratic(a)
    v = torch.tensor([4.0, 1.0, 0.25, 9.0, 0.01], dtype=torch.float64)
    step, beta2, eps = 10, 0.95, 1e-8
    estimate = preconditioned_sharpness(loss_fn, params, [v], step, beta2, eps, iters=300, tol=1e-10)
    d = np.sqrt(v.numpy() / (1 - beta2**step)) + eps
    scaled = a / np.sqrt(np.outer(d, d))
    expected = max(np.linalg.eigvalsh(scaled), key=abs)
    assert estimate == pytest.approx(expected, rel=0.01)


def test_thresholds():
    assert gd_threshold(0.01) == pytest.approx(200.0)
    assert adam_threshold(0.01, 0.9) == pytest.approx(3800.0)


def test_checkpoint_sharpness_on_a_tiny_trained_transformer(tmp_path):
    torch.manual_seed(0)
    model_cfg = ModelConfig(vocab_size=31, context_length=8, d_model=16, d_ff=32, n_layers=1, n_heads=2)
    config = RunConfig(model=model_cfg, train=TrainConfig(lr=3e-3, beta1=0.9, beta2=0.95, eps=1e-8),
                       vocab_from_data=False)
    model = TransformerLM(model_cfg)
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-3, betas=(0.9, 0.95), eps=1e-8)
    x = torch.randint(0, 31, (4, 8))
    y = torch.roll(x, -1, dims=1)
    for _ in range(3):
        opt.zero_grad()
        model(x, y).backward()
        opt.step()
    path = save_checkpoint({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 3,
                            "config": config.to_dict()}, tmp_path / "step_00000003.pt")

    result = checkpoint_sharpness(path, config.model, (x, y), iters=30)

    assert result.step == 3
    assert result.lr_at_step == pytest.approx(3e-3)
    assert result.gd_threshold == pytest.approx(2 / 3e-3)
    assert result.adam_threshold == pytest.approx(38 / 3e-3)
    assert np.isfinite(result.sharpness) and result.sharpness != 0
    assert np.isfinite(result.preconditioned_sharpness)
    # Adam's preconditioner divides by sqrt(v) << 1 this early, so the preconditioned value is far larger.
    assert abs(result.preconditioned_sharpness) > abs(result.sharpness)
    # Same answer from the checkpoint's own config.
    again = checkpoint_sharpness(path, None, (x, y), iters=30)
    assert again.sharpness == pytest.approx(result.sharpness, rel=1e-6)
    # The optimizer state is matched to the right parameters: same value as from the live optimizer.
    for block in model.blocks:
        block.attn.use_sdpa = False
    params = list(model.parameters())
    direct = preconditioned_sharpness(lambda: model(x, y), params, [opt.state[p]["exp_avg_sq"] for p in params],
                                      3, 0.95, 1e-8, iters=30)
    assert result.preconditioned_sharpness == pytest.approx(direct, rel=1e-5)
