"""A compare search's part of the report: the reference's runs as the common summary, every variant at its own best
LR against it (lmtune.searches.compare.comparison: CompareResult), its section of lr_sweep_analysis.md, two figures
(loss against LR per variant at equal tokens with each edge marked; each variant's learning curves at its own best
LR), and its lines before the CLIs' common ones."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import NullFormatter  # noqa: E402

from lmtune.analysis.locate import LocatedLr  # noqa: E402
from lmtune.analysis.runs import Budget, same_lr  # noqa: E402
from lmtune.findings.comparison import record_runs  # noqa: E402
from lmtune.findings.part import FigureInputs, ReportFigure, SweepInputs  # noqa: E402
from lmtune.findings.rows import trial_row  # noqa: E402
from lmtune.findings.stability import (
    TrialRecord,  # noqa: E402
    val_points,  # noqa: E402
)
from lmtune.findings.summary import SweepSummary, summarize_runs  # noqa: E402
from lmtune.findings.text import lr, table, tokens  # noqa: E402
from lmtune.searches.compare.batch import RULES, BatchScaling  # noqa: E402
from lmtune.searches.compare.comparison import (  # noqa: E402
    LOCATION_SD,
    UNRESOLVED,
    CompareResult,
    VariantResult,
    compare_variants,
    with_batches,
)
from lmtune.searches.compare.settings import CompareSettings  # noqa: E402
from lmtune.searches.trial_order import RANGE_STAGE  # noqa: E402
from lmtune.training.figures import (
    readable_lr_axis,  # noqa: E402
    save_figure,  # noqa: E402
)
from lmtune.usercode.config import MODEL_ARG_PREFIX, MODEL_SETTING  # noqa: E402

# What benchmarks/batch_coverage.py measured (3 and 5 batch sizes, 300 simulated searches per scenario, commit
# 532a474): the exponent's interval and each batch's LR* interval, where one power law holds.
K_COVERAGE, LR_COVERAGE = "98.7–100%", "96–99.8%"
LOSS_FIGURE, CURVES_FIGURE, BATCH_FIGURE = "compare_loss_vs_lr.png", "compare_curves.png", "compare_batch.png"


class CompareSection:
    """``search: compare``."""

    def summarize(self, sweep: SweepInputs) -> SweepSummary[CompareResult]:
        """The common summary of the reference's runs, and every variant against it."""
        settings: CompareSettings = sweep.strategy.settings  # (its sweep.json holds its plan: these are set)
        budget = Budget.of_run(sweep.base, None, sweep.unigram_loss)
        pairs = record_runs(sweep.trials, budget)
        by_variant = defaultdict(list)
        for run, record in pairs:
            by_variant[record.variant].append((run, record))
        result = compare_variants({name: [run for run, _ in p] for name, p in by_variant.items()}, settings, budget)
        result = with_batches(result, _speeds(sweep.trials))
        reference = by_variant.get(settings.reference.name, [])
        return summarize_runs([record for _, record in reference], reference, budget, target=sweep.target,
                              vocab_size=sweep.vocab_size, decisions=list(sweep.decisions),
                              search="compare",
                              conclusion=result.reference.conclusion, every_record=sweep.trials,
                              search_result=result)

    def markdown(self, summary: SweepSummary[CompareResult]) -> list[str]:
        result = summary.search_result
        reference = result.reference
        ref_lr = reference.conclusion.best_lr
        lines = ["## The variants, each at its own best LR", "", _method(result), "",
                 *table(["variant", "changes", "runs (tokens)", "best LR (basin)", "loss at it ± sd (seeds)",
                         "trains through – fails", f"at the reference's best LR ({lr(ref_lr)})",
                         "against the reference"],
                        [_row(v, i == 0) for i, v in enumerate(result.variants)]), ""]
        for variant in result.variants[1:]:
            if variant.difference is not None and variant.difference.verdict == UNRESOLVED:
                need = variant.difference.seeds_to_resolve
                lines.append(f"- {variant.name}: {variant.difference.value:+.4f} nats is within the threshold "
                             f"(±{variant.difference.threshold:.4f}); "
                             + (f"about {need} seeds per variant at each best LR would resolve a difference this "
                                "large." if need else "no practical number of seeds would resolve a difference "
                                                      "this small."))
            moved = variant.optimum_moved(reference)
            if moved is not None:
                lines.append(f"- {variant.name}: its best LR {lr(variant.conclusion.best_lr)} is "
                             f"{variant.conclusion.best_lr / ref_lr:.2g}x the reference's; "
                             + ("its basin and the reference's do not overlap: **the optimum moved**." if moved
                                else "its basin and the reference's overlap: the optimum did not move measurably."))
        if result.batch is not None:
            lines += ["", *_batch_lines(result.batch)]
        return [*lines, ""]

    def figures(self) -> tuple[ReportFigure, ...]:
        return (ReportFigure(LOSS_FIGURE, lambda f: True, lambda f, path: plot_loss_vs_lr(path, f.summary)),
                ReportFigure(CURVES_FIGURE, lambda f: True, lambda f, path: plot_best_curves(path, f)),
                ReportFigure(BATCH_FIGURE, lambda f: f.summary.search_result.batch is not None,
                             lambda f, path: plot_batch(path, f.summary.search_result.batch)))

    def headline(self, summary: SweepSummary[CompareResult]) -> list[str]:
        result = summary.search_result
        ref_lr = result.reference.conclusion.best_lr
        lines = [f"compare search: {len(result.variants)} variants, each at its own best lr (the reference: "
                 f"{result.reference.name})"]
        for v in result.variants:
            best = v.conclusion.best
            text = (f"best lr {lr(best.lr)}, loss {best.mean:.4f} ({len(best.losses)} seed"
                    f"{'s' * (len(best.losses) > 1)})" if best
                    else "no lr trained its whole budget")
            if v.difference is not None:
                text += f", {v.difference.value:+.4f} against the reference: {v.difference.verdict}"
            if v.at_reference is not None:
                text += f"; at the reference's lr {lr(ref_lr)}: {_at_reference_text(v)}"
            lines.append(f"  {v.name}: {text}")
        return [*lines, f"at the reference ({result.reference.name}), {summary.compared_at_tokens or 0:,} tokens:"]


