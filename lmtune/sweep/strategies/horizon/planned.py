"""What the horizon search plans: a stage's decision at one point of its axis (a budget, or a width), and each
trial it asks Tune for."""

from __future__ import annotations

from dataclasses import dataclass

from lmtune.sweep.trial_order import TrialOrder, TuneParams


@dataclass(frozen=True)
class Decision:
    """A stage's plan at one point: the LRs it asked for, and why."""

    stage: str
    point: int
    """The budget in steps (search: horizon) or the width, d_model (search: width)."""
    lrs: list[float]
    why: str


@dataclass
class Planned:
    """A trial the search asks for: its stage, point (budget in steps, or width), LR and seed, and why."""

    stage: str
    point: int
    """The budget in steps (search: horizon) or the width, d_model (search: width)."""
    lr: float
    seed: int
    why: str = ""
    fork_from: str | None = None
    """Under WSD: the trial id of this LR and seed's run at a smaller budget, whose stable phase this run
    continues from where it ended (the same run as from scratch: lmtune.training.fork)."""

    def config(self) -> TuneParams:
        """The trial's order as Tune carries it, but for what its point sets (the search's axis adds it:
        SearchAxis.params)."""
        return TrialOrder({"lr": self.lr, "seed": self.seed}, stage=self.stage, fork_from=self.fork_from).to_tune()
