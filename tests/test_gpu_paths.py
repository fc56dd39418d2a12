"""What lmtune decides and does on a GPU, exercised on the CPU: no machine of this project has a GPU, so
every CUDA and MPS path is run here with the CPU standing in for the device, with a stand-in for
``torch.cuda`` where the call order is the behaviour, or with the hardware's answers monkeypatched."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os

import numpy as np
import pytest
import torch

from lmtune.data.batches import BatchSampler, DeviceBatches
from lmtune.sweep import placement
from lmtune.sweep.plan import SweepPlan
from lmtune.sweep.spaces import load_space
from lmtune.sweep.trainable import limit_to_assigned_resources
from lmtune.training.config import budget_config
from lmtune.training.model import apply_rope, rope_tables
from lmtune.training.step import Runtime, forward_backward

# ---------------------------------------------------------------------------------------------
# Batches on the device


def test_batches_for_a_device_other_than_cpu_and_cuda_come_back_on_it():
    """On MPS the consumer copies each batch to the device (the meta device stands in for it)."""
    sampler = BatchSampler(np.arange(5000, dtype=np.uint16), 4, 16, seed=0)
    with DeviceBatches(sampler, torch.device("meta")) as batches:
        x, y = batches.next()
    assert x.device.type == y.device.type == "meta" and x.shape == (4, 16)


class RecordingCuda:
    """A stand-in for ``torch.cuda`` that logs, in order, what DeviceBatches asks of it (and, through the
    Tensor methods the test patches, what it does to the tensors)."""

    def __init__(self):
        self.log: list[str] = []
        self.active = "main"

    def Stream(self, device=None):  # noqa: N802 - torch.cuda's name
        return _Stream(self, "side")

    @contextlib.contextmanager
    def stream(self, stream):
        self.active = stream.name
        try:
            yield
        finally:
            self.active = "main"

    def Event(self):  # noqa: N802
        return _Event(self)

    def current_stream(self, device=None):
        return _Stream(self, "main")


class _Stream:
    def __init__(self, cuda: RecordingCuda, name: str):
        self.cuda, self.name = cuda, name

    def wait_event(self, event) -> None:
        self.cuda.log.append(f"{self.name} stream waits for the copy")


class _Event:
    def __init__(self, cuda: RecordingCuda):
        self.cuda = cuda

    def record(self, stream) -> None:
        self.cuda.log.append(f"event recorded on the {stream.name} stream")


def test_the_cuda_prefetch_pins_copies_on_a_side_stream_and_the_consumer_waits_then_records(monkeypatch):
    cuda = RecordingCuda()
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t: cuda.log.append("pin") or t)
    monkeypatch.setattr(torch.Tensor, "to", lambda t, *a, **k: cuda.log.append(
        f"copy on the {cuda.active} stream, non_blocking={k.get('non_blocking')}") or t)
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda t, s: cuda.log.append(f"record_stream({s.name})"))
    sampler = BatchSampler(np.arange(5000, dtype=np.uint16), 4, 16, seed=0)
    with DeviceBatches(sampler, torch.device("cuda"), prefetch=1, cuda=cuda) as batches:
        batches.next()
        consumer = cuda.log.index("main stream waits for the copy")
        first = cuda.log[:consumer]
    assert first[:5] == ["pin", "copy on the side stream, non_blocking=True", "pin",
                         "copy on the side stream, non_blocking=True", "event recorded on the side stream"]
    assert cuda.log[consumer + 1:consumer + 3] == ["record_stream(main)", "record_stream(main)"]


# ---------------------------------------------------------------------------------------------
# The step


class StaticOutputForward(torch.nn.Module):
    """Plays a CUDA graph's replay: each call overwrites the tensor the previous call returned."""

    def __init__(self, model):
        super().__init__()
        self.model, self.last = model, None

    def forward(self, x, y):
        loss = self.model(x, y)
        if self.last is not None:
            with torch.no_grad():
                self.last.copy_(loss)
        self.last = loss
        return loss


