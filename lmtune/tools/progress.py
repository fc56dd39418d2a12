"""A sweep's live progress (python -m lmtune.diagnose results/NAME): each trial's status, progress,
tokens/s and ETA, and the ETA of the whole sweep. Works while the sweep runs; reads files only."""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmtune.errors import LmtuneError
from lmtune.sweep.record import (
    is_sweep_dir,
    own_folders,
    read_outcomes,
    readable_trial,
    trial_folders,
    trial_id_in,
    tune_ended,
)
from lmtune.sweep.sweep_file import SweepRecord
from lmtune.training.config import run_config_of
from lmtune.training.metrics import METRICS_FILE, is_count, last_metrics_row

log = logging.getLogger(__name__)

# A trial without summary.json whose metrics.csv changed this recently counts as running.
RUNNING_IF_UPDATED_WITHIN_S = 600.0


@dataclass
class TrialStatus:
    name: str
    lr: float | None
    status: str
    tokens_done: int
    tokens_total: int
    tokens_per_s: float | None

    @property
    def progress(self) -> float:
        return min(1.0, self.tokens_done / self.tokens_total) if self.tokens_total else 0.0

    @property
    def remaining_tokens(self) -> int:
        return max(0, self.tokens_total - self.tokens_done) if self.status == "running" else 0

    @property
    def eta_s(self) -> float | None:
        if self.status != "running" or not self.tokens_per_s:
            return None
        return self.remaining_tokens / self.tokens_per_s


def find_trial_dirs(sweep_dir: Path) -> list[Path]:
    """Directories up to two levels below ``sweep_dir`` holding config.json and metrics.csv: its own only
    (lmtune.sweep.record.own_folders: none through a link, none of a sweep inside it)."""
    children = own_folders(sweep_dir)
    grandchildren = [path for child in children for path in own_folders(child)]
    return [path for path in (*children, *grandchildren)
            if (path / "config.json").is_file() and (path / METRICS_FILE).is_file()]


def read_trial(trial_dir: Path, sweep_dir: Path, now: float | None = None) -> TrialStatus:
    now = time.time() if now is None else now
    try:
        config = run_config_of(json.loads((trial_dir / "config.json").read_text()))
    except (OSError, ValueError) as err:
        raise LmtuneError(f"{trial_dir / 'config.json'} is unreadable ({type(err).__name__}: {err}); "
                          "it must hold a RunConfig (train.steps, train.batch_size, model.context_length)") from None
    if config is None:
        raise LmtuneError(f"{trial_dir / 'config.json'} is not a RunConfig (train.steps, train.batch_size, "
                          "model.context_length, each of its type)")
    total, lr = config.run_tokens, _float(config.train.lr)  # (a stability probe ends at run_steps)
    row = last_metrics_row(trial_dir / METRICS_FILE) or {}
    tokens_done = int(row.get("tokens") or 0)
    rate = _float(row.get("tokens_per_s"))
    status = None
    try:
        summary = json.loads((trial_dir / "summary.json").read_text())
        status = str(summary.get("status") or "finished")
        spent = _float(summary.get("tokens"))
        if spent is not None and not is_count(spent):  # (an edited summary.json: 1e300)
            log.warning("%s: tokens %s out of range; its metrics.csv's are shown", trial_dir / "summary.json", spent)
            spent = None
        tokens_done = int(spent or tokens_done)
    except (OSError, ValueError, AttributeError):
        pass  # still training (or being written): the metrics decide
    if status is None and tune_ended(trial_dir):  # Tune ended it; the ledger would say why
        status = "ended"
    if status is None:
        recent = now - (trial_dir / METRICS_FILE).stat().st_mtime < RUNNING_IF_UPDATED_WITHIN_S
        status = "running" if recent else "stopped"
    return TrialStatus(str(trial_dir.relative_to(sweep_dir)), lr, status, tokens_done, total, rate)


