"""Figures and files of the edge-of-stability report, from in-memory trial records.

lr_sweep_comparison.png, lr_vs_final_loss.png, instability.png, sharpness.png, lr_sweep_analysis.md,
summary.json and summary.csv. Every file is written atomically (a reader never sees half a file).
"""

from __future__ import annotations

import csv
import io
import json
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

from lmtune.checkpoint import atomic_write_text  # noqa: E402
from lmtune.plots import save_figure  # noqa: E402
from lmtune.stability import (  # noqa: E402
    AT_EDGE_BAND,
    CONSERVATIVE_ABOVE,
    DEFAULT_SMOOTH,
    NEAR_EDGE_BELOW,
    UNSTABLE_THRESHOLD,
    TrialRecord,
    classify,
    column,
    first_growth,
    initial_loss,
)

log = logging.getLogger(__name__)

HEADINGS = (
    "## Trials",
    "## Best learning rate",
    "## Edge of stability",
    "## Convergence speed",
    "## LR sensitivity",
    "## Target",
    "## How the unstable runs broke",
    "## Search strategy and compute",
    "## Definitions",
)


# ---------------------------------------------------------------------------------------------
# Figures


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


# ---------------------------------------------------------------------------------------------
# Markdown and tables


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "—"
        return f"{value:.{digits}g}"
    return str(value)


def _tokens(value: Any) -> str:
    if value is None:
        return "—"
    value = float(value)
    if value >= 1e6:
        return f"{value / 1e6:.2f}M"
    if value >= 1e3:
        return f"{value / 1e3:.1f}k"
    return f"{value:.0f}"


def _rate(value: Any) -> str:
    return "—" if value is None else f"{value:,.0f}"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def _varied_params(summary: dict[str, Any]) -> list[str]:
    names: list[str] = []
    for row in summary["trials"]:
        for key in row["params"]:
            if key != "lr" and key not in names:
                names.append(key)
    return names