def test_the_step_keeps_each_micro_batchs_loss_when_the_forward_reuses_its_output(tiny_config):
    """reduce-overhead and max-autotune replay CUDA graphs whose output the next replay overwrites."""
    from lmtune.training.state import TrainState

    config = tiny_config
    state = TrainState.create(config, torch.device("cpu"))
    x, y = BatchSampler(np.arange(20000, dtype=np.uint16) % 300, 8, config.model.context_length, 0).batch(0)
    plain = Runtime(torch.device("cpu"), state.model, None, compiled=False)
    replayed = Runtime(torch.device("cpu"), StaticOutputForward(state.model), None, compiled=False)
    expected = forward_backward(plain, x, y, micro_batches=4)
    state.model.zero_grad()
    assert forward_backward(replayed, x, y, micro_batches=4).item() == pytest.approx(expected.item(), rel=1e-6)


def test_rope_rotates_in_float32_even_for_bf16_queries():
    cos, sin = rope_tables(32, 256, 10000.0)
    q = torch.randn(2, 4, 256, 32).to(torch.bfloat16)
    assert torch.equal(apply_rope(q, cos, sin), apply_rope(q.float(), cos, sin).to(torch.bfloat16))


# ---------------------------------------------------------------------------------------------
# What a trial gets of the machine


