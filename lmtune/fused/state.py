"""The training state of a fused group: the fused model, its per-member AdamW, the step, and which of
the group's members are still in the fused tensors.

A member goes in and out as an ordinary single-model ``TrainState``: ``create`` initialises each
member exactly as an unfused run with its seed would, ``member_train_state`` is what its checkpoint
saves, and ``load_member`` takes a single-model checkpoint back in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from lmtune.fused.model import FusedLM
from lmtune.fused.optim import MemberAdamW, MemberHyperparameters
from lmtune.training.config import RunConfig
from lmtune.training.spec import TrainSpec, lmtune_spec
from lmtune.training.state import TrainState, TrainStateDict, build_optimizer, grouped, seed_everything


def adamw_order(model: FusedLM) -> list[str]:
    """Parameter names in the order ``build_optimizer`` lists a member's (its state dict's integer keys): its
    param groups' (by name and a member's multipliers)."""
    return [name for group in grouped(model.weight_decay_multipliers, model.lr_multipliers) for name in group.names]


@dataclass
class FusedState:
    model: FusedLM
    optimizer: MemberAdamW
    configs: list[RunConfig]
    """Every member's config, by the member's index in the group."""
    positions: list[int]
    """The group index of the member at each position of the fused tensors."""
    active: torch.Tensor
    """(K,) device bools: false once a member's step went non-finite (its updates are masked)."""
    spec: TrainSpec | None = None
    """How each member's model and its checkpoint's optimizer are built (None: lmtune's own)."""
    step: int = 0
    compiled_update: Callable | None = None
    """The clipping and AdamW update, compiled (lmtune.fused.step.compile_update), or None: eager."""

    @classmethod
    def create(cls, configs: Sequence[RunConfig], device: torch.device,
               dtype: torch.dtype = torch.float32, spec: TrainSpec | None = None) -> FusedState:
        """Each member initialised as ``TrainState.create`` would with its seed (one model per seed), its
        parameters in ``dtype`` (float64 to check the fusion's arithmetic against separate runs), built by ``spec``
        (the members'; None: lmtune's own)."""
        spec = spec or lmtune_spec(configs[0])
        by_seed: dict[int, nn.Module] = {}
        for config in configs:
            seed = config.train.seed
            if seed not in by_seed:
                seed_everything(seed)
                by_seed[seed] = spec.model.build(config, device, dtype)
        model = FusedLM([by_seed[c.train.seed] for c in configs], configs[0].model.z_loss, spec.model)
        like = next(model.parameters())
        optimizer = MemberAdamW(model, MemberHyperparameters.of([c.train for c in configs], like))
        active = torch.ones(len(configs), dtype=torch.bool, device=device)
        return cls(model, optimizer, list(configs), list(range(len(configs))), active, spec)

    @property
    def device(self) -> torch.device:
        return self.active.device

    def freeze(self, member: int) -> None:
        """The member's updates are masked from now on (it ended; its slot may stay in the tensors)."""
        self.active[self.positions.index(member)] = False

    def keep(self, members: list[int]) -> None:
        """Keep only these group members (in their current order) in the fused tensors."""
        positions = [self.positions.index(m) for m in members]
        self.model.keep(positions)
        self.optimizer.keep(positions)
        self.active = self.active[torch.tensor(positions, dtype=torch.long, device=self.device)]
        self.positions = list(members)

    def member_train_state(self, member: int, best_val_loss: float, elapsed_s: float) -> TrainState:
        """The member as a single-model TrainState (model and AdamW state): what its checkpoint holds."""
        config, position = self.configs[member], self.positions.index(member)
        spec = self.spec or lmtune_spec(config)
        model = spec.model.build(config, self.device, next(self.model.parameters()).dtype)
        model.load_state_dict(self.model.member_state_dict(position))
        optimizer = build_optimizer(model, config, self.device, spec=spec)
        params = dict(model.named_parameters())
        steps = float(self.optimizer.steps[position])
        for name, (m, v) in self.optimizer.member_moments(position).items():
            optimizer.state[params[name]] = {"step": torch.tensor(steps), "exp_avg": m, "exp_avg_sq": v}
        return TrainState(model, optimizer, self.step, best_val_loss, elapsed_s)

    @torch.no_grad()
    def load_member(self, member: int, saved: TrainStateDict) -> None:
        """A single-model checkpoint (``TrainState.state_dict``) into the member's slice."""
        position = self.positions.index(member)
        params = dict(self.model.stacked.named_parameters())
        for name, value in saved["model"].items():
            params[name][position].copy_(value)
        names = adamw_order(self.model)
        state = saved["optimizer"]["state"]
        moments = {names[int(i)]: (s["exp_avg"], s["exp_avg_sq"]) for i, s in state.items()}
        steps = int(float(next(iter(state.values()))["step"])) if state else 0
        self.optimizer.load_member_moments(position, moments, steps)
