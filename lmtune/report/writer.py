"""The edge-of-stability report of one sweep: reads it, computes the numbers, writes results/NAME/report/.

lr_sweep_comparison.png, lr_vs_loss.png (at equal token counts), lr_range_test.png (an edge search),
instability.png (when a run diverged or spiked), lr_sweep_analysis.md, summary.json,
summary.csv, and with ``sharpness`` sharpness.png and sharpness.csv. Nothing else in the sweep folder
is written. The command is ``python -m lmtune.analyze``.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lmtune.errors import LmtuneError
from lmtune.files import atomic_write_text, check_destination
from lmtune.report.figures import plot_horizon, plot_instability, plot_lr_vs_loss, plot_sharpness, plot_sweep_comparison
from lmtune.report.horizon import horizon_settings, horizon_summary, records_at
from lmtune.report.markdown import write_markdown, write_tables
from lmtune.report.reader import load_range_test, load_sweep, missing_trials
from lmtune.report.sharpness import SHARPNESS_COLUMNS, sweep_sharpness, write_sharpness_csv
from lmtune.report.stability import TrialRecord, budget_tokens, json_safe, tokens_spent
from lmtune.report.summary import sweep_summary, trial_table
from lmtune.sweep.plan import AshaBudget, asha_budget
from lmtune.sweep.record import SweepRecord, is_sweep_dir, read_edge_state
from lmtune.sweep.runs import Budget
from lmtune.sweep.spaces import SchedulerSpec
from lmtune.sweep.strategies.horizon.settings import HorizonSettings
from lmtune.training.divergence import DivergenceRule
from lmtune.training.figures import plot_range_test
from lmtune.training.lr_range import RangeTestResult

log = logging.getLogger(__name__)

REPORT_DIR = "report"


@dataclass
class SweepReport:
    """A sweep read from its folder and summarized: what ``analyze`` writes and ``run`` prints."""

    record: SweepRecord
    trials: list[TrialRecord]
    summary: dict[str, Any]
    """summary.json's content."""
    range_test: RangeTestResult | None