def test_a_trial_given_no_gpu_is_hidden_every_gpu(monkeypatch):
    """Ray 2.60 leaves CUDA_VISIBLE_DEVICES alone for a trial given no GPU (ray-project/ray#54868)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    limit_to_assigned_resources({"CPU": 1, "GPU": 0}, cuda=NoCalls())
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""


class NoCalls:
    def __getattr__(self, name):
        raise AssertionError(f"torch.cuda.{name} was called")


class FractionCuda:
    def __init__(self):
        self.fraction = None

    def is_available(self) -> bool:
        return True

    def set_per_process_memory_fraction(self, fraction: float, device: int) -> None:
        self.fraction = (fraction, device)


@pytest.mark.parametrize("share, capped", [(0.25, (0.25, 0)), (1.0, None), (2.0, None)])
def test_a_fractional_trial_is_capped_at_its_share_of_the_gpu_and_a_whole_one_is_not(monkeypatch, share, capped):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    cuda = FractionCuda()
    limit_to_assigned_resources({"CPU": 1, "GPU": share}, cuda=cuda)
    assert cuda.fraction == capped and os.environ["CUDA_VISIBLE_DEVICES"] == "3"


class NoCudaHere:
    def is_available(self) -> bool:
        return False

    def set_per_process_memory_fraction(self, fraction: float, device: int) -> None:
        raise AssertionError("no CUDA device to cap")


def test_a_trial_given_a_gpu_share_where_torch_sees_no_cuda_trains_on_the_cpu_and_says_so(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # what Ray sets on a (fake or driverless) GPU node
    note = limit_to_assigned_resources({"CPU": 1, "GPU": 0.5}, cuda=NoCudaHere())
    assert note and "given 0.5 GPU" in note and "sees no CUDA device" in note and "training on the CPU" in note
    assert limit_to_assigned_resources({"CPU": 1, "GPU": 0.5}, cuda=FractionCuda()) is None


def _space_base(name: str, fuse: int):
    space = load_space(name).fused(fuse, fail=ValueError)
    return space, SweepPlan.create(space, budget_config(space.budget, space.fixed)).largest_trial()


@pytest.mark.parametrize("gpu_gib, share", [(24, 1.0), (80, 0.25)])
def test_packing_counts_every_member_of_a_fused_trial(gpu_gib, share):
    """lr_grid with fuse: 7 needs about 14.6 GiB a trial: one per 24 GiB card (not four capped at 6 GiB)."""
    _, base = _space_base("lr_grid", 7)
    assert placement.trial_memory_bytes(base, 7) / 2**30 == pytest.approx(14.6, abs=0.1)
    assert placement.trial_resources(base, 1, None, 1, gpu_gib * 2**30, members=7)["gpu"] == share


def test_a_fused_trial_that_cannot_fit_one_gpu_is_refused_in_one_line():
    base = budget_config("full", {})  # batch 128: about 50 GiB with 7 members
    with pytest.raises(Exception, match=r"one trial needs about 50\.0 GiB .*lower --fuse") as info:
        placement.trial_resources(base, 1, None, 1, 40 * 2**30, members=7)
    assert "\n" not in str(info.value)


def test_packing_sizes_a_grid_over_batch_sizes_for_its_largest_batch():
    space, base = _space_base("lr_batch", 1)
    assert base.train.batch_size == 64 == max(space.strategy.params["batch_size"])
    assert placement.trial_memory_bytes(base) > placement.trial_memory_bytes(budget_config(space.budget, space.fixed))



# ---------------------------------------------------------------------------------------------
# torch.compile: the first call compiles, and nothing recompiles after it


class GraphCounter:
    """A torch.compile backend that counts the graphs Dynamo hands it (each graph break makes one more)
    and runs them as they are."""

    def __init__(self, name: str):
        self.__name__, self.graphs = name, []

    def __call__(self, gm, example_inputs):
        self.graphs.append([n.name for n in gm.graph.nodes if n.op == "placeholder"])
        return gm.forward

    def model_graphs(self) -> int:
        """The model's own graphs (the fused optimizer's compiled update is traced separately)."""
        return sum(any("idx" in name for name in graph) for graph in self.graphs)


@pytest.fixture
def counting_backend(monkeypatch):
    from lmtune.training import step as step_module

    torch.compiler.reset()
    counter = GraphCounter("counting")
    monkeypatch.setattr(step_module, "compile_backend", lambda config, device: counter)
    yield counter
    torch.compiler.reset()


def _single_runtime(config):
    from lmtune.training.state import TrainState

    state = TrainState.create(config, torch.device("cpu"))
    return state, Runtime.build(state.model, config, torch.device("cpu"), compiled=True)


@pytest.mark.slow
def test_the_train_step_and_evaluation_compile_before_the_first_step_without_graph_breaks(tiny_config,
                                                                                          counting_backend):
    state, runtime = _single_runtime(tiny_config)
    assert runtime.compiled and len(counting_backend.graphs) == 2  # training and evaluation: one graph each
    assert all(p.grad is None for p in state.model.parameters())  # the warm-up leaves no gradient behind


def test_a_compile_that_fails_at_its_first_call_trains_eager_says_so_once_and_records_it(
        make_tiny_config, tmp_path, monkeypatch):
    from lmtune.training import step as step_module
    from lmtune.training.loop import train

    def failing(gm, example_inputs):
        raise RuntimeError("no C compiler found")

    torch.compiler.reset()
    monkeypatch.setattr(step_module, "compile_backend", lambda config, device: failing)
    result = train(make_tiny_config(compile="on", steps=10), tmp_path / "run")
    torch.compiler.reset()
    assert result.status == "completed" and result.summary["compiled"] is False
    log = (tmp_path / "run" / "training.log").read_text()
    assert log.count("torch.compile (backend failing) FAILED at its first call") == 1
    assert "no C compiler found" in log


def _recompile_free_run(config, out, resume: bool = False):
    """A run whose steps after the first may not recompile anything (error_on_recompile from step 1 on)."""
    from lmtune.training.loop import train

    def strict(step: int, model) -> None:
        torch._dynamo.config.error_on_recompile = step >= 1

    try:
        return train(config, out, resume=resume, before_step=strict)
    finally:
        torch._dynamo.config.error_on_recompile = False


@pytest.mark.slow
def test_nothing_recompiles_across_steps_evaluation_checkpoints_an_lr_change_and_a_resume(
        make_tiny_config, tmp_path, monkeypatch):
    """(pytorch#107076: a float LR inside a compiled step recompiles on every change; here the LR stays
    outside the compiled forward, and changes every step of the schedule.)"""
    from lmtune.training import step as step_module

    torch.compiler.reset()
    monkeypatch.setattr(step_module, "compile_backend", lambda config, device: "aot_eager")
    config = make_tiny_config(compile="on", steps=30, checkpoint_interval=10, eval_interval=10)
    first = _recompile_free_run(config.__class__.from_dict({**config.to_dict(), "train": {
        **config.to_dict()["train"], "run_steps": 20}}), tmp_path / "run")
    resumed = _recompile_free_run(config, tmp_path / "run", resume=True)
    torch.compiler.reset()
    assert first.summary["compiled"] and resumed.summary["compiled"]
    assert resumed.status == "completed" and resumed.summary["steps"] == 30


@pytest.mark.release  # inductor on the CPU (a C++ compile of every kernel): a release check, not every push's
@pytest.mark.slow
def test_the_inductor_backend_compiles_the_quick_models_step_on_the_cpu_and_trains(make_tiny_config, tmp_path):
    from lmtune.training.loop import train

    torch.compiler.reset()
    result = _recompile_free_run(make_tiny_config(compile="on", compile_backend="inductor", steps=10), tmp_path / "r")
    torch.compiler.reset()
    assert result.status == "completed" and result.summary["steps"] == 10 and result.summary["compiled"]
    assert math.isfinite(result.summary["best_val_loss"])
    # it trains as the eager step does: the same losses at every log row, and the same validation loss
    eager = train(make_tiny_config(compile="off", steps=10), tmp_path / "eager")
    assert [row["step"] for row in result.history] == [row["step"] for row in eager.history] == [5, 10]
    assert [row["train_loss"] for row in result.history] == pytest.approx([row["train_loss"] for row in eager.history],
                                                                       rel=1e-3)
    assert result.summary["best_val_loss"] == pytest.approx(eager.summary["best_val_loss"], rel=1e-3)


@pytest.mark.release  # (torch.compile's tracing on the CPU, a GPU path: the release tier, with inductor's)
@pytest.mark.slow
def test_a_compiled_fused_group_losing_members_recompiles_at_most_log2_k_times(make_tiny_config, tmp_path,
                                                                               counting_backend):
    """One member ends at every log interval but the last: eager the tensors would shrink each time (and a compiled
    group recompile each time: 3 times for 4 members, and K - 1 for K, past Dynamo's limit of 8 graphs, after which
    it runs eager without a word); here only at half, then a quarter: twice, log2(4)."""
    from lmtune.fused.loop import train_fused
    from lmtune.training.loop import RunEnd

    members, steps = 4, 20
    configs = [make_tiny_config(compile="on", lr=0.001 * (k + 1), steps=steps, log_interval=5, eval_interval=5,
                                checkpoint_interval=steps) for k in range(members)]

    def one_ends_per_interval(step: int, rows: dict) -> dict:
        return {min(rows): RunEnd("stopped_early", "test")} if step < steps else {}

    with torch._dynamo.config.patch(recompile_limit=64):  # count every recompile there would be
        train_fused(configs, [tmp_path / f"m{k}" for k in range(members)], member_rule=one_ends_per_interval)
    recompiles = counting_backend.model_graphs() // 2 - 1  # training and evaluation graphs per member count
    assert 1 <= recompiles <= math.ceil(math.log2(members))


# ---------------------------------------------------------------------------------------------
# bf16 autocast, run on the CPU

# nats: 30 steps in bf16 end within this of float32 (measured on the tiny run below: 8e-5 apart, the loss down 1 nat
# from 8.23; a tenth more or less LR moves it 0.13)
BF16_TOLERANCE = 0.02


def _tiny_bf16(make_tiny_config, precision: str, lr: float):
    """The tiny run, with qk-norm and z-loss, in ``precision``: whether bf16 autocast trains as float32 does not
    depend on the model's size."""
    return make_tiny_config(steps=30, eval_interval=30, checkpoint_interval=30, qk_norm=True, z_loss=1e-4,
                            precision=precision, lr=lr)


