"""The report's text and tables: lr_sweep_analysis.md, summary.json and summary.csv."""

from __future__ import annotations

import csv
import io
import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lmtune.files import atomic_write_text
from lmtune.report.stability import (
    AT_EDGE_BAND,
    CONSERVATIVE_ABOVE,
    DEFAULT_SMOOTH,
    NEAR_EDGE_BELOW,
    UNSTABLE_THRESHOLD,
    TrialRecord,
    first_growth,
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
    sections = [
        _overview(summary), _trials(summary), _best_lr(summary), _edge(summary), _convergence(summary),
        _sensitivity(summary), _target(summary), _how_runs_broke(summary, records),
        _search_and_compute(summary, search_description, compute), _definitions(),
    ]
    text = "\n".join(line for section in sections for line in section)
    atomic_write_text(Path(path), text)
    log.info("wrote %s", path)
    return Path(path)


def _overview(summary: dict[str, Any]) -> list[str]:
    rows = summary["trials"]
    counts = ", ".join(f"{n} {s}" for s, n in summary.get("status_counts", {}).items())
    figures = ["lr_sweep_comparison.png", "lr_vs_final_loss.png"]
    if any(r["status"] in ("diverged", "unstable") for r in rows):
        figures.append("instability.png")
    if summary.get("sharpness"):
        figures.append("sharpness.png")
    return ["# Learning-rate sweep: analysis", "",
            f"{len(rows)} trials ({counts}). Figures: {', '.join(f'`{f}`' for f in figures)}.", ""]


def _trials(summary: dict[str, Any]) -> list[str]:
    extra = _varied_params(summary)
    header = ["trial", "lr", *extra, "status", "final val", "best val", "tokens", "wall time", "tokens/s",
              "stop reason", "stop step"]
    table_rows = []
    for r in summary["trials"]:
        wall = f"{r['wall_time_s']:.0f} s" if r["wall_time_s"] is not None else "—"
        table_rows.append([r["trial_id"], f"{r['lr']:.3g}", *[_fmt(r["params"].get(k)) for k in extra],
                           r["status"], _fmt(r["final_val_loss"]), _fmt(r["best_val_loss"]), _tokens(r["tokens"]),
                           wall, _rate(r["tokens_per_s"]), r["reason"] or "—", _fmt(r["stop_step"])])
    return ["## Trials", "", *_table(header, table_rows), ""]


def _best_lr(summary: dict[str, Any]) -> list[str]:
    if summary["best_lr"] is None:
        return ["## Best learning rate", "",
                "No trial that neither diverged nor errored was evaluated, so there is no best LR.", ""]
    lines = ["## Best learning rate", "",
             f"Best LR **{summary['best_lr']:.3g}** (trial `{summary['best_trial']}`): best val loss "
             f"**{summary['best_val_loss']:.4f}**. Among trials that neither diverged nor errored, the best val "
             "loss decides; an unstable run can still be the best."]
    fewest, most = summary.get("candidate_tokens") or (None, None)
    if fewest != most:
        lines += ["", f"**Not at equal token counts**: the candidates trained {_tokens(fewest)} to {_tokens(most)} "
                  "tokens (early stopping cut some), and a loss after fewer tokens is higher for reasons other than "
                  "the learning rate."]
    return lines + [""]


def _edge(summary: dict[str, Any]) -> list[str]:
    lines = ["## Edge of stability", ""]
    if summary["divergence_lr"] is None:
        lines += ["No trial diverged: the edge of stability lies above the largest LR tried. Extend the range "
                  "upward to locate it.", ""]
    else:
        lines += [f"Smallest diverging LR: **{summary['divergence_lr']:.3g}**."]
        if summary["edge_ratio"] is not None:
            lines += [f"Ratio divergence LR / best LR = **{summary['edge_ratio']:.2f}**: {summary['edge_reading']}."]
        lines += [""]
    return lines + [
        f"Reading of the ratio (a practitioners' rule of thumb, not a law): > {CONSERVATIVE_ABOVE:g} the best LR "
        f"is conservative; {NEAR_EDGE_BELOW:g}–{CONSERVATIVE_ABOVE:g} moderately below the edge; < "
        f"{NEAR_EDGE_BELOW:g} near the edge; within [{AT_EDGE_BAND[0]:g}, {AT_EDGE_BAND[1]:g}] at the edge. For "
        "Adam, Cohen et al. (2022) find the preconditioned sharpness hovering near (2 + 2β₁)/((1 − β₁)η) = 38/η "
        "for β₁ = 0.9; for full-batch GD, Cohen et al. (2021) find the sharpness at about 2/η.", ""]


def _convergence(summary: dict[str, Any]) -> list[str]:
    conv = summary.get("convergence") or {}
    if conv.get("level") is None:
        return ["## Convergence speed", "",
                "No trial completed without diverging, so there is no common loss level to compare.", ""]
    lines = ["## Convergence speed", "",
             f"Tokens each trial needed to reach val loss {conv['level']:.4f} (the worst final val loss among "
             "completed trials, so every completed trial reaches it; linear interpolation between evaluations):", ""]
    lines += _table(["trial", "lr", "status", "tokens to reach"],
                    [[c["trial_id"], f"{c['lr']:.3g}", c["status"],
                      _tokens(c["tokens"]) if c["tokens"] is not None else "never"] for c in conv["rows"]])
    reached = [c for c in conv["rows"] if c["tokens"] is not None]
    if reached:
        fastest = min(reached, key=lambda c: c["tokens"])
        lines += ["", f"Fastest: lr {fastest['lr']:.3g} ({_tokens(fastest['tokens'])} tokens)."]
    return lines + [""]


def _sensitivity(summary: dict[str, Any]) -> list[str]:
    if summary["lr_sensitivity"] is None:
        return ["## LR sensitivity", "", "Not computable: no trial has a final val loss.", ""]
    return ["## LR sensitivity", "",
            f"LR sensitivity (Wortsman et al. 2023) = **{summary['lr_sensitivity']:.4f}** nats, with "
            f"ℓ₀ = {_fmt(summary.get('initial_loss'))} (loss at initialization). Lower means the loss degrades "
            "less away from the best LR.", ""]


def _target(summary: dict[str, Any]) -> list[str]:
    if summary.get("target") is None:
        return ["## Target", "", "No target loss was given.", ""]
    if summary["target_met"]:
        at = f" after {_tokens(summary['target_tokens'])} tokens" if summary.get("target_tokens") else ""
        return ["## Target", "", f"Target val loss {summary['target']:g}: **met** by trial `{summary['target_trial']}` "
                f"(best val loss {summary['best_val_loss']:.4f}{at}).", ""]
    return ["## Target", "", f"Target val loss {summary['target']:g}: **not met** (best val loss "
            f"{_fmt(summary['best_val_loss'])}).", ""]


def _how_runs_broke(summary: dict[str, Any], records: Sequence[TrialRecord]) -> list[str]:
    by_id = {r.trial_id: r for r in records}
    best_record = by_id.get(summary.get("best_trial"))
    broken = [by_id[r["trial_id"]] for r in summary["trials"]
              if r["status"] in ("diverged", "unstable") and r["trial_id"] in by_id]
    if not broken:
        return ["## How the unstable runs broke", "", "No run diverged or went unstable.", ""]
    return ["## How the unstable runs broke", "",
            "Which stability probe first exceeded 2× the best trial's value at the same step (attention-logit "
            "growth is what qk-layernorm fixes, output-logit divergence what z-loss fixes; Wortsman et al. 2023):",
            "", *[f"- {first_growth(r, best_record)}" for r in broken], ""]


def _search_and_compute(summary: dict[str, Any], search_description: str, compute: dict[str, Any]) -> list[str]:
    rows = summary["trials"]
    spent = compute.get("tokens_spent")
    if spent is None:
        spent = sum(r["tokens"] or 0 for r in rows)
    full = compute.get("full_grid_tokens")
    if full is None:
        completed = [r["tokens"] for r in rows if r["status"] in ("completed", "unstable") and r["tokens"]]
        full = len(rows) * max(completed) if completed else None
    lines = ["## Search strategy and compute", "", search_description.strip() or "(no description given)", "",
             f"- tokens trained: {_tokens(spent)}"]
    if full:
        lines += [f"- a full grid without early stopping: {_tokens(full)} tokens",
                  f"- saving: {100.0 * (1.0 - spent / full):.1f}%"]
    lines += [f"- {key.replace('_', ' ')}: {_fmt(value)}" for key, value in compute.items()
              if key not in ("tokens_spent", "full_grid_tokens")]
    return lines + [""]


def _definitions() -> list[str]:
    return ["## Definitions", "",
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
            ""]


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
