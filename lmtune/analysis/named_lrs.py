"""The LRs an edge report names, each for what it is (the README's Definitions), Ray-free:

- the **best LR**: the lowest mean full-budget loss, crowned on as many seeds as it beats (lmtune.analysis.runs);
- the **top of the useful range**: the largest LR above the best, reached through tried LRs that all qualify, whose
  mean full-budget loss is within max(SIGNIFICANCE_SE standard errors of the difference, USEFUL_TOLERANCE) of the
  best's; with the measured cost (loss over the best's) of 2x and 4x the best LR;
- the **divergence LR**: the first LR, above one that trained (and, in the report, not below the best), at which a
  run diverged: its loss went non-finite, or rose above its initial loss and did not come back
  (lmtune.training.divergence); the practitioners' rubric reads divergence LR / best LR;
- the **failing LR**: the first LR, above one that trained (in the report, not below the best), at which a run
  failed: it diverged, or ended its budget no better than the data's unigram baseline (lmtune.analysis.bracket; what
  the edge search bisects).

A run that failed below those (where no smaller LR trained, or below the best) is set aside (``failed_below``): it
broke for another reason than a large LR, and the report says so.

A failing LR at or below the divergence LR: a run can end untrained without ever climbing above its initial loss.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from lmtune.analysis.bracket import Bracket, bracket_floor
from lmtune.analysis.runs import SIGNIFICANCE_SE, LrResult, Run, effective_runs, standard_error
from lmtune.files import JsonObject

# Nats: a loss this close to the best's is as good, whatever the seeds can resolve. The differences that decide a
# CS336 ablation at the full budget are 0.01-0.02 nats, so a user trading more than this for a larger LR loses.
USEFUL_TOLERANCE = 0.02
# The multiples of the best LR whose measured cost the report states ("how much does going higher cost?").
COST_AT = (2, 4)


@dataclass(frozen=True)
class UsefulRange:
    """How far above the best LR the loss stays as good (see the module's definition)."""

    top_lr: float
    """The top of the useful range: the largest qualifying LR (the best LR itself when none above qualifies)."""
    best_lr: float
    """The best LR it starts from."""
    next_lr: float | None
    """The next LR tried above it, which did not qualify (None: none tried, or it diverged): the top lies between."""
    margin: float
    """The loss margin an LR had to be within (nats): max(2 SE of its difference with the best, USEFUL_TOLERANCE)
    for the LR next above the top, or USEFUL_TOLERANCE where no seed spread was measured."""
    cost_at: tuple[tuple[int, float | None], ...]
    """(multiple of the best LR, mean full-budget loss there minus the best's), interpolated in log LR between the
    LRs tried that trained their budget (None: that multiple lies outside them)."""
    top_seeds: int = 1
    """The seeds the top's mean is over (where it is above the best: one seed is one draw of its noise)."""

    @property
    def above_best(self) -> bool:
        """A larger LR than the best came out as good."""
        return self.top_lr > self.best_lr

    @property
    def measured_above_best(self) -> bool:
        """A larger LR than the best came out as good on more than one seed: measured, not one draw."""
        return self.above_best and self.top_seeds > 1

    def to_json(self) -> JsonObject:
        return {"useful_top_lr": self.top_lr, "useful_top_seeds": self.top_seeds, "useful_top_next_lr": self.next_lr,
                "useful_margin": self.margin,
                "useful_tolerance": USEFUL_TOLERANCE,
                **{f"cost_at_{factor}x": cost for factor, cost in self.cost_at}}


def useful_range(ranking: list[LrResult], best: LrResult | None, sigma: float | None,
                 failing: Bracket) -> UsefulRange | None:
    """The useful range above ``best`` among ``ranking``'s LRs (those that trained their budget, same other
    parameters as the best), below the failing LR; None without a best LR."""
    if best is None:
        return None
    line = sorted((r for r in ranking if r.others == best.others and r.lr >= best.lr
                   and (failing.diverged_lr is None or r.lr < failing.diverged_lr)), key=lambda r: r.lr)
    top, margin = best, USEFUL_TOLERANCE
    nxt = None
    for result in line[1:]:
        error = standard_error(result, best, sigma)
        margin = max(USEFUL_TOLERANCE, SIGNIFICANCE_SE * error) if error is not None else USEFUL_TOLERANCE
        if result.mean - best.mean > margin:
            nxt = result.lr
            break
        top = result
    if nxt is None and failing.diverged_lr is not None and failing.diverged_lr > top.lr:
        nxt = failing.diverged_lr
    return UsefulRange(top.lr, best.lr, nxt, margin, tuple((f, _cost(line, best, f)) for f in COST_AT),
                       len(top.losses))


def _cost(line: list[LrResult], best: LrResult, factor: float) -> float | None:
    """The mean full-budget loss at ``factor`` x the best LR minus the best's, linear in log LR between the LRs
    tried on either side (None: no LR tried at or beyond it)."""
    return interpolated([(math.log(r.lr / best.lr), r.mean - best.mean) for r in line], math.log(factor))


def interpolated(curve: list[tuple[float, float]], x: float) -> float | None:
    """The value at ``x`` of a curve given by its points (ascending x), linear between them (None outside them)."""
    for (x0, y0), (x1, y1) in zip(curve, curve[1:], strict=False):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return curve[0][1] if len(curve) == 1 and abs(curve[0][0] - x) < 1e-12 else None


def divergence_bracket(runs: Iterable[Run], floor: float | None = None) -> Bracket:
    """Where runs diverge (non-finite, or above their initial loss for good): between the largest LR below the
    first diverging one at or above ``floor`` at which a run ran its whole budget without diverging, however well it
    ended, and that first diverging LR. ``floor``: as the failing LR's (lmtune.analysis.bracket.bracket: the lowest
    LR that trained through, or ``floor`` where higher), so the divergence LR lies at or above the failing LR; a
    divergence below it is ``failed_below``."""
    runs = effective_runs(runs)
    floor = bracket_floor(floor, min((r.lr for r in runs if r.trained_through()), default=None))
    every = {r.lr for r in runs if r.diverged}
    set_aside = tuple(sorted(lr for lr in every if floor is not None and lr < floor))
    diverged = sorted(every - set(set_aside))
    ran = {r.lr for r in runs if r.ran_its_budget()}
    if not diverged:
        return Bracket(max(ran) if ran else None, None, failed_below=set_aside)
    first = diverged[0]
    below = [lr for lr in ran if lr < first]
    return Bracket(max(below) if below else None, first, tuple(sorted(lr for lr in ran - set(diverged) if lr > first)),
                   set_aside)
