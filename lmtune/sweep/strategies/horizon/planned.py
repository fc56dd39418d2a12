"""What the horizon search plans: a stage's decision at one budget, and each trial it asks Tune for."""

from __future__ import annotations

from dataclasses import dataclass

from lmtune.sweep.tune_types import TuneParams


@dataclass(frozen=True)
class Decision:
    """A stage's plan at one budget: the LRs it asked for, and why."""

    stage: str
    steps: int
    lrs: list[float]
    why: str


@dataclass
class Planned:
    """A trial the search asks for: its stage, budget (steps), LR and seed, and why."""

    stage: str
    steps: int
    lr: float
    seed: int
    why: str = ""
    fork_from: str | None = None
    """Under WSD: the trial id of this LR and seed's run at a smaller budget, whose stable phase this run
    continues from where it ended (the same run as from scratch: lmtune.training.fork)."""

    def config(self) -> TuneParams:
        """The trial's Tune config: the budget is its ``steps`` (its schedule decays over them)."""
        config: TuneParams = {"stage": self.stage, "steps": self.steps, "lr": self.lr, "seed": self.seed}
        if self.fork_from:
            config["fork_from"] = self.fork_from
        return config
