"""What the horizon and width searches share of their settings (``LrSearchSettings``): the LR search at each point of
the axis (a budget or a width), its seeds, walls, edge probes and the confirmation at the target, their checks and
the grids they give. Ray-free and stateless; each search adds the settings that choose its points
(lmtune.searches.horizon.settings, lmtune.searches.width.settings)."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

from lmtune.searches.base import MAX_SEEDS, failed_checks
from lmtune.searches.grid.settings import MAX_GRID_TRIALS
from lmtune.training.config import MAX_LR

# The most points searched (budgets or widths): each is an LR search of its own (grid, seeds, edge probes), and the
# horizon fit needs 3.
MAX_BUDGETS = 10
# The smallest LR a grid may reach: the smallest normal float (below it an LR loses precision, then is 0).
MIN_LR = sys.float_info.min


@dataclass(frozen=True)
class LrSearchSettings:
    """What the horizon and width searches share: the LR search at each point (budget or width), its seeds,
    edge probes and the confirmation at the target. (A point is a budget for ``search: horizon``, a width for
    ``search: width``.)"""

    lr_min: float = 1e-4
    """The smallest point's grid starts here ..."""
    lr_max: float = 0.1
    """... and ends at the first LR at or above this."""
    ratio: float = 2.0
    """Neighbouring LRs of a point's grid differ by this factor."""
    below: int = 2
    """A larger point's grid: the next smaller point's best LR and this many grid steps below it (the best
    LR falls as the budget, or the width under SP, grows) ..."""
    above: int = 1
    """... and this many above it."""
    max_extensions: int = 3
    """A grid whose best LR lies at its end is extended by one LR beyond it, at most this many times."""
    seeds: int = 3
    """Runs of each point's best LR and of its two neighbours, the first seed included: the best LR is
    chosen on the mean, and its seed spread is the fit's uncertainty."""
    seed_rounds: int = 1
    """Further rounds of seeds for an LR that beats a point's crowned best seed for seed."""
    refine: bool = True
    """Once a budget's best LR is settled, train the LRs halfway (in log) between it and its neighbours with
    ``seeds`` seeds each (2 x seeds runs per budget), so that LR* is located on five LRs sqrt(ratio) apart:
    finer than the shift of LR* between budgets budget_ratio apart (2^0.3 = 1.23x for beta = 0.3)."""
    edge_probes: int = 3
    """Full-budget probes per point for where training fails (0: none): from the point's highest LR that
    trained through, edge_ratio x up until one fails, then halving the bracket in log LR."""
    edge_ratio: float = 4.0
    """The step of an edge probe above the highest LR that trained through."""
    edge_tolerance: float = 2.0
    """The edge probes stop once failed LR / trained-through LR <= this."""
    walls: int = 2
    """At most this many LRs per point added a grid step beyond those tried, ``seeds`` runs each, where no LR on
    that side of the best is clearly worse than it: an LR* is bounded only between LRs clearly worse."""
    confirm_ratio: float = 2.0
    """Confirmation at the target: the predicted LR, and it divided and multiplied by this."""
    confirm_seeds: int = 2
    """Runs of each confirmation LR: with 2, the target's own seed spread says whether the prediction lies in
    the target's basin (with 1 it borrows the largest budget's, and usually cannot tell)."""

    def problems(self) -> list[tuple[str, str]]:
        """(key, what is wrong and the fix) for each setting no search could use; once each is usable, for each
        that would make trials no run accepts, or ask for more than a search could ever run (``bounds``)."""
        checks = [
            *self.point_checks(),
            ("lr_min", self.lr_min > 0, "must be > 0, e.g. 1e-4"),
            ("lr_max", self.lr_max > self.lr_min, f"must be above lr_min ({self.lr_min:g})"),
            ("ratio", self.ratio > 1, "must be above 1, e.g. 2"),
            ("below", self.below >= 0, "must be >= 0"),
            ("above", self.above >= 0, "must be >= 0"),
            ("max_extensions", self.max_extensions >= 0, "must be >= 0"),
            ("seeds", self.seeds >= 1, "must be at least 1 (1: no further seeds)"),
            ("seed_rounds", self.seed_rounds >= 0, "must be >= 0"),
            ("refine", isinstance(self.refine, bool), "must be true or false"),
            ("walls", self.walls >= 0, "must be >= 0 (0: no walls)"),
            ("edge_probes", self.edge_probes >= 0, "must be >= 0 (0: no edge probes)"),
            ("edge_ratio", self.edge_ratio > 1, "must be above 1, e.g. 4"),
            ("edge_tolerance", 1 < self.edge_tolerance <= self.edge_ratio,
             f"must be above 1 and at most edge_ratio ({self.edge_ratio:g}), e.g. 2"),
            ("confirm_ratio", self.confirm_ratio > 1, "must be above 1, e.g. 2"),
            ("confirm_seeds", self.confirm_seeds >= 1, "must be at least 1"),
        ]
        found = failed_checks(self, checks)
        return found or self.bounds()

    def bounds(self) -> list[tuple[str, str]]:
        """(key, the bound and the fix) for each setting beyond what its trials accept (lmtune.training.config:
        MAX_LR) or beyond any search a user would run. Assumes every setting is usable (``problems``)."""
        size = self.grid_size()
        checks = [
            *self.point_bounds(),
            ("seeds", self.seeds <= MAX_SEEDS, f"must be at most {MAX_SEEDS}"),
            ("walls", self.walls <= MAX_BUDGETS,
             f"must be at most {MAX_BUDGETS} (each wall is a grid step further out)"),
            ("confirm_seeds", self.confirm_seeds <= MAX_SEEDS, f"must be at most {MAX_SEEDS}"),
            ("ratio", size <= MAX_GRID_TRIALS,
             f"makes lr_min {self.lr_min:g} to lr_max {self.lr_max:g} a grid of {size:,} LRs; a grid holds at most "
             f"{MAX_GRID_TRIALS:,} (as a grid space's trials): give a larger ratio or a narrower lr_min..lr_max"),
            ("above", self.below + self.above + 1 <= MAX_GRID_TRIALS,
             f"with below ({self.below}) makes each larger budget's grid {self.below + self.above + 1:,} LRs; a grid "
             f"holds at most {MAX_GRID_TRIALS:,}: give fewer"),
            *self._reach_checks(),
        ]
        return failed_checks(self, checks)

    def _reach_checks(self) -> list[tuple[str, bool, str]]:
        """What the settings alone fix stays within the LRs a trial accepts: the smallest budget's grid, it extended
        max_extensions times either way, and edge probes edge_ratio x apart above that. (A larger budget's LRs
        follow results, as does the confirmation: the search leaves out any beyond, lmtune.searches.
        axis.search.) In logs: nothing here may overflow."""
        log_max, log_ratio = math.log(MAX_LR), math.log(self.ratio)
        top = math.log(self.lr_min) + (self.grid_size() - 1) * log_ratio
        extended = top + self.max_extensions * log_ratio
        above_min = math.log(self.lr_min) - math.log(MIN_LR)  # ln(lr_min / MIN_LR), which may overflow
        probed = extended + self.edge_probes * math.log(self.edge_ratio)
        return [
            ("lr_max", _within(top, log_max),
             f"makes the grid end at {_exp(top):.3g} (the first LR {self.ratio:g}x apart at or above lr_max), above "
             f"the largest LR a trial accepts ({MAX_LR:g}): give an lr_max of at most {MAX_LR / self.ratio:g}"),
            ("max_extensions", _within(extended, log_max),
             f"would extend the smallest budget's grid (ending at {_exp(top):.3g}) {self.ratio:g}x at a time past the "
             f"largest LR a trial accepts ({MAX_LR:g}): give max_extensions at most {_fits(log_max - top, log_ratio)}"),
            ("max_extensions", _within(self.max_extensions * log_ratio, above_min),
             f"would extend the grid below lr_min ({self.lr_min:g}) {self.ratio:g}x at a time past the smallest "
             f"normal float ({MIN_LR:g}): give max_extensions at most {_fits(above_min, log_ratio)}"),
            ("edge_probes", not _within(extended, log_max) or _within(probed, log_max),
             f"would probe {self.edge_ratio:g}x at a time above the extended grid's end ({_exp(extended):.3g}), past "
             f"the largest LR a trial accepts ({MAX_LR:g}): give edge_probes at most "
             f"{_fits(log_max - extended, math.log(self.edge_ratio))}"),
        ]

    def point_checks(self) -> list[tuple[str, bool, str]]:
        """The checks of the settings that choose the points (the subclass's: budgets, or widths)."""
        return []

    def point_bounds(self) -> list[tuple[str, bool, str]]:
        """Their bounds, once each is usable."""
        return []

    def added_seeds(self) -> int:
        """How far past the base seed the search's seeds go: its seeds stage and its confirmation."""
        return max(self.seeds, self.confirm_seeds) - 1

    def first_grid(self) -> list[float]:
        """The smallest point's LRs: lr_min up to the first at or above lr_max, ``ratio`` apart."""
        return [self.lr_min * self.ratio ** k for k in range(self.grid_size())]

    def grid_around(self, best_lr: float) -> list[float]:
        """A larger point's LRs around the smaller point's best: ``below`` steps down, ``above`` up."""
        return [best_lr * self.ratio ** k for k in range(-self.below, self.above + 1)]

    def confirmation_lrs(self, predicted_lr: float) -> list[float]:
        return [predicted_lr / self.confirm_ratio, predicted_lr, predicted_lr * self.confirm_ratio]

    def expected_trials(self, points: int) -> int:
        """The trials a search over ``points`` points plans, roughly: per point its grid (the smallest spans
        lr_min..lr_max), the extra seeds of the best and its neighbours, the refinement LRs and the walls, the
        edge probes; then the confirmation's runs at the target."""
        grids = self.grid_size() + (points - 1) * (self.below + self.above + 1)
        settling = 3 * (self.seeds - 1) + (2 if self.refine else 0) * self.seeds + self.walls * self.seeds
        return grids + points * (settling + self.edge_probes) + 3 * self.confirm_seeds

    def grid_size(self) -> int:
        """How many LRs the smallest point's grid holds, known before any is built."""
        span = math.log(self.lr_max) - math.log(self.lr_min)  # (lr_max / lr_min may overflow)
        return max(2, math.ceil(span / math.log(self.ratio) - 1e-9) + 1)


def _within(log_value: float, log_limit: float) -> bool:
    """value <= limit, in logs, with room for rounding (a grid ending exactly at the limit is within it)."""
    return log_value <= log_limit + 1e-9


def _fits(log_room: float, log_step: float) -> int:
    """How many steps of e^log_step fit in a factor of e^log_room (0 when none does)."""
    return max(0, math.floor(log_room / log_step + 1e-9))


def _exp(log_value: float) -> float:
    return math.exp(min(log_value, 709.0))  # (for a message: at most about the largest float)