def summarize_sweep(sweep_dir: Path, target: float | None = None) -> SweepReport:
    """Read a sweep folder (finished or running) and compute its summary, writing nothing."""
    sweep_dir = Path(sweep_dir)
    if target is not None and not (isinstance(target, (int, float)) and math.isfinite(target) and target > 0):
        raise LmtuneError(f"--target must be a positive loss in nats/token (got {target!r})")
    record, trials = load_sweep(sweep_dir)
    if not trials:
        raise LmtuneError(f"{sweep_dir} has no trials yet (no trial folders); wait until the sweep has started "
                          "trials, then run the report again")
    range_test = load_range_test(sweep_dir)
    range_tokens = range_test.tokens if range_test is not None else None
    horizon = horizon_settings(record.space)
    if horizon is not None:
        summary = horizon_sweep_summary(record, trials, horizon, target)
    else:
        summary = sweep_summary(trials, sweep_budget(record, trials), target=target, vocab_size=vocab_size(record),
                                edge_state=read_edge_state(sweep_dir), range_tokens=range_tokens)
    best = next((t for t in trials if t.trial_id == summary["best_trial"]), None)
    summary.update({"sweep": record.name or sweep_dir.name, "sweep_dir": str(sweep_dir.resolve()),
                    "missing_trials": missing_trials(sweep_dir, trials),
                    "best_trial_dir": str(best.checkpoint_dir.parent) if best and best.checkpoint_dir else None,
                    "best_config": best.params if best else None,
                    "search_strategy": search_description(record, trials),
                    "compute": compute_accounting(record, trials, range_tokens), "data": data_description(record),
                    "range_test": range_summary(range_test), "generated": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    return SweepReport(record, trials, summary, range_test)


def analyze(sweep_dir: Path, out_dir: Path | None = None, target: float | None = None,
            sharpness: bool = False) -> dict[str, Any]:
    """Write the report of one sweep; returns the summary (summary.json's content) with ``report_dir``."""
    sweep_dir = Path(sweep_dir)
    out = Path(out_dir) if out_dir is not None else sweep_dir / REPORT_DIR
    check_report_dir(out, sweep_dir)  # first: the next check's probe file would touch another sweep's report
    if out_dir is None:  # (a read-only sweep: its report can go elsewhere)
        check_destination(out, "the sweep's report folder", fix="give --out FOLDER to write the report elsewhere")
    else:
        check_destination(out, "--out")
    report = summarize_sweep(sweep_dir, target)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / REPORT_MARKER, json.dumps({"sweep": str(sweep_dir.resolve())}) + "\n")
    summary, trials = report.summary, report.trials
    sharp_rows = sweep_sharpness(report.record, trials, summary["best_trial"]) if sharpness else None
    if sharp_rows is not None:
        summary["sharpness"] = [{k: row.get(k) for k in SHARPNESS_COLUMNS} for row in sharp_rows]
    write_figures(out, trials, summary, report.range_test, sharp_rows, target)
    write_markdown(summary, trials, out / "lr_sweep_analysis.md", summary["search_strategy"], summary["compute"])
    write_tables(json_safe(summary), out)
    summary["report_dir"] = str(out)
    return summary


# Written into every report folder: a later analyze replaces only a folder that holds this sweep's report.
REPORT_MARKER = ".lmtune-report"


def check_report_dir(out: Path, sweep_dir: Path) -> None:
    """Refuse a report folder whose files analyze would overwrite: anything but a missing or empty folder,
    the sweep's own report/ folder (while it is the sweep's own: check_own_report_dir), or one holding an earlier
    report of this same sweep."""
    own = sweep_dir / REPORT_DIR
    if out == own or out.resolve() == own.resolve():
        check_own_report_dir(own, sweep_dir)
        return
    if not out.is_dir() or not any(out.iterdir()):
        return
    owner = _report_owner(out)
    if owner != str(sweep_dir.resolve()):
        whose = f"the report of another sweep ({owner})" if owner else "files analyze did not write"
        raise LmtuneError(f"--out {out} already holds {whose}, which the report would overwrite; "
                          "give an empty or new folder")


def check_own_report_dir(own: Path, sweep_dir: Path) -> None:
    """The sweep's report/ is written only while it is the sweep's own: a link leading out of it (to another
    sweep's report, to anyone's files) is refused, and so is a folder holding the report of another sweep that
    exists (a copy of it: its marker names the original)."""
    home = sweep_dir.resolve()
    if own.exists() and own.resolve() != home / REPORT_DIR:
        raise LmtuneError(f"{own} is a link to {own.resolve()}, not a folder of the sweep's own, whose files the "
                          "report would overwrite; remove the link, or give --out FOLDER")
    owner = _report_owner(own)
    if owner and owner != str(home) and is_sweep_dir(Path(owner)):
        raise LmtuneError(f"{own} holds the report of another sweep ({owner}), which the report would overwrite; "
                          f"delete {own} if it is a copy, or give --out FOLDER")


def _report_owner(folder: Path) -> str | None:
    """The sweep whose report a folder holds, by its marker (None: no marker, or not one analyze wrote)."""
    try:
        owner = json.loads((folder / REPORT_MARKER).read_text()).get("sweep")
    except (OSError, ValueError, AttributeError):
        return None
    return owner if isinstance(owner, str) else None


def write_figures(out: Path, trials: list[TrialRecord], summary: dict[str, Any], range_test,
                  sharp_rows: list[dict[str, Any]] | None, target: float | None) -> None:
    plot_sweep_comparison(trials, out / "lr_sweep_comparison.png", target=target)
    plot_lr_vs_loss(out / "lr_vs_loss.png", summary)
    if "predicted_lr" in summary:
        plot_horizon(out / "horizon.png", summary)
    if range_test is not None:
        plot_range_test(range_test, out / "lr_range_test.png")
    if any(row["status"] in ("diverged", "spiked") for row in summary["trials"]):
        best = next((t for t in trials if t.trial_id == summary["best_trial"]), None)
        plot_instability(trials, best, out / "instability.png")
    if sharp_rows is not None:
        write_sharpness_csv(sharp_rows, out / "sharpness.csv")
        if sharp_rows:
            plot_sharpness(sharp_rows, out / "sharpness.png")
        else:
            log.warning("no checkpoint gave a sharpness estimate; sharpness.png not written")


def horizon_sweep_summary(record: SweepRecord, trials: list[TrialRecord], settings: HorizonSettings,
                          target: float | None) -> dict[str, Any]:
    """A horizon search's summary: the usual one of the target budget's runs (the largest budget with runs,
    while none has trained at the target yet), every trial's row, and the horizon keys (lmtune.report.horizon)."""
    base = Budget.of_config(record.base_config, None)
    budget_steps = [base.steps, *reversed(settings.budget_steps(base.steps))]
    steps = next((s for s in budget_steps if records_at(trials, s, base)), base.steps)
    summary = sweep_summary(records_at(trials, steps, base) or trials, base.at_steps(steps), target=target,
                            vocab_size=vocab_size(record))
    rows, counts = trial_table(trials)
    return json_safe({**summary, "trials": rows, "status_counts": counts,
                      **horizon_summary(trials, settings, base)})


def sweep_budget(record: SweepRecord, trials: list[TrialRecord]) -> Budget | None:
    """The sweep's budget and comparison rungs, from sweep.json (None when it lacks a base config)."""
    try:
        asha = sweep_asha_budget(record, trials)
        return Budget.of_config(record.base_config, asdict(asha) if asha else None)
    except (KeyError, TypeError, ValueError):
        return None


def range_summary(result) -> dict[str, Any] | None:
    if result is None:
        return None
    return {"steepest_lr": result.steepest_lr, "min_loss_lr": result.min_loss_lr, "blowup_lr": result.blowup_lr,
            "stopped_because": result.stopped_because, "tokens": result.tokens, "steps": len(result.lrs)}


def data_description(record: SweepRecord) -> str:
    """What the trials trained on, from sweep.json (the data dir and its meta.json)."""
    data = record.data or {}
    meta = data.get("meta") or {}
    where = data.get("dir") or "an unrecorded data dir"
    parts = [f"{meta[k]:,} {label}" for k, label in (("train_tokens", "train tokens"), ("val_tokens", "val tokens"),
                                                     ("vocab_size", "vocab"))
             if isinstance(meta.get(k), int)]
    sources = [str(s.get("name")) for s in meta.get("sources") or [] if isinstance(s, dict) and s.get("name")]
    text = where + (f" ({', '.join(parts)})" if parts else "")
    return text + (f", prepared from {', '.join(sources[:3])}" + (" and more" if len(sources) > 3 else "")
                   if sources else "")


def vocab_size(record: SweepRecord) -> int | None:
    for value in ((record.base_config.get("model") or {}).get("vocab_size"),
                  (record.data.get("meta") or {}).get("vocab_size")):
        if isinstance(value, int) and value > 0:
            return value
    return None


def compute_accounting(record: SweepRecord, trials: list[TrialRecord],
                       range_tokens: int | None = None) -> dict[str, Any]:
    """Tokens trained (each trial as of its newest metrics row, and an edge search's range test) against a
    full grid without early stopping (every trial to its own budget)."""
    base_budget = budget_tokens(record.base_config)
    spent = sum(tokens_spent(t) for t in trials) + (range_tokens or 0)
    budgets = [t.budget_tokens or base_budget for t in trials]
    full = sum(budgets) if budgets and all(b is not None for b in budgets) else None
    compute: dict[str, Any] = {"tokens_spent": spent, "full_grid_tokens": full,
                               "trials_started": len(trials) + (range_tokens is not None)}
    if record.num_trials is not None and record.num_trials != len(trials):
        compute["trials_planned"] = record.num_trials
    walls = [t.wall_time_s for t in trials if t.wall_time_s is not None]
    if walls:
        compute["trial_time_total"] = f"{sum(walls):.0f} s"
    return compute


def search_description(record: SweepRecord, trials: list[TrialRecord]) -> str:
    """The search strategy in words: grid/Optuna (sweep.json), the ASHA settings, the stopper settings."""
    space = record.space
    strategy = space.get("description_of_search") or f"{space.get('search', 'unknown')} search"
    lines = [f"Search space `{space['name']}`: {strategy}." if space.get("name") else f"{strategy}."]
    if space.get("description"):
        lines.append(f"The space file describes itself as: \"{str(space['description']).strip()}\" "
                     f"This sweep trained on {data_description(record)}.")
    scheduler = space.get("scheduler") or {}
    if scheduler.get("name") == "asha":
        asha = sweep_asha_budget(record, trials)
        lines.append("Early stopping: ASHA on val loss against tokens trained, " + (
            f"grace period {asha.grace_period:,} tokens, reduction factor {asha.reduction_factor:g}, max_t "
            f"{asha.max_t:,} tokens (the space's grace_period {scheduler.get('grace_period')} and max_t "
            f"{scheduler.get('max_t')}, fractions of the largest trial budget where <= 1)." if asha else
            f"settings {scheduler}."))
    elif scheduler:
        lines.append("Early stopping: none (every trial trains to its budget unless it diverges).")
    stopper = space.get("stopper") or {}
    if stopper:
        rule = trials[0].rule if trials else DivergenceRule()
        text = (f"Stopper: a trial is diverged at a non-finite train loss or gradient norm, or once its train loss "
                f"stayed above its loss at initialisation (ℓ₀ = ln vocab) for {rule.recovery_window:g} of its "
                "budget's steps (the recovery window) without coming back; only then does the stopper end it "
                "early" + (f" (at {rule.stop_factor:g} × ℓ₀)" if rule.stop_factor != 1 else "")
                + ". A run that rose far above its running minimum and came back is spiked, not diverged")
        floor = float(stopper.get("min_tokens_per_s") or 0)
        if floor > 0:
            text += f"; too slow under {floor:,.0f} tokens/s"
        if record.time_budget_s:
            text += f"; too slow when projected past the sweep's time budget of {float(record.time_budget_s):,.0f} s"
        lines.append(text + ".")
    return "\n\n".join(lines)


def sweep_asha_budget(record: SweepRecord, trials: list[TrialRecord]) -> AshaBudget | None:
    """ASHA's budget in tokens: as sweep.json recorded it, or (older sweeps) by run's own rule from the
    space's settings and the largest trial budget."""
    if record.asha:
        return AshaBudget(**record.asha)
    largest = max((b for b in (t.budget_tokens for t in trials) if b), default=None)
    try:
        spec = SchedulerSpec(**record.space["scheduler"])
    except (KeyError, TypeError):
        return None
    return asha_budget(spec, largest) if largest else None
