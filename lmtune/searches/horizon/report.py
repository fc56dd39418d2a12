"""A horizon search's part of the report: its summary (the target budget's runs, or the largest budget's while none
has trained at the target, with every budget's conclusion, the fit and the confirmation: HorizonResult), its section
of lr_sweep_analysis.md, horizon.png, and its lines before the CLIs' common ones."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import EngFormatter  # noqa: E402

from lmtune.analysis.runs import Budget, format_tokens  # noqa: E402
from lmtune.findings.comparison import record_runs  # noqa: E402
from lmtune.findings.part import ReportFigure, SweepInputs  # noqa: E402
from lmtune.findings.summary import SweepSummary, summarize_runs  # noqa: E402
from lmtune.findings.text import lr, table, tokens  # noqa: E402
from lmtune.searches.axis.axis import PointConclusion  # noqa: E402
from lmtune.searches.axis.held_out import (  # noqa: E402
    HELD_OUT_COVERAGE,
    held_out_sentence,
    held_out_span,
    interval_words,
)
from lmtune.searches.axis.report_confirmation import TargetConfirmation  # noqa: E402
from lmtune.searches.axis.report_points import (  # noqa: E402
    LrAgainstAxis,
    best_loss_text,
    confirmation_markdown,
    draw_lr_against_axis,
    located_text,
)
from lmtune.searches.horizon.report_conclusion import HorizonResult, horizon_settings, horizon_summary, records_at  # noqa: E402
from lmtune.searches.horizon.report_fit import fit_headline, fit_sentences  # noqa: E402
from lmtune.searches.horizon.settings import NO_GAIN_UP_TO_RATIO  # noqa: E402
from lmtune.searches.textbook import horizon_rule, largest_below, rule_sentence  # noqa: E402
from lmtune.training.figures import save_figure  # noqa: E402


class HorizonSection:
    """``search: horizon``."""

    def summarize(self, sweep: SweepInputs) -> SweepSummary[HorizonResult]:
        """The usual summary of the target budget's runs (the largest budget with runs, while none has trained at
        the target yet), every trial's row, and the horizon's own results
        (lmtune.searches.horizon.report_conclusion)."""
        # (a horizon search's sweep.json holds its plan: its base, strategy and baseline are set)
        settings, base = horizon_settings(sweep.strategy), Budget.of_run(sweep.base, None, sweep.unigram_loss)
        pairs = record_runs(sweep.trials, base)  # every trial as a run, once: each budget's are among them
        result = horizon_summary([run for run, _ in pairs], settings, base)
        at = next((b for b in reversed(result.budgets) if records_at(sweep.trials, b.value, base)), None)
        records = records_at(sweep.trials, at.value, base) if at else sweep.trials
        steps = at.value if at else base.steps
        chosen = {id(record) for record in records}
        return summarize_runs(records, [p for p in pairs if id(p[1]) in chosen], base.at_steps(steps),
                               target=sweep.target, vocab_size=sweep.vocab_size, search="horizon",
                               conclusion=at.conclusion if at else None, every_record=sweep.trials,
                               search_result=result)

    def markdown(self, summary: SweepSummary[HorizonResult]) -> list[str]:
        """Each budget's crowned LR, located LR* and edge, the fit, the prediction and the confirmation."""
        result = summary.search_result
        target = result.target_tokens
        lines = ["## The best LR at the target budget, predicted across token horizons", "",
                 f"Target: {target:,} tokens. Each budget's LRs are compared at that budget's full token count (its "
                 "cosine decays over it); the crowned LR is the lowest mean over as many seeds as the LRs it beats; "
                 "LR* is located between grid points by a quadratic in ln LR through the LRs within 2.25x of the "
                 "crowned LR (at least two either side), weighted by each LR's seeds; Fieller's interval is every LR "
                 "at which the fitted curve's slope is within t standard errors of flat (the errors from the pooled "
                 "seed spread), and LR*'s 90% interval that one widened 3x in ln LR, its SE (of ln LR*, so relative, "
                 "as the fit weighs it) Fieller's half-width x 1.5 / 1.645: the widenings that brought each to 90% "
                 "on simulated searches (real curves are skewed, and a budget is located when its curve looks "
                 "sharp); 'may lie in' is between the nearest LRs clearly worse (2 standard errors); the edge is the "
                 "bracket between the largest LR that trained through and the smallest that failed, found by probes "
                 "of one seed each.", ""]
        lines += budget_table(result)
        fit = result.fit
        if fit is None:
            return [*lines, "", f"No fit: {result.fit_problem or 'fewer than two budgets have a best LR'}.", ""]
        (plo, phi), largest = fit.predicted_lr_interval, max(b.tokens for b in result.budgets[:-1])
        lines += ["", " ".join(fit_sentences(fit)), "",
                  f"**Predicted best LR at the target**: {fit.predicted_lr:.3g} "
                  f"({interval_words(HELD_OUT_COVERAGE, 'predicted')} {plo:.3g} to "
                  f"{phi:.3g}): an extrapolation {target / largest:.0f}x beyond the largest searched budget, which "
                  f"assumes the power law holds that far.{_pays_sentence(target / largest)}", "", held_out_sentence(),
                  ""]
        if rule := textbook_sentence(result):
            lines += [f"**Textbook rule**: {rule}.", ""]
        return lines + _confirmed(result)

    def figures(self) -> tuple[ReportFigure, ...]:
        return (ReportFigure("horizon.png", lambda _: True, lambda f, path: plot_horizon(path, f.summary)),)

    def headline(self, summary: SweepSummary[HorizonResult]) -> list[str]:
        """Each budget's crowned LR and LR*, the fit, the prediction at the target and the confirmation's verdict;
        then which budget the common lines are at."""
        result = summary.search_result
        lines = [budget_line(b) for b in result.budgets[:-1]]
        fit = result.fit
        if fit is None:
            lines.append(f"no fit: {result.fit_problem or 'too few budgets have a best LR'}")
        else:
            lines += fit_headline(fit)
            low, high = fit.predicted_lr_interval
            lines.append(f"predicted best lr at {result.target_tokens:,} tokens (the target): "
                         f"{fit.predicted_lr:.3g} ({interval_words(HELD_OUT_COVERAGE, 'predicted')} {low:.3g} to "
                         f"{high:.3g}; such intervals held "
                         f"{held_out_span(HELD_OUT_COVERAGE, 'predicted')} of simulated searches the method was "
                         "not tuned on)")
            if rule := textbook_sentence(result):
                lines.append(f"  textbook rule: {rule}")
            lines += _confirmed_lines(result)
        at = "the target" if summary.compared_at_tokens == result.target_tokens else "the largest"
        return [*lines, f"at {at} budget's {summary.compared_at_tokens or 0:,} tokens:"]