def _method(result: CompareResult) -> str:
    budget = result.reference.budget
    trained = (f"every run trained its whole budget ({tokens(budget.full_tokens)} tokens: a batch-size variant in its "
               "own steps) with nothing cut early but a divergence") if len(budget.rungs) < 2 else (
        f"its coarse grid cut by an ASHA of the variant's own (rungs at {', '.join(tokens(r) for r in budget.rungs)} "
        "tokens: a variant's LRs judged only against its own), the rest trained to the whole budget (a batch-size "
        "variant in its own steps)")
    return (f"Every variant had an edge search of its own (its LRs chosen from its own runs), {trained}; each "
            "variant is read at its own crowned best LR (the lowest mean over as "
            "many seeds as the LRs it beats, from its own search's runs: the same design, so the same number of "
            "candidates, as the reference's). Against the reference: the difference of the two best means, judged "
            "at the level of 2 standard errors of a difference (each mean's error its variant's pooled seed sd over "
            f"√seeds, and {LOCATION_SD:g} seed sd for where its crowned LR landed, whatever the seeds), made "
            "Student's t for Welch–Satterthwaite's degrees of freedom: the ± is the threshold it had to exceed. A "
            "best LR is "
            "the lowest of noisy means, so it sits low (the winner's curse); crowned alike, both sides sit low "
            "alike: in simulated compare searches, two identical variants were called better in 0.9% and worse in "
            "0.7% of comparisons at 2 seeds, and at most 1.8% a side in every scenario measured at 2 and 4 seeds "
            "(benchmarks/compare_verdicts.py). "
            "The reference's best LR was also trained on every other variant with the reference's seeds: the "
            "loss at the previous optimal LR (beside the variant's own crown, not a candidate for it).")


def _change(setting: str, value: object) -> str:
    """A variant's setting in words: the user's model by its callable's name, an argument of it as name=value."""
    if setting == MODEL_SETTING:
        return f"model {str(value).rpartition(':')[2]}"
    if setting.startswith(MODEL_ARG_PREFIX):
        return f"{setting.removeprefix(MODEL_ARG_PREFIX)}={value}"
    return f"{setting} {value}"


