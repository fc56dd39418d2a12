"""Where the report's figures are drawn: lr_sweep_comparison.png, lr_vs_loss.png, instability.png and
sharpness.png, from trial records and the summary; FIGURES names each one's file and when it is drawn (a search's
own figures are its report section's: lmtune.report.sections). (A run's own two figures are drawn by
lmtune.training.figures.)
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import EngFormatter, ScalarFormatter  # noqa: E402

from lmtune.analysis.landscape import Gap, Region  # noqa: E402
from lmtune.analysis.runs import SIGNIFICANCE_SE, format_tokens  # noqa: E402
from lmtune.findings.part import FigureInputs, ReportFigure  # noqa: E402
from lmtune.findings.sharpness import SharpnessRow  # noqa: E402
from lmtune.findings.stability import TrialRecord, classify, column, initial_loss, trial_statuses  # noqa: E402
from lmtune.findings.summary import SweepSummary  # noqa: E402
from lmtune.findings.text import basin_lrs, initial_loss_text, per_doubling  # noqa: E402
from lmtune.findings.text import lr as _lr  # noqa: E402
from lmtune.training.figures import plot_range_test, save_figure, wall_unit  # noqa: E402
from lmtune.training.metric_registry import instability_panels  # noqa: E402

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# A sweep



def _lr_colors(records: Sequence[TrialRecord]):
    from matplotlib.colors import LogNorm

    lrs = [r.lr for r in records]
    lo, hi = min(lrs), max(lrs)
    if lo == hi:  # LogNorm needs a non-empty range
        lo, hi = lo / 2, hi * 2
    norm = LogNorm(vmin=lo, vmax=hi)
    cmap = plt.get_cmap("viridis")
    return norm, cmap


def _finite_xy(x: np.ndarray | None, y: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    if x is None or y is None:
        return np.empty(0), np.empty(0)
    keep = np.isfinite(x) & np.isfinite(y)
    return x[keep], y[keep]


def _loss_limits(records: Sequence[TrialRecord]) -> tuple[float, float]:
    """y-range that keeps every healthy curve readable: exploding losses are cut a bit above the start."""
    start = initial_loss(records)
    firsts = []
    lows = []
    # A diverged run's first logged loss can already be far above the start (a huge LR blows up within
    # the first log interval): only runs that did not diverge (nor were cut while above ℓ₀) set the top, unless
    # none is left.
    healthy = ({id(r) for r in records if classify(r) not in ("diverged", "unconfirmed")}
               or {id(r) for r in records})
    for r in records:
        for name in ("train_loss", "val_loss"):
            _, y = _finite_xy(column(r, "tokens"), column(r, name))
            if y.size:
                lows.append(y.min())
                if name == "train_loss" and id(r) in healthy:
                    firsts.append(y[0])
    if not lows:
        return 0.0, 1.0
    top = max(firsts) if firsts else (start or max(lows))
    bottom = min(lows)
    top = max(top, bottom + 1e-3)
    pad = 0.05 * (top - bottom)
    return bottom - pad, top + pad


def _trial_label(record: TrialRecord, status: str) -> str:
    seed = f" s{record.seed}" if record.seed else ""
    stage = f" {record.stage}" if record.stage != "grid" else ""
    return f"lr={record.lr:.3g}{seed}{stage} ({status})"


# A learning-curve figure's x axis: metrics.csv's column, its label, the name its title gives it.
CURVE_X = {"tokens": ("tokens", "tokens", "tokens"),
           "wall": ("elapsed_s", "wall-clock time ({unit}; a resumed run's earlier processes included)",
                    "wall-clock time")}


def plot_sweep_comparison(records: Sequence[TrialRecord], path: Path, target: float | None = None,
                          x: str = "tokens") -> Path:
    """Val loss (bold) and train loss (thin) against ``x`` (tokens, or wall: the run's wall-clock time) for every
    trial, colored by LR (sweep_comparison_figure), written to ``path``."""
    return save_figure(sweep_comparison_figure(records, target, x), path)


def sweep_comparison_figure(records: Sequence[TrialRecord], target: float | None = None, x: str = "tokens"):
    """plot_sweep_comparison's figure (a matplotlib Figure, not yet written): each trial marked by its status
    among the sweep's trials (trial_statuses); a wall-clock axis in one unit (wall_unit)."""
    x_column, x_label, x_name = CURVE_X[x]
    scale, x_format = 1.0, EngFormatter()
    if x == "wall":
        longest = [float(np.nanmax(v)) for r in records if (v := column(r, x_column)) is not None
                   and np.isfinite(v).any()]
        unit, scale = wall_unit(max(longest, default=0.0))
        x_label, x_format = x_label.format(unit=unit), ScalarFormatter()
    statuses = trial_statuses(records)
    fig, ax = plt.subplots(figsize=(9, 5.5))
    norm, cmap = _lr_colors(records)
    low, high = _loss_limits(records)
    for r in sorted(records, key=lambda rec: rec.lr):
        status = statuses[r.trial_id]
        color = cmap(norm(r.lr))
        style = "--" if status == "stopped_early" or r.outcome == "stopped_early" else "-"
        tokens = column(r, x_column)
        tokens = tokens / scale if tokens is not None else None
        tx, ty = _finite_xy(tokens, column(r, "train_loss"))
        vx, vy = _finite_xy(tokens, column(r, "val_loss"))
        if tx.size:
            # No clipping of values: the axis limits cut exploding curves off at the top edge.
            ax.plot(tx, ty, style, color=color, alpha=0.35, linewidth=0.8)
        if vx.size:
            ax.plot(vx, vy, style, color=color, linewidth=2.0, marker="o", markersize=3, label=_trial_label(r, status))
        end_x = tx if tx.size else vx
        end_y = ty if tx.size else vy
        if status == "diverged":
            # Where it stopped: the last logged step, pinned to the top edge if the loss had exploded.
            stop = np.nanmax(tokens) if tokens is not None and np.isfinite(tokens).any() else (
                end_x[-1] if end_x.size else None)
            if stop is not None:
                y = min(end_y[-1], high) if end_y.size else high
                y = high if not math.isfinite(y) else y
                # A run stopped before its first evaluation has no val line: the marker carries its legend entry.
                ax.plot([stop], [y], "x", color="red", markersize=11, markeredgewidth=2.5, zorder=5, clip_on=False,
                        label=None if vx.size else f"lr={r.lr:.3g} (diverged)")
        elif style == "--" and end_x.size:
            last_x, last_y = (vx[-1], vy[-1]) if vx.size else (end_x[-1], end_y[-1])
            ax.plot([last_x], [min(last_y, high)], "|", color=color, markersize=16, markeredgewidth=2.5, zorder=5)
    if target is not None:
        ax.axhline(target, color="black", linestyle=":", linewidth=1.5, label=f"target {target:g}")
    ax.set_ylim(low, high)
    ax.xaxis.set_major_formatter(x_format)
    ax.set_xlabel(x_label)
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(f"LR sweep against {x_name}: val loss (bold), train loss (thin); x = diverged, dashed | = stopped "
                 "early", fontsize=10)
    ax.grid(alpha=0.3)
    sm = plt.cm.ScalarMappable(norm=norm, cmap=cmap)
    fig.colorbar(sm, ax=ax, label="peak learning rate")
    if len(records) > 10:  # below the plot, where it hides no curve
        ax.legend(fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3)
    else:
        ax.legend(fontsize=7, loc="best", ncol=2)
    return fig


def plot_lr_vs_loss(path: Path, summary: SweepSummary) -> Path:
    """Val loss against LR at equal token counts (lr_vs_loss_figure), written to ``path``."""
    return save_figure(lr_vs_loss_figure(summary), path)


def lr_vs_loss_title(summary: SweepSummary) -> str:
    """What lr_vs_loss.png's curves are: ASHA's rungs only where the runs had them."""
    if len(summary.rungs) < 2:
        return "val loss against LR at the full budget"
    if summary.asha_rungs:
        return "val loss against LR at equal token counts (one curve per ASHA rung)"
    return "val loss against LR at equal token counts (one curve per comparison point: these runs had no rungs)"


def lr_vs_loss_figure(summary: SweepSummary):
    """Val loss against LR at equal token counts: one curve per comparison point (each trial's loss interpolated at
    exactly that many tokens; a trial appears only at the points it reached), seeds as dots with their range at the
    full budget; the LRs in the failed region as red x at the top and the unconfirmed ones (cut while above ℓ₀) as
    purple triangles there, as the report's table names them (Conclusion.regions); the three regions shaded
    (basin green, degraded orange, failed red), each boundary hatched across the interval it is known to lie in, and
    each band's legend saying the same numbers (a matplotlib Figure, not yet written)."""
    table = summary.equal_tokens.table
    fig, ax = plt.subplots(figsize=(8.5, 5.2))
    colors = plt.get_cmap("viridis")
    rungs = sorted(table)
    values = [v for by_lr in table.values() for losses in by_lr.values() for v in losses]
    final_values = [v for losses in (table[rungs[-1]] if rungs else {}).values() for v in losses]
    start = summary.initial_loss
    # The full budget's curve and ℓ₀ set the scale: an early rung's loss far above ℓ₀ goes off the top.
    top = max([*final_values, *([start] if start else [])] or values or [1.0])
    bottom = min(values) if values else top - 1.0
    top_edge = top + 0.08 * max(top - bottom, 1e-3)
    clipped = any(v > top_edge for v in values)
    for i, tokens in enumerate(rungs):
        by_lr = table[tokens]
        if not by_lr:
            continue
        final = tokens == rungs[-1]
        color = colors(0.85 * i / max(len(rungs) - 1, 1))
        lrs = sorted(by_lr)
        means = [float(np.mean(by_lr[lr])) for lr in lrs]
        label = f"{format_tokens(tokens)} tokens" + (" (full budget)" if final else "")
        ax.plot(lrs, means, "o-" if final else "o--", color=color, linewidth=2.2 if final else 1.2,
                markersize=5 if final else 3, label=f"{label}: {len(lrs)} LRs")
        if final:
            for lr in lrs:
                if len(by_lr[lr]) > 1:
                    ax.plot([lr] * len(by_lr[lr]), by_lr[lr], ".", color=color, alpha=0.6)
                    ax.vlines(lr, min(by_lr[lr]), max(by_lr[lr]), color=color, linewidth=1)
    failed = summary.conclusion.lrs_in(Region.FAILED)
    if failed:
        ax.plot(failed, [top_edge] * len(failed), "x", color="red", markersize=10, markeredgewidth=2.2,
                label="failed: a run diverged, or ended no better than the unigram baseline", clip_on=False)
    unconfirmed = summary.conclusion.lrs_in(Region.UNCONFIRMED)
    if unconfirmed:
        ax.plot(unconfirmed, [top_edge] * len(unconfirmed), "^", color="tab:purple", markersize=9,
                markerfacecolor="none", markeredgewidth=2, label="unconfirmed: cut while above ℓ₀", clip_on=False)
    if start:
        ax.axhline(start, color="gray", linestyle="--", linewidth=1,  # (said as it was found: ln vocab, an estimate)
                   label=initial_loss_text(start, summary.initial_loss_from, digits=3, short=True))
    if summary.unigram_loss:  # a run ending above it, above an LR that trained, failed
        ax.axhline(summary.unigram_loss, color="tab:red", linestyle=":", linewidth=1,
                   label=f"unigram baseline = {summary.unigram_loss:.2f} (ending above it: failed)")
    _shade_edge_and_best(ax, summary)
    ax.set_xscale("log")
    ax.set_ylim(bottom - 0.05 * max(top - bottom, 1e-3), top_edge + 0.05 * max(top - bottom, 1e-3))
    ax.set_xlabel("peak learning rate")
    ax.set_ylabel("val loss (nats/token)")
    early = "early-rung" if summary.asha_rungs else "early-point"
    ax.set_title(lr_vs_loss_title(summary) + (f"\n{early} losses far above ℓ₀ run off the top" if clipped else ""),
                 fontsize=10)
    ax.grid(alpha=0.3, which="both")
    # Below the axes, not over them: the curves, the bands and the failed marks at the top fill the whole plot.
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, frameon=False)
    return fig


