"""μP (parametrization: mup): it is SP at its base shape, scales the hidden matrices' LR and decay and the
logits with the width elsewhere, and trains, resumes, fuses and compiles like the standard model."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from conftest import TINY, assert_refused

from lmtune.data.batches import BatchSampler
from lmtune.data.dataset import load_data
from lmtune.errors import LmtuneError
from lmtune.fused.state import FusedState
from lmtune.fused.step import fused_train_step
from lmtune.train import main
from lmtune.training import checkpoint as ckpt
from lmtune.training.config import budget_config
from lmtune.training.loop import resolve_config, train
from lmtune.training.model import HIDDEN, TransformerLM
from lmtune.training.schedule import lr_at
from lmtune.training.state import TrainState, build_optimizer
from lmtune.training.step import Runtime, train_step

CPU = torch.device("cpu")
# A small model of its own vocabulary and context, d_model 32 in 2 heads of 16.
SMALL = {**TINY, "vocab_size": 64, "context_length": 16}
# μP at twice its base width and half its base head dimension's scale, so every μP rule acts.
MUP_2X = dict(parametrization="mup", mup_base_width=16, mup_base_head_dim=8)


def _config(**overrides):
    return budget_config("quick", {**SMALL, **overrides})


def _batch(config, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    shape = (config.train.batch_size, config.model.context_length)
    x = torch.randint(0, config.model.vocab_size, shape, generator=generator)
    return x, torch.randint(0, config.model.vocab_size, shape, generator=generator)


def _trained(config, steps: int) -> TrainState:
    """``steps`` real train_steps (build_optimizer's AdamW, LR 1e-2) on fixed random batches."""
    state = TrainState.create(config, CPU)
    runtime = Runtime(CPU, state.model, None, compiled=False)
    for step in range(steps):
        x, y = _batch(config, step)
        assert train_step(state, runtime, x, y, 1e-2, config.train).applied
    return state


def test_at_its_base_width_and_head_dim_mup_is_sp_bit_for_bit_at_init_in_the_logits_and_after_three_steps():
    # torch.equal, no tolerance: at the base shape every multiplier is exactly 1 (groups, init std, output
    # scale), the attention scale is SDPA's own default, and so every operation is SP's.
    sp = _config()
    mup = _config(parametrization="mup", mup_base_width=32, mup_base_head_dim=16)
    x, _ = _batch(sp)
    sp_state, mup_state = TrainState.create(sp, CPU), TrainState.create(mup, CPU)
    assert mup_state.model.width_multiplier == 1.0
    for (name, a), b in zip(sp_state.model.named_parameters(), mup_state.model.parameters(), strict=True):
        assert torch.equal(a, b), name
    assert torch.equal(sp_state.model(x), mup_state.model(x))
    after_sp, after_mup = _trained(sp, 3).model, _trained(mup, 3).model
    for (name, a), b in zip(after_sp.named_parameters(), after_mup.parameters(), strict=True):
        assert torch.equal(a, b), name


def test_at_twice_the_base_width_hidden_matrices_take_half_the_lr_and_twice_the_weight_decay():
    state = _trained(_config(**MUP_2X), 1)
    assert state.model.width_multiplier == 2.0
    names = {id(p): name for name, p in state.model.named_parameters()}
    by_name = {names[id(p)]: group for group in state.optimizer.param_groups for p in group["params"]}
    embed, gain = by_name["embed.weight"], by_name["final_norm.weight"]
    assert embed["lr"] == 1e-2 and by_name["lm_head.weight"] is embed and gain["weight_decay"] == 0.0
    hidden = [name for name in by_name if name.endswith(HIDDEN)]
    assert len(hidden) == 5 * 2
    for name in hidden:
        assert by_name[name]["lr"] == embed["lr"] / 2, name
        assert by_name[name]["weight_decay"] == 2 * embed["weight_decay"], name


def test_under_sp_every_parameter_group_takes_the_schedules_lr():
    state = _trained(_config(d_model=64, n_heads=4), 1)
    assert state.model.width_multiplier == 1.0
    assert set(state.model.lr_multipliers().values()) == {1.0}
    assert [group["lr"] for group in state.optimizer.param_groups] == [1e-2, 1e-2]


def test_mup_logits_at_twice_the_base_width_are_lm_head_of_the_hidden_states_halved():
    config = _config(**MUP_2X)
    model = TrainState.create(config, CPU).model
    x, _ = _batch(config)
    with torch.no_grad():
        assert torch.equal(model(x), model.lm_head(model.hidden(x)) / 2)


def test_mup_output_layer_init_keeps_the_base_shapes_std_whatever_the_width():
    def lm_head_std(d_model: int) -> float:
        torch.manual_seed(0)
        config = _config(parametrization="mup", mup_base_width=32, d_model=d_model, n_heads=d_model // 16,
                         vocab_size=4096).model
        return TransformerLM(config).lm_head.weight.std().item()

    base, wide = lm_head_std(32), lm_head_std(128)
    assert wide == pytest.approx(base, rel=0.05)
    assert base == pytest.approx((2 / (32 + 4096)) ** 0.5, rel=0.05)


def test_a_bf16_autocast_forward_of_a_mup_model_is_finite():
    config = _config(**MUP_2X)
    model = TrainState.create(config, CPU).model
    x, y = _batch(config)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, loss = model(x), model(x, y)
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits).all() and torch.isfinite(loss)


