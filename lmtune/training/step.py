"""One training step: the forward and backward passes over the step's micro-batches, gradient
clipping, the non-finite check and the AdamW update; at a log step, what a row measures of the step itself
(``measured``: the relative update size of each transformer block).

``train_step`` is the step the training loop runs and the benchmark times; ``Runtime`` is how the
steps run on a device (the compiled forward, the autocast precision), built once per run.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from lmtune.training.compile import compile_backend, compile_failed, compile_model, should_compile, warm_up
from lmtune.training.config import RunConfig, TrainConfig
from lmtune.training.device import autocast_dtype
from lmtune.training.lm import LanguageModelLoss, block_parameters
from lmtune.training.spec import TrainSpec
from lmtune.training.state import TrainState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Runtime:
    """How a model's steps run on one device."""

    device: torch.device
    forward: nn.Module
    """The model's loss (lmtune.training.lm.LanguageModelLoss, or a fused group's), or its torch.compile'd wrapper:
    ``forward(x, y)`` is the mean loss."""
    amp_dtype: torch.dtype | None
    """bf16 under autocast, or None for float32."""
    compiled: bool
    """Whether ``forward`` is compiled (a compile that failed at its first call falls back to eager: False)."""
    sync_is_free: bool | None = None
    """Whether a host sync costs nothing, so a bad step is caught before it is applied: on CPU (None: by the
    device). False runs the GPU path, where the check waits for the next log interval."""

    def __post_init__(self) -> None:
        if self.sync_is_free is None:
            object.__setattr__(self, "sync_is_free", self.device.type == "cpu")

    @classmethod
    def build(cls, model: nn.Module, config: RunConfig, device: torch.device, compile_mode: str | None = None,
              compiled: bool | None = None, train_shape: tuple[int, ...] | None = None,
              eval_shape: tuple[int, ...] | None = None, spec: TrainSpec | None = None) -> Runtime:
        """``model``'s loss (a single model's: lmtune.training.lm.LanguageModelLoss; a fused group computes its own),
        compiled as ``should_compile`` says (or as ``compiled`` forces), with the config's backend, mode and
        precision, and the first calls run at once (``warm_up``) on inputs of ``train_shape`` and ``eval_shape``
        (default: a micro-batch of the config's): a compile that fails there falls back to eager, said once.
        ``spec``: the run's (its model's size decides "auto" on the CPU; None: lmtune's own)."""
        amp = autocast_dtype(config, device)
        model = model if getattr(model, "computes_loss", False) else LanguageModelLoss(model, config.model.z_loss)
        if compiled is None:
            compiled = should_compile(config, device, spec)
        if not compiled:
            why = "CPU default for small models: eager measured faster" if config.train.compile == "auto" \
                else "compile=off"
            log.info("torch.compile off (%s)", why)
            return cls(device, model, amp, compiled=False)
        backend, mode = compile_backend(config, device), compile_mode or config.train.compile_mode
        forward = compile_model(model, backend, mode)
        micro = (config.train.batch_size // config.train.grad_accum_steps, config.model.context_length)
        train_x = torch.zeros(train_shape or micro, dtype=torch.long, device=device)
        eval_x = torch.zeros(eval_shape or micro, dtype=torch.long, device=device)
        runtime = cls(device, forward, amp, compiled=True)
        failure = warm_up(forward, model, train_x, eval_x, runtime.autocast())
        if failure is not None:
            compile_failed(backend, failure)
            return cls(device, model, amp, compiled=False)
        log.info("torch.compile active (backend=%s%s), compiled before the first step",
                 getattr(backend, "__name__", backend), "" if mode == "default" else f", mode={mode}")
        return runtime

    def autocast(self) -> contextlib.AbstractContextManager:
        return torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None)


@dataclass
class StepResult:
    loss: torch.Tensor
    """Mean loss of the step's batch (over its micro-batches), left on the device."""
    grad_norm: torch.Tensor
    """Global gradient norm before clipping, left on the device."""
    finite: torch.Tensor
    """Whether loss and gradient norm were finite (a device bool: reading it is a host sync)."""
    applied: bool
    """False when the step was refused: found non-finite where the check is free, nothing updated."""
    measured: dict[str, torch.Tensor] = field(default_factory=dict)
    """At a log step (``measure``), metrics of the step itself by registered name (lmtune.training.metric_registry),
    on the device: the interval meter reads them with the row. Empty at other steps."""


