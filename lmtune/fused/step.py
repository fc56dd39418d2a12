"""One optimizer step of a fused group, and its validation: ``train_step`` and ``evaluate`` for K members.

A member whose loss or gradient norm is non-finite is frozen in the same step, on the device (no host
sync on any device): its update is masked and stays masked; the loop ends it at its next log
interval with the first bad step the meter kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lmtune.fused.optim import clip_member_gradients
from lmtune.fused.state import FusedState
from lmtune.training.step import Runtime, StepMeasure


@dataclass
class MemberStepResult:
    loss: torch.Tensor
    """(K,) each member's mean loss over the step's batch, on the device."""
    grad_norm: torch.Tensor
    """(K,) each member's gradient norm before clipping."""
    finite: torch.Tensor
    """(K,) whether loss and gradient norm were finite."""
    measured: dict[str, torch.Tensor] = field(default_factory=dict)
    """At a log step (``measure``), StepResult.measured's metrics with the members first: (K,) or (K, n_layers)."""


def fused_train_step(state: FusedState, runtime: Runtime, x: torch.Tensor, y: torch.Tensor, lrs: torch.Tensor,
                     micro_batches: int = 1, measure: bool = False) -> MemberStepResult:
    """One step at learning rates ``lrs`` (K,), the batch split into ``micro_batches`` along its batch axis;
    ``measure`` (a log step) also measures the step's ``measured`` metrics, on the device."""
    total = None
    for xs, ys in zip(x.chunk(micro_batches, dim=-2), y.chunk(micro_batches, dim=-2), strict=True):
        with runtime.autocast():
            losses = runtime.forward(xs, ys)
        # Summed over members: each member's gradient is its own loss's (no operation mixes members).
        (losses.sum() / micro_batches).backward()
        # A copy: a CUDA graph's replay for the next micro-batch overwrites its output (see forward_backward).
        total = losses.detach().clone() if total is None else total + losses.detach()
    loss = total / micro_batches
    update = state.compiled_update or clip_and_update
    probe = StepMeasure(state.model.stacked, members=True) if measure else None
    norms, finite = update(state, loss, lrs.to(loss.dtype))
    state.optimizer.zero_grad()
    state.step += 1
    return MemberStepResult(loss, norms, finite, probe.after() if probe else {})


@torch.no_grad()
def clip_and_update(state: FusedState, loss: torch.Tensor, lrs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Clip each member's gradients, freeze a member whose loss or gradient norm is not finite, and apply
    AdamW: about 15 elementwise operations per parameter and member. Eager that is hundreds of small kernels
    a step on a GPU; ``compile_update`` fuses them."""
    norms = clip_member_gradients(state.model, state.optimizer.hyper.grad_clip)
    finite = torch.isfinite(loss) & torch.isfinite(norms)
    state.active &= finite
    state.optimizer.step(lrs.to(norms.dtype), state.active)
    return norms, finite


def compile_update(state: FusedState, backend) -> None:
    """Run ``clip_and_update`` compiled with ``backend`` from now on (the learning rates are a tensor, so a
    new LR never recompiles it: pytorch#107076)."""
    state.compiled_update = torch.compile(clip_and_update, backend=backend)


@torch.no_grad()
def evaluate_members(runtime: Runtime, batches: list[tuple[torch.Tensor, torch.Tensor]],
                     micro_batches: int = 1) -> list[float]:
    """Each member's mean loss over ``batches`` (the same held-out batches for every member)."""
    runtime.forward.train(False)
    total = None
    for x, y in batches:
        x, y = x.to(runtime.device, non_blocking=True), y.to(runtime.device, non_blocking=True)
        for xs, ys in zip(x.chunk(micro_batches), y.chunk(micro_batches), strict=True):
            with runtime.autocast():
                losses = runtime.forward(xs, ys).float() / micro_batches
            total = losses if total is None else total + losses
    runtime.forward.train(True)
    return (total / len(batches)).tolist()
