"""``python -m lmtune.analyze results/NAME``: the edge-of-stability report of a sweep.

Reads a sweep written by ``python -m lmtune.run`` (finished or still running) into
:class:`lmtune.stability.TrialRecord` objects and writes results/NAME/report/ (or ``--out``):
lr_sweep_comparison.png, lr_vs_final_loss.png, instability.png (when a run diverged or went
unstable), lr_sweep_analysis.md, summary.json, summary.csv, and with ``--sharpness`` sharpness.png
and sharpness.csv. Nothing else in the sweep dir is written; Ray's pickles are never loaded.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import logging
import math
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lmtune.errors import LmtuneError, cli_entry, setup_cli_logging
from lmtune.stability import OUTCOMES, TrialRecord, classify, sweep_summary, tokens_trained
from lmtune.sweep_files import LEDGER_NAME, SWEEP_FILE, is_sweep_dir, trial_id_of

log = logging.getLogger(__name__)

REPORT_DIR = "report"
TRIAL_MARKERS = ("params.json", "metrics.csv", "result.json", "config.json")
SHARPNESS_COLUMNS = ["trial_id", "lr", "step", "lr_at_step", "sharpness", "preconditioned_sharpness",
                     "gd_threshold", "adam_threshold"]
USAGE_HINT = "give results/NAME (a sweep folder written by python -m lmtune.run)"


# ---------------------------------------------------------------------------------------------
# Finding sweeps


def _start_time(sweep_dir: Path) -> float:
    """sweep.json start_time as a timestamp, else the file's mtime (for ordering sweeps)."""
    path = sweep_dir / SWEEP_FILE
    try:
        text = json.loads(path.read_text()).get("start_time")
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S%z").timestamp()
    except (OSError, ValueError, TypeError, AttributeError):
        return path.stat().st_mtime


def find_sweeps(root: Path) -> list[Path]:
    """Sweep folders directly under ``root``, newest first."""
    sweeps = [p for p in Path(root).iterdir() if p.is_dir() and is_sweep_dir(p)]
    return sorted(sweeps, key=lambda p: (_start_time(p), p.name), reverse=True)


def resolve_sweep(path: Path) -> tuple[Path, list[Path]]:
    """The sweep to report on and the other sweeps beside it (when ``path`` is a results root)."""
    path = Path(path)
    if not path.exists():
        raise LmtuneError(f"{path} does not exist; {USAGE_HINT}")
    if not path.is_dir():
        raise LmtuneError(f"{path} is not a directory; {USAGE_HINT}")
    if is_sweep_dir(path):
        return path, []
    sweeps = find_sweeps(path)
    if not sweeps:
        raise LmtuneError(f"{path} is not an lmtune sweep (no {SWEEP_FILE}); {USAGE_HINT}")
    return sweeps[0], sweeps[1:]


# ---------------------------------------------------------------------------------------------
# Reading one sweep


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise LmtuneError(f"{path} ({what}) is unreadable ({type(err).__name__}: {err}); "
                          "restore it or re-run the sweep") from None


