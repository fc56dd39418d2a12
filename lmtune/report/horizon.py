"""The report of a horizon search (``search: horizon``): per searched budget, the best LR at that budget's
full token count with its seed spread, basin and edge; the power law fitted through them with its interval;
the LR it predicts at the target budget; and what the target budget's own runs (the confirmation) show.

Read from the trials' own files like the rest of the report (never from the searcher's state): the fit is
recomputed from the runs, with the search's bootstrap settings and seed, so the two agree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from lmtune.report.comparison import record_runs
from lmtune.report.stability import TrialRecord
from lmtune.sweep.runs import SAME_LR, Budget, Run, conclude
from lmtune.sweep.strategies.horizon import HorizonStrategy
from lmtune.sweep.strategies.horizon.search import fit_budgets, runs_at
from lmtune.sweep.strategies.horizon.settings import HorizonSettings

# The per-budget keys of lmtune.sweep.runs.conclude the report carries for each budget.
BUDGET_KEYS = ("best_lr", "best_lr_mean_loss", "best_lr_spread", "best_lr_seeds", "best_lr_seed_losses",
               "best_lr_interval", "seed_spread", "basin", "edge_lr_low", "divergence_lr", "bracket_ratio",
               "ranking")


def horizon_settings(space: dict[str, Any]) -> HorizonSettings | None:
    """The horizon search's settings from sweep.json's space (None: not a horizon search)."""
    return HorizonStrategy.from_json(space).settings if space.get("search") == HorizonStrategy.name else None


def records_at(records: Sequence[TrialRecord], steps: int, target: Budget) -> list[TrialRecord]:
    """The trials whose budget is ``steps`` (a trial without its own budget has the sweep's)."""
    tokens = steps * target.tokens_per_step
    return [r for r in records if (r.budget_tokens or target.full_tokens) == tokens]


def horizon_summary(records: Sequence[TrialRecord], settings: HorizonSettings, target: Budget) -> dict[str, Any]:
    """summary.json's horizon keys: ``budgets`` (one entry per searched budget and the target), ``horizon_fit``
    (beta, intercept, their 90% intervals), ``predicted_lr`` and ``predicted_lr_interval``, ``confirmed``
    (the target budget's losses and how far the prediction was from its best)."""
    runs = [run for run, _ in record_runs(records, target)]
    budgets = [*settings.budget_steps(target.steps), target.steps]
    per_budget = [budget_entry(runs, steps, target) for steps in budgets]
    fit, problem = fit_budgets(runs, settings, target)
    summary: dict[str, Any] = {"budgets": per_budget, "target_tokens": target.full_tokens, "horizon_fit": None,
                               "predicted_lr": None, "predicted_lr_interval": None, "fit_problem": problem}
    if fit is not None:
        summary.update(horizon_fit={"beta": fit.beta, "beta_interval": list(fit.beta_interval),
                                    "intercept": fit.intercept, "intercept_interval": list(fit.intercept_interval),
                                    "budgets_fitted": len(fit.best_lrs), "best_lrs": fit.to_json()["best_lrs"]},
                       predicted_lr=fit.predicted_lr, predicted_lr_interval=list(fit.predicted_lr_interval))
    summary["confirmed"] = confirmation(per_budget[-1], fit.predicted_lr if fit else None,
                                        largest_budget_spread(per_budget[:-1]))
    return summary


def budget_entry(runs: Sequence[Run], steps: int, target: Budget) -> dict[str, Any]:
    """One budget's conclusion (lmtune.sweep.runs.conclude at its full token count) and its trial count."""
    at = runs_at(runs, steps, target)
    c = conclude(at, target.at_steps(steps))
    return {"steps": steps, "tokens": steps * target.tokens_per_step, "fraction": steps / target.steps,
            "trials": len(at), **{k: c.get(k) for k in BUDGET_KEYS}}


def confirmation(target: dict[str, Any], predicted_lr: float | None, searched_spread: float | None) -> dict[str, Any]:
    """The target budget's losses by LR, its best, and the predicted LR's excess over that best (nats) with the
    standard error of that difference: from the target runs' seed spread, or, when they have one seed each, from
    the largest searched budget's (``searched_spread``)."""
    rows = target["ranking"] or []
    result: dict[str, Any] = {"losses": [{"lr": r["lr"], "seeds": r["seeds"], "losses": r["losses"], "mean": r["mean"]}
                                         for r in sorted(rows, key=lambda r: r["lr"])],
                              "best_lr": target["best_lr"], "best_mean_loss": target["best_lr_mean_loss"],
                              "predicted_excess": None, "predicted_excess_se": None, "se_from": None,
                              "best_over_predicted": None}
    if predicted_lr is None or not rows:
        return result
    predicted = min(rows, key=lambda r: abs(math.log(r["lr"] / predicted_lr)))
    if abs(math.log(predicted["lr"] / predicted_lr)) > math.log(SAME_LR):
        return result  # the prediction itself was not trained at the target
    best = min(rows, key=lambda r: r["mean"])
    result["best_over_predicted"] = best["lr"] / predicted_lr
    result["predicted_excess"] = predicted["mean"] - best["mean"]
    sigma, where = ((target["seed_spread"], "the target runs' seeds") if target["seed_spread"] is not None
                    else (searched_spread, "the largest searched budget's seeds"))
    if sigma is not None:
        result["se_from"] = where
        result["predicted_excess_se"] = (0.0 if best is predicted else
                                         sigma * math.sqrt(1 / len(predicted["losses"]) + 1 / len(best["losses"])))
    return result


def largest_budget_spread(budgets: Sequence[dict[str, Any]]) -> float | None:
    """The run-to-run sd near the best LR at the largest searched budget that has one: the nearest to the
    target's (on the built-in corpus the spread shrinks as runs grow longer, so this errs wide)."""
    return next((b["seed_spread"] for b in reversed(budgets) if b.get("seed_spread") is not None), None)