def _row(v: VariantResult, is_reference: bool) -> list[str]:
    c = v.conclusion
    best, basin = c.best, c.landscape.basin
    given = v.variant.given
    changes = ", ".join(_change(k, val) for k, val in given.items()) or "(the reference)"
    if "steps" in v.variant.derived:
        changes += f" ({v.budget.steps} steps)"
    if v.variant.largest_batch:
        changes += f" ({v.variant.largest_batch})"
    basin_text = f" ({lr(basin.lrs[0])}–{lr(basin.lrs[-1])})" if basin else ""
    loss = (f"{best.mean:.4f} ± {best.spread:.4f} ({len(best.losses)})" if best and best.spread is not None
            else f"{best.mean:.4f} (1)" if best else "—")
    edge = (f"{lr(c.edge.stable_lr) if c.edge.stable_lr else '—'} – {lr(c.edge.diverged_lr)}"
            if c.edge.diverged_lr else "no LR diverged")
    at_ref = "(itself)" if is_reference else _at_reference_text(v) if v.at_reference else "—"
    d = v.difference
    versus = "—" if d is None else f"{d.value:+.4f}" + (f" ± {d.threshold:.4f}" if d.threshold else "") + \
        f": {d.verdict}"
    return [v.name, changes, f"{v.runs} ({tokens(v.tokens)})", f"{lr(c.best_lr)}{basin_text}" if best else "—",
            loss, edge, at_ref, versus]


def _speeds(trials: Sequence[TrialRecord]) -> dict[str, float | None]:
    """Each variant's median tokens per second over its runs (its range test left out)."""
    speeds: dict[str, list[float]] = defaultdict(list)
    for record in trials:
        if record.variant and record.stage != RANGE_STAGE and (speed := trial_row(record).tokens_per_s):
            speeds[record.variant].append(speed)
    return {name: statistics.median(values) for name, values in speeds.items()}  # (each has a run)


def _batch_lines(batch: BatchScaling) -> list[str]:
    """The batch sizes' paragraph: the table, and the power law with the rules its interval allows."""
    rows = [[str(p.batch_size), p.variant, lr(p.best_lr) if p.best_lr else "—",
             _located_text(p.located), f"{p.loss:.4f}" + (f" ± {p.loss_sd:.4f}" if p.loss_sd is not None else "")
             if p.loss is not None else "—", f"{p.tokens_per_s:,.0f}" if p.tokens_per_s else "—"] for p in batch.points]
    lines = ["### Batch size", "", f"Every batch trains the same tokens; see `{BATCH_FIGURE}`. LR* is located between "
             f"the grid LRs, its interval as the horizon search's (it held each batch's true LR* in {LR_COVERAGE} of "
             "simulated searches); tokens/s is the median of the variant's runs while the sweep ran its trials side "
             "by side.", "",
             *table(["batch", "variant", "best LR", "LR* (interval)", "loss at it ± sd", "tokens/s"], rows), ""]
    if batch.law is None:
        return [*lines, f"No power law fitted: {batch.why_no_law}."]
    k, (low, high) = batch.exponent, batch.exponent_interval
    allowed = ", ".join(f"{name} (k = {RULES[name]:g})" for name, ok in batch.rules_allowed().items() if ok)
    lines.append(f"LR* ∝ batch^k with **k = {k:.2f}**, interval {low:.2f} to {high:.2f} from {batch.law.dof + 2} "
                 f"batch sizes (intervals so made held the true k in {K_COVERAGE} of simulated searches where one "
                 f"power law holds: benchmarks/batch_coverage.py); the rules it allows: "
                 f"{allowed or 'neither the square-root nor the linear'}.")
    if batch.law.law_holds is False:
        lines.append(f"The batch sizes' LR*s lie further from one line than their errors allow (lack-of-fit p = "
                     f"{batch.law.lack_of_fit_p:.2g}): no one power law holds across them.")
    return lines


def _located_text(located: LocatedLr | None) -> str:
    if located is None or not located.usable:
        return "not bounded"
    low, high = located.interval()
    return f"{lr(located.lr)} ({lr(low)}–{lr(high)})"


