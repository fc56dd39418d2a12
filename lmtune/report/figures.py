"""Where the report's figures are drawn: lr_sweep_comparison.png, lr_vs_final_loss.png,
instability.png and sharpness.png, from trial records. (A run's own two figures are drawn by
lmtune.training.figures.)
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import EngFormatter  # noqa: E402

from lmtune.report.stability import TrialRecord, classify, column, initial_loss  # noqa: E402
from lmtune.training.figures import save_figure  # noqa: E402

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
    # the first log interval): only runs that did not diverge set the top, unless all diverged.
    healthy = {id(r) for r in records if classify(r) != "diverged"} or {id(r) for r in records}
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


def plot_sweep_comparison(records: Sequence[TrialRecord], path: Path, target: float | None = None) -> Path:
    """Val loss (bold) and train loss (thin) against tokens for every trial, colored by LR."""
    fig, ax = plt.subplots(figsize=(9, 5.5))
    norm, cmap = _lr_colors(records)
    low, high = _loss_limits(records)
    for r in sorted(records, key=lambda rec: rec.lr):
        status = classify(r)
        color = cmap(norm(r.lr))
        style = "--" if status == "stopped_early" or r.outcome == "stopped_early" else "-"
        tokens = column(r, "tokens")
        tx, ty = _finite_xy(tokens, column(r, "train_loss"))
        vx, vy = _finite_xy(tokens, column(r, "val_loss"))
        if tx.size:
            # No clipping of values: the axis limits cut exploding curves off at the top edge.
            ax.plot(tx, ty, style, color=color, alpha=0.35, linewidth=0.8)
        if vx.size:
            ax.plot(vx, vy, style, color=color, linewidth=2.0, marker="o", markersize=3,
                    label=f"lr={r.lr:.3g} ({status})")
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
    ax.xaxis.set_major_formatter(EngFormatter())
    ax.set_xlabel("tokens")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title("LR sweep: val loss (bold), train loss (thin); x = diverged, dashed | = stopped early")
    ax.grid(alpha=0.3)
    sm = plt.cm.ScalarMappable(norm=norm, cmap=cmap)
    fig.colorbar(sm, ax=ax, label="peak learning rate")
    ax.legend(fontsize=7, loc="best", ncol=2)
    return save_figure(fig, path)


def plot_lr_vs_loss(records: Sequence[TrialRecord], path: Path, summary: dict[str, Any]) -> Path:
    """Best and final val loss against LR; diverged trials pinned to the top edge as red x."""
    rows = summary["trials"]
    fig, ax = plt.subplots(figsize=(8, 5))
    healthy = [r for r in rows if r["status"] != "diverged"]
    values = [v for r in healthy for v in (r["best_val_loss"], r["final_val_loss"]) if v is not None]
    start = summary.get("initial_loss")
    top = max(values + ([start] if start is not None else [])) if values else (start or 1.0)
    bottom = min(values) if values else top - 1.0
    top_edge = top + 0.08 * max(top - bottom, 1e-3)
    best_pts = sorted((r["lr"], r["best_val_loss"]) for r in healthy if r["best_val_loss"] is not None)
    final_pts = sorted((r["lr"], r["final_val_loss"]) for r in healthy if r["final_val_loss"] is not None)
    if best_pts:
        ax.plot(*zip(*best_pts, strict=True), "o-", color="tab:blue", label="best val loss")
    if final_pts:
        ax.plot(*zip(*final_pts, strict=True), "s--", color="tab:orange", alpha=0.8, label="final val loss")
    for r in rows:
        if r["status"] == "unstable" and r["best_val_loss"] is not None:
            ax.plot([r["lr"]], [r["best_val_loss"]], "o", markersize=12, markerfacecolor="none",
                    markeredgecolor="tab:purple", markeredgewidth=1.5)
    diverged = [r["lr"] for r in rows if r["status"] == "diverged"]
    if diverged:
        ax.plot(diverged, [top_edge] * len(diverged), "x", color="red", markersize=11, markeredgewidth=2.5,
                label="diverged", clip_on=False)
    if any(r["status"] == "unstable" for r in rows):
        ax.plot([], [], "o", markerfacecolor="none", markeredgecolor="tab:purple", label="unstable")
    if summary.get("best_lr") is not None:
        ax.axvline(summary["best_lr"], color="tab:green", linestyle=":")
        ax.annotate(f"best lr {summary['best_lr']:.3g}", (summary["best_lr"], bottom), rotation=90,
                    xytext=(4, 4), textcoords="offset points", color="tab:green", fontsize=8, va="bottom")
    if summary.get("divergence_lr") is not None:
        ax.axvline(summary["divergence_lr"], color="red", linestyle=":")
        ratio = summary.get("edge_ratio")
        text = f"diverges at {summary['divergence_lr']:.3g}" + (f" ({ratio:.1f}x best)" if ratio else "")
        ax.annotate(text, (summary["divergence_lr"], bottom), rotation=90, xytext=(4, 4),
                    textcoords="offset points", color="red", fontsize=8, va="bottom")
    ax.set_xscale("log")
    ax.set_ylim(bottom - 0.05 * max(top - bottom, 1e-3), top_edge + 0.05 * max(top - bottom, 1e-3))
    ax.set_xlabel("peak learning rate")
    ax.set_ylabel("val loss (nats/token)")
    ax.set_title("val loss against learning rate")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def plot_instability(records: Sequence[TrialRecord], best_record: TrialRecord | None, path: Path) -> Path:
    """Gradient norm, attention-logit max and output-logit max over tokens (log y) for the broken runs."""
    broken = [r for r in records if classify(r) in ("diverged", "unstable")]
    shown = ([best_record] if best_record is not None else []) + [r for r in broken if r is not best_record]
    norm, cmap = _lr_colors(records)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    panels = (("grad_norm", "gradient norm"), ("attn_logit_max", "attention-logit max"),
              ("output_logit_max", "output-logit max"))
    for ax, (name, label) in zip(axes, panels, strict=True):
        for r in shown:
            x, y = _finite_xy(column(r, "tokens"), column(r, name))
            y = np.abs(y)
            keep = y > 0
            if not keep.any():
                continue
            is_best = best_record is not None and r is best_record
            ax.plot(x[keep], y[keep], color="black" if is_best else cmap(norm(r.lr)),
                    linewidth=2.2 if is_best else 1.3, zorder=3 if is_best else 2,
                    label=f"{'best ' if is_best else ''}lr={r.lr:.3g} ({classify(r)})")
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(EngFormatter())
        ax.set_xlabel("tokens")
        ax.set_title(label)
        ax.grid(alpha=0.3, which="both")
        if not ax.lines:
            ax.text(0.5, 0.5, "not logged", transform=ax.transAxes, ha="center", va="center", color="gray")
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        axes[0].legend(fontsize=7)
    fig.suptitle("stability probes: diverged and unstable runs beside the best run")
    return save_figure(fig, path)


def plot_sharpness(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    """Sharpness vs 2/lr and preconditioned sharpness vs (2+2b1)/((1-b1) lr), over steps.

    Rows carrying ``trial_id`` (and ``lr``) are drawn as one series per trial, each with its own
    threshold line in the same color; rows without are one series.
    """
    groups: dict[Any, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(r.get("trial_id"), []).append(r)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = plt.get_cmap("tab10")

    def series(part, key):
        return [abs(r[key]) if r.get(key) is not None else np.nan for r in part]

    for ax, value_key, line_key, label, line_label in (
        (axes[0], "sharpness", "gd_threshold", "sharpness (top Hessian eigenvalue)", "2/lr"),
        (axes[1], "preconditioned_sharpness", "adam_threshold", "preconditioned sharpness (Adam)",
         "(2+2β₁)/((1-β₁) lr), 38/lr at β₁=0.9"),
    ):
        for i, (trial_id, part) in enumerate(groups.items()):
            part = sorted(part, key=lambda r: r["step"])
            steps = [r["step"] for r in part]
            color = colors(i % 10) if len(groups) > 1 else "tab:blue"
            line_color = color if len(groups) > 1 else "tab:red"
            name = "" if trial_id is None else f"lr={part[0]['lr']:.3g} " if part[0].get("lr") else f"{trial_id} "
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
