"""The edge search's settings (the ``edge:`` section of a space) and what each of its stages picks: the
coarse grid around the range test's findings, the LRs refined around the best, the cut LRs re-run, the
LRs given more seeds. Ray-free and stateless; lmtune.searches.edge.search decides when."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import cast

from lmtune.analysis.bracket import Bracket
from lmtune.analysis.landscape import best_lr_interval
from lmtune.analysis.named_lrs import COST_AT
from lmtune.analysis.runs import SAME_LR, Budget, LrResult, Run, format_tokens, same_lr
from lmtune.errors import LmtuneError
from lmtune.searches.base import MAX_SEEDS, failed_checks
from lmtune.searches.grid.settings import MAX_GRID_TRIALS
from lmtune.training.config import MAX_LR
from lmtune.training.lr_range import MAX_RANGE_STEPS, MIN_RANGE_STEPS

# Keys of the edge: section that earlier versions had (a space naming one is told what replaced it).
RETIRED_KEYS = {"horizon": "probes now train the full budget: divergence is failure to recover within the "
                           "stopper's recovery_window; remove it"}
# The smallest LR the search may reach: the smallest normal float (below it an LR loses precision, then is 0).
MIN_LR = sys.float_info.min


@dataclass(frozen=True)
class EdgeSettings:
    """The ``edge:`` section of a space with ``search: edge``."""

    range_min_lr: float = 1e-5
    """The range test's first LR."""
    range_max_lr: float = 10.0
    """The range test's last LR, if the loss has not blown up before."""
    range_steps: int = 100
    """Steps of the range test (the LR is multiplied by the same factor at each)."""
    range_blowup_factor: float = 1.5
    """The range test stops when its smoothed loss exceeds this x its lowest value."""
    coarse_below: float = 10.0
    """The coarse grid starts this factor below the range test's steepest-descent LR."""
    coarse_above: float = 1.0
    """... and ends at the first LR at or above the blow-up LR x this."""
    coarse_ratio: float = 3.16
    """Neighbouring coarse LRs differ by this factor (3.16: two per decade)."""
    tolerance: float = 1.25
    """Bisection ends when smallest diverged LR / largest LR trained through <= this."""
    edge_seeds: int = 2
    """Seeds that must all train through at the bracket's stable end: the edge is where any seed fails (it moves
    from seed to seed; one seed would hide that). A bisection probe trains the first seed only: one failing seed
    already places the edge below it, and the stable end's further seeds are the confirmation's."""
    bisect_points: int = 1
    """Probes per bisection round (1: halve the bracket in log-LR; k: cut it into k + 1 parts)."""
    refine_factor: float = 2.0
    """Refinement LRs lie within best / refine_factor .. best x refine_factor."""
    refine_points: int = 4
    """Refinement LRs (log-spaced, half below and half above the best), besides the multiples of the best whose
    cost the report states (lmtune.analysis.named_lrs.COST_AT: 2x and 4x)."""
    rerun_margin: float = 0.05
    """An LR below the best that ASHA cut is re-run to the full budget when its val loss at its last
    rung was within this fraction of that rung's best."""
    seeds: int = 3
    """Runs per LR for the best LRs, the first seed included."""
    seed_lrs: int = 1
    """How many of the best LRs get the further seeds (1: the best alone; an LR that beats it seed for seed is
    given the same seeds before the crown is settled, so a second LR's seeds buy nothing the contenders rule does
    not, and cost two full-budget runs)."""
    seed_rounds: int = 3
    """Further rounds of seeds for LRs that beat the crowned best seed for seed (each round: the seeds
    the best has, for every such LR)."""
    max_extensions: int = 3
    """When no LR diverged (or every LR did), probes this many times further out, coarse_ratio^2 apart."""

    def validate(self, where: str = "edge") -> None:
        """Raise LmtuneError (one line naming the key) for settings no search could use."""
        for key, message in self.problems():
            raise LmtuneError(f"{where}.{key}: {message}")

    def problems(self) -> list[tuple[str, str]]:
        """(key, what is wrong and the fix) for each setting no search could use."""
        checks = [
            ("range_min_lr", self.range_min_lr > 0, "must be > 0, e.g. 1e-5"),
            ("range_max_lr", self.range_max_lr > self.range_min_lr,
             f"must be above range_min_lr ({self.range_min_lr:g})"),
            ("range_steps", MIN_RANGE_STEPS <= self.range_steps <= MAX_RANGE_STEPS,
             f"must be from {MIN_RANGE_STEPS} to {MAX_RANGE_STEPS:,}, as a range test takes (about 100)"),
            ("range_blowup_factor", self.range_blowup_factor > 1, "must be above 1, e.g. 1.5"),
            ("coarse_below", self.coarse_below >= 1, "must be >= 1 (a factor below the steepest descent)"),
            ("coarse_above", self.coarse_above > 0, "must be > 0 (a factor on the blow-up LR)"),
            ("coarse_ratio", self.coarse_ratio > 1, "must be above 1, e.g. 3.16"),
            ("tolerance", 1 < self.tolerance <= self.coarse_ratio,
             f"must be above 1 and at most coarse_ratio ({self.coarse_ratio:g}), e.g. 1.25"),
            ("bisect_points", self.bisect_points >= 1, "must be at least 1"),
            ("edge_seeds", self.edge_seeds >= 1, "must be at least 1"),
            ("refine_factor", self.refine_factor > 1, "must be above 1, e.g. 2"),
            ("refine_points", self.refine_points >= 0 and self.refine_points % 2 == 0,
             "must be an even number >= 0 (half below the best, half above)"),
            ("rerun_margin", self.rerun_margin >= 0, "must be >= 0 (a fraction, e.g. 0.05)"),
            ("seeds", self.seeds >= 1, "must be at least 1 (1: no further seeds)"),
            ("seed_lrs", self.seed_lrs >= 1, "must be at least 1"),
            ("seed_rounds", self.seed_rounds >= 0, "must be >= 0"),
            ("max_extensions", self.max_extensions >= 0, "must be >= 0"),
        ]
        found = failed_checks(self, checks)
        return found or self.bounds()

    def bounds(self) -> list[tuple[str, str]]:
        """(key, the bound and the fix) for each setting beyond what its trials accept (lmtune.training.config:
        MAX_LR) or beyond any search a user would run. Assumes every setting is usable (``problems``)."""
        size = self.coarse_size()
        checks = [
            ("seeds", self.seeds <= MAX_SEEDS, f"must be at most {MAX_SEEDS}"),
            ("edge_seeds", self.edge_seeds <= MAX_SEEDS, f"must be at most {MAX_SEEDS}"),
            ("refine_points", self.refine_points <= MAX_GRID_TRIALS,
             f"must be at most {MAX_GRID_TRIALS:,} (as a grid space's trials)"),
            ("bisect_points", self.bisect_points <= MAX_GRID_TRIALS,
             f"must be at most {MAX_GRID_TRIALS:,} (as a grid space's trials)"),
            ("range_max_lr", self.range_max_lr <= MAX_LR,
             f"must be at most {MAX_LR:g}, the largest LR a trial accepts"),
            ("coarse_ratio", size <= MAX_GRID_TRIALS,
             f"makes the widest coarse grid the range test allows (range_min_lr / coarse_below to range_max_lr x "
             f"coarse_above) {size:,} LRs; a grid holds at most {MAX_GRID_TRIALS:,} (as a grid space's trials): give a "
             "larger coarse_ratio or a narrower range"),
            *self._reach_checks(),
        ]
        return failed_checks(self, checks)

    def _reach_checks(self) -> list[tuple[str, bool, str]]:
        """Every LR the search can reach stays within the LRs a trial accepts: the coarse grid ends below the
        range test's largest LR x coarse_above, x coarse_ratio; refinement goes a further max(coarse_ratio,
        refine_factor); each extension coarse_ratio^2 past the LRs tried (and as far down). In logs."""
        log_ratio, step = math.log(self.coarse_ratio), math.log(max(self.coarse_ratio, self.refine_factor))
        top = math.log(self.range_max_lr) + max(math.log(self.coarse_above), 0.0) + log_ratio + step
        bottom = math.log(self.range_min_lr) - math.log(self.coarse_below) - step
        reach = 2 * self.max_extensions * log_ratio
        log_max, log_min = math.log(MAX_LR), math.log(MIN_LR)
        return [
            ("coarse_above", top <= log_max + 1e-9,
             f"lets the coarse grid and the refinement around its end reach {_exp(top):.3g} (range_max_lr x "
             "coarse_above (at least 1) x coarse_ratio x max(coarse_ratio, refine_factor)), above the largest LR a "
             f"trial accepts ({MAX_LR:g}): give a smaller range_max_lr, coarse_above, coarse_ratio or refine_factor"),
            ("max_extensions", top + reach <= log_max + 1e-9,
             f"would extend the LRs tried (up to {_exp(top):.3g}) {self.coarse_ratio:g}^2 x at a time past the largest "
             f"LR a trial accepts ({MAX_LR:g}): give max_extensions at most {_fits(log_max - top, 2 * log_ratio)}"),
            ("max_extensions", bottom - reach >= log_min - 1e-9,
             f"would extend the LRs tried (down to {_exp(bottom):.3g}) {self.coarse_ratio:g}^2 x at a time below the "
             f"smallest normal float ({MIN_LR:g}): give max_extensions at most "
             f"{_fits(bottom - log_min, 2 * log_ratio)}"),
        ]

    def coarse_size(self) -> int:
        """The most LRs a coarse grid can hold (its ends depend on the range test; its widest span does not)."""
        span = (math.log(self.range_max_lr) + math.log(self.coarse_above) + math.log(self.coarse_below)
                - math.log(self.range_min_lr))  # (in logs: the product may overflow)
        return max(2, math.ceil(span / math.log(self.coarse_ratio) - 1e-9) + 1)

    def added_seeds(self) -> int:
        """How far past the base seed the search's seeds go: its bisection probes' and the best LRs' seeds."""
        return max(self.seeds, self.edge_seeds) - 1


