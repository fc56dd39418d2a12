"""The report of a horizon search (``search: horizon``): per searched budget, the crowned LR at that budget's
full token count with its seed spread, basin and edge, and its LR* located between grid points with its SE; the
power law fitted through the LR*s with its interval; the LR it predicts at the target budget with its interval;
and the confirmation's verdict: whether the target budget's own runs place the prediction in their basin
(lmtune.searches.axis.report_confirmation).

Read from the trials' own files like the rest of the report (never from the searcher's state): the fit is
recomputed from the runs, with the search's bootstrap settings and seed, so the two agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lmtune.analysis.fit import HorizonFit
from lmtune.analysis.runs import Budget, Run
from lmtune.files import JsonObject
from lmtune.findings.stability import TrialRecord
from lmtune.searches.axis.axis import PointConclusion
from lmtune.searches.axis.report_confirmation import Predicted, TargetConfirmation, confirmation, search_tokens
from lmtune.searches.base import SearchStrategy
from lmtune.searches.horizon import HorizonStrategy
from lmtune.searches.horizon.budgets import conclude_horizon
from lmtune.searches.horizon.settings import HorizonSettings

# The per-budget keys of lmtune.analysis.conclusion.Conclusion.to_json the report carries for each budget.
BUDGET_KEYS = ("best_lr", "best_lr_mean_loss", "best_lr_spread", "best_lr_seeds", "best_lr_seed_losses",
               "best_lr_interval", "seed_spread", "basin", "failing_lr_low", "failing_lr", "bracket_ratio",
               "divergence_lr", "ranking")


def horizon_settings(strategy: SearchStrategy) -> HorizonSettings | None:
    """The horizon search's settings of a sweep's plan's ``strategy`` (None: not a horizon search)."""
    return strategy.settings if isinstance(strategy, HorizonStrategy) else None


def records_at(records: Sequence[TrialRecord], steps: int, target: Budget) -> list[TrialRecord]:
    """The trials whose budget is ``steps`` (a trial without its own budget has the sweep's)."""
    tokens = steps * target.tokens_per_step
    return [r for r in records if (r.budget_tokens or target.full_tokens) == tokens]


@dataclass(frozen=True)
class HorizonResult(Predicted):
    """A horizon search's own results: every budget's conclusion, the fit and its prediction, the confirmation."""

    budgets: tuple[PointConclusion, ...]
    """The searched budgets, smallest first, then the target."""
    target_tokens: int
    """The target budget's tokens."""
    fit: HorizonFit | None
    """ln LR* = a - beta ln D through the searched budgets' located LR*s (None: it cannot be fitted)."""
    fit_problem: str | None
    """Why there is no fit (None: there is one)."""
    confirmed: TargetConfirmation
    """What the target budget's own runs show of the prediction."""

    def to_json(self) -> JsonObject:
        """summary.json's horizon keys (the target budget's tokens are ``horizon_target_tokens``: ``target_tokens``
        is the common summary's, where the target val loss given to analyze was met)."""
        fit = self.fit
        return {"budgets": [_budget_json(b) for b in self.budgets], "horizon_target_tokens": self.target_tokens,
                "horizon_fit": None if fit is None else _fit_json(fit), "predicted_lr": self.predicted_lr,
                "predicted_lr_interval": list(fit.predicted_lr_interval) if fit else None,
                "fit_problem": self.fit_problem, "confirmed": self.confirmed.to_json()}


def _budget_json(budget: PointConclusion) -> JsonObject:
    """One budget's conclusion, its crowned LR and its located LR* (None at the target: its LR is predicted)."""
    conclusion = budget.conclusion.to_json()
    return {"steps": budget.value, "tokens": budget.tokens, "fraction": budget.fraction, "trials": budget.trials,
            **{k: conclusion[k] for k in BUDGET_KEYS}, "crowned_lr": budget.conclusion.best_lr,
            **budget.located_json(_not_located(budget))}


def _not_located(budget: PointConclusion) -> str:
    if budget.fraction >= 1:
        return "the target budget: its LR is predicted and confirmed, not searched"
    return "no LR trained this budget through"


def _fit_json(fit: HorizonFit) -> JsonObject:
    usable = [p for p in fit.points if p.usable]
    return {"beta": fit.beta, "beta_interval": list(fit.beta_interval), "beta_resolved": fit.resolved,
            "intercept": fit.intercept, "intercept_interval": list(fit.intercept_interval),
            "budgets_fitted": len(usable), "best_lrs": {str(p.tokens): p.lr for p in usable},
            "chi2": fit.chi2, "dof": fit.dof, "scale": fit.scale, "lack_of_fit_p": fit.lack_of_fit_p,
            "law_holds": fit.law_holds, "points": [p.to_json() for p in fit.points]}


def horizon_summary(runs: Sequence[Run], settings: HorizonSettings, target: Budget) -> HorizonResult:
    """Every budget's conclusion and located LR*, the fit (beta, intercept, their 90% intervals) and its prediction
    at the target, and the confirmation's verdict (lmtune.searches.axis.report_confirmation), from every trial
    as a run (lmtune.findings.comparison.record_runs)."""
    found = conclude_horizon(runs, settings, target)
    at_target = [r for r in runs if r.budget_tokens == target.full_tokens]
    confirmed = confirmation(at_target, found.fit.predicted_lr if found.fit else None, search_tokens(runs))
    return HorizonResult(found.points, target.full_tokens, found.fit, found.fit_problem, confirmed)
