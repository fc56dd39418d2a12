"""Fused trials: K learning rates trained as one model (horizontal fusion) train exactly as K separate runs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from conftest import user_model

from lmtune.data.batches import BatchSampler
from lmtune.data.dataset import load_data
from lmtune.errors import LmtuneError
from lmtune.fused.loop import train_fused
from lmtune.fused.state import FusedState
from lmtune.fused.step import fused_train_step
from lmtune.training.checkpoint import STABLE_NAME, load_checkpoint
from lmtune.training.lm import LanguageModelLoss
from lmtune.training.loop import resolve_config, train
from lmtune.training.metrics import METRICS_FILE, read_metrics
from lmtune.training.schedule import lr_at, scheduled_lr
from lmtune.training.state import TrainState
from lmtune.training.step import Runtime, train_step
from lmtune.usercode.spec import spec_for

LRS = (3e-3, 1e-2, 3e-2)


def _configs(make_tiny_config, lrs=LRS, **overrides):
    configs = []
    for lr in lrs:
        config = make_tiny_config(lr=lr, grad_clip=0.5, **overrides)
        configs.append(resolve_config(config, Path(config.data_dir)))
    return configs


def _batches(config, steps):
    data = load_data(config.data_dir, config.model.context_length, config.model.vocab_size)
    sampler = BatchSampler(data.train, config.train.batch_size, config.model.context_length, config.train.seed)
    return [sampler.batch(step) for step in range(steps)]


def _separate_runs(configs, batches):
    """Each config alone through the ordinary train_step, in float64: per-step losses, grad norms, final weights."""
    runs = []
    for config in configs:
        state = TrainState.create(config, torch.device("cpu"), spec_for(config))
        state.model.double()
        runtime = Runtime(torch.device("cpu"), LanguageModelLoss(state.model, config.model.z_loss), None,
                          compiled=False)
        t = config.train
        losses, norms = [], []
        for step, (x, y) in enumerate(batches):
            result = train_step(state, runtime, x, y, lr_at(step, t.lr, t.min_lr_ratio, t.warmup_steps, t.steps), t)
            losses.append(result.loss.item())
            norms.append(result.grad_norm.item())
        runs.append((losses, norms, state.model.state_dict()))
    return runs


def _fused_run(configs, batches, lr_scale=None):
    state = FusedState.create(configs, torch.device("cpu"), dtype=torch.float64, spec=spec_for(configs[0]))
    runtime = Runtime(torch.device("cpu"), state.model, None, compiled=False)
    losses, norms = [], []
    for step, (x, y) in enumerate(batches):
        lrs = torch.tensor([lr_at(step, c.train.lr, c.train.min_lr_ratio, c.train.warmup_steps, c.train.steps)
                            for c in configs], dtype=torch.float64)
        result = fused_train_step(state, runtime, x, y, lrs)
        losses.append(result.loss.tolist())
        norms.append(result.grad_norm.tolist())
    return state, losses, norms


def _close(a: float, b: float, rel: float = 1e-9) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-30)


# The model options that act on more than a matmul: per-head q/k RMSNorm and the z-loss on the logits; and a model of
# the user's own (lmtune's example: its own Linear, RoPE and attention, run under vmap as written).
MODEL_OPTIONS = [pytest.param({}, id="plain"), pytest.param({"qk_norm": True, "z_loss": 1e-3}, id="qk_norm+z_loss"),
                 pytest.param({"code": user_model("example"), "z_loss": 1e-3}, id="the example model")]


@pytest.mark.slow
@pytest.mark.parametrize("options", MODEL_OPTIONS)
def test_three_fused_members_in_float64_train_exactly_as_three_separate_runs_with_clipping(make_tiny_config, options):
    configs = _configs(make_tiny_config, **options)
    batches = _batches(configs[0], 20)
    separate = _separate_runs(configs, batches)
    state, losses, norms = _fused_run(configs, batches)
    for k, (alone_losses, alone_norms, alone_weights) in enumerate(separate):
        assert all(_close(f[k], a) for f, a in zip(losses, alone_losses, strict=True)), k
        assert all(_close(f[k], a) for f, a in zip(norms, alone_norms, strict=True)), k
        assert max(n[k] for n in norms) > configs[k].train.grad_clip  # clipping was active
        fused_weights = state.model.member_state_dict(k)
        for name, weight in alone_weights.items():
            scale = weight.abs().max().item()
            assert (fused_weights[name] - weight).abs().max().item() <= 1e-9 * scale, (k, name)


@pytest.mark.parametrize("options", MODEL_OPTIONS)
def test_each_members_stability_probes_are_its_own_models(make_tiny_config, options):
    # A seed each, so that the members' weights, and probes, differ.
    configs = [resolve_config(c, Path(c.data_dir)) for c in
               (make_tiny_config(lr=lr, seed=seed, **options) for seed, lr in enumerate(LRS))]
    state = FusedState.create(configs, torch.device("cpu"), dtype=torch.float64, spec=spec_for(configs[0]))
    x, _ = _batches(configs[0], 1)[0]
    fused = state.model.stability_probes(x)
    for k, config in enumerate(configs):
        spec = spec_for(config)
        alone = TrainState.create(config, torch.device("cpu"), spec).model.double()
        for name, value in spec.model.probes(alone, x).items():
            assert _close(fused[name][k].item(), value), (k, name)


def _train_group(make_tiny_config, root: Path, lrs, **overrides):
    configs = [make_tiny_config(lr=lr, **overrides) for lr in lrs]
    dirs = [root / f"m{k}" for k in range(len(lrs))]
    return train_fused(configs, dirs), dirs


def _curve(folder: Path, column: str) -> list:
    return [row[column] for row in read_metrics(folder / METRICS_FILE)]


@pytest.mark.slow
def test_a_diverging_member_is_dropped_at_its_divergence_step_and_the_others_go_on_bit_for_bit(
        make_tiny_config, tmp_path):
    with_it, dirs3 = _train_group(make_tiny_config, tmp_path / "three", (3e-3, 1e-2, 1e5))
    without, dirs2 = _train_group(make_tiny_config, tmp_path / "two", (3e-3, 1e-2))
    alone = train(make_tiny_config(lr=1e5), tmp_path / "alone")
    assert with_it[2].status == "diverged" and alone.status == "diverged"
    assert with_it[2].end.diverged_step == alone.end.diverged_step < 10
    for k in range(2):
        assert with_it[k].status == without[k].status == "completed"
        for column in ("train_loss", "val_loss", "grad_norm", "attn_logit_max"):
            assert _curve(dirs3[k], column) == _curve(dirs2[k], column), (k, column)
        final3 = load_checkpoint(dirs3[k] / "checkpoints" / "step_00000030.pt")["model"]
        final2 = load_checkpoint(dirs2[k] / "checkpoints" / "step_00000030.pt")["model"]
        assert all(torch.equal(final3[name], final2[name]) for name in final2)


@pytest.mark.slow
def test_a_members_checkpoint_resumes_as_an_ordinary_single_model_run(make_tiny_config, tmp_path):
    results, dirs = _train_group(make_tiny_config, tmp_path / "group", (3e-3, 1e-2))
    alone_dir = tmp_path / "alone" / "checkpoints"
    alone_dir.mkdir(parents=True)
    for name in ("step_00000010.pt", "step_00000010.pt.sha256"):
        shutil.copy(dirs[1] / "checkpoints" / name, alone_dir / name)
    resumed = train(make_tiny_config(lr=1e-2), alone_dir.parent, resume=True)
    assert resumed.status == "completed"
    # continued from step 10, not from scratch; its rows up to there are the member's, carried by the checkpoint
    assert "(step 10)" in (alone_dir.parent / "training.log").read_text()
    assert _curve(alone_dir.parent, "step")[:3] == [5, 10, 15]
    assert _curve(alone_dir.parent, "train_loss")[:2] == _curve(dirs[1], "train_loss")[:2]
    assert resumed.summary["final_val_loss"] == pytest.approx(results[1].summary["final_val_loss"], rel=1e-4)


@pytest.mark.slow
def test_an_interrupted_group_resumes_from_its_members_checkpoints_to_the_same_result(make_tiny_config, tmp_path):
    results, dirs = _train_group(make_tiny_config, tmp_path / "group", (3e-3, 1e-2, 1e5))
    for folder in dirs[:2]:  # as if killed just after step 10's checkpoints
        (folder / "summary.json").unlink()
        for step in (20, 30):
            (folder / "checkpoints" / f"step_{step:08d}.pt").unlink()
    configs = [make_tiny_config(lr=lr) for lr in (3e-3, 1e-2, 1e5)]
    resumed = train_fused(configs, dirs, resume=True)
    assert [r.status for r in resumed] == ["completed", "completed", "diverged"]
    for before, after in zip(results, resumed, strict=True):
        assert after.summary["final_val_loss"] == before.summary["final_val_loss"]
    assert _curve(dirs[0], "step") == [5, 10, 15, 20, 25, 30]  # every step once


def test_members_that_differ_in_more_than_their_optimizer_settings_are_refused(make_tiny_config, tmp_path):
    configs = [make_tiny_config(lr=1e-3), make_tiny_config(lr=1e-2, batch_size=4)]
    with pytest.raises(LmtuneError, match="batch_size"):
        train_fused(configs, [tmp_path / "a", tmp_path / "b"])


@pytest.mark.slow
def test_fused_members_under_wsd_follow_their_own_schedule_and_keep_their_stable_phases_end(make_tiny_config,
                                                                                              tmp_path):
    configs = _configs(make_tiny_config, lrs=(3e-3, 1e-2), schedule="wsd", cooldown_fraction=0.25)
    dirs = [tmp_path / f"m{k}" for k in range(len(configs))]
    results = train_fused(configs, dirs)
    for config, out, result in zip(configs, dirs, results, strict=True):
        t = config.train
        assert result.status == "completed"
        rows = read_metrics(out / METRICS_FILE)
        assert [r["lr"] for r in rows] == pytest.approx([scheduled_lr(r["step"] - 1, t) for r in rows], rel=1e-6)
        assert any(r["step"] == t.fork_step for r in rows)
        assert load_checkpoint(out / "checkpoints" / STABLE_NAME)["step"] == t.fork_step


def test_a_fused_group_attends_without_cudnns_kernel_which_does_not_compile_under_vmap(make_tiny_config, monkeypatch):
    """On an H200 (torch 2.11) torch.compile of a fused group failed at aten._scaled_dot_product_cudnn_attention
    under vmap and the group trained eager; with that kernel off inside the group's forward it compiled. The kernel
    is off only there: a single model's SDPA keeps its choice."""
    import lmtune.fused.model as fused_model

    configs = _configs(make_tiny_config, lrs=LRS[:2])
    state = FusedState.create(configs, torch.device("cpu"), spec=spec_for(configs[0]))
    seen = []
    real_vmap = fused_model.vmap

    def recording_vmap(*args, **kwargs):
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        return real_vmap(*args, **kwargs)

    monkeypatch.setattr(fused_model, "vmap", recording_vmap)
    before = torch.backends.cuda.cudnn_sdp_enabled()
    x, y = _batches(configs[0], 1)[0]
    losses = state.model(x, y)
    assert seen == [False] and losses.shape == (2,)
    assert torch.backends.cuda.cudnn_sdp_enabled() == before