@pytest.mark.slow
def test_the_model_trains_in_bf16_as_in_float32_with_qk_norm_and_z_loss(make_tiny_config, tmp_path):
    from lmtune.training.loop import train

    losses = {}
    for precision in ("fp32", "bf16"):
        result = train(_tiny_bf16(make_tiny_config, precision, 3e-3), tmp_path / precision)
        assert result.summary["precision"] == ("bfloat16" if precision == "bf16" else "float32")
        losses[precision] = result.summary["last_val_loss"]
    assert math.isfinite(losses["bf16"]) and abs(losses["bf16"] - losses["fp32"]) < BF16_TOLERANCE
    assert losses["bf16"] != losses["fp32"]  # bf16 did run: not float32's numbers


@pytest.mark.slow
def test_a_fused_group_trains_in_bf16_as_in_float32(make_tiny_config, tmp_path):
    from lmtune.fused.loop import train_fused

    ends = {}
    for precision in ("fp32", "bf16"):
        configs = [_tiny_bf16(make_tiny_config, precision, lr) for lr in (1e-3, 3e-3)]
        results = train_fused(configs, [tmp_path / f"{precision}-{k}" for k in range(2)])
        ends[precision] = [r.summary["last_val_loss"] for r in results]
    assert all(math.isfinite(v) for v in ends["bf16"])
    assert max(abs(a - b) for a, b in zip(ends["bf16"], ends["fp32"], strict=True)) < BF16_TOLERANCE
    assert ends["bf16"] != ends["fp32"]  # bf16 did run: not float32's numbers


