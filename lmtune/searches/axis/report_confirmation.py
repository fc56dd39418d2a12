"""Whether a horizon or width search's prediction lies in the target's own basin (the target budget, or the target
width), judged by the target runs alone
(the confirmation: the predicted LR and confirm_ratio x either side, confirm_seeds seeds each).

The verdict, with sigma the target runs' pooled seed sd (lmtune.analysis.runs.pooled_seed_spread) and best their
crowned best (lmtune.analysis.runs.crown): the prediction's excess over the best, excess = mean(predicted) -
mean(best), has standard error se = sigma * sqrt(1/n_predicted + 1/n_best). It is
- out of the basin (in_basin False) when excess > 2 se: clearly worse than the best at the target;
- in it (True) when excess <= 2 se and the best has a clearly worse LR tried on both sides: the target's own
  minimum is bracketed by what was tried, so the prediction is within 2 SE of it;
- undetermined otherwise, with why: one seed per LR (no spread to judge by: a searched budget's spread is not
  the target's), the best at an end of the LRs tried, or every LR within 2 SE of the best.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lmtune.analysis.runs import (
    SAME_LR,
    LrResult,
    Run,
    clearly_worse,
    crown,
    effective_runs,
    full_budget_ranking,
    pooled_seed_spread,
    same_lr,
    standard_error,
)
from lmtune.files import JsonObject

UNDETERMINED = "undetermined"


class Predicted:
    """What a horizon-style result (a horizon or width search's) predicts at its target: its fit's LR and that LR's
    90% interval (None: no fit). A result mixes it in beside its ``fit`` field."""

    fit: Any

    @property
    def predicted_lr(self) -> float | None:
        return self.fit.predicted_lr if self.fit else None

    @property
    def predicted_lr_interval(self) -> tuple[float, float] | None:
        return self.fit.predicted_lr_interval if self.fit else None


@dataclass(frozen=True)
class TargetConfirmation:
    """What the target budget's own runs show of the prediction."""

    losses: tuple[LrResult, ...]
    """Each LR trained at the target with its losses by seed, ascending by LR."""
    best_lr: float | None
    """The target runs' crowned best LR."""
    best_mean_loss: float | None
    """That LR's mean loss over its seeds."""
    judged_lr: float | None
    """The LR trained at the target that stands for the prediction (None: none did)."""
    predicted_excess: float | None
    """judged_lr's mean loss minus the crowned best's (nats; None: the prediction was not trained)."""
    predicted_excess_se: float | None
    """The standard error of that difference, from the target runs' seeds (None: one seed per LR)."""
    seed_sd: float | None
    """The target runs' pooled run-to-run sd (None: no LR at the target has two seeds)."""
    best_over_predicted: float | None
    """The crowned best LR / the predicted LR."""
    in_basin: bool | None
    """Whether the prediction lies in the target's basin (None: the runs cannot tell; ``verdict`` says why)."""
    verdict: str
    """The verdict in one sentence."""
    tokens: int
    """Tokens of the confirmation: its runs x the target budget's tokens."""
    one_seed_tokens: int
    """What one seed per confirmation LR would have cost (the confirmation before issue 32)."""
    search_tokens: int
    """Tokens of the whole search, every run at its budget's tokens (the confirmation included)."""

    @property
    def share_of_search(self) -> float | None:
        """The confirmation's share of the search's tokens."""
        return self.tokens / self.search_tokens if self.search_tokens else None

    def to_json(self) -> JsonObject:
        return {"losses": [{"lr": r.lr, "seeds": list(r.seeds), "losses": list(r.losses), "mean": r.mean}
                           for r in self.losses],
                "best_lr": self.best_lr, "best_mean_loss": self.best_mean_loss, "judged_lr": self.judged_lr,
                "predicted_excess": self.predicted_excess, "predicted_excess_se": self.predicted_excess_se,
                "seed_sd": self.seed_sd, "best_over_predicted": self.best_over_predicted,
                "in_basin": UNDETERMINED if self.in_basin is None else self.in_basin, "verdict": self.verdict,
                "tokens": self.tokens, "one_seed_tokens": self.one_seed_tokens,
                "search_tokens": self.search_tokens, "share_of_search_tokens": self.share_of_search}


def confirmation(target_runs: Sequence[Run], predicted_lr: float | None, search_tokens: int) -> TargetConfirmation:
    """The confirmation's verdict from the runs at the target budget (``target_runs``) and the predicted LR;
    ``search_tokens``: the whole search's tokens, to state the confirmation's share of them."""
    runs = effective_runs(target_runs)
    ranking = full_budget_ranking(runs)
    rows = tuple(sorted(ranking, key=lambda r: r.lr))
    best, _ = crown(ranking)
    budget = max((r.budget_tokens for r in runs), default=0)
    cost = (len(runs) * budget, len({r.lr for r in runs}) * budget, search_tokens)
    base = (rows, best.lr if best else None, best.mean if best else None)

    def undetermined(why: str) -> TargetConfirmation:
        return TargetConfirmation(*base, None, None, None, None, None, None, f"{UNDETERMINED}: {why}", *cost)

    if predicted_lr is None:
        return undetermined("no prediction to confirm")
    if best is None:
        return undetermined("no run at the target budget has trained it through yet")
    predicted = _trained_prediction(ranking, predicted_lr)
    if predicted is None:
        return undetermined(f"the predicted LR ({predicted_lr:.3g}) has no run that trained the target through")
    sigma = pooled_seed_spread(ranking)
    excess = predicted.mean - best.mean
    se = standard_error(predicted, best, sigma)
    in_basin, verdict = _verdict(ranking, best, sigma, excess, se, _diverged_above(runs, best.lr))
    if not same_lr(predicted.lr, predicted_lr):
        verdict += (f"; judged at {predicted.lr:.3g}, the LR trained at the target nearest the prediction "
                    f"({predicted_lr:.3g}): its runs were planned on the search's own fit")
    return TargetConfirmation(*base, predicted.lr, excess, se, sigma, best.lr / predicted_lr, in_basin, verdict,
                              *cost)


def _trained_prediction(ranking: Sequence[LrResult], predicted_lr: float) -> LrResult | None:
    """The LR trained at the target that stands for the prediction: the nearest in log LR, if nearer than halfway
    to the next LR tried (the search trains the prediction itself; a record whose runs were planned on another
    fit's prediction is judged at the LR that was)."""
    lrs = sorted(r.lr for r in ranking)
    gaps = [math.log(b / a) for a, b in zip(lrs, lrs[1:], strict=False)]
    reach = max(min(gaps, default=0.0) / 2, math.log(SAME_LR))
    nearest = min(ranking, key=lambda r: abs(math.log(r.lr / predicted_lr)))
    return nearest if abs(math.log(nearest.lr / predicted_lr)) <= reach else None


def _verdict(ranking: Sequence[LrResult], best: LrResult, sigma: float | None, excess: float, se: float | None,
             diverged_above: bool) -> tuple[bool | None, str]:
    """(in_basin, the sentence) once the prediction trained the target through."""
    gap = f"{excess:.4f} nats above the best ({best.lr:.3g})"
    if sigma is None or se is None:
        return None, (f"{UNDETERMINED}: one seed per LR at the target, no spread to judge by (one run each: the "
                      f"prediction's is {gap})")
    counts = sorted({len(r.losses) for r in ranking})
    seeds = f"sd {sigma:.3g}, {counts[0]}{f'-{counts[-1]}' if len(counts) > 1 else ''} seeds per LR"
    if excess > 2 * se:
        return False, (f"out of the target's basin: the prediction is clearly worse than {best.lr:.3g} at the "
                       f"target, {excess:.4f} ± {se:.4f} nats above it (more than 2 SE; {seeds})")
    below = any(r.lr < best.lr and clearly_worse(r, best, sigma) for r in ranking)
    above = diverged_above or any(r.lr > best.lr and clearly_worse(r, best, sigma) for r in ranking)
    within = f"{excess:.4f} ± {se:.4f} nats above the best ({best.lr:.3g}), within 2 SE"
    if below and above:
        return True, (f"in the target's basin: the prediction is {within}, and the target's minimum is bracketed "
                      f"by clearly worse LRs either side ({seeds})")
    lrs = sorted(r.lr for r in ranking)
    if not below and not above:
        return None, (f"{UNDETERMINED}: the target runs cannot tell the prediction from the LRs tried either side "
                      f"({lrs[0]:.3g} to {lrs[-1]:.3g}): all within 2 SE of the best ({seeds}; the prediction is "
                      f"{excess:.4f} ± {se:.4f} nats above it)")
    if (best.lr == lrs[0] and not below) or (best.lr == lrs[-1] and not above):
        return None, (f"{UNDETERMINED}: the lowest target loss is at the end of the LRs tried ({best.lr:.3g}): "
                      f"the target's minimum may lie beyond them (the prediction is {within})")
    side = "below" if not below else "above"
    return None, (f"{UNDETERMINED}: no LR tried {side} the best ({best.lr:.3g}) is clearly worse (2 SE; {seeds}): "
                  f"the target's minimum may lie {side} it (the prediction is {within})")


def _diverged_above(runs: Sequence[Run], best_lr: float) -> bool:
    """A run above the best LR diverged at the target: that side is bounded (a diverged LR is no contender)."""
    return any(r.diverged and r.lr > best_lr for r in runs)


def search_tokens(runs: Sequence[Run]) -> int:
    """Tokens of a search's runs, each at its budget's tokens (the plan's cost, not what early stops saved)."""
    return sum(r.budget_tokens for r in effective_runs(runs))