def _shade_edge_and_best(ax, summary: SweepSummary) -> None:
    """The regions as bands: solid where the region is known to hold, hatched where its boundary lies; each band's
    legend names the LRs and the hatched intervals it draws."""
    regions = summary.conclusion.landscape
    basin, degraded, failed = regions.basin, regions.degraded, regions.diverged
    if basin:
        _band(ax, "tab:green", f"basin: {basin_lrs(basin.lrs, '–')}, within {SIGNIFICANCE_SE:g} SE of the best",
              (basin.low[1], basin.high[0]), (basin.low, basin.high))
    if degraded:
        lrs = [p.lr for p in degraded.points]
        _band(ax, "tab:orange", f"degraded: {basin_lrs(lrs, '–')}, {per_doubling(degraded)}",
              (degraded.low[1], degraded.high[0]), (degraded.high,))
    if failed and failed[1] is not None:
        low, high = failed
        right = ax.get_xlim()[1] if ax.get_xlim()[1] > high else high * 1.5
        _band(ax, "red", f"failed: from lr {_lr(high)} up", (high, right), ((low, high),))
    best = summary.best_lr
    if best is not None:
        ax.axvline(best, color="tab:green", linestyle=":", linewidth=1.5, label=f"best lr {best:.3g}")


def _band(ax, color: str, label: str, solid: tuple[float, float], gaps: tuple[Gap, ...]) -> None:
    """A region's band: solid over ``solid`` (a sliver where it is one LR), hatched over each of ``gaps`` with both
    ends known (where a boundary lies); its legend is ``label`` and the hatched intervals, from the same numbers."""
    start, end = solid
    hatched = [gap for gap in gaps if gap[0] is not None and gap[1] is not None]
    ends = " and ".join(f"{_lr(low)}–{_lr(high)}" for low, high in hatched)
    where = f"; {'its ends lie' if len(hatched) > 1 else 'an end lies'} in the hatched {ends}" if hatched else ""
    ax.axvspan(start, end if end > start else start * 1.02, color=color, alpha=0.12, label=label + where)
    for low, high in hatched:
        ax.axvspan(low, high, color=color, alpha=0.05, hatch="//", linewidth=0)


