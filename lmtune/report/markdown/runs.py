"""The report's sections on the trials themselves: the overview, the trial table, the losses at equal token
counts, convergence speed, LR sensitivity and the target."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

from lmtune.findings.comparison import SENSITIVITY_RANGE
from lmtune.findings.rows import TrialRow, varied_params
from lmtune.findings.summary import SweepFacts, SweepSummary
from lmtune.findings.text import fmt, initial_loss_text, rate, table, tokens
from lmtune.report.figures import LR_VS_LOSS


def overview(summary: SweepSummary, facts: SweepFacts, figures: Sequence[str]) -> list[str]:
    rows = summary.trials
    counts = ", ".join(f"{n} {s}" for s, n in summary.status_counts.items())
    data = f" Data: {facts.data}." if facts.data else ""
    return ["# Learning-rate sweep: analysis", "",
            f"{len(rows)} trials ({counts}).{data} Figures: {', '.join(f'`{f}`' for f in figures)}.", "",
            *_missing(facts)]


def _missing(facts: SweepFacts) -> list[str]:
    """The trials the ledger lists without a folder the report could read: the conclusions are drawn without them."""
    missing = facts.missing_trials
    if not missing:
        return []
    named = ", ".join(f"`{m.trial_id}` ({m.outcome})" for m in missing)
    return [f"**Warning:** the sweep's ledger lists {len(missing)} trial{'s' * (len(missing) > 1)} whose folder is "
            f"missing or unreadable: {named}. The best LR and every conclusion below were chosen without "
            f"{'them' if len(missing) > 1 else 'it'}, and may differ from what the whole sweep shows.", ""]


def trials(summary: SweepSummary) -> list[str]:
    extra = varied_params(summary.trials)
    staged = any(r.stage not in (None, "grid") for r in summary.trials)
    seeded = any(r.seed is not None for r in summary.trials)
    header = [*(["stage"] if staged else []), "trial", "lr", *(["seed"] if seeded else []), *extra, "status",
              "final val", "best val", "tokens", "wall time", "tokens/s", "stop reason", "stop step"]
    table_rows = []
    for r in sorted(summary.trials, key=_trial_order([s.name for s in summary.stages])):
        wall = f"{r.wall_time_s:.0f} s" if r.wall_time_s is not None else "—"
        table_rows.append([*([r.stage or "—"] if staged else []), r.trial_id, f"{r.lr:.4g}",
                           *([fmt(r.seed)] if seeded else []), *[fmt(r.params.get(k)) for k in extra],
                           r.status, fmt(r.final_val_loss), fmt(r.best_val_loss), tokens(r.tokens),
                           wall, rate(r.tokens_per_s), r.reason or "—", fmt(r.stop_step)])
    unconfirmed = ("; \"unconfirmed\": cut early while its train loss stood above ℓ₀, so whether it would have come "
                   "back is not known (Definitions)" if summary.status_counts.get("unconfirmed") else "")
    return ["## Trials", "", "\"final val\": the val loss at the end of the whole budget (empty for a trial that "
            f"stopped earlier){unconfirmed}.", "", *table(header, table_rows), ""]


def _trial_order(stages: list[str]) -> Callable[[TrialRow], tuple]:
    """Trials by stage (in the order the search ran them), then LR and seed."""
    def key(row: TrialRow) -> tuple:
        return (stages.index(row.stage) if row.stage in stages else len(stages)), row.lr, row.seed or 0

    return key


def equal_tokens(summary: SweepSummary) -> list[str]:
    table_by_rung = summary.equal_tokens.table
    rungs = [t for t in sorted(table_by_rung) if table_by_rung[t]]
    lines = ["## Loss against LR at equal token counts", ""]
    if not rungs:
        return lines + ["No trial was evaluated at a comparison point yet.", ""]
    lrs = sorted({lr for t in rungs for lr in table_by_rung[t]})
    diverged = {r.lr for r in summary.trials if r.status == "diverged"}
    cut = {run.lr for run in summary.unconfirmed}
    rows = []
    for lr in lrs:
        cells = []
        for t in rungs:
            losses = table_by_rung[t].get(lr)
            cells.append("—" if not losses else f"{sum(losses) / len(losses):.4f}"
                         + (f" ({len(losses)})" if len(losses) > 1 else ""))
        mark = (" (diverged in a trial)" if lr in diverged else
                " (a trial cut while above ℓ₀: unconfirmed)" if lr in cut else "")
        rows.append([f"{lr:.4g}{mark}", *cells])
    header = ["lr", *[f"{tokens(t)} tokens" + (" (full)" if t == summary.compared_at_tokens else "") for t in rungs]]
    points, stopped = (("ASHA's rungs and the whole budget", "A trial ASHA stopped") if summary.asha_rungs else
                       ("fractions of the budget and the whole budget: these runs had no rungs",
                        "A run whose log ends earlier"))
    return lines + [
        f"Each trial's val loss at exactly each comparison point ({points}; linear "
        "interpolation between its evaluations), the mean where several seeds reached it (their number in "
        f"brackets). {stopped} appears only at the points it reached; a diverged trial at none. "
        f"`{LR_VS_LOSS.file}` draws one curve per column.", "", *table(header, rows), ""]


def convergence(summary: SweepSummary) -> list[str]:
    conv = summary.convergence
    if conv.level is None:
        return ["## Convergence speed", "",
                "No trial trained its whole budget without diverging, so there is no common loss level to compare.",
                ""]
    lines = ["## Convergence speed", "",
             f"Tokens each trial that trained its whole budget ({tokens(conv.budget_tokens)} tokens) needed to "
             f"reach val loss {conv.level:.4f} (the worst final loss among the basin's runs, so each of them "
             "reaches it; linear interpolation between evaluations). Trials stopped earlier are left out: they cannot "
             "be compared.", ""]
    lines += table(["trial", "lr", "seed", "status", "tokens to reach"],
                   [[c.trial_id, f"{c.lr:.4g}", fmt(c.seed), c.status,
                     tokens(c.tokens) if c.tokens is not None else "never"] for c in conv.rows])
    reached = [c for c in conv.rows if c.tokens is not None]
    if reached:
        fastest = min(reached, key=lambda c: cast(float, c.tokens))
        lines += ["", f"Fastest: lr {fastest.lr:.4g} ({tokens(fastest.tokens)} tokens)."]
    return lines + [""]


def sensitivity(summary: SweepSummary) -> list[str]:
    found = summary.sensitivity
    if found.value is None:
        return ["## LR sensitivity", "", "Not computable: no trial trained its whole budget.", ""]
    low, high = SENSITIVITY_RANGE
    ell0 = initial_loss_text(summary.initial_loss, summary.initial_loss_from, short=True)
    return ["## LR sensitivity", "",
            f"LR sensitivity (Wortsman et al. 2023) = **{found.value:.4f}** nats on lmtune's fixed grid of "
            f"{found.points} LRs half a decade apart from {low:g} to {high:g} (the same for every sweep and every "
            f"variant, so values compare), {found.lrs} of them covered, at {tokens(found.tokens)} tokens (the whole "
            "budget): each grid LR's loss interpolated in log LR between the LRs that trained their budget, "
            f"ℓ₀, the loss at initialization ({ell0}), at and above a diverged LR, grid LRs "
            "outside what was measured left out. Lower means the loss degrades less away from the best LR.", ""]


def target(summary: SweepSummary) -> list[str]:
    found = summary.target
    if found.target is None:
        return ["## Target", "", "No target loss was given.", ""]
    if found.met:
        at = f" after {tokens(found.tokens)} tokens" if found.tokens else ""
        return ["## Target", "", f"Target val loss {found.target:g}: **met** by trial `{found.trial}` "
                f"(val loss {summary.best_val_loss:.4f}{at}).", ""]
    return ["## Target", "", f"Target val loss {found.target:g}: **not met** (best val loss "
            f"{fmt(summary.best_val_loss)}).", ""]