def _read_json_quiet(path: Path) -> Any:
    """A trial's own JSON file; a half-written or missing one (running trial) is None."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        if path.exists():
            log.warning("ignoring unreadable %s: %s", path, err)
        return None


def _trial_folders(sweep_dir: Path) -> list[Path]:
    return sorted(p for p in sweep_dir.iterdir()
                  if p.is_dir() and p.name != REPORT_DIR and any((p / m).exists() for m in TRIAL_MARKERS))


def read_curve(path: Path) -> pd.DataFrame:
    """metrics.csv as numbers (empty cells -> NaN); empty when missing. A torn last line is dropped."""
    if not path.is_file():
        return pd.DataFrame()
    try:
        frame = pd.read_csv(path, on_bad_lines="skip")
    except pd.errors.EmptyDataError:
        return pd.DataFrame()
    except (OSError, pd.errors.ParserError, UnicodeDecodeError) as err:
        log.warning("ignoring unreadable %s: %s", path, err)
        return pd.DataFrame()
    frame = frame.apply(pd.to_numeric, errors="coerce")
    if "step" in frame.columns:
        frame = frame[frame["step"].notna()]
    return frame.reset_index(drop=True)


def _positive(value: Any) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and value > 0 else None


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value) if value is not None and math.isfinite(float(value)) else None
    except (TypeError, ValueError):
        return None


def load_sweep(sweep_dir: Path) -> tuple[dict[str, Any], list[TrialRecord]]:
    """(sweep.json with a ``trials`` side table added, one TrialRecord per trial folder).

    outcome: the ledger's (trial_outcomes.json); without an entry the trial's summary.json status;
    else ``running``. The side table ``meta["trial_files"]`` maps trial_id -> {dir, config, summary,
    ledger} for the compute accounting.
    """
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise LmtuneError(f"{sweep_dir} does not exist; {USAGE_HINT}")
    meta = _read_json(sweep_dir / SWEEP_FILE, "the sweep's record")
    if meta is None:
        raise LmtuneError(f"{sweep_dir} is not an lmtune sweep (no {SWEEP_FILE}); {USAGE_HINT}")
    if not isinstance(meta, dict):
        raise LmtuneError(f"{sweep_dir / SWEEP_FILE} is not a JSON object; restore it or re-run the sweep")
    ledger = _read_json(sweep_dir / LEDGER_NAME, "the trial outcome ledger") or {}
    records: list[TrialRecord] = []
    files: dict[str, dict[str, Any]] = {}
    for folder in _trial_folders(sweep_dir):
        trial_id = trial_id_of(folder, list(ledger))
        params = _read_json_quiet(folder / "params.json") or {}
        config = _read_json_quiet(folder / "config.json") or {}
        summary = _read_json_quiet(folder / "summary.json") or {}
        entry = ledger.get(trial_id) or {}
        lr = _positive(params.get("lr")) or _positive((config.get("train") or {}).get("lr"))
        if lr is None:
            log.warning("skipping %s: no learning rate in params.json or config.json", folder.name)
            continue
        outcome = entry.get("outcome") or summary.get("status") or "running"
        if outcome not in OUTCOMES:
            log.warning("trial %s: unknown outcome %r, reported as error", trial_id, outcome)
            outcome = "error"
        curve = read_curve(folder / "metrics.csv")
        wall = _positive(summary.get("wall_time_s"))
        if wall is None and "elapsed_s" in curve.columns and curve["elapsed_s"].notna().any():
            wall = float(curve["elapsed_s"].dropna().iloc[-1])
        reason = entry.get("reason") or summary.get("reason") or ("still running" if outcome == "running" else "")
        records.append(TrialRecord(
            trial_id=trial_id, lr=lr, params={"lr": lr, **{k: v for k, v in params.items() if k != "lr"}},
            outcome=outcome, reason=str(reason), stop_step=_int_or_none(entry.get("step")), curve=curve,
            wall_time_s=wall, checkpoint_dir=folder / "checkpoints",
        ))
        files[trial_id] = {"dir": folder, "config": config, "summary": summary, "ledger": entry}
    meta["trial_files"] = files
    log.info("loaded %d trials from %s", len(records), sweep_dir)
    return meta, records


# ---------------------------------------------------------------------------------------------
# Search strategy and compute


def _trial_budget(config: dict[str, Any], base: dict[str, Any]) -> int | None:
    """steps x batch_size x context_length of one trial's RunConfig dict (the sweep's base as fallback)."""
    def get(section: str, key: str) -> Any:
        for source in (config, base):
            value = (source.get(section) or {}).get(key)
            if value is not None:
                return value
        return None

    parts = [get("train", "steps"), get("train", "batch_size"), get("model", "context_length")]
    if any(_positive(p) is None for p in parts):
        return None
    return int(parts[0]) * int(parts[1]) * int(parts[2])


def _trained_tokens(record: TrialRecord, files: dict[str, Any]) -> int:
    """The most tokens any source says the trial trained (summary, ledger, last metrics row)."""
    candidates = [files.get("summary", {}).get("tokens"), files.get("ledger", {}).get("tokens"),
                  tokens_trained(record)]
    values = [int(v) for v in candidates if _positive(v) is not None]
    return max(values) if values else 0


def compute_accounting(meta: dict[str, Any], records: list[TrialRecord]) -> dict[str, Any]:
    """Tokens spent against a full grid without early stopping (every trial to its own budget)."""
    base = meta.get("base_config") or {}
    files = meta.get("trial_files") or {}
    spent = sum(_trained_tokens(r, files.get(r.trial_id, {})) for r in records)
    budgets = [_trial_budget(files.get(r.trial_id, {}).get("config") or {}, base) for r in records]
    full = sum(budgets) if budgets and all(b is not None for b in budgets) else None
    planned = (meta.get("space") or {}).get("num_trials")
    compute: dict[str, Any] = {"tokens_spent": spent, "full_grid_tokens": full, "trials_started": len(records)}
    if isinstance(planned, int) and planned != len(records):
        compute["trials_planned"] = planned
    walls = [r.wall_time_s for r in records if r.wall_time_s is not None]
    if walls:
        compute["trial_time_total"] = f"{sum(walls):.0f} s"
    return compute


def _frac_or_tokens(value: Any, of: int | None, what: str) -> str:
    value = float(value)
    if value <= 1 and of:
        return f"{value:g} × {what} = {int(value * of):,} tokens"
    if value <= 1:
        return f"{value:g} × {what}"
    return f"{int(value):,} tokens"


def search_description(meta: dict[str, Any], records: list[TrialRecord]) -> str:
    """The search strategy in words: grid/Optuna (sweep.json), the ASHA settings, the stopper settings."""
    space = meta.get("space") or {}
    lines = []
    strategy = space.get("description_of_search") or f"{space.get('search', 'unknown')} search"
    name = space.get("name")
    lines.append(f"Search space `{name}`: {strategy}." if name else f"{strategy}.")
    if space.get("description"):
        lines.append(f"({str(space['description']).strip()})")
    scheduler = space.get("scheduler") or {}
    if scheduler.get("name") == "asha":
        files = meta.get("trial_files") or {}
        budgets = [_trial_budget(files.get(r.trial_id, {}).get("config") or {}, meta.get("base_config") or {})
                   for r in records]
        largest = max((b for b in budgets if b), default=None)
        try:
            max_t_tokens = (int(float(scheduler["max_t"]) * largest) if float(scheduler["max_t"]) <= 1 and largest
                            else int(float(scheduler["max_t"])) if float(scheduler["max_t"]) > 1 else None)
            max_t = _frac_or_tokens(scheduler["max_t"], largest, "the largest trial budget")
            grace = _frac_or_tokens(scheduler["grace_period"], max_t_tokens, "max_t")
            lines.append(f"Early stopping: ASHA on val loss against tokens trained, grace period {grace}, "
                         f"reduction factor {float(scheduler['reduction_factor']):g}, max_t {max_t}.")
        except (KeyError, TypeError, ValueError):
            lines.append(f"Early stopping: ASHA ({scheduler}).")
    elif scheduler:
        lines.append("Early stopping: none (every trial trains to its budget unless it diverges).")
    stopper = space.get("stopper") or {}
    if stopper:
        text = (f"Stopper: a trial is diverged at a non-finite train loss or gradient norm, or after warm-up "
                f"at a train loss above {float(stopper.get('explode_factor', 1.5)):g}× its loss at initialisation "
                f"(ln vocab, or its first reported loss if lower)")
        floor = float(stopper.get("min_tokens_per_s") or 0)
        if floor > 0:
            text += f"; too slow under {floor:,.0f} tokens/s"
        if meta.get("time_budget_s"):
            text += f"; too slow when projected past the sweep's time budget of {float(meta['time_budget_s']):,.0f} s"
        lines.append(text + ".")
    return "\n\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Sharpness


def sharpness_trials(records: list[TrialRecord], summary: dict[str, Any]) -> list[TrialRecord]:
    """The best trial and the trial at the largest non-diverged LR (once if they coincide)."""
    chosen: list[TrialRecord] = []
    by_id = {r.trial_id: r for r in records}
    if summary.get("best_trial") in by_id:
        chosen.append(by_id[summary["best_trial"]])
    healthy = [r for r in records if classify(r) != "diverged"
               and r.checkpoint_dir is not None and r.checkpoint_dir.is_dir()]
    if healthy:
        largest = max(healthy, key=lambda r: (r.lr, r.trial_id))
        if all(largest is not c for c in chosen):
            chosen.append(largest)
    return chosen


def sharpness_batch(meta: dict[str, Any], context_length: int, batch_size: int = 4):
    """A fixed validation batch (batch_size x context) from the sweep's data dir."""
    from lmtune.data import fixed_val_batches, load_data

    data_dir = (meta.get("data") or {}).get("dir") or (meta.get("base_config") or {}).get("data_dir")
    if not data_dir or not Path(data_dir).is_dir():
        raise LmtuneError(f"--sharpness needs the sweep's data dir ({data_dir or 'not recorded in sweep.json'}), "
                          "which is missing; restore it there or run without --sharpness")
    data = load_data(Path(data_dir), context_length)
    return fixed_val_batches(data.val, batch_size, context_length, 1)[0]