# ---------------------------------------------------------------------------------------------- training


@pytest.mark.slow
def test_a_mup_run_trains_to_a_finite_loss_and_a_resumed_one_ends_as_the_uninterrupted_one(
        make_tiny_config, tmp_path):
    config = make_tiny_config(**MUP_2X)
    whole = train(config, tmp_path / "whole")
    uniform = math.log(resolve_config(config, Path(config.data_dir)).model.vocab_size)
    assert whole.status == "completed" and whole.summary["final_val_loss"] < uniform - 0.3  # it learned

    def crash_at_17(step, model):
        if step == 17:
            raise RuntimeError("simulated crash")

    with pytest.raises(RuntimeError, match="simulated crash"):
        train(config, tmp_path / "resumed", before_step=crash_at_17)
    resumed = train(config, tmp_path / "resumed", resume=True)
    assert resumed.status == "completed"
    assert resumed.summary["final_val_loss"] == whole.summary["final_val_loss"]
    final = "checkpoints/step_00000030.pt"
    a, b = ckpt.load_checkpoint(tmp_path / "whole" / final), ckpt.load_checkpoint(tmp_path / "resumed" / final)
    assert all(torch.equal(a["model"][name], b["model"][name]) for name in a["model"])
    assert [g["lr_scale"] for g in b["optimizer"]["param_groups"]] == [1.0, 0.5, 1.0]  # the groups round-trip


def _member_configs(make_tiny_config, lrs=(3e-3, 1e-2)):
    return [resolve_config(c, Path(c.data_dir)) for c in
            (make_tiny_config(lr=lr, grad_clip=0.5, weight_decay=0.1, **MUP_2X) for lr in lrs)]


def _batches(config, steps: int):
    data = load_data(config.data_dir, config.model.context_length, config.model.vocab_size)
    sampler = BatchSampler(data.train, config.train.batch_size, config.model.context_length, config.train.seed)
    return [sampler.batch(step) for step in range(steps)]


def _lr(step: int, config) -> float:
    t = config.train
    return lr_at(step, t.lr, t.min_lr_ratio, t.warmup_steps, t.steps)