def write_markdown(summary: dict[str, Any], records: Sequence[TrialRecord], path: Path,
                   search_description: str, compute: dict[str, Any]) -> Path:
    """lr_sweep_analysis.md: the report's text, one section per heading in HEADINGS."""
    rows = summary["trials"]
    extra = _varied_params(summary)
    lines = ["# Learning-rate sweep: analysis", ""]
    counts = ", ".join(f"{n} {s}" for s, n in summary.get("status_counts", {}).items())
    figures = ["lr_sweep_comparison.png", "lr_vs_final_loss.png"]
    if any(r["status"] in ("diverged", "unstable") for r in rows):
        figures.append("instability.png")
    if summary.get("sharpness"):
        figures.append("sharpness.png")
    lines += [f"{len(rows)} trials ({counts}). Figures: {', '.join(f'`{f}`' for f in figures)}.", ""]

    lines += ["## Trials", ""]
    header = ["trial", "lr", *extra, "status", "final val", "best val", "tokens", "wall time", "tokens/s",
              "stop reason", "stop step"]
    table_rows = []
    for r in rows:
        wall = f"{r['wall_time_s']:.0f} s" if r["wall_time_s"] is not None else "—"
        table_rows.append([r["trial_id"], f"{r['lr']:.3g}", *[_fmt(r["params"].get(k)) for k in extra],
                           r["status"], _fmt(r["final_val_loss"]), _fmt(r["best_val_loss"]), _tokens(r["tokens"]),
                           wall, _rate(r["tokens_per_s"]), r["reason"] or "—", _fmt(r["stop_step"])])
    lines += _table(header, table_rows) + [""]

    lines += ["## Best learning rate", ""]
    if summary["best_lr"] is None:
        lines += ["No trial that did not diverge was evaluated, so there is no best LR.", ""]
    else:
        lines += [f"Best LR **{summary['best_lr']:.3g}** (trial `{summary['best_trial']}`): best val loss "
                  f"**{summary['best_val_loss']:.4f}**. Among trials that did not diverge, the best val loss "
                  "decides; an unstable run can still be the best.", ""]

    lines += ["## Edge of stability", ""]
    if summary["divergence_lr"] is None:
        lines += ["No trial diverged: the edge of stability lies above the largest LR tried. Extend the range "
                  "upward to locate it.", ""]
    else:
        ratio = summary["edge_ratio"]
        lines += [f"Smallest diverging LR: **{summary['divergence_lr']:.3g}**."]
        if ratio is not None:
            lines += [f"Ratio divergence LR / best LR = **{ratio:.2f}**: {summary['edge_reading']}."]
        lines += [""]
    lines += [f"Reading of the ratio (folk wisdom, ../shared/REFERENCE.md): > {CONSERVATIVE_ABOVE:g} the best "
              f"LR is conservative; {NEAR_EDGE_BELOW:g}–{CONSERVATIVE_ABOVE:g} moderately below the edge; "
              f"< {NEAR_EDGE_BELOW:g} near the edge; within [{AT_EDGE_BAND[0]:g}, {AT_EDGE_BAND[1]:g}] at the "
              "edge. For Adam, Cohen et al. (2022) find the preconditioned sharpness hovering near "
              "(2 + 2β₁)/((1 − β₁)η) = 38/η for β₁ = 0.9; for full-batch GD, Cohen et al. (2021) find the "
              "sharpness at about 2/η.", ""]

    lines += ["## Convergence speed", ""]
    conv = summary.get("convergence") or {}
    if conv.get("level") is None:
        lines += ["No trial completed without diverging, so there is no common loss level to compare.", ""]
    else:
        lines += [f"Tokens each trial needed to reach val loss {conv['level']:.4f} (the worst final val loss "
                  "among completed trials, so every completed trial reaches it; linear interpolation between "
                  "evaluations):", ""]
        lines += _table(["trial", "lr", "status", "tokens to reach"],
                        [[c["trial_id"], f"{c['lr']:.3g}", c["status"],
                          _tokens(c["tokens"]) if c["tokens"] is not None else "never"] for c in conv["rows"]])
        reached = [c for c in conv["rows"] if c["tokens"] is not None]
        if reached:
            fastest = min(reached, key=lambda c: c["tokens"])
            lines += ["", f"Fastest: lr {fastest['lr']:.3g} ({_tokens(fastest['tokens'])} tokens)."]
        lines += [""]

    lines += ["## LR sensitivity", ""]
    if summary["lr_sensitivity"] is None:
        lines += ["Not computable: no trial has a final val loss.", ""]
    else:
        lines += [f"LR sensitivity (Wortsman et al. 2023) = **{summary['lr_sensitivity']:.4f}** nats, with "
                  f"ℓ₀ = {_fmt(summary.get('initial_loss'))} (loss at initialization). Lower means the loss "
                  "degrades less away from the best LR.", ""]

    lines += ["## Target", ""]
    if summary.get("target") is None:
        lines += ["No target loss was given.", ""]
    elif summary["target_met"]:
        at = f" after {_tokens(summary['target_tokens'])} tokens" if summary.get("target_tokens") else ""
        lines += [f"Target val loss {summary['target']:g}: **met** by trial `{summary['target_trial']}` "
                  f"(best val loss {summary['best_val_loss']:.4f}{at}).", ""]
    else:
        best = _fmt(summary["best_val_loss"])
        lines += [f"Target val loss {summary['target']:g}: **not met** (best val loss {best}).", ""]

    lines += ["## How the unstable runs broke", ""]
    by_id = {r.trial_id: r for r in records}
    best_record = by_id.get(summary.get("best_trial"))
    broken = [by_id[r["trial_id"]] for r in rows if r["status"] in ("diverged", "unstable") and r["trial_id"] in by_id]
    if not broken:
        lines += ["No run diverged or went unstable.", ""]
    else:
        lines += ["Which stability probe first exceeded 2× the best trial's value at the same step "
                  "(attention-logit growth is what qk-layernorm fixes, output-logit divergence what z-loss "
                  "fixes; Wortsman et al. 2023):", ""]
        lines += [f"- {first_growth(r, best_record)}" for r in broken] + [""]

    lines += ["## Search strategy and compute", ""]
    lines += [search_description.strip() or "(no description given)", ""]
    spent = compute.get("tokens_spent")
    if spent is None:
        spent = sum(r["tokens"] or 0 for r in rows)
    full = compute.get("full_grid_tokens")
    if full is None:
        completed = [r["tokens"] for r in rows if r["status"] in ("completed", "unstable") and r["tokens"]]
        full = len(rows) * max(completed) if completed else None
    lines += [f"- tokens trained: {_tokens(spent)}"]
    if full:
        lines += [f"- a full grid without early stopping: {_tokens(full)} tokens",
                  f"- saving: {100.0 * (1.0 - spent / full):.1f}%"]
    for key, value in compute.items():
        if key not in ("tokens_spent", "full_grid_tokens"):
            lines += [f"- {key.replace('_', ' ')}: {_fmt(value)}"]
    lines += [""]

    lines += ["## Definitions", ""]
    lines += [
        f"- **Instability score**: the train loss is smoothed with a trailing moving average over "
        f"{DEFAULT_SMOOTH} log intervals; after warm-up (from the first row at the peak LR) the score is the "
        "largest rise of the smoothed loss above its running minimum, relative to that minimum: "
        "max_t (s_t − min_{u≤t} s_u) / min_{u≤t} s_u. A run that trained to the end (or until ASHA stopped it) "
        f"is **unstable** when the score exceeds {UNSTABLE_THRESHOLD:g} (a {100 * UNSTABLE_THRESHOLD:.0f}% "
        "rise).",
        "- **Diverged**: the sweep stopped the run as diverged, or a train loss was NaN/inf.",
        "- **LR sensitivity** (Wortsman et al. 2023): S = (1/|H|) Σ_{η∈H} [min(ℓ(η), ℓ₀) − ℓ*], where H is the "
        "set of LRs tried, ℓ(η) the final val loss at η (ℓ₀ if the run diverged; the lowest when several "
        "trials share η), ℓ* = min_η ℓ(η) and ℓ₀ the loss at initialization.",
        "- **Edge ratio**: smallest diverging LR / best LR.",
        "",
    ]
    text = "\n".join(lines)
    atomic_write_text(Path(path), text)
    log.info("wrote %s", path)
    return Path(path)


CSV_COLUMNS = ["trial_id", "lr", "status", "final_val_loss", "best_val_loss", "tokens", "wall_time_s",
               "tokens_per_s", "instability_score", "stop_step", "reason"]


def write_tables(summary: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    """summary.json (the whole summary) and summary.csv (one row per trial, params flattened)."""
    out_dir = Path(out_dir)
    json_path, csv_path = out_dir / "summary.json", out_dir / "summary.csv"
    atomic_write_text(json_path, json.dumps(summary, indent=2, allow_nan=False) + "\n")
    extra = _varied_params(summary)
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(CSV_COLUMNS[:2] + extra + CSV_COLUMNS[2:])
    for row in summary["trials"]:
        values = [row[c] for c in CSV_COLUMNS]
        values = values[:2] + [row["params"].get(k) for k in extra] + values[2:]
        writer.writerow(["" if v is None else v for v in values])
    atomic_write_text(csv_path, buffer.getvalue())
    return json_path, csv_path