def textbook_sentence(result: HorizonResult) -> str | None:
    """The prediction against the textbook rule (the largest budget's best LR x ratio^-0.3), in one sentence (None:
    no fit, or no budget below the target has a best LR)."""
    largest = largest_below([(b.tokens, b.conclusion.best_lr) for b in result.budgets[:-1]], result.target_tokens)
    if result.fit is None or largest is None:
        return None
    rule = horizon_rule(largest[1], int(largest[0]), result.target_tokens)
    return rule_sentence(rule, result.fit.predicted_lr_interval, "the largest budget")


def _pays_sentence(ratio: float) -> str:
    """Where lmtune's measurements found no gain at this ratio over a direct local search at the target: say so."""
    if ratio > NO_GAIN_UP_TO_RATIO * 1.01:
        return ""
    return (f" Up to {NO_GAIN_UP_TO_RATIO:g}x, a direct local search at the target (as many runs there as this search "
            "trained, around the largest budget's best LR scaled by ratio^-0.3) found an LR as good for 48-63% of "
            "this search's tokens in lmtune's measurements (benchmarks/README.md, \"Where the horizon and width "
            "searches pay\").")


def _edge_text(b: PointConclusion) -> str:
    edge = b.conclusion.edge
    if edge.diverged_lr:
        return (f"{lr(edge.stable_lr)} – {lr(edge.diverged_lr)}" if edge.stable_lr is not None
                else f"fails from {lr(edge.diverged_lr)} (no LR below it trained through)")
    return f"none failed (≤ {lr(edge.stable_lr)})" if edge.stable_lr is not None else "—"


def _interval_text(low: float | None, high: float | None) -> str:
    """Where the crowned LR may lie, an unbounded end in words."""
    if low is not None and high is not None:
        return f"{lr(low)} – {lr(high)}"
    if low is None and high is None:
        return "not bounded by the LRs tried"
    return (f"below {lr(high)} (no lower LR clearly worse)" if low is None
            else f"above {lr(low)} (no higher LR clearly worse)")


def budget_table(result: HorizonResult) -> list[str]:
    """Each budget's crowned LR, its loss, where it may lie, its located LR* and its edge (one seed a probe)."""
    return table(["steps", "tokens", "trials", "crowned lr", "val loss ± sd (seeds)", "crowned lr may lie in",
                  "LR* (located), 90% interval", "edge, 1 seed (trains through – fails)"],
                 [_budget_row(b, result.target_tokens) for b in result.budgets])


def _budget_row(b: PointConclusion, target: int) -> list[str]:
    c = b.conclusion
    low, high = c.best_lr_interval
    is_target = b.tokens == target
    return [f"{b.value:,}" + (" (target)" if is_target else ""), tokens(b.tokens), str(b.trials), lr(c.best_lr),
            best_loss_text(c), _interval_text(low, high),
            "predicted (below)" if is_target else located_text(b.located), _edge_text(b)]


