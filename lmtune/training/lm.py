"""What lmtune needs of a language model, whoever wrote it.

A run trains lmtune's own TransformerLM (lmtune.training.model) or the model its user brings (``--model``,
lmtune.usercode): any nn.Module whose ``forward(token_ids[B, T])`` gives logits ``[B, T, vocab]``. What the training
loops, the fused groups, the probes, the optimizer and the FLOP counts need of a model goes through here, so none of
them names a class:

    build_model(config, device)        the model a RunConfig describes (the caller seeds it)
    LanguageModelLoss(model, z_loss)   forward(idx, targets): the mean loss lmtune trains (cross-entropy + z-loss)
    probe_tensors(model, idx)          the stability probes the model allows (attention logits: lmtune's only)
    block_parameters(model)            its parameters by transformer block (the relative update size per block)
    weight_decay_multipliers, lr_multipliers   per parameter: μP's in lmtune's model; decay on matrices otherwise
    model_size(config)                 parameter counts and training FLOPs per token (a user's model's counted)
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
from dataclasses import dataclass

import torch
from torch import nn

from lmtune.training.config import RunConfig
from lmtune.training.model import TransformerLM, count_parameters, lm_loss
from lmtune.training.model import flops_per_token as lmtune_flops_per_token

log = logging.getLogger(__name__)


def build_model(config: RunConfig, device: torch.device, dtype: torch.dtype = torch.float32) -> nn.Module:
    """The model ``config`` describes, on ``device`` with parameters in ``dtype``: the user's (config.code.model) or
    lmtune's TransformerLM. Seeding is the caller's (lmtune.training.state.seed_everything)."""
    if config.code.user_model:
        from lmtune.usercode.model import build_user_model

        return build_user_model(config.code, config.model, device, dtype)
    return TransformerLM(config.model).to(device=device, dtype=dtype)


def is_lmtune_model(model: nn.Module) -> bool:
    return isinstance(model, TransformerLM)


class LanguageModelLoss(nn.Module):
    """``forward(idx, targets)``: the mean next-token loss of ``model``'s logits (cross-entropy + z-loss, in at least
    float32): what a training step differentiates and torch.compile compiles, the model inside."""

    def __init__(self, model: nn.Module, z_loss: float = 0.0):
        super().__init__()
        self.model = model
        self.z_loss = z_loss

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return lm_loss(self.model(idx), targets, self.z_loss)


@torch.no_grad()
def probe_tensors(model: nn.Module, idx: torch.Tensor) -> dict[str, torch.Tensor]:
    """The stability probes of ``model`` on ``idx`` as 0-d device tensors (no host sync): lmtune's model gives the
    attention-logit maximum too; any other model the output logits' (its attention is not exposed)."""
    if is_lmtune_model(model):
        return model.probe_tensors(idx)
    logits = model(idx).float()
    return {"output_logit_max": logits.abs().amax(), "output_logz_mean": logits.logsumexp(-1).mean()}


# The first dotted component of a parameter name that is a layer index: "layers.3.attn.q" -> "layers.3".
_LAYER_INDEX = re.compile(r"^((?:[^.]+\.)*?\d+)\.")


def block_parameters(model: nn.Module) -> list[list[nn.Parameter]]:
    """The model's parameters by transformer block, in the model's order: a block is everything under a name with a
    layer index (``blocks.3.`` in lmtune's model, ``layers.3.`` in CS336's); parameters outside every block (the
    embedding, the final norm, the output) are left out. A model without layer indices: one group per top-level
    module."""
    groups: dict[str, list[nn.Parameter]] = {}
    for name, param in model.named_parameters():
        if (match := _LAYER_INDEX.match(name)) is not None:
            groups.setdefault(match.group(1), []).append(param)
    if groups:
        return list(groups.values())
    for name, param in model.named_parameters():
        groups.setdefault(name.split(".")[0], []).append(param)
    return list(groups.values())