def sweep_sharpness(meta: dict[str, Any], records: list[TrialRecord], summary: dict[str, Any],
                    iters: int = 100, tol: float = 1e-4) -> list[dict[str, Any]]:
    """checkpoint_sharpness at every remaining periodic checkpoint of :func:`sharpness_trials`.

    The largest (algebraic) Hessian eigenvalue, not the largest-magnitude one: late in training a
    negative-curvature direction can dominate in magnitude, and sharpness is the top eigenvalue.
    """
    import torch

    from lmtune.checkpoint import periodic_checkpoints
    from lmtune.sharpness import checkpoint_sharpness

    torch.set_num_threads(1)
    files = meta.get("trial_files") or {}
    base = meta.get("base_config") or {}
    rows: list[dict[str, Any]] = []
    batches: dict[int, Any] = {}
    for record in sharpness_trials(records, summary):
        config = files.get(record.trial_id, {}).get("config") or base or None
        context = int(((config or {}).get("model") or {}).get("context_length") or 0)
        checkpoints = periodic_checkpoints(record.checkpoint_dir) if record.checkpoint_dir else []
        if not checkpoints:
            log.warning("trial %s has no periodic checkpoints left; no sharpness for it", record.trial_id)
            continue
        if context <= 0:
            log.warning("trial %s: no context_length in its config; no sharpness for it", record.trial_id)
            continue
        if context not in batches:
            batches[context] = sharpness_batch(meta, context)
        for path in checkpoints:
            try:
                result = checkpoint_sharpness(path, config, batches[context], iters=iters, tol=tol,
                                              largest=True)
            except (ValueError, RuntimeError, OSError, KeyError) as err:
                log.warning("skipping checkpoint %s: %s", path, err)
                continue
            rows.append({"trial_id": record.trial_id, "lr": record.lr, **result})
    return rows


