"""One training spec: how a run builds its model, its optimizer and its LR schedule (torchtitan's TrainSpec).

The training loops, the fused groups, the memory check, the probes and the report ask a ``TrainSpec`` what they need
of a model, an optimizer or a schedule, and never whose they are. ``LMTUNE`` is lmtune's own: TransformerLM
(lmtune.training.model, μP's multipliers), AdamW and the schedules of lmtune.training.schedule. The user's
(``--model``/``--optimizer``/``--schedule``) is built from a run's UserCode above this package, by
lmtune.usercode.spec.spec_for, at the entry point that starts the run; nothing here imports it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from lmtune.errors import LmtuneError
from lmtune.training.config import RunConfig, TrainConfig
from lmtune.training.lm import ModelSize
from lmtune.training.model import TransformerLM, count_parameters, flops_per_token
from lmtune.training.schedule import scheduled_lr


class ModelSpec(Protocol):
    """How a run builds its model and what lmtune may ask of it."""

    measured_memory: bool
    """True where lmtune knows the model only as a module: its activations are measured by building it
    (lmtune.training.memory.measured_activations); False: lmtune's formula (estimate_trial_memory_bytes) holds."""
    exposes_layers: bool
    """Whether lmtune's per-layer tools reach its blocks (attention-logit probes, the coord check, the SDPA kernel
    report, plain-math attention for double backward)."""

    def build(self, config: RunConfig, device: torch.device, dtype: torch.dtype = torch.float32) -> nn.Module:
        """Args: config: the run (its model section is the shape); device, dtype: where its parameters live.
        The caller seeds it (lmtune.training.state.seed_everything)."""

    def size(self, config: RunConfig, count_flops: bool = True) -> ModelSize:
        """Args: config: the run; count_flops: False where only the parameter counts are read (cheaper)."""

    def parameter_tensors(self, config: RunConfig) -> int:
        """Args: config: the run. How many parameter tensors its model has (a checkpoint's per-tensor costs)."""

    def fingerprint(self, config: RunConfig) -> str:
        """Args: config: the run. A digest of the parameters it builds, which a resumed sweep checks its model
        against ('': the config alone fixes them, as it does lmtune's model)."""

    def probes(self, model: nn.Module, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        """Args: model: one it built; idx: token ids [B, T]. The stability probes as 0-d device tensors."""

    def weight_decay_multipliers(self, model: nn.Module) -> dict[str, float]:
        """Args: model: one it built. Each parameter's weight decay over the config's, by name."""

    def lr_multipliers(self, model: nn.Module) -> dict[str, float]:
        """Args: model: one it built. Each parameter's LR over the schedule's, by name."""

    def plain_attention(self, model: nn.Module) -> None:
        """Args: model: one it built, switched to attention torch can differentiate twice (no fused kernel)."""


class OptimizerSpec(Protocol):
    """How a run builds its optimizer over lmtune's param groups."""

    def build(self, groups: list[dict], t: TrainConfig, device: torch.device,
              fused: bool | None = None) -> torch.optim.Optimizer:
        """Args: groups: params, weight_decay, lr and lr_scale per group; t: the run's training section; device:
        where the parameters live; fused: lmtune's AdamW's fused kernels (None: on CUDA)."""


class ScheduleSpec(Protocol):
    """A run's learning rate per step."""

    def lr_function(self, config: RunConfig) -> Callable[[int], float]:
        """Args: config: the run. The LR of each 0-based step (step k's update uses index k - 1's)."""

    def describe(self, t: TrainConfig) -> str:
        """Args: t: the run's training section. The schedule's shape in words (the lr_schedule.png title)."""


@dataclass(frozen=True)
class TrainSpec:
    """A run's model, optimizer and schedule, each lmtune's or the user's."""

    model: ModelSpec
    optimizer: OptimizerSpec
    schedule: ScheduleSpec


class LmtuneModel:
    """lmtune's TransformerLM: its own probes and μP multipliers, its size and memory by formula."""

    measured_memory = False
    exposes_layers = True

    def build(self, config: RunConfig, device: torch.device, dtype: torch.dtype = torch.float32) -> nn.Module:
        return TransformerLM(config.model).to(device=device, dtype=dtype)

    def size(self, config: RunConfig, count_flops: bool = True) -> ModelSize:
        counts = count_parameters(config.model)
        return ModelSize(counts["total"], counts["non_embedding"], flops_per_token(config.model))

    def parameter_tensors(self, config: RunConfig) -> int:
        # Per block two norm gains, qkv, out, gate, up and down, and the q/k norm gains; the embedding, the final
        # norm and the output layer.
        return config.model.n_layers * (7 + 2 * config.model.qk_norm) + 3

    def fingerprint(self, config: RunConfig) -> str:
        return ""  # (its parameters are its config's model section, which sweep.json records)

    @torch.no_grad()
    def probes(self, model: nn.Module, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        return model.probe_tensors(idx)  # the attention-logit maximum too

    def weight_decay_multipliers(self, model: nn.Module) -> dict[str, float]:
        return model.weight_decay_multipliers()

    def lr_multipliers(self, model: nn.Module) -> dict[str, float]:
        return model.lr_multipliers()

    def plain_attention(self, model: nn.Module) -> None:
        for block in model.blocks:
            block.attn.use_sdpa = False


class AdamW:
    """torch's AdamW, fused kernels (one launch for every parameter, no host sync) on CUDA or where asked."""

    def build(self, groups: list[dict], t: TrainConfig, device: torch.device,
              fused: bool | None = None) -> torch.optim.Optimizer:
        return torch.optim.AdamW(groups, lr=t.lr, betas=(t.beta1, t.beta2), eps=t.eps,
                                 fused=device.type == "cuda" if fused is None else fused)


class LmtuneSchedule:
    """TrainConfig.schedule: cosine or WSD with linear warm-up (lmtune.training.schedule)."""

    def lr_function(self, config: RunConfig) -> Callable[[int], float]:
        return functools.partial(scheduled_lr, t=config.train)

    def describe(self, t: TrainConfig) -> str:
        return "linear warm-up, warmup-stable-decay" if t.schedule == "wsd" else "linear warm-up, cosine decay"


LMTUNE = TrainSpec(LmtuneModel(), AdamW(), LmtuneSchedule())
"""lmtune's own model, optimizer and schedules: the spec of every run that names no code of its user's."""


def lmtune_spec(config: RunConfig) -> TrainSpec:
    """``LMTUNE`` for a run that names none of its user's code; a run that does is refused in one line: its spec
    comes from lmtune.usercode.spec.spec_for, which the entry point that starts it calls (a caller's bug).

    Args:
        config: the run.
    """
    if config.code.specs:
        raise LmtuneError(f"{', '.join(config.code.specs.values())}: this run names its user's code but was given "
                          "lmtune's training spec; resolve it with lmtune.usercode.spec.spec_for(config)")
    return LMTUNE