# ---------------------------------------------------------------------------------------------
# The stages' choices


def coarse_lrs(steepest_lr: float | None, blowup_lr: float | None, settings: EdgeSettings) -> tuple[list[float], str]:
    """The coarse grid (most promising first) and why: from steepest / coarse_below up to the first LR
    at or above blowup x coarse_above, coarse_ratio apart. A range test without a steepest descent or a
    blow-up falls back to its own LR bounds on that side."""
    low = (steepest_lr or settings.range_min_lr * settings.coarse_below) / settings.coarse_below
    high = (blowup_lr or settings.range_max_lr) * settings.coarse_above
    count = max(2, math.ceil(math.log(high / low) / math.log(settings.coarse_ratio) - 1e-9) + 1)
    lrs = [low * settings.coarse_ratio ** k for k in range(count)]
    centre = steepest_lr or math.sqrt(low * high)
    lrs.sort(key=lambda lr: (abs(math.log(lr / centre)), lr))
    why = (f"{count} LRs a factor {settings.coarse_ratio:g} apart from {low:.3g} (the range test's steepest descent "
           f"{_g(steepest_lr)} / {settings.coarse_below:g}) up to {lrs and max(lrs):.3g} (at or above its blow-up "
           f"{_g(blowup_lr)} x {settings.coarse_above:g}); nearest the steepest descent first, so that ASHA's early "
           "rungs hold good results to cut the others against")
    return lrs, why