def weight_decay_multipliers(model: nn.Module) -> dict[str, float]:
    """Each parameter's weight decay over the config's, by name: lmtune's model's own (0 for its RMSNorm gains, m
    for μP's hidden matrices); for any other model 1 for matrices and embeddings, 0 for vectors (gains, biases)."""
    if is_lmtune_model(model):
        return model.weight_decay_multipliers()
    return {name: 1.0 if param.ndim >= 2 else 0.0 for name, param in model.named_parameters()}


def lr_multipliers(model: nn.Module) -> dict[str, float]:
    """Each parameter's LR over the schedule's, by name: μP's in lmtune's model, 1.0 everywhere else."""
    if is_lmtune_model(model):
        return model.lr_multipliers()
    return {name: 1.0 for name, _ in model.named_parameters()}


@dataclass(frozen=True)
class ModelSize:
    """A model's parameter counts and training FLOPs per token."""

    total: int
    """Every parameter (a tied one once)."""
    non_embedding: int
    """All but the token embedding and the output projection (the convention of CS336's "17M")."""
    flops_per_token: float
    """Training FLOPs per token: 6 x (non-embedding + output projection) + attention, 12 n_layers context d_model."""
    estimated: bool = False
    """True where the FLOPs are a formula's over a user's model's parameters (its count failed): the embedding and
    output told apart by shape, the attention term the config's. lmtune's own model's formula is exact."""
    counted: bool = False
    """True where the FLOPs of a user's model were counted (counted_flops_per_token)."""


def model_size(config: RunConfig, count_flops: bool = True) -> ModelSize:
    """The size of the model ``config`` describes, without training it (a user's model is built once on the CPU to
    count it, lmtune.usercode.model.named_parameter_shapes; ``count_flops``: its FLOPs counted too, else the formula's,
    for a caller that reads only the parameter counts)."""
    m = config.model
    if not config.code.user_model:
        counts = count_parameters(m)
        return ModelSize(counts["total"], counts["non_embedding"], lmtune_flops_per_token(m))
    from lmtune.usercode.model import parameter_shapes

    total, vocab_matrices = 0, 0
    for shape in parameter_shapes(config.code, m):
        count = 1
        for dim in shape:
            count *= dim
        total += count
        if len(shape) == 2 and sorted(shape) == sorted((m.vocab_size, m.d_model)):
            vocab_matrices += count  # the embedding or the output projection (tied: one matrix)
    non_embedding = total - vocab_matrices
    counted = counted_flops_per_token(config) if count_flops else None
    if counted is not None:
        return ModelSize(total, non_embedding, counted, counted=True)
    return ModelSize(total, non_embedding, formula_flops_per_token(config, non_embedding), estimated=True)


def formula_flops_per_token(config: RunConfig, non_embedding: int) -> float:
    """The 6N rule over a user's model's non-embedding parameters, its output projection's matmul (tied or not) and
    attention's 12 n_layers context d_model: the fallback where its FLOPs cannot be counted."""
    m = config.model
    return 6.0 * (non_embedding + m.vocab_size * m.d_model) + 12.0 * m.n_layers * m.context_length * m.d_model


def counted_flops_per_token(config: RunConfig) -> float | None:
    """Training FLOPs per token of the user's model, counted by torch.utils.flop_counter.FlopCounterMode over one
    forward and backward of the loss lmtune trains, on one sequence of context_length tokens on the CPU (matmuls and
    attention as torch counts them; the random state left as it was). None where the count fails (the caller falls
    back to the formula and says so). Cached per process, by the model's code and shape."""
    return _counted(config.code.model, tuple(sorted(config.code.model_args.items())),
                    tuple(sorted(dataclasses.asdict(config.model).items())))


@functools.lru_cache(maxsize=16)
def _counted(spec: str, model_args: tuple, model_key: tuple) -> float | None:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from lmtune.training.config import ModelConfig
    from lmtune.usercode.config import UserCode
    from lmtune.usercode.model import build_user_model

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


def flops_per_token(config: RunConfig) -> float:
    """Training FLOPs per token of the model ``config`` describes (model_size's)."""
    return model_size(config).flops_per_token
