"""The report's numbers (summary.json): the best LR at equal tokens with its spread over seeds, the
landscape above it (basin, degraded, diverged), the edge bracket and how it was confirmed, the ratio as a
range, the runs that spiked, equal-token losses per rung, sensitivity, convergence, target, the stages of
the search, and one row per trial. JSON-safe (no NaN)."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from lmtune.errors import LmtuneError
from lmtune.report.comparison import (
    best_record,
    edge_conclusion,
    full_budget_convergence,
    full_budget_sensitivity,
    logit_growth,
    record_runs,
    same_resolution_grid,
    stage_accounting,
    standing_pairs,
    summarize_equal_tokens,
)
from lmtune.report.stability import (
    STATUSES,
    TrialRecord,
    best_candidates,
    best_val_loss,
    candidate_token_range,
    edge_reading,
    edge_reading_range,
    initial_loss,
    json_safe,
    tokens_to_reach,
    tokens_trained,
    trial_row,
)
from lmtune.sweep.runs import Budget, equal_token_losses

log = logging.getLogger(__name__)


def sweep_summary(records: Sequence[TrialRecord], budget: Budget | None = None, target: float | None = None,
                  ell0: float | None = None, vocab_size: int | None = None, edge_state: dict[str, Any] | None = None,
                  range_tokens: int | None = None) -> dict[str, Any]:
    """The sweep's headline numbers and one row per trial. ``budget``: the sweep's (steps, warm-up,
    tokens per step, rungs); without it, one rung at the largest trial budget."""
    if not records:
        raise LmtuneError("the sweep has no trials to analyze; run a sweep first")
    budget = budget or budget_from_records(records)
    pairs = record_runs(records, budget)
    standing = standing_pairs(pairs)  # a run continued by another, or retrained, counts once
    conclusion = edge_conclusion(pairs, budget)
    best = best_record(standing, conclusion["best_lr"])
    summary: dict[str, Any] = {**conclusion, "compared_at_tokens": budget.full_tokens, "candidate_tokens": None}
    if best is not None:
        summary.update(best_val_loss=conclusion["best_lr_mean_loss"], best_tokens=budget.full_tokens)
    else:  # no trial trained its whole budget: the lowest loss at any token count, said to be unequal
        candidates = best_candidates(records)
        best = min(candidates, key=lambda r: (best_val_loss(r), r.lr)) if candidates else None
        summary.update(best_lr=best.lr if best else None, best_val_loss=best_val_loss(best) if best else None,
                       best_tokens=tokens_trained(best) if best else None,
                       candidate_tokens=candidate_token_range(records))
        summary["edge_ratio"] = (conclusion["divergence_lr"] / best.lr if best and conclusion["divergence_lr"]
                                 else None)
    ell0 = ell0 if ell0 is not None else (math.log(vocab_size) if vocab_size else initial_loss(records))
    sensitivity = full_budget_sensitivity(standing, ell0)
    table = equal_token_losses([run for run, _ in standing], budget.rungs)
    rows, counts = trial_table(records)
    stages = stage_accounting(pairs, edge_state, range_tokens)
    summary.update({
        "best_trial": best.trial_id if best is not None else None,
        "edge_reading": edge_reading(summary["edge_ratio"]),
        "edge_range_reading": edge_reading_range(*summary["edge_ratio_range"]),
        "equal_token_losses": summarize_equal_tokens(table),
        "equal_token_trials": {str(t): {f"{lr:.4g}": losses for lr, losses in by_lr.items()}
                               for t, by_lr in table.items()},
        "rungs": list(budget.rungs),
        "spiked": [{"trial_id": record.trial_id, "lr": run.lr, "seed": run.seed, "spikes": run.spikes}
                   for run, record in standing if run.spikes and not run.diverged],
        "divergence_rule": asdict(records[0].rule),
        "lr_sensitivity": sensitivity["value"], "lr_sensitivity_lrs": sensitivity["lrs"],
        "lr_sensitivity_tokens": sensitivity["tokens"], "initial_loss": ell0,
        **target_summary(best, summary["best_val_loss"], target),
        "convergence": full_budget_convergence(standing, (conclusion.get("basin") or {}).get("lrs")),
        "logit_growth": logit_growth(standing, best),
        "stages": [{"name": s["name"], "lrs": s["lrs"], "tokens": s["tokens"], "trials": s["trials"],
                    "why": s["why"]} for s in stages],
        "same_resolution_grid": same_resolution_grid(pairs, conclusion["bracket_ratio"], budget),
        "status_counts": counts,
        "trials": rows,
    })
    log.info("sweep summary: best lr %s (val %s), edge [%s, %s]", summary["best_lr"], summary["best_val_loss"],
             summary["edge_lr_low"], summary["divergence_lr"])
    return json_safe(summary)


def trial_table(records: Sequence[TrialRecord]) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """One row per trial (by LR, seed, id) and how many trials have each status."""
    rows = [trial_row(r) for r in sorted(records, key=lambda rec: (rec.lr, rec.seed or 0, rec.trial_id))]
    counts = {s: sum(row["status"] == s for row in rows) for s in STATUSES if any(row["status"] == s for row in rows)}
    return rows, counts


def budget_from_records(records: Sequence[TrialRecord]) -> Budget:
    """One rung at the largest budget the trials' configs name (or the most tokens any trained)."""
    budgets = [r.budget_tokens or tokens_trained(r) or 0 for r in records]
    full = max(budgets) if budgets else 0
    return Budget(steps=max(full, 1), warmup_steps=0, tokens_per_step=1, seed=0, rungs=(max(full, 1),))


def target_summary(best: TrialRecord | None, best_loss: float | None, target: float | None) -> dict[str, Any]:
    """Whether the best LR reached the target val loss, and after how many tokens its best trial did."""
    if target is None:
        return {"target": None, "target_met": None, "target_trial": None, "target_tokens": None}
    met = best_loss is not None and best_loss <= target
    return {"target": target, "target_met": met, "target_trial": best.trial_id if met else None,
            "target_tokens": tokens_to_reach(best, target) if met else None}
