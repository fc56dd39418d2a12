"""The training state: the model, its optimizer, the step count, and what a checkpoint restores.

Everything a training step changes lives here, so the loop, the benchmark and a resumed run all
start from the same ``TrainState.create`` and save/restore through ``state_dict``.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict, cast

import numpy as np
import torch
from torch import nn
from torch.optim.optimizer import StateDict

from lmtune.errors import LmtuneError
from lmtune.training.config import RunConfig
from lmtune.training.spec import ModelSpec, TrainSpec, lmtune_spec


class RngState(TypedDict):
    """Every random generator's state, as a checkpoint file holds it (tensors and lists: weights_only loads it)."""

    torch: torch.Tensor
    """torch's CPU generator."""
    numpy: list
    """numpy's legacy global generator: (name, keys as a list, pos, has_gauss, cached_gaussian)."""
    python: list
    """``random``'s state, its tuples as lists."""
    cuda: NotRequired[torch.Tensor]
    """The CUDA device's generator (a run on CUDA only)."""


class TrainStateDict(TypedDict):
    """A TrainState as a checkpoint file holds it (lmtune.training.checkpoint adds what a resume needs besides)."""

    model: dict[str, torch.Tensor]
    """The model's state_dict."""
    optimizer: StateDict
    """The optimizer's state_dict (torch's own format)."""
    step: int
    """Optimizer steps taken."""
    best_val_loss: float
    """Lowest validation loss so far."""
    elapsed_s: NotRequired[float]
    """Wall time of the processes so far (absent from checkpoints of older versions: 0)."""
    rng: RngState
    """Every random generator's state."""


@dataclass
class TrainState:
    model: nn.Module
    """The eager module (lmtune's TransformerLM or the user's model): its parameters are what the optimizer updates
    and checkpoints hold."""
    optimizer: torch.optim.Optimizer
    """lmtune's AdamW, or the user's optimizer (--optimizer)."""
    step: int = 0
    """Optimizer steps taken (the next step is step + 1)."""
    best_val_loss: float = math.inf
    """Lowest validation loss so far (best.pt holds the model that reached it)."""
    elapsed_s: float = 0.0
    """Wall time of the earlier processes of a resumed run."""

    @classmethod
    def create(cls, config: RunConfig, device: torch.device, spec: TrainSpec | None = None) -> TrainState:
        """A freshly initialised model and optimizer, as ``spec`` (None: lmtune's own) builds them: seeded, so the
        same config starts identically."""
        spec = spec or lmtune_spec(config)
        seed_everything(config.train.seed)
        model = spec.model.build(config, device)
        return cls(model=model, optimizer=build_optimizer(model, config, device, spec=spec))

    def state_dict(self) -> TrainStateDict:
        device = next(self.model.parameters()).device
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "step": self.step,
                "best_val_loss": self.best_val_loss, "elapsed_s": self.elapsed_s, "rng": rng_state(device)}

    def load_state_dict(self, saved: TrainStateDict) -> None:
        device = next(self.model.parameters()).device
        check_same_parameters(self.model, saved["model"])
        self.model.load_state_dict(saved["model"])
        self.optimizer.load_state_dict(saved["optimizer"])
        self.step, self.best_val_loss = saved["step"], saved["best_val_loss"]
        self.elapsed_s = saved.get("elapsed_s", 0.0)
        restore_rng_state(saved["rng"], device)


@dataclass(frozen=True)
class ParamGroup:
    """One of ``build_optimizer``'s parameter groups, by the parameters' names."""

    names: tuple[str, ...]
    """Its parameters (the model's names, in the model's order)."""
    weight_decay_scale: float
    """Its weight decay over the config's: 0 (RMSNorm gains), 1, or m (μP's hidden matrices)."""
    lr_scale: float
    """Its learning rate over the schedule's: 1, or 1/m (μP's hidden matrices)."""


