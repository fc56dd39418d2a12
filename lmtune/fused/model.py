"""K Transformer LMs of one shape trained as one (horizontal fusion, HFTA: Wang et al., MLSys 2021).

The model is lmtune.training.model's ``TransformerLM`` itself, not a copy of it: every parameter is held
once per member, stacked along a new first dimension, and TransformerLM's own forward runs for all members
at once under ``torch.func.vmap``, ``functional_call`` handing it each member's slice. Under vmap the
linear layers become batched matmuls, the embedding one lookup and attention one SDPA call over the
members' batches (CUDA's flash, memory-efficient and cuDNN kernels have vmap rules; CPU's flash kernel
runs per member). No operation mixes members, so the gradient of their summed losses is each member's own.

The parameters keep TransformerLM's names, so ``member_state_dict(k)`` is an ordinary single-model state
dict (checkpoints, ``best.pt``).
"""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from lmtune.training.model import TransformerLM

# CPU's flash attention has no vmap rule, so vmap runs it once per member and warns at every call; on the
# quick model with 4 members that measured no slower than one SDPA call over the folded batch.
warnings.filterwarnings("ignore", message=r".*batching rule for aten::_scaled_dot_product_flash_attention_for_cpu")


class FusedTransformerLM(nn.Module):
    """``members`` TransformerLMs of one shape: ``forward(idx, targets)`` returns each member's mean loss (K,).

    ``idx`` is (B, T) when every member sees the same batch (common random numbers) or (K, B, T) for a
    batch per member.
    """

    def __init__(self, models: list[TransformerLM]):
        """The fused model whose member k is ``models[k]`` (one config, device and dtype), copied."""
        super().__init__()
        self.cfg = models[0].cfg
        self.stacked = copy.deepcopy(models[0])
        """A TransformerLM whose every parameter has the members on its first dimension."""
        stacked, _ = stack_module_state(models)
        for name, value in stacked.items():
            owner, _, attr = name.rpartition(".")
            setattr(self.stacked.get_submodule(owner), attr, nn.Parameter(value.detach().clone()))

    @property
    def members(self) -> int:
        return self.stacked.embed.weight.shape[0]

    def member_state_dict(self, k: int) -> dict[str, torch.Tensor]:
        """Member k's weights as a TransformerLM state dict (copies, so they outlive a later ``keep``)."""
        return {name: value[k].detach().clone() for name, value in self.stacked.state_dict().items()}

    @torch.no_grad()
    def keep(self, positions: list[int]) -> None:
        """Keep only the members at ``positions`` (in that order): the others' compute is reclaimed."""
        index = torch.tensor(positions, dtype=torch.long, device=self.stacked.rope_cos.device)
        for param in self.stacked.parameters():
            param.data = param.data.index_select(0, index)
            param.grad = None

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        batch_dim = None if idx.dim() == 2 else 0
        return vmap(self._member_loss, in_dims=(0, batch_dim, batch_dim))(
            dict(self.stacked.named_parameters()), idx, targets)

    def _member_loss(self, params: dict[str, torch.Tensor], idx: torch.Tensor, targets: torch.Tensor):
        return functional_call(self.stacked, params, (idx, targets))

    @torch.no_grad()
    def stability_probes(self, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        """TransformerLM's probes per member (tensors of shape (K,))."""
        probes = _Probes(self.stacked)
        params = {f"model.{name}": p for name, p in self.stacked.named_parameters()}
        batch_dim = None if idx.dim() == 2 else 0
        return vmap(lambda p, x: functional_call(probes, p, (x,)), in_dims=(0, batch_dim))(params, idx)


class _Probes(nn.Module):
    """TransformerLM.probe_tensors as a forward (functional_call calls forward)."""

    def __init__(self, model: TransformerLM):
        super().__init__()
        self.model = model

    def forward(self, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.model.probe_tensors(idx)
