"""A horizon search's part of the report: its summary (the target budget's runs, or the largest budget's while none
has trained at the target, with every budget's conclusion, the fit and the confirmation: HorizonResult), its section
of lr_sweep_analysis.md, horizon.png, and its lines before the CLIs' common ones."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import EngFormatter, NullFormatter  # noqa: E402

from lmtune.report.comparison import record_runs  # noqa: E402
from lmtune.report.horizon import HorizonResult, horizon_settings, horizon_summary, records_at  # noqa: E402
from lmtune.report.rows import trial_table  # noqa: E402
from lmtune.report.sections.base import ReportFigure, SweepInputs  # noqa: E402
from lmtune.report.summary import SweepSummary, summarize_runs  # noqa: E402
from lmtune.report.text import fmt, lr, table, tokens  # noqa: E402
from lmtune.sweep.runs import Budget, format_tokens  # noqa: E402
from lmtune.sweep.strategies.horizon.conclusion import BudgetConclusion  # noqa: E402
from lmtune.training.figures import save_figure  # noqa: E402


class HorizonSection:
    """``search: horizon``."""

    def summarize(self, sweep: SweepInputs) -> SweepSummary:
        """The usual summary of the target budget's runs (the largest budget with runs, while none has trained at
        the target yet), every trial's row, and the horizon's own results (lmtune.report.horizon)."""
        plan = sweep.record.plan  # (a horizon search's record has its plan: its settings came from it)
        settings, base = horizon_settings(plan), Budget.of_run(plan.base, None)
        pairs = record_runs(sweep.trials, base)  # every trial as a run, once: each budget's are among them
        result = horizon_summary(pairs, settings, base)
        at = next((b for b in reversed(result.budgets) if records_at(sweep.trials, b.steps, base)), None)
        records = records_at(sweep.trials, at.steps, base) if at else sweep.trials
        steps = at.steps if at else base.steps
        chosen = {id(record) for record in records}
        summary = summarize_runs(records, [p for p in pairs if id(p[1]) in chosen], base.at_steps(steps),
                                 target=sweep.target, vocab_size=sweep.vocab_size, search="horizon",
                                 conclusion=at.conclusion if at else None)
        rows, counts = trial_table(sweep.trials)
        return replace(summary, trials=rows, status_counts=counts, search_result=result)

    def markdown(self, summary: SweepSummary) -> list[str]:
        """Each budget's best LR and edge, the fit, the prediction and the target runs."""
        result = _result(summary)
        target = result.target_tokens
        lines = ["## The best LR at the target budget, predicted across token horizons", "",
                 f"Target: {target:,} tokens. Each budget's LRs are compared at that budget's full token count (its "
                 "cosine decays over it); the best LR is crowned on the mean over as many seeds as the LRs it beats; "
                 "'may lie in' is between the nearest LRs clearly worse (2 standard errors); the edge is the bracket "
                 "between the largest LR that trained through and the smallest that failed to recover.", ""]
        rows = []
        for b in result.budgets:
            c = b.conclusion
            losses = c.best.losses if c.best else ()
            spread = f" ± {c.best.spread:.4f}" if len(losses) > 1 else ""
            low, high = c.best_lr_interval
            edge = (f"{lr(c.edge.stable_lr, '?')} – {lr(c.edge.diverged_lr)}" if c.edge.diverged_lr
                    else f"none failed (≤ {lr(c.edge.stable_lr, '?')})")
            rows.append([f"{b.steps:,}" + (" (target)" if b.tokens == target else ""), tokens(b.tokens),
                         str(b.trials), lr(c.best_lr),
                         f"{fmt(c.best.mean)}{spread} ({len(losses)})" if losses else "—",
                         f"{lr(low, '?')} – {lr(high, '?')}", edge])
        lines += table(["steps", "tokens", "trials", "best lr", "val loss ± sd (seeds)", "best lr may lie in",
                        "edge (trains through – fails)"], rows)
        fit = result.fit
        if fit is None:
            return [*lines, "", f"No fit: {result.fit_problem or 'fewer than two budgets have a best LR'}.", ""]
        (blo, bhi), (plo, phi) = fit.beta_interval, fit.predicted_lr_interval
        lines += ["", f"**Fit**: ln LR* = a − β ln D through the {len(fit.best_lrs)} searched budgets' best LRs: "
                  f"β = {fit.beta:.3f} (90% interval {blo:.3f} to {bhi:.3f}), a = {fit.intercept:.3f} "
                  f"(90% interval {fit.intercept_interval[0]:.3f} to {fit.intercept_interval[1]:.3f}). The "
                  "intervals are a bootstrap: each resample draws every LR's seeds with replacement and places the "
                  "best LR anywhere within half a grid step of the grid point it won (the grid's resolution).", "",
                  f"**Predicted best LR at the target**: {fit.predicted_lr:.3g} (90% interval {plo:.3g} to "
                  f"{phi:.3g}): an extrapolation {target / max(b.tokens for b in result.budgets[:-1]):.0f}x beyond "
                  "the largest searched budget, which assumes the power law holds that far.", ""]
        return lines + _confirmed(result)

    def figures(self) -> tuple[ReportFigure, ...]:
        return (ReportFigure("horizon.png", lambda _: True, lambda f, path: plot_horizon(path, f.summary)),)

    def headline(self, summary: SweepSummary) -> list[str]:
        """Each budget's best LR, the fit, the prediction at the target and what the target's runs showed; then
        which budget the common lines are at."""
        result = _result(summary)
        lines = [_budget_line(b) for b in result.budgets[:-1]]
        fit = result.fit
        if fit is None:
            lines.append(f"no fit: {result.fit_problem or 'too few budgets have a best LR'}")
        else:
            low, high = fit.beta_interval
            lines.append(f"fit: best lr ∝ tokens^-beta, beta {fit.beta:.2f} (90% interval {low:.2f} to {high:.2f}, "
                         "from the seeds and the grid's spacing)")
            low, high = fit.predicted_lr_interval
            lines.append(f"predicted best lr at {result.target_tokens:,} tokens (the target): "
                         f"{fit.predicted_lr:.3g} (90% interval {low:.3g} to {high:.3g})")
            lines += _confirmed_lines(result)
        at = "the target" if summary.compared_at_tokens == result.target_tokens else "the largest"
        return [*lines, f"at {at} budget's {summary.compared_at_tokens or 0:,} tokens:"]