def plot_batch(path: Path, batch: BatchScaling) -> Path:
    """Three panels against batch size: LR* (located, bars: its interval) with the fitted power law and the
    square-root and linear rules through the smallest batch's LR*; the loss at each batch's best LR (the same tokens);
    tokens/s."""
    fig, (ax_lr, ax_loss, ax_speed) = plt.subplots(1, 3, figsize=(14, 4.2), layout="constrained")
    sizes = [p.batch_size for p in batch.points]
    found = [p for p in batch.points if p.located is not None and p.located.usable]
    if found:
        intervals = [p.located.interval() for p in found]
        ax_lr.errorbar([p.batch_size for p in found], [p.located.lr for p in found], fmt="o", capsize=3,
                       yerr=[[p.located.lr - lo for p, (lo, _) in zip(found, intervals, strict=True)],
                             [hi - p.located.lr for p, (_, hi) in zip(found, intervals, strict=True)]],
                       color="black", label="LR* (its interval)")
        span = [min(sizes), max(sizes)]
        anchor = found[0]
        for (name, k), style in zip(RULES.items(), (":", "-."), strict=True):
            ax_lr.plot(span, [anchor.located.lr * (b / anchor.batch_size) ** k for b in span], style, color="gray",
                       label=f"{name} rule (k = {k:g})")
        if batch.law is not None:
            ax_lr.plot(span, [math.exp(batch.law.intercept) * b ** batch.exponent for b in span], "-", color="C0",
                       label=f"fit: k = {batch.exponent:.2f}")
    ax_lr.set_xscale("log")
    readable_lr_axis(ax_lr, axis="y")
    ax_lr.set_xlabel("batch size")
    ax_lr.set_ylabel("best learning rate")
    ax_lr.legend(fontsize=7)
    with_loss = [p for p in batch.points if p.loss is not None]
    ax_loss.errorbar([p.batch_size for p in with_loss], [p.loss for p in with_loss], fmt="o-", capsize=3,
                     yerr=[p.loss_sd or 0.0 for p in with_loss], color="C1")
    ax_loss.set_ylabel("val loss at its best LR (nats/token)")
    with_speed = [p for p in batch.points if p.tokens_per_s]
    ax_speed.plot([p.batch_size for p in with_speed], [p.tokens_per_s for p in with_speed], "o-", color="C2")
    ax_speed.set_ylabel("tokens/s (median of its runs)")
    for ax in (ax_loss, ax_speed):
        ax.set_xscale("log")
        ax.set_xlabel("batch size")
    for ax in (ax_lr, ax_loss, ax_speed):
        ax.grid(alpha=0.3, which="both")
        ax.set_xticks(sizes, [str(b) for b in sizes])
        ax.xaxis.set_minor_formatter(NullFormatter())
    fig.suptitle("batch size at equal tokens: best LR, loss at it, throughput", fontsize=10)
    return save_figure(fig, path)


def _at_reference_text(v: VariantResult) -> str:
    at = v.at_reference
    parts = [f"{at.mean:.4f} ({len(at.losses)} seed{'s' * (len(at.losses) > 1)})"] if at.losses else []
    if at.diverged:
        parts.append(f"{at.diverged} of {at.diverged + len(at.losses)} diverged")
    return ", ".join(parts)


def plot_loss_vs_lr(path: Path, summary: SweepSummary[CompareResult]) -> Path:
    """Val loss against LR at each variant's full budget (the same tokens), mean over seeds with sd bars, each
    variant's smallest diverging LR marked (dashed) in its colour."""
    result = summary.search_result
    fig, ax = plt.subplots(figsize=(8, 5))
    colors = plt.get_cmap("tab10")
    for i, v in enumerate(result.variants):
        ranking = sorted(v.conclusion.ranking, key=lambda r: r.lr)
        color = colors(i % 10)
        if ranking:
            ax.errorbar([r.lr for r in ranking], [r.mean for r in ranking], capsize=3, fmt="o-", markersize=4,
                        yerr=[r.spread if len(r.losses) > 1 else 0.0 for r in ranking], color=color,
                        label=v.name + (" (reference)" if i == 0 else ""))
        if v.conclusion.edge.diverged_lr:
            ax.axvline(v.conclusion.edge.diverged_lr, color=color, linestyle="--", alpha=0.7)
    ax.plot([], [], "--", color="gray", label="smallest diverging LR")
    readable_lr_axis(ax)
    ax.set_xlabel("peak learning rate")
    ax.set_ylabel("val loss at the budget's end (nats/token)")
    ax.set_title(f"each variant's loss against LR at {tokens(result.reference.budget.full_tokens)} tokens\n"
                 "(mean over seeds, bars: sd)", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def plot_best_curves(path: Path, figure: FigureInputs) -> Path:
    """Val loss against tokens of each variant's runs at its own best LR (every seed), in its colour."""
    result: CompareResult = figure.summary.search_result
    fig, ax = plt.subplots(figsize=(8, 5))
    colors = plt.get_cmap("tab10")
    for i, v in enumerate(result.variants):
        best = v.conclusion.best_lr
        runs = [r for r in figure.trials if best and r.variant == v.name and same_lr(r.lr, best)]
        for k, record in enumerate(runs):
            x, y = val_points(record)
            ax.plot(x, y, color=colors(i % 10), alpha=0.8,
                    label=f"{v.name} at lr {lr(best)}" if k == 0 else None)
    ax.set_xlabel("tokens")
    ax.set_ylabel("val loss (nats/token)")
    ax.set_title("each variant at its own best LR (every seed)", fontsize=10)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    return save_figure(fig, path)


SECTION = CompareSection()