def train_step(state: TrainState, runtime: Runtime, x: torch.Tensor, y: torch.Tensor, lr: float,
               settings: TrainConfig, measure: bool = False) -> StepResult:
    """One optimizer step at learning rate ``lr`` (times each parameter group's ``lr_scale``: μP's multipliers)
    on the batch (x, y) of ``settings.batch_size`` windows.

    The batch is split into ``settings.grad_accum_steps`` equal micro-batches whose gradients add up
    to the gradient of the whole batch's mean loss. On CPU a non-finite loss or gradient norm refuses
    the update (``applied`` False); on a GPU, where checking would stall the pipeline every step, the
    update lands and ``finite`` tells the caller, who checks at its next log interval. ``measure`` (a log
    step) also measures the step's ``measured`` metrics, on the device.
    """
    for group in state.optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)  # μP's per-group multiplier (absent: older checkpoints)
    loss = forward_backward(runtime, x, y, settings.grad_accum_steps)
    grad_norm = clip_gradients(state.model, settings.grad_clip)
    finite = torch.isfinite(loss) & torch.isfinite(grad_norm)
    if runtime.sync_is_free and not bool(finite):
        state.optimizer.zero_grad(set_to_none=True)
        return StepResult(loss, grad_norm, finite, applied=False)
    probe = StepMeasure(state.model) if measure else None
    state.optimizer.step()
    state.optimizer.zero_grad(set_to_none=True)
    state.step += 1
    return StepResult(loss, grad_norm, finite, applied=True, measured=probe.after() if probe else {})


class StepMeasure:
    """What a log step measures of the step itself, taken around its update: made before the update, ``after()``
    once it landed. The one place a step metric is measured, for both loops' steps (this module's and
    lmtune.fused.step's, whose model carries the members first: ``members``); its column is a Metric of
    lmtune.training.metric_registry."""

    def __init__(self, model: nn.Module, members: bool = False) -> None:
        self.blocks = block_parameters(model)
        self.before = snapshot_layers(self.blocks)
        self.members = members

    def after(self) -> dict[str, torch.Tensor]:
        """Each metric by its registered name, on the device (no host sync): shape () or (n_layers,), (K,) or
        (K, n_layers) with ``members``."""
        return {"update_ratio": layer_update_ratios(self.blocks, self.before, self.members)}


def forward_backward(runtime: Runtime, x: torch.Tensor, y: torch.Tensor, micro_batches: int = 1) -> torch.Tensor:
    """Backward of the batch's mean loss, accumulated over ``micro_batches`` equal slices; returns that
    mean loss (detached, on the device: no host sync)."""
    total = None
    for xs, ys in zip(x.chunk(micro_batches), y.chunk(micro_batches), strict=True):
        with runtime.autocast():
            loss = runtime.forward(xs, ys)
        (loss / micro_batches).backward()
        # A copy: under CUDA graphs (compile modes reduce-overhead, max-autotune) the forward's output lives
        # in the graph's static memory, which the next micro-batch's replay overwrites.
        total = loss.detach().clone() if total is None else total + loss.detach()
    return total / micro_batches


def clip_gradients(model: nn.Module, max_norm: float) -> torch.Tensor:
    """The global gradient norm (before clipping); gradients clipped to ``max_norm`` unless it is 0."""
    params = [p for p in model.parameters() if p.grad is not None]
    if max_norm > 0:
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    return torch.nn.utils.get_total_norm([p.grad for p in params])


@torch.no_grad()
def snapshot_layers(blocks: Sequence[Sequence[nn.Parameter]]) -> list[list[torch.Tensor]]:
    """A copy of each transformer block's parameters (lmtune.training.lm.block_parameters), before a log step's
    update (one model's worth of memory, for that step only)."""
    return [[p.detach().clone() for p in block] for block in blocks]


@torch.no_grad()
def layer_update_ratios(blocks: Sequence[Sequence[nn.Parameter]], before: list[list[torch.Tensor]],
                        members: bool = False) -> torch.Tensor:
    """||W_after - W_before|| / ||W_before|| per block, its parameters taken as one vector, on the device (no
    host sync): (n_layers,), or (K, n_layers) for a fused model, whose parameters have the members first."""
    def squares(t: torch.Tensor) -> torch.Tensor:
        return t.pow(2).flatten(1).sum(1) if members else t.pow(2).sum()

    ratios = []
    for block, old in zip(blocks, before, strict=True):
        change = sum(squares(p - o) for p, o in zip(block, old, strict=True))
        size = sum(squares(o) for o in old)
        ratios.append((change / size).sqrt())
    return torch.stack(ratios, dim=-1)


@torch.no_grad()
def evaluate(runtime: Runtime, batches: list[tuple[torch.Tensor, torch.Tensor]], micro_batches: int = 1) -> float:
    """Mean loss over ``batches`` (CPU tensors, e.g. ``fixed_val_batches``). Each batch is run in
    ``micro_batches`` equal slices, so evaluation fits wherever the training step does."""
    runtime.forward.train(False)
    total = torch.zeros((), device=runtime.device)
    for x, y in batches:
        x, y = x.to(runtime.device, non_blocking=True), y.to(runtime.device, non_blocking=True)
        for xs, ys in zip(x.chunk(micro_batches), y.chunk(micro_batches), strict=True):
            with runtime.autocast():
                total += runtime.forward(xs, ys).float() / micro_batches
    runtime.forward.train(True)
    return (total / len(batches)).item()