# A search started from another's answer: its first grid reaches this many coarse_ratio steps each side of that best
# LR (benchmarks/compare_start.py measured it).
WARM_REACH = 2


def warm_lrs(best_lr: float, stable_lr: float | None, diverged_lr: float | None,
             settings: EdgeSettings) -> tuple[list[float], str]:
    """The first grid of a search that starts from another's answer (a compare search's later variant, from the
    reference's): WARM_REACH LRs coarse_ratio apart each side of that best LR, and the ends of its edge
    bracket (where training failed moves less than the best LR does); nearest the best first."""
    reach = WARM_REACH
    lrs = [best_lr * settings.coarse_ratio ** k for k in range(-reach, reach + 1)]
    for end in (stable_lr, diverged_lr):
        if end is not None and not any(same_lr(end, lr) for lr in lrs):
            lrs.append(end)
    lrs.sort(key=lambda lr: (abs(math.log(lr / best_lr)), lr))
    bracket_text = (f", and its edge bracket's ends {_g(stable_lr)} and {_g(diverged_lr)}"
                    if stable_lr or diverged_lr else "")
    why = (f"started from the reference's answer: {2 * reach + 1} LRs a factor {settings.coarse_ratio:g} apart "
           f"around its best LR {best_lr:.3g}{bracket_text}, instead of a range test and a grid of its own")
    return lrs, why


def refine_lrs(best: LrResult, runs: list[Run], edge_lr: float | None, settings: EdgeSettings,
               budget: Budget, queued: tuple[float, ...] = ()) -> list[float]:
    """refine_points LRs log-spaced within best / refine_factor .. best x refine_factor, and the multiples of
    the best whose cost the report states (COST_AT: the useful range's 2x and 4x, measured rather than
    interpolated across the coarse grid's gaps), leaving out LRs at or above a known divergence and LRs that
    already have (or will have: ``queued``) a full-budget run at the first seed. A coarse LR within SAME_LR of one
    is used exactly (so that a run ASHA cut there is continued and the rungs line up)."""
    half = settings.refine_points // 2
    candidates = [best.lr * settings.refine_factor ** (k / half) for k in range(-half, half + 1) if k] if half else []
    candidates += [best.lr * factor for factor in COST_AT]
    tried = sorted({r.lr for r in runs})
    covered = [r.lr for r in runs if _full_budget_at_first_seed(r, budget.seed)] + list(queued)
    chosen: list[float] = []
    for lr in sorted(_snap(lr, tried) for lr in candidates):
        if edge_lr is not None and lr >= edge_lr:
            continue
        if not any(same_lr(lr, other) for other in covered + chosen):
            chosen.append(lr)
    return chosen


