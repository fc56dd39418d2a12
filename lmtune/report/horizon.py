"""The report of a horizon search (``search: horizon``): per searched budget, the best LR at that budget's
full token count with its seed spread, basin and edge; the power law fitted through them with its interval;
the LR it predicts at the target budget; and what the target budget's own runs (the confirmation) show.

Read from the trials' own files like the rest of the report (never from the searcher's state): the fit is
recomputed from the runs, with the search's bootstrap settings and seed, so the two agree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from lmtune.files import JsonObject
from lmtune.report.comparison import Pair
from lmtune.report.stability import TrialRecord
from lmtune.sweep.plan import SweepPlan
from lmtune.sweep.runs import SAME_LR, Budget, LrResult
from lmtune.sweep.strategies.horizon import HorizonStrategy
from lmtune.sweep.strategies.horizon.conclusion import BudgetConclusion, HorizonConclusion, conclude_horizon
from lmtune.sweep.strategies.horizon.fit import HorizonFit
from lmtune.sweep.strategies.horizon.settings import HorizonSettings

# The per-budget keys of lmtune.sweep.conclusion.Conclusion.to_json the report carries for each budget.
BUDGET_KEYS = ("best_lr", "best_lr_mean_loss", "best_lr_spread", "best_lr_seeds", "best_lr_seed_losses",
               "best_lr_interval", "seed_spread", "basin", "edge_lr_low", "divergence_lr", "bracket_ratio",
               "ranking")


def horizon_settings(plan: SweepPlan | None) -> HorizonSettings | None:
    """The horizon search's settings of a sweep's plan (None: not a horizon search, or no plan recorded)."""
    strategy = plan.space.strategy if plan is not None else None
    return strategy.settings if isinstance(strategy, HorizonStrategy) else None


def records_at(records: Sequence[TrialRecord], steps: int, target: Budget) -> list[TrialRecord]:
    """The trials whose budget is ``steps`` (a trial without its own budget has the sweep's)."""
    tokens = steps * target.tokens_per_step
    return [r for r in records if (r.budget_tokens or target.full_tokens) == tokens]


@dataclass(frozen=True)
class TargetConfirmation:
    """What the target budget's own runs show of the prediction."""

    losses: tuple[LrResult, ...]
    """Each LR trained at the target with its losses by seed, ascending by LR."""
    best_lr: float | None
    """The target runs' best (crowned) LR."""
    best_mean_loss: float | None
    """That LR's mean loss over its seeds."""
    predicted_excess: float | None
    """The predicted LR's mean loss minus the lowest mean (nats; None: the prediction was not trained)."""
    predicted_excess_se: float | None
    """The standard error of that difference (None: no seed spread to take it from)."""
    se_from: str | None
    """Whose seeds that spread comes from, in words."""
    best_over_predicted: float | None
    """The lowest-loss LR / the predicted LR."""

    def to_json(self) -> JsonObject:
        return {"losses": [{"lr": r.lr, "seeds": list(r.seeds), "losses": list(r.losses), "mean": r.mean}
                           for r in self.losses],
                "best_lr": self.best_lr, "best_mean_loss": self.best_mean_loss,
                "predicted_excess": self.predicted_excess, "predicted_excess_se": self.predicted_excess_se,
                "se_from": self.se_from, "best_over_predicted": self.best_over_predicted}


@dataclass(frozen=True)
class HorizonResult:
    """A horizon search's own results: every budget's conclusion, the fit and its prediction, the confirmation."""

    budgets: tuple[BudgetConclusion, ...]
    """The searched budgets, smallest first, then the target."""
    target_tokens: int
    """The target budget's tokens."""
    fit: HorizonFit | None
    """ln LR* = a - beta ln D through the searched budgets' best LRs (None: it cannot be fitted)."""
    fit_problem: str | None
    """Why there is no fit (None: there is one)."""
    confirmed: TargetConfirmation
    """What the target budget's own runs show of the prediction."""

    @property
    def predicted_lr(self) -> float | None:
        return self.fit.predicted_lr if self.fit else None

    @property
    def predicted_lr_interval(self) -> tuple[float, float] | None:
        return self.fit.predicted_lr_interval if self.fit else None

    def to_json(self) -> JsonObject:
        """summary.json's horizon keys (``target_tokens`` here is the target budget's, replacing the target loss's)."""
        fit = self.fit
        return {"budgets": [_budget_json(b) for b in self.budgets], "target_tokens": self.target_tokens,
                "horizon_fit": None if fit is None else {
                    "beta": fit.beta, "beta_interval": list(fit.beta_interval), "intercept": fit.intercept,
                    "intercept_interval": list(fit.intercept_interval), "budgets_fitted": len(fit.best_lrs),
                    "best_lrs": fit.to_json()["best_lrs"]},
                "predicted_lr": self.predicted_lr,
                "predicted_lr_interval": list(fit.predicted_lr_interval) if fit else None,
                "fit_problem": self.fit_problem, "confirmed": self.confirmed.to_json()}


def _budget_json(budget: BudgetConclusion) -> JsonObject:
    conclusion = budget.conclusion.to_json()
    return {"steps": budget.steps, "tokens": budget.tokens, "fraction": budget.fraction, "trials": budget.trials,
            **{k: conclusion[k] for k in BUDGET_KEYS}}


def horizon_summary(pairs: Sequence[Pair], settings: HorizonSettings, target: Budget) -> HorizonResult:
    """Every budget's conclusion, the fit (beta, intercept, their 90% intervals) and its prediction at the target,
    and the confirmation (the target budget's losses and how far the prediction was from its best), from every
    trial as a run (``pairs``: lmtune.report.comparison.record_runs)."""
    found = conclude_horizon([run for run, _ in pairs], settings, target)
    at_target = found.budgets[-1].conclusion
    confirmed = confirmation(at_target.ranking, at_target.best, at_target.seed_spread,
                             found.fit.predicted_lr if found.fit else None, largest_budget_spread(found))
    return HorizonResult(found.budgets, target.full_tokens, found.fit, found.fit_problem, confirmed)


def confirmation(ranking: Sequence[LrResult], best: LrResult | None, seed_spread: float | None,
                 predicted_lr: float | None, searched_spread: float | None) -> TargetConfirmation:
    """The target budget's losses by LR, its best, and the predicted LR's excess over that best (nats) with the
    standard error of that difference: from the target runs' seed spread, or, when they have one seed each, from
    the largest searched budget's (``searched_spread``)."""
    rows = tuple(sorted(ranking, key=lambda r: r.lr))
    empty = TargetConfirmation(rows, best.lr if best else None, best.mean if best else None, None, None, None, None)
    if predicted_lr is None or not rows:
        return empty
    predicted = min(ranking, key=lambda r: abs(math.log(r.lr / predicted_lr)))
    if abs(math.log(predicted.lr / predicted_lr)) > math.log(SAME_LR):
        return empty  # the prediction itself was not trained at the target
    lowest = min(ranking, key=lambda r: r.mean)
    sigma, where = ((seed_spread, "the target runs' seeds") if seed_spread is not None
                    else (searched_spread, "the largest searched budget's seeds"))
    se = None
    if sigma is not None:
        se = 0.0 if lowest is predicted else sigma * math.sqrt(1 / len(predicted.losses) + 1 / len(lowest.losses))
    return TargetConfirmation(rows, empty.best_lr, empty.best_mean_loss, predicted.mean - lowest.mean, se,
                              where if sigma is not None else None, lowest.lr / predicted_lr)


def largest_budget_spread(found: HorizonConclusion) -> float | None:
    """The run-to-run sd near the best LR at the largest searched budget that has one: the nearest to the
    target's (on the built-in corpus the spread shrinks as runs grow longer, so this errs wide)."""
    searched = found.budgets[:-1]
    return next((b.conclusion.seed_spread for b in reversed(searched) if b.conclusion.seed_spread is not None), None)