# ---------------------------------------------------------------------------------------------
# The GPU's way of catching a bad step: no host sync per step


def test_on_the_gpu_path_a_nan_at_step_k_is_reported_at_step_k_and_nothing_after_it_is_checkpointed(
        make_tiny_config, tmp_path, monkeypatch):
    """sync_is_free=False: the update lands (NaN) and the loop finds it at its next log interval."""
    from lmtune.training.checkpoint import periodic_checkpoints
    from lmtune.training.loop import train

    build = Runtime.build
    monkeypatch.setattr(Runtime, "build", classmethod(
        lambda cls, *a, **k: dataclasses.replace(build(*a, **k), sync_is_free=False)))
    bad_step = 13

    def poison(step: int, model) -> None:
        if step == bad_step:
            with torch.no_grad():
                model.lm_head.weight.fill_(float("nan"))

    result = train(make_tiny_config(steps=30, log_interval=5, checkpoint_interval=5), tmp_path / "r",
                   before_step=poison)
    assert result.status == "diverged" and result.end.diverged_step == bad_step
    assert result.summary["steps"] == bad_step - 1
    saved = [int(p.stem.split("_")[1]) for p in periodic_checkpoints(tmp_path / "r" / "checkpoints")]
    assert saved and max(saved) < bad_step