def _result(summary: SweepSummary) -> HorizonResult:
    result = summary.search_result
    assert isinstance(result, HorizonResult), "a horizon search's summary carries its HorizonResult"
    return result


def _budget_line(b: BudgetConclusion) -> str:
    c = b.conclusion
    if c.best is None:
        return f"{b.steps} steps ({b.tokens:,} tokens): no LR trained it through yet"
    losses = c.best.losses
    spread = f" ± {c.best.spread:.4f} ({len(losses)} seeds)" if len(losses) > 1 else " (one seed)"
    edge = (f"; edge between {lr(c.edge.stable_lr, '?')} (trained through) and {lr(c.edge.diverged_lr, '?')} "
            "(failed)" if c.edge.diverged_lr else "; no LR tried failed")
    return f"{b.steps} steps ({b.tokens:,} tokens): best lr {c.best.lr:.3g}, val {c.best.mean:.4f}{spread}{edge}"


def _confirmed_lines(result: HorizonResult) -> list[str]:
    confirmed = result.confirmed
    if not confirmed.losses:
        return []
    lines = ["target runs: " + ", ".join(f"{r.lr:.3g}: {r.mean:.4f}" for r in confirmed.losses)]
    if confirmed.predicted_excess is not None:
        se = (f" ± {confirmed.predicted_excess_se:.4f} (SE, from {confirmed.se_from})"
              if confirmed.predicted_excess_se else "")
        lines.append(f"  the predicted lr is {confirmed.predicted_excess:.4f} nats{se} above the best of them "
                     f"({confirmed.best_lr:.3g}, {confirmed.best_over_predicted:.2g}x the prediction)")
    return lines