def plot_instability(records: Sequence[TrialRecord], best_record: TrialRecord | None, path: Path,
                     unmeasured: str = "not logged") -> Path:
    """Every metric registered for the instability figure (metric_registry.instability_panels: gradient norm,
    attention-logit max, output-logit max, the largest relative update of a layer) over tokens for the broken
    runs, a panel each; a run whose metrics.csv lacks one (written before it was logged, or a model that does not
    expose it) is absent from it, and a panel no run has says ``unmeasured``."""
    statuses = trial_statuses(records)
    broken = [r for r in records if statuses[r.trial_id] in ("diverged", "unconfirmed", "spiked")]
    shown = ([best_record] if best_record is not None else []) + [r for r in broken if r is not best_record]
    norm, cmap = _lr_colors(records)
    panels = instability_panels()
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.5), squeeze=False)
    for ax, metric in zip(axes[0], panels, strict=True):
        for r in shown:
            x, y = _finite_xy(column(r, "tokens"), column(r, metric.column))
            keep = np.ones(y.shape, dtype=bool)
            if metric.log_scale:
                y = np.abs(y)
                keep = y > 0
            if not keep.any():
                continue
            is_best = best_record is not None and r is best_record
            ax.plot(x[keep], y[keep], color="black" if is_best else cmap(norm(r.lr)),
                    linewidth=2.2 if is_best else 1.3, zorder=3 if is_best else 2,
                    label=f"{'best ' if is_best else ''}lr={r.lr:.3g} ({statuses[r.trial_id]})")
        ax.set_title(metric.title)
        if not ax.lines:  # an empty panel: the words, no axes
            ax.text(0.5, 0.5, unmeasured, transform=ax.transAxes, ha="center", va="center", color="gray")
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        if metric.log_scale:
            ax.set_yscale("log")
        ax.xaxis.set_major_formatter(EngFormatter())
        ax.set_xlabel("tokens")
        ax.grid(alpha=0.3, which="both")
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        axes[0][0].legend(fontsize=7)
    fig.suptitle("stability probes: diverged and spiked runs beside the best run")
    return save_figure(fig, path)


