"""The horizon search's settings (the ``horizon:`` section of a space) and the budgets and grids they give.
Ray-free and stateless; lmtune.searches.axis.search decides when. (What the horizon and width searches share of
their settings: lmtune.searches.axis.settings.)

The target budget is the space's ``steps`` (the budget the user will train at); the searched budgets are
fractions of it, the largest ``largest_fraction`` of it and each next one ``budget_ratio`` times smaller.
Why D/16, D/8, D/4 by default: a line through log LR* needs three budgets to show a trend and a residual;
the largest is as close to the target as the cost allows (one run at each of the three budgets costs 7/16
of one target run); budgets two-fold apart move LR* by a factor 2^beta each (1.23x for beta = 0.3), less
than one step of a 1.5x grid, so each budget's LR* is located between grid points (``refine``, and
lmtune.analysis.locate) rather than read off the grid.

What these defaults resolve, by simulation (benchmarks/horizon_coverage.py: the real search on simulated
runs, quick_horizon's settings, 1,000 searches per case, beta = 0.3 across D/16-D/4): with a sharp basin
(the loss 0.1 nats up at e x LR*, run-to-run sd 0.01) beta's 90% interval excludes 0 in 90% of searches;
with a flat one (0.04 nats, sd 0.012) in 27%; with the sds measured on the built-in corpus at these budgets
(0.105, 0.040, 0.029 nats at 40, 81, 162 steps) in 20%. Whatever is resolved, the 90% intervals hold the
true LR* at the target in 86-90% of those searches. More budgets or seeds buy resolution at a price (same
simulation, built-in noise, 200 searches each; the sd at D/2 taken as 0.02, between the 0.029 measured at D/4
and 0.012 at D): 3 seeds resolve 23% (+40% trials), the largest budget at D/2 30% (its runs cost twice as
much), D/2 with 3 seeds 40%, four budgets D/2..D/16 38%. Where beta is not resolved, the report says so and
the prediction's interval includes the largest budget's LR*.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lmtune.errors import LmtuneError
from lmtune.searches.axis.settings import MAX_BUDGETS, LrSearchSettings

# The smallest budget at least this fraction of the target: below it a budget trains a handful of steps of any
# real target, and budget_ratio^budgets stays a float.
MIN_BUDGET_FRACTION = 1e-6


# The extrapolation ratio (the target over the largest searched budget) up to which the horizon search gained
# nothing in lmtune's measurements: a direct local search at the target cost less for an answer as good
# (benchmarks/README.md, "Where the horizon and width searches pay").
NO_GAIN_UP_TO_RATIO = 8.0


@dataclass(frozen=True)
class HorizonSettings(LrSearchSettings):
    """The ``horizon:`` section of a space with ``search: horizon``."""

    largest_fraction: float = 0.25
    """The largest budget searched, as a fraction of the target budget (the space's steps)."""
    budgets: int = 3
    """How many budgets are searched."""
    budget_ratio: float = 2.0
    """Each searched budget is this factor smaller than the next."""

    def point_checks(self) -> list[tuple[str, bool, str]]:
        return [
            ("largest_fraction", 0 < self.largest_fraction < 1,
             "must be between 0 and 1 (a fraction of the target budget, e.g. 0.25)"),
            ("budgets", self.budgets >= 2, "must be at least 2 (a line needs two budgets; 3 shows its residual)"),
            ("budget_ratio", self.budget_ratio > 1, "must be above 1, e.g. 2"),
        ]

    def point_bounds(self) -> list[tuple[str, bool, str]]:
        return [
            ("budgets", self.budgets <= MAX_BUDGETS,
             f"must be at most {MAX_BUDGETS} (each budget is an LR search of its own; the fit needs 3)"),
            ("budget_ratio", self._log_smallest_fraction() >= math.log(MIN_BUDGET_FRACTION),
             f"makes the smallest of {self.budgets} budgets (largest_fraction / budget_ratio^(budgets - 1)) less "
             f"than {MIN_BUDGET_FRACTION:g} of the target: give a smaller budget_ratio or fewer budgets"),
        ]

    def _log_smallest_fraction(self) -> float:
        """ln of the smallest budget's fraction of the target (budget_ratio^budgets itself may overflow)."""
        return math.log(self.largest_fraction) - (self.budgets - 1) * math.log(self.budget_ratio)

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