def param_groups(model: nn.Module, spec: ModelSpec) -> list[ParamGroup]:
    """The parameters grouped by (weight decay, LR) multiplier (``spec``'s, which built the model): the decayed
    groups first, then the undecayed (gains, biases), each in the order of its first parameter. Under SP (or μP at
    its base width) that is two groups, the matrices and the gains, so the optimizer's state-dict indices stay what
    older checkpoints hold."""
    return grouped(spec.weight_decay_multipliers(model), spec.lr_multipliers(model))


def grouped(decay: dict[str, float], lr: dict[str, float]) -> list[ParamGroup]:
    """``param_groups`` of a model whose parameters' multipliers are ``decay`` and ``lr`` (by name, in the model's
    order)."""
    groups: dict[tuple[float, float], list[str]] = {}
    for name in sorted(decay, key=lambda n: decay[n] == 0.0):  # stable: the model's order within each part
        groups.setdefault((decay[name], lr[name]), []).append(name)
    return [ParamGroup(tuple(names), wd, scale) for (wd, scale), names in groups.items()]


def optimizer_order(model: nn.Module, spec: ModelSpec) -> list[str]:
    """Parameter names in the order ``build_optimizer`` lists them (its state dict's integer keys)."""
    return [name for group in param_groups(model, spec) for name in group.names]


def build_optimizer(model: nn.Module, config: RunConfig, device: torch.device, fused: bool | None = None,
                    spec: TrainSpec | None = None) -> torch.optim.Optimizer:
    """``spec``'s optimizer (None: lmtune's AdamW) over a group per ``param_groups`` entry, weight decay on matrices
    only (not on gains or biases), each group's ``lr_scale`` the step multiplies the schedule's LR by. lmtune's
    AdamW runs fused kernels (one launch for every parameter, no host sync) on CUDA, or wherever ``fused`` asks;
    else torch's foreach implementation."""
    spec = spec or lmtune_spec(config)
    params = dict(model.named_parameters())
    t = config.train
    groups = [{"params": [params[n] for n in g.names], "weight_decay": t.weight_decay * g.weight_decay_scale,
               "lr": t.lr * g.lr_scale, "lr_scale": g.lr_scale} for g in param_groups(model, spec.model)]
    return spec.optimizer.build(groups, t, device, fused)


def check_same_parameters(model: nn.Module, saved: dict[str, torch.Tensor], where: str = "the checkpoint") -> None:
    """One line when ``saved`` (a state dict) is not of ``model``'s parameters and buffers: names or shapes differ,
    as when the model's code changed since the run began."""
    own = model.state_dict()
    missing = sorted(set(own) - set(saved))
    unexpected = sorted(set(saved) - set(own))
    reshaped = sorted(k for k in set(own) & set(saved) if tuple(own[k].shape) != tuple(saved[k].shape))
    if not (missing or unexpected or reshaped):
        return
    found = (("missing", missing), ("not in the model", unexpected), ("of another shape", reshaped))
    parts = [f"{label} {', '.join(names[:3])}{', ...' if len(names) > 3 else ''}" for label, names in found if names]
    raise LmtuneError(f"{where} holds another model than the one built now ({'; '.join(parts)}): the model's code or "
                      "shape changed since the run began; restore that code, or start a new run")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state(device: torch.device) -> RngState:
    """Every random generator's state, as tensors and lists (loadable with weights_only=True)."""
    np_state = cast(tuple[Any, ...], np.random.get_state())  # (the legacy tuple)
    state: RngState = {
        "torch": torch.get_rng_state(),
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "python": _tuples_to_lists(random.getstate()),
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng_state(state: RngState, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    random.setstate(_lists_to_tuples(state["python"]))
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def _tuples_to_lists(value):
    return [_tuples_to_lists(v) for v in value] if isinstance(value, (tuple, list)) else value


def _lists_to_tuples(value):
    return tuple(_lists_to_tuples(v) for v in value) if isinstance(value, list) else value