def plot_sharpness(rows: Sequence[SharpnessRow], path: Path) -> Path:
    """Sharpness vs 2/lr and preconditioned sharpness vs (2+2b1)/((1-b1) lr), over steps.

    Rows carrying a ``trial_id`` (and ``lr``) are drawn as one series per trial, each with its own
    threshold line in the same color; rows without are one series.
    """
    groups: dict[str | None, list[SharpnessRow]] = {}
    for r in rows:
        groups.setdefault(r.trial_id, []).append(r)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = plt.get_cmap("tab10")

    def series(part: list[SharpnessRow], key: str) -> list[float]:
        values = [getattr(r.estimate, key) for r in part]
        return [abs(v) if v is not None else np.nan for v in values]

    for ax, value_key, line_key, label, line_label in (
        (axes[0], "sharpness", "gd_threshold", "sharpness (top Hessian eigenvalue)", "2/lr"),
        (axes[1], "preconditioned_sharpness", "adam_threshold", "preconditioned sharpness (Adam)",
         "(2+2β₁)/((1-β₁) lr), 38/lr at β₁=0.9"),
    ):
        for i, (trial_id, part) in enumerate(groups.items()):
            part = sorted(part, key=lambda r: r.estimate.step)
            steps = [r.estimate.step for r in part]
            color = colors(i % 10) if len(groups) > 1 else "tab:blue"
            line_color = color if len(groups) > 1 else "tab:red"
            name = "" if trial_id is None else f"lr={part[0].lr:.3g} " if part[0].lr else f"{trial_id} "
            ax.plot(steps, series(part, value_key), "o-", color=color,
                    label=f"{name}{'measured' if name else label}")
            ax.plot(steps, series(part, line_key), "--", color=line_color, alpha=0.8, label=f"{name}{line_label}")
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_title(label)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle("edge of stability: sharpness against the stability thresholds")
    return save_figure(fig, path)