@dataclass(frozen=True)
class Bound:
    """A refinement LR that closes the best LR's interval on one side, and why."""

    lr: float
    why: str


def bound_lr(best: LrResult, ranking: list[LrResult], edge: Bracket, cut: tuple[float, ...],
             settings: EdgeSettings) -> Bound | None:
    """Where no full-budget LR below (above) ``best`` in ``ranking`` is clearly worse than it (the best LR's interval
    is open on that side: lmtune.analysis.landscape.best_lr_interval), the LR ``refine_factor`` beyond the lowest
    (highest) full-budget LR, or the ``cut`` coarse LR furthest out between them (its run to continue); None where
    the interval is closed (or the LR above would reach the failing LR)."""
    low, high = best_lr_interval(ranking, edge)
    lrs = [r.lr for r in ranking if r.others == best.others]
    factor = settings.refine_factor
    if low is None:
        side, end, lr = "below", min(lrs), min(lrs) / factor
        lr = min((c for c in cut if lr * SAME_LR < c < end / SAME_LR), default=lr)
    elif high is None and (edge.diverged_lr is None or max(lrs) * factor < edge.diverged_lr):
        side, end, lr = "above", max(lrs), max(lrs) * factor
        lr = max((c for c in cut if end * SAME_LR < c < lr / SAME_LR), default=lr)
    else:
        return None
    lr = lr if lr in cut else float(f"{lr:.4g}")
    return Bound(lr, f"no full-budget LR {side} the best, {best.lr:.3g} (val {best.mean:.4f}), is clearly worse "
                     f"than it: lr {lr:.3g}, {side} {end:.3g}, bounds it")


def _snap(lr: float, tried: list[float]) -> float:
    """An LR already tried within SAME_LR of ``lr`` (so a re-run shares its LR exactly), else ``lr``."""
    return next((other for other in tried if same_lr(lr, other)), lr)


def _full_budget_at_first_seed(run: Run, seed: int) -> bool:
    """A first-seed run that trained, or will train, the whole budget (a coarse one only if ASHA let it)."""
    if run.seed != seed or run.diverged:
        return False
    return run.full if run.stage == "coarse" else run.run_tokens >= run.budget_tokens


def rerun_lrs(best: LrResult, runs: list[Run], settings: EdgeSettings, budget: Budget) -> list[tuple[float, str]]:
    """Coarse LRs below the best that ASHA cut while within rerun_margin of their last rung's leader:
    (lr, why) each, to be trained to the full budget."""
    chosen = []
    for run in runs:
        if run.stage != "coarse" or run.outcome != "stopped_early" or run.lr >= best.lr:
            continue
        rung = max((r for r in budget.rungs if run.loss_at(r) is not None), default=None)
        if rung is None:
            continue
        leader = min(loss for other in runs if (loss := None if other.diverged else other.loss_at(rung)) is not None)
        mine = cast(float, run.loss_at(rung))  # (rung: the last it has a loss at)
        if mine <= leader * (1 + settings.rerun_margin):
            chosen.append((run.lr, f"ASHA cut lr {run.lr:.3g} at {format_tokens(rung)} tokens with val {mine:.4f}, "
                                   f"within {100 * (mine / leader - 1):.1f}% of that rung's best {leader:.4f}"))
    return chosen


def seed_lrs(ranking: list[LrResult], settings: EdgeSettings) -> list[LrResult]:
    """The LRs the seeds stage gives further seeds: the ``seed_lrs`` lowest means. Not the crowned ranking: the
    crown goes to an LR with the most seeds, and a bracket end confirmed (or probed) with two seeds before this
    stage, far above the best, would take the seeds the best LRs need."""
    return sorted(ranking, key=lambda r: (r.mean, r.lr))[: settings.seed_lrs] if settings.seeds > 1 else []


def _fits(log_room: float, log_step: float) -> int:
    """How many steps of e^log_step fit in a factor of e^log_room (0 when none does)."""
    return max(0, math.floor(log_room / log_step + 1e-9))


def _exp(log_value: float) -> float:
    return math.exp(min(log_value, 709.0))  # (for a message: at most about the largest float)


def _g(value: float | None) -> str:
    return "—" if value is None else f"{value:.3g}"