@pytest.mark.slow
def test_two_fused_mup_members_in_float64_train_exactly_as_each_trains_alone(make_tiny_config):
    configs = _member_configs(make_tiny_config)
    batches = _batches(configs[0], 12)
    fused = FusedState.create(configs, CPU, dtype=torch.float64)
    runtime = Runtime(CPU, fused.model, None, compiled=False)
    for step, (x, y) in enumerate(batches):
        fused_train_step(fused, runtime, x, y, torch.tensor([_lr(step, c) for c in configs], dtype=torch.float64))
    for k, config in enumerate(configs):
        alone = TrainState.create(config, CPU)
        alone.model.double()
        alone_runtime = Runtime(CPU, alone.model, None, compiled=False)
        for step, (x, y) in enumerate(batches):
            train_step(alone, alone_runtime, x, y, _lr(step, config), config.train)
        member = fused.model.member_state_dict(k)
        for name, weight in alone.model.state_dict().items():
            torch.testing.assert_close(member[name], weight, rtol=1e-9, atol=1e-12, msg=f"{k} {name}")


def test_a_fused_mup_members_checkpoint_state_goes_out_and_back_in_unchanged(make_tiny_config):
    configs = _member_configs(make_tiny_config)
    fused = FusedState.create(configs, CPU)
    runtime = Runtime(CPU, fused.model, None, compiled=False)
    for step, (x, y) in enumerate(_batches(configs[0], 3)):
        fused_train_step(fused, runtime, x, y, torch.tensor([_lr(step, c) for c in configs]))
    saved = fused.member_train_state(1, float("inf"), 0.0).state_dict()
    assert [g["weight_decay"] for g in saved["optimizer"]["param_groups"]] == [0.1, 0.2, 0.0]
    before = fused.optimizer.member_moments(1)
    fresh = FusedState.create(configs, CPU)
    fresh.load_member(1, saved)
    for name, (m, v) in fresh.optimizer.member_moments(1).items():
        assert torch.equal(m, before[name][0]) and torch.equal(v, before[name][1]), name


def test_a_mup_models_fused_adamw_forced_on_the_cpu_makes_the_foreach_adamws_updates():
    config = _config(**MUP_2X)

    def run(fused: bool) -> TrainState:
        state = TrainState.create(config, CPU)
        state.optimizer = build_optimizer(state.model, config, CPU, fused=fused)  # CUDA's kernel, CPU's build
        runtime = Runtime(CPU, state.model, None, compiled=False)
        for step in range(3):
            train_step(state, runtime, *_batch(config, step), 1e-2, config.train)
        return state

    foreach, fused = run(False), run(True)
    for a, b in zip(foreach.model.parameters(), fused.model.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_a_mup_model_compiled_on_the_cpu_gives_the_eager_loss():
    # aot_eager, as the CPU compile tests use: Dynamo traces the μP forward (its scales are constants of the
    # graph) and AOTAutograd its backward, without Inductor's C compiler.
    config = _config(**MUP_2X, compile="on", compile_backend="aot_eager")
    state = TrainState.create(config, CPU)
    x, y = _batch(config)
    torch.compiler.reset()
    try:
        runtime = Runtime.build(state.model, config, CPU, compiled=True)
        assert runtime.compiled
        compiled_loss = runtime.forward(x, y)
    finally:
        torch.compiler.reset()
    torch.testing.assert_close(compiled_loss, state.model(x, y), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------- validation


@pytest.mark.parametrize(("pair", "fix"), [("parametrization=xyz", "must be one of sp, mup"),
                                           ("mup_base_width=0", "mup_base_width must be a positive integer"),
                                           ("mup_base_head_dim=-1", "mup_base_head_dim must be a positive")])
def test_bad_mup_settings_are_refused_in_one_line_naming_the_fix(builtin_data, tmp_path, capsys, pair, fix):
    with pytest.raises(LmtuneError, match=fix):
        _config(**dict([pair.split("=")]))
    out = tmp_path / "run"
    assert_refused(main, ["--data", str(builtin_data), "--out", str(out), "--set", pair], capsys, fix)
    assert not out.exists()