def budget_line(b: PointConclusion) -> str:
    c = b.conclusion
    if c.best is None:
        return f"{b.value} steps ({b.tokens:,} tokens): no LR trained it through yet"
    losses = c.best.losses
    spread = f" ± {c.best.spread:.4f} ({len(losses)} seeds)" if len(losses) > 1 else " (one seed)"
    edge = (f"; edge (one seed) {_edge_text(b)} (trains through – fails)" if c.edge.diverged_lr
            else "; no LR tried failed")
    at = b.located
    star = f"; LR* {located_text(at)}" if at is None or at.located else f"; LR* not located ({at.why.split(':')[0]})"
    return (f"{b.value} steps ({b.tokens:,} tokens): crowned lr {c.best.lr:.3g}, val {c.best.mean:.4f}{spread}"
            f"{star}{edge}")


def _cost(confirmed: TargetConfirmation) -> str:
    share = f", {confirmed.share_of_search:.0%} of the search's {tokens(confirmed.search_tokens)}" \
        if confirmed.share_of_search is not None else ""
    return (f"{tokens(confirmed.tokens)} tokens{share}; one seed per LR would have cost "
            f"{tokens(confirmed.one_seed_tokens)}")


def _confirmed_lines(result: HorizonResult) -> list[str]:
    confirmed = result.confirmed
    if not confirmed.losses:
        return [f"confirmation: {confirmed.verdict}"]
    runs = ", ".join(f"{r.lr:.3g}: {r.mean:.4f} ({len(r.losses)} seed{'s' * (len(r.losses) > 1)})"
                     for r in confirmed.losses)
    return [f"target runs: {runs}", f"  confirmation: {confirmed.verdict}", f"  its cost: {_cost(confirmed)}"]


def _confirmed(result: HorizonResult) -> list[str]:
    return confirmation_markdown(result.confirmed, result.predicted_lr, _cost(result.confirmed), "the target budget")


def plot_horizon(path: Path, summary: SweepSummary[HorizonResult]) -> Path:
    """Left, val loss against LR at each budget's full token count (seeds as dots, the budget's first failing LR
    as an x: an edge probe of one seed); right, each budget's located LR* with its 90% interval and its crowned
    grid LR, the fitted power law, the prediction at the target with its interval, and the target runs' best."""
    result = summary.search_result
    budgets = result.budgets
    fig, (left, right) = plt.subplots(1, 2, figsize=(12.5, 5), gridspec_kw={"wspace": 0.3})
    colors = plt.get_cmap("viridis")
    for i, b in enumerate(budgets):
        color = "black" if i == len(budgets) - 1 else colors(0.85 * i / max(len(budgets) - 2, 1))
        rows = sorted(b.conclusion.ranking, key=lambda r: r.lr)
        what = "target" if i == len(budgets) - 1 else "searched"
        if rows:
            left.plot([r.lr for r in rows], [r.mean for r in rows], "o-", color=color, markersize=4,
                      label=f"{b.value} steps, {format_tokens(b.tokens)} tokens ({what})")
            for r in rows:
                if len(r.losses) > 1:
                    left.plot([r.lr] * len(r.losses), r.losses, ".", color=color, alpha=0.6)
        if b.conclusion.edge.diverged_lr and rows:
            left.plot([b.conclusion.edge.diverged_lr], [max(r.mean for r in rows)], "x", color=color, markersize=9,
                      markeredgewidth=2)
    left.plot([], [], "x", color="gray", markeredgewidth=2, label="first LR that failed (edge probe, one seed)")
    left.set_xscale("log")
    left.set_xlabel("peak learning rate")
    left.set_ylabel("val loss at the budget's end (nats/token)")
    left.set_title("loss against LR, each budget at its own full token count\n(x: the budget's first LR that "
                   "failed, one seed, drawn at its curve's top)", fontsize=10)
    left.grid(alpha=0.3, which="both")
    left.legend(fontsize=7)
    _plot_fit(right, result)
    return save_figure(fig, path)


def _plot_fit(ax, result: HorizonResult) -> None:
    searched = [b for b in result.budgets[:-1] if b.conclusion.best_lr]
    fit, target = result.fit, result.target_tokens
    curve = None
    if fit is not None and searched:
        xs = np.geomspace(min(b.tokens for b in searched), target, 50)
        curve = (xs, np.exp(fit.intercept) * xs ** -fit.beta,
                 f"fit: LR* ∝ tokens^-{fit.beta:.2f}" + ("" if fit.resolved else " (β not resolved)"))
    draw_lr_against_axis(ax, LrAgainstAxis(
        [(b.tokens, b.conclusion.best_lr, b.located) for b in searched], "searched budget", target, curve,
        (fit.predicted_lr, fit.predicted_lr_interval, interval_words(HELD_OUT_COVERAGE, "predicted"))
        if fit is not None and searched else None,
        result.confirmed.best_lr, {"color": "black", "markersize": 13}, [b.tokens for b in searched] + [target],
        EngFormatter(places=0), "tokens (the budget)", "the best LR against the token horizon"))


SECTION = HorizonSection()