def sweep_status(sweep_dir: Path) -> tuple[list[TrialStatus], SweepRecord]:
    """Every trial's status (the ledger's outcome where it has one) and sweep.json."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise LmtuneError(f"{sweep_dir} is not a directory; pass the results dir of a sweep, e.g. results/NAME")
    found = find_trial_dirs(sweep_dir)
    if not is_sweep_dir(sweep_dir) and not found:
        raise LmtuneError(f"{sweep_dir} is not a sweep dir (no sweep.json and no trial dirs with config.json + "
                          "metrics.csv); pass the directory a sweep wrote, e.g. results/NAME")
    record = SweepRecord.read(sweep_dir) if is_sweep_dir(sweep_dir) else SweepRecord()
    trial_dirs = [d for d in found if readable_trial(d)]
    for folder in trial_folders(sweep_dir) if is_sweep_dir(sweep_dir) else []:
        if not (folder.path / "config.json").is_file():
            readable_trial(folder.path)  # (warns: a trial's folder without its config, as analyze does)
    trials = [read_trial(d, sweep_dir) for d in trial_dirs]
    # The ledger says why a trial ended (ASHA, divergence, too slow) where the trial could not.
    outcomes = read_outcomes(sweep_dir)
    ids = [trial_id_in(d) for d in trial_dirs]
    for trial, trial_id in zip(trials, ids, strict=True):
        entry = outcomes.get(trial_id or "")
        if entry:
            trial.status = str(entry.get("outcome", trial.status))
    missing = sorted(t for t, entry in outcomes.items() if t not in ids and "members" not in entry)
    if missing:
        log.warning("the ledger lists %d trial(s) not shown, with no readable folder: %s", len(missing),
                    ", ".join(missing))
    return trials, record


def sweep_eta(trials: list[TrialStatus], record: SweepRecord) -> tuple[float | None, int, int]:
    """(seconds, remaining tokens, trials not started): remaining tokens of running trials plus those not
    yet started (sized like the started ones), over the running trials' aggregate tokens/s, i.e.
    assuming the sweep keeps running as many trials at once as it does now."""
    running = [t for t in trials if t.status == "running"]
    remaining = sum(t.remaining_tokens for t in running)
    pending = max(0, record.num_trials - len(trials)) if record.num_trials is not None else 0
    if pending and trials:
        remaining += pending * sorted(t.tokens_total for t in trials)[len(trials) // 2]
    rate = sum(t.tokens_per_s or 0.0 for t in running)
    if remaining == 0:
        return 0.0, 0, pending
    return (remaining / rate if rate > 0 else None), remaining, pending


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


def format_sweep(sweep_dir: Path, trials: list[TrialStatus], record: SweepRecord) -> str:
    width = max([5, *(len(t.name) for t in trials)])
    lines = [f"sweep {sweep_dir}: {len(trials)} trials",
             f"{'trial':<{width}}  {'lr':>9}  {'status':<13} {'progress':>8}  {'tokens/s':>10}  {'ETA':>8}"]
    for t in sorted(trials, key=lambda t: (t.lr is None, t.lr or 0.0, t.name)):
        lr = f"{t.lr:.3g}" if t.lr is not None else "?"
        rate = f"{t.tokens_per_s:,.0f}" if t.tokens_per_s else "-"
        lines.append(f"{t.name:<{width}}  {lr:>9}  {t.status:<13} {100 * t.progress:>7.1f}%  {rate:>10}  "
                     f"{format_duration(t.eta_s):>8}")
    eta, remaining, pending = sweep_eta(trials, record)
    running = sum(t.status == "running" for t in trials)
    together = sum(t.tokens_per_s or 0.0 for t in trials if t.status == "running")
    if remaining == 0:
        lines.append("sweep ETA: done (no trial running or pending)")
    elif eta is None:
        lines.append(f"sweep ETA: unknown ({remaining:,} tokens left, {pending} trials not started, nothing running)")
    else:
        lines.append(f"sweep ETA: {format_duration(eta)} ({remaining:,} tokens left"
                     + (f" incl. {pending} trials not started" if pending else "")
                     + f", {running} running at {together:,.0f} tokens/s together)")
    return "\n".join(lines)


def _float(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None