def _broken(f: FigureInputs) -> bool:
    return any(row.status in ("diverged", "unconfirmed", "spiked") for row in f.summary.trials)


def _draw_instability(f: FigureInputs, path: Path) -> Path:
    best = next((t for t in f.trials if t.trial_id == f.summary.best_trial), None)
    model = f.facts.model
    unreachable = model is not None and model.attention_logits_measured is False
    return plot_instability(f.trials, best, path, "not measured for this model" if unreachable else "not logged")


# The report's figures, in the order the report lists them (after its search section's own): each one's file name
# is defined here alone (the markdown names a figure through these). A new figure is a plot function above and an
# entry here.
COMPARISON = ReportFigure("lr_sweep_comparison.png", lambda f: "tokens" in f.x_axes,
                          lambda f, path: plot_sweep_comparison(f.trials, path, target=f.target))
COMPARISON_WALL = ReportFigure("lr_sweep_comparison_wall.png", lambda f: "wall" in f.x_axes,
                               lambda f, path: plot_sweep_comparison(f.trials, path, target=f.target, x="wall"))
LR_VS_LOSS = ReportFigure("lr_vs_loss.png", lambda f: True, lambda f, path: plot_lr_vs_loss(path, f.summary))
RANGE_TEST = ReportFigure("lr_range_test.png", lambda f: f.range_test is not None,
                          lambda f, path: plot_range_test(f.range_test, path))
INSTABILITY = ReportFigure("instability.png", _broken, _draw_instability)
SHARPNESS = ReportFigure("sharpness.png", lambda f: bool(f.sharpness),
                         lambda f, path: plot_sharpness(f.sharpness, path))
FIGURES = (COMPARISON, COMPARISON_WALL, LR_VS_LOSS, RANGE_TEST, INSTABILITY, SHARPNESS)
