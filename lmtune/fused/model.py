"""K language models of one shape trained as one (horizontal fusion, HFTA: Wang et al., MLSys 2021).

The model is the members' own class (lmtune's ``TransformerLM`` or the user's model), not a copy of its code:
every parameter is held once per member, stacked along a new first dimension, and the model's own forward runs for
all members at once under ``torch.func.vmap``, ``functional_call`` handing it each member's slice. Under vmap the
linear layers become batched matmuls, the embedding one lookup and attention one SDPA call over the
members' batches (CUDA's flash and memory-efficient kernels have vmap rules; CPU's flash kernel
runs per member; cuDNN's is left out: it does not compile under vmap). No operation mixes members, so the gradient
of their summed losses is each member's own.
A user's model fuses where vmap can run its forward (lmtune.usercode.checks tries it before a sweep fuses one).

The parameters keep the model's names, so ``member_state_dict(k)`` is an ordinary single-model state
dict (checkpoints, ``best.pt``); buffers (RoPE tables) are the first member's, shared by all.
"""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap
from torch.nn.attention import SDPBackend, sdpa_kernel

from lmtune.training.model import lm_loss
from lmtune.training.spec import ModelSpec

# CPU's flash attention has no vmap rule, so vmap runs it once per member and warns at every call; on the
# quick model with 4 members that measured no slower than one SDPA call over the folded batch.
warnings.filterwarnings("ignore", message=r".*batching rule for aten::_scaled_dot_product_flash_attention_for_cpu")
# cuDNN's attention under vmap does not compile: on an H200 (torch 2.11+cu130) torch.compile of a fused group failed
# at its first call ("expected Tensor() for op: torch.ops.aten._scaled_dot_product_cudnn_attention.default") and the
# group trained eager. A fused group attends with the other kernels (dynamo traces sdpa_kernel; a single model keeps
# whichever kernel SDPA picks).
FUSED_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


class FusedLM(nn.Module):
    """``members`` language models of one shape: ``forward(idx, targets)`` returns each member's mean loss (K,),
    cross-entropy plus ``z_loss`` times log^2 Z, as lmtune.training.lm.LanguageModelLoss computes one model's.

    ``idx`` is (B, T) when every member sees the same batch (common random numbers) or (K, B, T) for a
    batch per member.
    """

    computes_loss = True
    """Its forward is the loss already (lmtune.training.step.Runtime takes it as it is)."""

    def __init__(self, models: list[nn.Module], z_loss: float, spec: ModelSpec):
        """The fused model whose member k is ``models[k]`` (one config, device and dtype, built by ``spec``),
        copied."""
        super().__init__()
        self.z_loss, self.spec = z_loss, spec
        self.weight_decay_multipliers = spec.weight_decay_multipliers(models[0])
        """A member's weight-decay multipliers by parameter name (the spec's): a member's, not the stacked
        model's, whose every parameter has one dimension more (the shape rule would decay its gains)."""
        self.lr_multipliers = spec.lr_multipliers(models[0])
        """A member's LR multipliers by parameter name."""
        self.stacked = copy.deepcopy(models[0])
        """The model whose every parameter has the members on its first dimension."""
        stacked, _ = stack_module_state(models)  # (by each parameter's first name: a tied one once)
        params = {name: nn.Parameter(value.detach().clone()) for name, value in stacked.items()}
        first_name: dict[int, str] = {}
        for name, param in models[0].named_parameters(remove_duplicate=False):  # a tied parameter stays tied
            owner, _, attr = name.rpartition(".")
            setattr(self.stacked.get_submodule(owner), attr, params[first_name.setdefault(id(param), name)])

    @property
    def members(self) -> int:
        return next(self.stacked.parameters()).shape[0]

    def member_state_dict(self, k: int) -> dict[str, torch.Tensor]:
        """Member k's weights as the model's state dict (copies, so they outlive a later ``keep``)."""
        return {name: value[k].detach().clone() for name, value in self.stacked.state_dict().items()}

    @torch.no_grad()
    def keep(self, positions: list[int]) -> None:
        """Keep only the members at ``positions`` (in that order): the others' compute is reclaimed."""
        index = torch.tensor(positions, dtype=torch.long, device=next(self.stacked.parameters()).device)
        for param in self.stacked.parameters():
            param.data = param.data.index_select(0, index)
            param.grad = None

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        batch_dim = None if idx.dim() == 2 else 0
        with sdpa_kernel(FUSED_SDPA_BACKENDS):
            return vmap(self._member_loss, in_dims=(0, batch_dim, batch_dim))(
                dict(self.stacked.named_parameters()), idx, targets)

    def _member_loss(self, params: dict[str, torch.Tensor], idx: torch.Tensor, targets: torch.Tensor):
        return lm_loss(functional_call(self.stacked, params, (idx,)), targets, self.z_loss)

    @torch.no_grad()
    def stability_probes(self, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        """The model's probes (its spec's) per member (tensors of shape (K,))."""
        probes = _Probes(self.stacked, self.spec)
        params = {f"model.{name}": p for name, p in self.stacked.named_parameters()}
        batch_dim = None if idx.dim() == 2 else 0
        return vmap(lambda p, x: functional_call(probes, p, (x,)), in_dims=(0, batch_dim))(params, idx)


class _Probes(nn.Module):
    """The model's probes (``spec``'s) as a forward (functional_call calls forward)."""

    def __init__(self, model: nn.Module, spec: ModelSpec):
        super().__init__()
        self.model, self.spec = model, spec

    def forward(self, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.spec.probes(self.model, idx)