class LocalScalarCounter(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts ``aten._local_scalar_dense``: every ``.item()``, ``bool(tensor)``, ``float(tensor)`` (on a GPU,
    each one waits for the device)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


def test_a_training_step_on_the_gpu_path_never_waits_for_the_device(tiny_config):
    from lmtune.training.state import TrainState, build_optimizer
    from lmtune.training.step import train_step

    state = TrainState.create(tiny_config, torch.device("cpu"))
    state.optimizer = build_optimizer(state.model, tiny_config, torch.device("cpu"), fused=True)  # CUDA's
    runtime = Runtime(torch.device("cpu"), state.model, None, compiled=False, sync_is_free=False)
    x, y = BatchSampler(np.arange(20000, dtype=np.uint16) % 300, 8, tiny_config.model.context_length, 0).batch(0)
    train_step(state, runtime, x, y, 1e-3, tiny_config.train)  # the first step creates AdamW's state
    with LocalScalarCounter() as counter:
        train_step(state, runtime, x, y, 2e-3, tiny_config.train)
    assert counter.count == 0


def test_a_fused_groups_step_never_waits_for_the_device(make_tiny_config):
    from lmtune.fused.state import FusedState
    from lmtune.fused.step import fused_train_step

    configs = [make_tiny_config(lr=lr) for lr in (1e-3, 3e-3)]
    state = FusedState.create(configs, torch.device("cpu"))
    runtime = Runtime(torch.device("cpu"), state.model, None, compiled=False, sync_is_free=False)
    x, y = BatchSampler(np.arange(20000, dtype=np.uint16) % 300, 8, configs[0].model.context_length, 0).batch(0)
    with LocalScalarCounter() as counter:
        fused_train_step(state, runtime, x, y, torch.tensor([1e-3, 3e-3]))
    assert counter.count == 0


# ---------------------------------------------------------------------------------------------
# Fused AdamW (CUDA's) and torch's foreach AdamW: the same updates, and checkpoints move between them


def test_fused_adamw_forced_on_the_cpu_matches_foreach_and_checkpoints_resume_across_the_two(tiny_config):
    from lmtune.training.state import TrainState, build_optimizer
    from lmtune.training.step import train_step

    cpu = torch.device("cpu")
    runtime = Runtime(cpu, None, None, compiled=False)
    batches = [BatchSampler(np.arange(20000, dtype=np.uint16) % 300, 8, tiny_config.model.context_length,
                            0).batch(s) for s in range(6)]

    def run(fused_for: list[bool]) -> TrainState:
        state = TrainState.create(tiny_config, cpu)
        for step, (x, y) in enumerate(batches):
            if step == 0 or fused_for[step] != fused_for[step - 1]:  # a resume with the other optimizer
                saved = state.optimizer.state_dict()
                state.optimizer = build_optimizer(state.model, tiny_config, cpu, fused=fused_for[step])
                if step:
                    state.optimizer.load_state_dict(saved)
            train_step(state, dataclasses.replace(runtime, forward=state.model), x, y, 1e-3, tiny_config.train)
        return state

    foreach, fused = run([False] * 6), run([True] * 6)
    mixed = run([True, True, True, False, False, False])
    for a, b, c in zip(foreach.model.parameters(), fused.model.parameters(), mixed.model.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(c, a, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# The decisions that read the hardware, with the hardware's answers monkeypatched


class GpuOfCapability:
    """torch.cuda as a GPU of a given compute capability sees it (what autocast_dtype and diagnose ask)."""

    def __init__(self, major: int, minor: int = 0):
        self.major, self.minor = major, minor

    def get_device_capability(self, device=None):
        return self.major, self.minor

    def get_device_properties(self, device=None):
        return dataclasses.make_dataclass("Props", ["major", "minor"])(self.major, self.minor)

    def is_bf16_supported(self, including_emulation: bool = True) -> bool:
        return self.major >= 8 or including_emulation  # what torch answers: emulation counts by default


@pytest.mark.parametrize("major, minor, expected", [
    (9, 0, torch.bfloat16), (8, 9, torch.bfloat16), (8, 0, torch.bfloat16), (7, 5, None), (7, 0, None)])
def test_bf16_is_chosen_only_on_gpus_with_bf16_tensor_cores(tiny_config, major, minor, expected):
    """H100 9.0, RTX 4090 8.9, A100 8.0: bf16; T4 7.5 and V100 7.0: float32 (bf16 emulated, not compiled)."""
    from lmtune.training.device import autocast_dtype

    assert autocast_dtype(tiny_config, torch.device("cuda"), cuda=GpuOfCapability(major, minor)) == expected


def test_bf16_asked_for_on_a_gpu_without_bf16_tensor_cores_is_refused_in_one_line(make_tiny_config):
    from lmtune.errors import LmtuneError
    from lmtune.training.device import autocast_dtype

    with pytest.raises(LmtuneError, match=r"compute capability 7\.5\) has no bf16 tensor cores.*precision=auto"):
        autocast_dtype(make_tiny_config(precision="bf16"), torch.device("cuda"), cuda=GpuOfCapability(7, 5))


def test_diagnose_calls_emulated_bf16_emulated_and_reads_tf32_as_a_run_sets_it(monkeypatch):
    import types as pytypes

    from lmtune.tools import environment

    matmul = pytypes.SimpleNamespace(allow_tf32=False)  # torch's default, before a run sets it
    monkeypatch.setattr(torch.backends.cuda, "matmul", matmul)
    monkeypatch.setattr(environment, "configure_backend", lambda device: setattr(matmul, "allow_tf32", True))
    v100 = environment.cuda_environment(torch.device("cuda"), cuda=GpuOfCapability(7, 0))
    a100 = environment.cuda_environment(torch.device("cuda"), cuda=GpuOfCapability(8, 0))
    assert (v100.bf16, v100.bf16_emulated, v100.tf32) == (False, True, False)
    assert (a100.bf16, a100.bf16_emulated, a100.tf32, a100.tf32_enabled) == (True, False, True, True)


@pytest.mark.parametrize("name, dtype, peak", [
    ("NVIDIA H100 80GB HBM3", torch.bfloat16, 989e12), ("NVIDIA H100 PCIe", torch.bfloat16, 756e12),
    ("NVIDIA A100-SXM4-80GB", torch.bfloat16, 312e12), ("NVIDIA L40S", torch.bfloat16, 362e12),
    ("NVIDIA GeForce RTX 4090", torch.bfloat16, 165.2e12), ("NVIDIA GeForce RTX 4060 Ti", torch.bfloat16, 44.1e12),
    ("Tesla T4", torch.float32, 8.1e12), ("Tesla V100-SXM2-16GB", torch.float32, 15.7e12),
    ("Apple M3 Max", torch.float32, 14.3e12), ("NVIDIA H100 80GB HBM3", torch.float32, 67e12),
    ("Tesla T4", torch.bfloat16, 8.1e12),  # no bf16 tensor cores: its float32 peak
])
def test_the_peak_an_mfu_is_measured_against_is_the_devices_for_the_precision_it_trains_in(name, dtype, peak):
    from lmtune.training.device import peak_flops

    device = torch.device("mps" if name.startswith("Apple") else "cuda")
    assert peak_flops(device, dtype, name=name) == peak


def test_a_device_without_figures_has_no_peak():
    from lmtune.training.device import peak_flops

    assert peak_flops(torch.device("cuda"), torch.bfloat16, name="Some Future GPU") is None
    assert peak_flops(torch.device("cpu"), torch.float32) is None


def test_nvml_finds_the_gpu_by_its_uuid_whatever_cuda_visible_devices_renumbered(monkeypatch):
    """With CUDA_VISIBLE_DEVICES=3, torch's cuda:0 is NVML's index 3: only the UUID names the same GPU."""
    import sys
    import types as pytypes

    from lmtune.tools import environment

    asked = []
    fake = pytypes.SimpleNamespace(
        NVMLError=RuntimeError, nvmlInit=lambda: None,
        nvmlDeviceGetHandleByUUID=lambda uuid: asked.append(uuid) or f"handle {uuid}",
        nvmlDeviceGetHandleByIndex=lambda index: pytest.fail("looked up by index"))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: pytypes.SimpleNamespace(uuid="5c0b-feed"))
    assert environment._nvml_handle(torch.device("cuda:0")) == "handle GPU-5c0b-feed" and asked == ["GPU-5c0b-feed"]


@pytest.mark.slow
def test_the_fused_optimizers_compiled_update_is_one_graph_that_trains_as_the_eager_one(make_tiny_config,
                                                                                         counting_backend):
    """Eager, the per-member clipping and AdamW are ~15 small operations per parameter tensor; compiled,
    one graph (no break), never recompiled as the learning rates change, with the same arithmetic."""
    from lmtune.fused.state import FusedState
    from lmtune.fused.step import compile_update, fused_train_step

    configs = [make_tiny_config(lr=lr) for lr in (1e-3, 3e-3)]
    cpu = torch.device("cpu")
    eager, compiled = FusedState.create(configs, cpu), FusedState.create(configs, cpu)
    compile_update(compiled, counting_backend)
    sampler = BatchSampler(np.arange(20000, dtype=np.uint16) % 300, 8, configs[0].model.context_length, 0)
    for step in range(4):
        x, y = sampler.batch(step)
        lrs = torch.tensor([1e-3, 3e-3]) * (step + 1) / 4  # a new LR every step (the warm-up)
        for state in (eager, compiled):
            fused_train_step(state, Runtime(cpu, state.model, None, compiled=False), x, y, lrs)
    updates = [g for g in counting_backend.graphs if not any("idx" in name for name in g)]
    assert len(updates) == 1
    for a, b in zip(eager.model.parameters(), compiled.model.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7)


def test_the_sync_check_counts_a_reported_sync_but_not_torchs_warning_that_its_debug_mode_is_a_prototype():
    """On an H200 the check failed on the warning torch gives when the mode is set (issue: no sync had happened)."""
    from lmtune.tools.throughput.loops import synchronizations

    prototype = ("Synchronization debug mode is a prototype feature and does not yet detect all synchronizing "
                 "operations (Triggered internally at /pytorch/torch/csrc/cuda/Module.cpp:1003.)")
    sync = "called a synchronizing CUDA operation"
    assert synchronizations([prototype]) == []
    assert synchronizations([prototype, sync]) == [sync]