def _confirmed(result: HorizonResult) -> list[str]:
    confirmed = result.confirmed
    if not confirmed.losses:
        return ["**Confirmation**: no run at the target budget has finished yet.", ""]
    predicted = result.predicted_lr
    rows = [[lr(r.lr), f"{r.lr / predicted:.2g}x", ", ".join(f"{v:.4f}" for v in r.losses), fmt(r.mean)]
            for r in confirmed.losses]
    lines = ["**Confirmation** at the target budget:", "",
             *table(["lr", "of the prediction", "val loss per seed", "mean"], rows), ""]
    if confirmed.predicted_excess is None:
        return [*lines, "The predicted LR itself has no finished run at the target budget.", ""]
    se = confirmed.predicted_excess_se
    significance = ("" if not se else f" ± {se:.4f} (standard error of the difference, from {confirmed.se_from})"
                    + ("; within 2 standard errors: the target runs do not tell the prediction from their best"
                       if confirmed.predicted_excess <= 2 * se else "; more than 2 standard errors"))
    lines.append(f"The lowest target loss is at {confirmed.best_lr:.3g} ({confirmed.best_over_predicted:.2g}x the "
                 f"prediction); the predicted LR's loss is {confirmed.predicted_excess:.4f} nats above "
                 f"it{significance}. Three LRs a factor apart bound the best only to within that factor.")
    return [*lines, ""]


def plot_horizon(path: Path, summary: SweepSummary) -> Path:
    """Left, val loss against LR at each budget's full token count (seeds as dots, the budget's first failing LR
    as an x); right, each budget's best LR against its tokens with the interval it lies in, the fitted power law,
    the prediction at the target with its 90% interval, and the target runs' best."""
    result = _result(summary)
    budgets = result.budgets
    fig, (left, right) = plt.subplots(1, 2, figsize=(12.5, 5), gridspec_kw={"wspace": 0.3})
    colors = plt.get_cmap("viridis")
    for i, b in enumerate(budgets):
        color = "black" if i == len(budgets) - 1 else colors(0.85 * i / max(len(budgets) - 2, 1))
        rows = sorted(b.conclusion.ranking, key=lambda r: r.lr)
        what = "target" if i == len(budgets) - 1 else "searched"
        if rows:
            left.plot([r.lr for r in rows], [r.mean for r in rows], "o-", color=color, markersize=4,
                      label=f"{b.steps} steps, {format_tokens(b.tokens)} tokens ({what})")
            for r in rows:
                if len(r.losses) > 1:
                    left.plot([r.lr] * len(r.losses), r.losses, ".", color=color, alpha=0.6)
        if b.conclusion.edge.diverged_lr and rows:
            left.plot([b.conclusion.edge.diverged_lr], [max(r.mean for r in rows)], "x", color=color, markersize=9,
                      markeredgewidth=2)
    left.set_xscale("log")
    left.set_xlabel("peak learning rate")
    left.set_ylabel("val loss at the budget's end (nats/token)")
    left.set_title("loss against LR, each budget at its own full token count\n(x: the budget's first LR that "
                   "failed, drawn at its curve's top)", fontsize=10)
    left.grid(alpha=0.3, which="both")
    left.legend(fontsize=7)
    _plot_fit(right, result)
    return save_figure(fig, path)


def _plot_fit(ax, result: HorizonResult) -> None:
    searched = [b for b in result.budgets[:-1] if b.conclusion.best_lr]
    for b in searched:
        best, (low, high) = b.conclusion.best_lr, b.conclusion.best_lr_interval
        lo, hi = (low or best), (high or best)
        ax.errorbar([b.tokens], [best], yerr=[[best - lo], [hi - best]], fmt="o", color="tab:blue", capsize=4)
    ax.plot([], [], "o", color="tab:blue", label="best LR of a searched budget (bar: where it may lie)")
    fit, target = result.fit, result.target_tokens
    if fit is not None and searched:
        xs = np.geomspace(min(b.tokens for b in searched), target, 50)
        ax.plot(xs, np.exp(fit.intercept) * xs ** -fit.beta, "-", color="tab:blue", alpha=0.7,
                label=f"fit: LR* ∝ tokens^-{fit.beta:.2f}")
        low, high = fit.predicted_lr_interval
        ax.errorbar([target], [fit.predicted_lr], yerr=[[fit.predicted_lr - low], [high - fit.predicted_lr]],
                    fmt="s", color="tab:orange", capsize=5, label="predicted at the target (90% interval)")
    if result.confirmed.best_lr:
        ax.plot([target], [result.confirmed.best_lr], "*", color="black", markersize=13,
                label="best of the target runs")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks([b.tokens for b in searched] + [target])  # the budgets themselves, labelled
    ax.xaxis.set_major_formatter(EngFormatter(places=0))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("tokens (the budget)")
    ax.set_ylabel("best learning rate")
    ax.set_title("the best LR against the token horizon", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