def write_sharpness_csv(rows: list[dict[str, Any]], path: Path) -> Path:
    from lmtune.checkpoint import atomic_write_text

    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(SHARPNESS_COLUMNS)
    for row in rows:
        writer.writerow(["" if row.get(c) is None else row.get(c) for c in SHARPNESS_COLUMNS])
    atomic_write_text(path, buffer.getvalue())
    return path


# ---------------------------------------------------------------------------------------------
# The report


def _vocab_size(meta: dict[str, Any]) -> int | None:
    for value in (((meta.get("base_config") or {}).get("model") or {}).get("vocab_size"),
                  ((meta.get("data") or {}).get("meta") or {}).get("vocab_size")):
        if _positive(value) is not None:
            return int(value)
    return None


def analyze(sweep_dir: Path, out_dir: Path | None = None, target: float | None = None,
            sharpness: bool = False) -> dict[str, Any]:
    """Write the report of one sweep; returns the summary (summary.json's content) with ``report_dir``."""
    from lmtune.report import (
        plot_instability,
        plot_lr_vs_loss,
        plot_sharpness,
        plot_sweep_comparison,
        write_markdown,
        write_tables,
    )
    from lmtune.stability import best_trial

    sweep_dir = Path(sweep_dir)
    if target is not None and not (isinstance(target, (int, float)) and math.isfinite(target) and target > 0):
        raise LmtuneError(f"--target must be a positive loss in nats/token (got {target!r})")
    meta, records = load_sweep(sweep_dir)
    if not records:
        raise LmtuneError(f"{sweep_dir} has no trials yet (no trial folders); wait until the sweep has started "
                          "trials, then run the report again")
    out = Path(out_dir) if out_dir is not None else sweep_dir / REPORT_DIR
    if out.exists() and not out.is_dir():
        raise LmtuneError(f"{out} exists and is not a directory; give another --out")
    out.mkdir(parents=True, exist_ok=True)

    summary = sweep_summary(records, target=target, vocab_size=_vocab_size(meta))
    compute = compute_accounting(meta, records)
    search = search_description(meta, records)
    sharp_rows = sweep_sharpness(meta, records, summary) if sharpness else None
    summary.update({"sweep": meta.get("name") or sweep_dir.name, "sweep_dir": str(sweep_dir.resolve()),
                    "search_strategy": search, "compute": compute,
                    "generated": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    if sharp_rows is not None:
        summary["sharpness"] = [{k: row.get(k) for k in SHARPNESS_COLUMNS} for row in sharp_rows]

    plot_sweep_comparison(records, out / "lr_sweep_comparison.png", target=target)
    plot_lr_vs_loss(records, out / "lr_vs_final_loss.png", summary)
    if any(row["status"] in ("diverged", "unstable") for row in summary["trials"]):
        plot_instability(records, best_trial(records), out / "instability.png")
    if sharp_rows is not None:
        write_sharpness_csv(sharp_rows, out / "sharpness.csv")
        if sharp_rows:
            plot_sharpness(sharp_rows, out / "sharpness.png")
        else:
            log.warning("no checkpoint gave a sharpness estimate; sharpness.png not written")
    write_markdown(summary, records, out / "lr_sweep_analysis.md", search, compute)
    write_tables(_json_ready(summary), out)
    summary["report_dir"] = str(out)
    return summary


def _json_ready(value: Any) -> Any:
    """NaN/inf -> None, numpy -> Python (summary.json is written with allow_nan=False)."""
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# ---------------------------------------------------------------------------------------------
# CLI


def _parse_target(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise LmtuneError(f"--target must be a positive loss in nats/token, e.g. --target 3.5 (got {text!r})")
    return value


def headline(summary: dict[str, Any]) -> list[str]:
    """The few lines the CLI prints."""
    lines = []
    counts = ", ".join(f"{n} {s}" for s, n in summary.get("status_counts", {}).items())
    lines.append(f"sweep {summary.get('sweep')}: {len(summary['trials'])} trials ({counts})")
    if summary["best_lr"] is not None:
        lines.append(f"best lr {summary['best_lr']:.3g}: val loss {summary['best_val_loss']:.4f} "
                     f"(trial {summary['best_trial']})")
    else:
        lines.append("best lr: none (no non-diverged trial was evaluated yet)")
    if summary["divergence_lr"] is not None:
        lines.append(f"divergence lr {summary['divergence_lr']:.3g}")
    else:
        lines.append("divergence lr: none (no trial diverged)")
    if summary["edge_ratio"] is not None:
        lines.append(f"edge ratio {summary['edge_ratio']:.2f}: {summary['edge_reading']}")
    if summary.get("target") is not None:
        met = "met" if summary.get("target_met") else "not met"
        lines.append(f"target {summary['target']:g}: {met}")
    report = Path(summary["report_dir"]) / "lr_sweep_analysis.md"
    lines.append(f"report: {report}")
    return lines


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lmtune.analyze", description=__doc__.splitlines()[0])
    parser.add_argument("sweep", help="results/NAME (a sweep) or results/ (reports the newest sweep in it)")
    parser.add_argument("--out", default=None, help="report folder (default: results/NAME/report)")
    parser.add_argument("--target", default=None, help="target val loss (nats/token): was it met, and by which trial")
    parser.add_argument("--sharpness", action="store_true",
                        help="estimate the Hessian's top eigenvalue at saved checkpoints of the best trial and "
                             "the largest non-diverged LR (slow: minutes on CPU)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress")
    return parser


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_cli_logging(logging.INFO if args.verbose else logging.WARNING)
    target = _parse_target(args.target)
    sweep_dir, others = resolve_sweep(Path(args.sweep))
    if others or sweep_dir != Path(args.sweep):
        print(f"reporting the newest sweep: {sweep_dir}")
        if others:
            print(f"other sweeps in {args.sweep}: {', '.join(p.name for p in others)}")
    summary = analyze(sweep_dir, out_dir=Path(args.out) if args.out else None, target=target,
                      sharpness=args.sharpness)
    print("\n".join(headline(summary)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
