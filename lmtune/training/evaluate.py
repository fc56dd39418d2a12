"""Validation: the mean loss over a fixed set of held-out batches."""

from __future__ import annotations

import torch

from lmtune.training.step import Runtime


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
