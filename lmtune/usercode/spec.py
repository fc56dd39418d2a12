"""The user's training spec: the model (``--model``), optimizer (``--optimizer``) and schedule (``--schedule``) a
run's UserCode names, each in place of lmtune's own (lmtune.training.spec.LMTUNE) where it is named, and guarded
as lmtune.usercode.model and lmtune.usercode.optim guard them.

``spec_for(config)`` is what an entry point (train, a sweep's trial, lr_find, bench, the report) calls once to learn
how the run it starts builds its model, optimizer and schedule; ``model_size(config)`` is the spec's size of the
model, for the callers above training that only count it; ``load_model`` a checkpoint's model, the user's built only
with the user's consent.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from lmtune.training.config import RunConfig, TrainConfig
from lmtune.training.lm import LanguageModelLoss, ModelSize, formula_flops_per_token
from lmtune.training.model_config import ModelConfig
from lmtune.training.sampling import read_model_checkpoint, with_weights
from lmtune.training.spec import LMTUNE, TrainSpec
from lmtune.usercode.config import UserCode
from lmtune.usercode.consent import NO_CONSENT, CodeConsent, only_consented_code
from lmtune.usercode.model import build_user_model, parameter_fingerprint, parameter_shapes
from lmtune.usercode.optim import build_user_optimizer, user_schedule

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class UserModel:
    """The user's model: any nn.Module whose forward(token_ids[B, T]) gives logits; lmtune knows it only as that
    (output-logit probes, decay on matrices, LR multiplier 1, its FLOPs counted, its activations measured)."""

    code: UserCode

    measured_memory = True
    exposes_layers = False

    def build(self, config: RunConfig, device: torch.device, dtype: torch.dtype = torch.float32) -> nn.Module:
        return build_user_model(self.code, config.model, device, dtype)

    def size(self, config: RunConfig, count_flops: bool = True) -> ModelSize:
        """Counted from one build on the CPU (lmtune.usercode.model.named_parameter_shapes); its FLOPs counted
        where ``count_flops`` (else, or where the count fails, the formula's)."""
        m = config.model
        total, vocab_matrices = 0, 0
        for shape in parameter_shapes(self.code, m):
            count = 1
            for dim in shape:
                count *= dim
            total += count
            if len(shape) == 2 and sorted(shape) == sorted((m.vocab_size, m.d_model)):
                vocab_matrices += count  # the embedding or the output projection (tied: one matrix)
        non_embedding = total - vocab_matrices
        counted = counted_flops_per_token(self.code, m) if count_flops else None
        if counted is not None:
            return ModelSize(total, non_embedding, counted, counted=True)
        return ModelSize(total, non_embedding, formula_flops_per_token(config, non_embedding), estimated=True)

    def parameter_tensors(self, config: RunConfig) -> int:
        return len(parameter_shapes(self.code, config.model))

    def fingerprint(self, config: RunConfig) -> str:
        return parameter_fingerprint(self.code, config.model)  # (its code may build other parameters next time)

    @torch.no_grad()
    def probes(self, model: nn.Module, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = model(idx).float()  # (its attention is not exposed: the output logits' only)
        return {"output_logit_max": logits.abs().amax(), "output_logz_mean": logits.logsumexp(-1).mean()}

    def weight_decay_multipliers(self, model: nn.Module) -> dict[str, float]:
        return {name: 1.0 if param.ndim >= 2 else 0.0 for name, param in model.named_parameters()}

    def lr_multipliers(self, model: nn.Module) -> dict[str, float]:
        return {name: 1.0 for name, _ in model.named_parameters()}

    def plain_attention(self, model: nn.Module) -> None:
        """A user's model runs as written."""


@dataclasses.dataclass(frozen=True)
class UserOptimizer:
    """The user's torch.optim.Optimizer class, called as CLASS(param_groups, lr=, betas=, eps=, weight_decay=)."""

    spec: str

    def build(self, groups: list[dict], t: TrainConfig, device: torch.device,
              fused: bool | None = None) -> torch.optim.Optimizer:
        return build_user_optimizer(UserCode(optimizer=self.spec), groups, t)


@dataclasses.dataclass(frozen=True)
class UserSchedule:
    """The user's schedule function, called as CS336's (lmtune.usercode.optim.user_schedule checks it)."""

    spec: str

    def lr_function(self, config: RunConfig) -> Callable[[int], float]:
        return user_schedule(dataclasses.replace(config, code=UserCode(schedule=self.spec)))

    def describe(self, t: TrainConfig) -> str:
        return self.spec


def spec_for(config: RunConfig) -> TrainSpec:
    """The training spec of the run ``config`` configures: the user's model, optimizer and schedule where its code
    names them, lmtune's own where not.

    Args:
        config: the run (its ``code`` section names the user's code).
    """
    code = config.code
    return TrainSpec(UserModel(code) if code.model else LMTUNE.model,
                     UserOptimizer(code.optimizer) if code.optimizer else LMTUNE.optimizer,
                     UserSchedule(code.schedule) if code.schedule else LMTUNE.schedule)


def load_model(checkpoint: Path, device: torch.device,
               consent: CodeConsent = NO_CONSENT) -> tuple[nn.Module, RunConfig]:
    """The model a checkpoint holds (best.pt, or a periodic one), built as its own config says, in eval mode on
    ``device``; one line when the file cannot serve. A user's model is code the checkpoint names: built only as
    ``consent`` allows (--model's in its place, or the recorded one), FolderCodeRefused otherwise."""
    config, weights = read_model_checkpoint(checkpoint)
    config.code = consent.code_for(config.code, str(checkpoint))
    with only_consented_code(consent):
        model = spec_for(config).model.build(config, device)
    return with_weights(model, weights, checkpoint), config


def model_size(config: RunConfig, count_flops: bool = True) -> ModelSize:
    """The size of the model ``config`` describes, by its spec, without training it."""
    return spec_for(config).model.size(config, count_flops)


def flops_per_token(config: RunConfig) -> float:
    """Training FLOPs per token of the model ``config`` describes (model_size's)."""
    return model_size(config).flops_per_token


def counted_flops_per_token(code: UserCode, model: ModelConfig) -> float | None:
    """Training FLOPs per token of the user's model, counted by torch.utils.flop_counter.FlopCounterMode over one
    forward and backward of the loss lmtune trains, on one sequence of context_length tokens on the CPU (matmuls and
    attention as torch counts them; the random state left as it was). None where the count fails (the caller falls
    back to the formula and says so). Cached per process, by the model's code and shape."""
    return _counted(code.model, tuple(sorted(code.model_args.items())),
                    tuple(sorted(dataclasses.asdict(model).items())))


@functools.lru_cache(maxsize=16)
def _counted(spec: str, model_args: tuple, model_key: tuple) -> float | None:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    shape = ModelConfig(**dict(model_key))
    tokens = shape.context_length
    try:
        with torch.random.fork_rng(devices=[]):
            model = build_user_model(UserCode(spec, dict(model_args)), shape, torch.device("cpu"))
            idx = torch.randint(0, shape.vocab_size, (1, tokens + 1), generator=torch.Generator().manual_seed(0))
            # SDPA's fused CPU kernels are not in FlopCounterMode's registry (counted as 0); its math backend is
            # matmuls, counted.
            with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
                LanguageModelLoss(model)(idx[:, :-1], idx[:, 1:]).backward()
        total = counter.get_total_flops()
    except Exception:  # noqa: BLE001 - any failure of the user's code here: the formula stands in, labelled
        log.warning("could not count the FLOPs of %s with FlopCounterMode; estimating them by formula", spec,
                    exc_info=True)
        return None
    return float(total) / tokens if total > 0 else None
