"""The horizon search's settings (the ``horizon:`` section of a space) and the budgets and grids they give.
Ray-free and stateless; lmtune.sweep.strategies.horizon.search decides when.

The target budget is the space's ``steps`` (the budget the user will train at); the searched budgets are
fractions of it, the largest ``largest_fraction`` of it and each next one ``budget_ratio`` times smaller.
Why D/16, D/8, D/4 by default: a line through log LR* needs three budgets to show a trend and a residual;
the largest is as close to the target as the cost allows (one run at each of the three budgets costs 7/16
of one target run); budgets two-fold apart move LR* by a factor 2^beta each, far enough apart that the seed
noise of the best LR does not swamp the slope.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lmtune.errors import LmtuneError


@dataclass(frozen=True)
class HorizonSettings:
    """The ``horizon:`` section of a space with ``search: horizon``."""

    largest_fraction: float = 0.25
    """The largest budget searched, as a fraction of the target budget (the space's steps)."""
    budgets: int = 3
    """How many budgets are searched."""
    budget_ratio: float = 2.0
    """Each searched budget is this factor smaller than the next."""
    lr_min: float = 1e-4
    """The smallest budget's grid starts here ..."""
    lr_max: float = 0.1
    """... and ends at the first LR at or above this."""
    ratio: float = 2.0
    """Neighbouring LRs of a budget's grid differ by this factor."""
    below: int = 2
    """A larger budget's grid: the next smaller budget's best LR and this many grid steps below it (the best
    LR falls as the budget grows) ..."""
    above: int = 1
    """... and this many above it."""
    max_extensions: int = 3
    """A grid whose best LR lies at its end is extended by one LR beyond it, at most this many times."""
    seeds: int = 3
    """Runs of each budget's best LR and of its two neighbours, the first seed included: the best LR is
    chosen on the mean, and its seed spread is the fit's uncertainty."""
    seed_rounds: int = 1
    """Further rounds of seeds for an LR that beats a budget's crowned best seed for seed."""
    edge_probes: int = 3
    """Full-budget probes per budget for where training fails (0: none): from the budget's highest LR that
    trained through, edge_ratio x up until one fails, then halving the bracket in log LR."""
    edge_ratio: float = 4.0
    """The step of an edge probe above the highest LR that trained through."""
    edge_tolerance: float = 2.0
    """The edge probes stop once failed LR / trained-through LR <= this."""
    confirm_ratio: float = 2.0
    """Confirmation at the target budget: the predicted LR, and it divided and multiplied by this."""
    confirm_seeds: int = 1
    """Runs of each confirmation LR."""
    resamples: int = 2000
    """Bootstrap resamples of the fit."""

    def problems(self) -> list[tuple[str, str]]:
        """(key, what is wrong and the fix) for each setting no search could use."""
        checks = [
            ("largest_fraction", 0 < self.largest_fraction < 1,
             "must be between 0 and 1 (a fraction of the target budget, e.g. 0.25)"),
            ("budgets", self.budgets >= 2, "must be at least 2 (a line needs two budgets; 3 shows its residual)"),
            ("budget_ratio", self.budget_ratio > 1, "must be above 1, e.g. 2"),
            ("lr_min", self.lr_min > 0, "must be > 0, e.g. 1e-4"),
            ("lr_max", self.lr_max > self.lr_min, f"must be above lr_min ({self.lr_min:g})"),
            ("ratio", self.ratio > 1, "must be above 1, e.g. 2"),
            ("below", self.below >= 0, "must be >= 0"),
            ("above", self.above >= 0, "must be >= 0"),
            ("max_extensions", self.max_extensions >= 0, "must be >= 0"),
            ("seeds", self.seeds >= 1, "must be at least 1 (1: no further seeds)"),
            ("seed_rounds", self.seed_rounds >= 0, "must be >= 0"),
            ("edge_probes", self.edge_probes >= 0, "must be >= 0 (0: no edge probes)"),
            ("edge_ratio", self.edge_ratio > 1, "must be above 1, e.g. 4"),
            ("edge_tolerance", 1 < self.edge_tolerance <= self.edge_ratio,
             f"must be above 1 and at most edge_ratio ({self.edge_ratio:g}), e.g. 2"),
            ("confirm_ratio", self.confirm_ratio > 1, "must be above 1, e.g. 2"),
            ("confirm_seeds", self.confirm_seeds >= 1, "must be at least 1"),
            ("resamples", self.resamples >= 100, "must be at least 100"),
        ]
        return [(key, f"{message} (got {getattr(self, key)!r})") for key, ok, message in checks if not ok]

    def budget_steps(self, target_steps: int) -> list[int]:
        """The searched budgets in steps, smallest first."""
        return sorted(max(1, round(target_steps * self.largest_fraction / self.budget_ratio ** k))
                      for k in range(self.budgets))

    def check_target(self, target_steps: int, warmup_steps: int) -> None:
        """One line when the smallest budget cannot hold the warm-up, or two budgets round to one."""
        steps = self.budget_steps(target_steps)
        if len(set(steps)) < len(steps):
            raise LmtuneError(f"horizon: a target of {target_steps} steps gives budgets {steps}, some the same; "
                              "give a larger steps or fewer horizon.budgets")
        if steps[0] <= warmup_steps:
            raise LmtuneError(f"horizon: the smallest budget, {steps[0]} steps ({target_steps} x "
                              f"{self.largest_fraction:g} / {self.budget_ratio:g}^{self.budgets - 1}), does not "
                              f"outlast the {warmup_steps} warm-up steps; give a larger steps, a smaller "
                              "warmup_steps or fewer horizon.budgets")

    def first_grid(self) -> list[float]:
        """The smallest budget's LRs: lr_min up to the first at or above lr_max, ``ratio`` apart."""
        count = max(2, math.ceil(math.log(self.lr_max / self.lr_min) / math.log(self.ratio) - 1e-9) + 1)
        return [self.lr_min * self.ratio ** k for k in range(count)]

    def grid_around(self, best_lr: float) -> list[float]:
        """A larger budget's LRs around the smaller budget's best: ``below`` steps down, ``above`` up."""
        return [best_lr * self.ratio ** k for k in range(-self.below, self.above + 1)]

    def confirmation_lrs(self, predicted_lr: float) -> list[float]:
        return [predicted_lr / self.confirm_ratio, predicted_lr, predicted_lr * self.confirm_ratio]
