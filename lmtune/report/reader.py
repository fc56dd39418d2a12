"""Reading a sweep folder (finished or still running) into the report's trial records.

Reads sweep.json, the ledger and each trial's own files (trial.json, config.json, summary.json,
metrics.csv); never Ray's pickles. Nothing is written.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from lmtune.errors import LmtuneError
from lmtune.files import JsonObject
from lmtune.findings.stability import OUTCOMES, TrialRecord
from lmtune.findings.summary import MissingTrial
from lmtune.searches.state import read_search_states
from lmtune.sweep.record import (
    BOOKKEEPING_PARAMS,
    SWEEP_FILE,
    TrialFolder,
    is_sweep_dir,
    read_outcomes,
    readable_trial,
    trial_folders,
    tune_ended,
)
from lmtune.sweep.sweep_file import SweepRecord
from lmtune.training.checkpoint import BEST_NAME
from lmtune.training.divergence import DEFAULT_RULE, DivergenceRule
from lmtune.training.lr_range import RangeTestResult, read_range_test
from lmtune.training.metrics import METRICS_FILE, is_count, read_metrics_frame

log = logging.getLogger(__name__)

USAGE_HINT = "give results/NAME (a sweep folder written by python -m lmtune.run)"


def find_sweeps(root: Path) -> list[Path]:
    """Sweep folders directly under ``root``, newest first (by sweep.json's start_time, else its mtime)."""
    sweeps = [p for p in Path(root).iterdir() if p.is_dir() and is_sweep_dir(p)]
    return sorted(sweeps, key=lambda p: (_start_time(p), p.name), reverse=True)


def resolve_sweep(path: Path) -> tuple[Path, list[Path]]:
    """The sweep to report on and the other sweeps beside it (when ``path`` is a results root): the newest whose
    sweep.json can be read; each newer one that cannot is skipped with a warning saying why."""
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
    unreadable: list[LmtuneError] = []
    for index, sweep in enumerate(sweeps):
        try:
            SweepRecord.read(sweep)
        except LmtuneError as err:
            unreadable.append(err)
            continue
        for skipped, err in zip(sweeps, unreadable, strict=False):  # (the newer ones, each unreadable)
            log.warning("skipped %s, a newer sweep whose records cannot be read (%s)", skipped,
                        str(err).partition("; ")[0])
        return sweep, sweeps[index + 1:]
    raise unreadable[0]  # none can be read: the newest one's problem


def load_sweep(sweep_dir: Path) -> tuple[SweepRecord, list[TrialRecord]]:
    """sweep.json and one TrialRecord per trial that has started.

    A trial's outcome is the ledger's (decisions/trial_outcomes.json); without an entry, its own
    summary.json status (it ended by itself, the driver has not recorded it yet); else ``ended`` for one
    a deciding search (edge, horizon, width, compare) planned again after a driver restart, and ``running`` for the
    rest.
    """
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise LmtuneError(f"{sweep_dir} does not exist; {USAGE_HINT}")
    record = SweepRecord.read(sweep_dir)
    ledger = read_outcomes(sweep_dir)
    # Trials a deciding search planned again after a driver restart (Ray never recorded them): ended.
    interrupted = {trial: why for state in read_search_states(sweep_dir).values()
                   for trial, why in (state.get("interrupted") or {}).items()}
    ledger.update({t: {"outcome": "ended", "reason": why} for t, why in interrupted.items() if t not in ledger})
    trials = [t for t in (trial_record(folder, ledger.get(folder.trial_id) or {}, record.divergence_rule)
                          for folder in trial_folders(sweep_dir)
                          if folder.params.get("stage") != "range" and readable_trial(folder.path))
              if t is not None]
    log.info("loaded %d trials from %s", len(trials), sweep_dir)
    return record, trials


def missing_trials(sweep_dir: Path, trials: list[TrialRecord]) -> list[MissingTrial]:
    """The trials the ledger lists that the report has no folder for (deleted, or unreadable): their id, outcome
    and reason, from the ledger. A conclusion drawn without them may differ from the sweep's (the best trial's
    folder gone changes the best LR)."""
    present = {t.trial_id for t in trials} | {f.trial_id for f in trial_folders(sweep_dir)
                                              if f.params.get("stage") == "range"}
    return [MissingTrial(trial_id, str(entry["outcome"]), str(entry.get("reason") or ""))
            for trial_id, entry in sorted(read_outcomes(sweep_dir).items())
            if trial_id not in present and "members" not in entry]  # (a fused group's own entry: no folder)


def kept_checkpoint(checkpoint_dir: Path, periodic: Sequence[Path]) -> Path | None:
    """The checkpoint a run kept to sample from: its checkpoints/best.pt (the weights at its lowest validation loss),
    else its newest periodic checkpoint (``periodic``: oldest first); None when it kept neither."""
    best = Path(checkpoint_dir) / BEST_NAME
    if best.is_file():
        return best
    return Path(periodic[-1]) if periodic else None


def load_range_test(sweep_dir: Path, variant: str | None = None) -> RangeTestResult | None:
    """The edge search's LR range test (its trial folder's range_test.json), or None; with ``variant``, that
    compare variant's."""
    for folder in trial_folders(sweep_dir):
        if folder.params.get("stage") == "range" and (variant is None or folder.params.get("variant") == variant):
            return read_range_test(folder.path)
    return None


def trial_record(folder: TrialFolder, entry: JsonObject,
                 rule: DivergenceRule = DEFAULT_RULE) -> TrialRecord | None:
    config, summary = folder.read_json("config.json"), folder.read_json("summary.json")
    lr = _positive(folder.params.get("lr")) or _positive((config.get("train") or {}).get("lr"))
    if lr is None:
        log.warning("skipping %s: no learning rate in trial.json, params.json or config.json", folder.path.name)
        return None
    outcome = entry.get("outcome") or summary.get("status") or ("ended" if tune_ended(folder.path) else "running")
    if outcome not in OUTCOMES:
        log.warning("trial %s: unknown outcome %r, reported as error", folder.trial_id, outcome)
        outcome = "error"
    curve = read_metrics_frame(folder.path / METRICS_FILE)
    wall = _positive(summary.get("wall_time_s"))
    if wall is None and "elapsed_s" in curve.columns and curve["elapsed_s"].notna().any():
        wall = float(curve["elapsed_s"].dropna().iloc[-1])
    reason = entry.get("reason") or summary.get("reason") or {
        "running": "still running", "ended": "ended; the sweep's ledger has no record of why"}.get(outcome, "")
    step = _count(entry.get("step"))  # (None for a step no run has: an edited ledger's 1e300 or -6)
    return TrialRecord(
        trial_id=folder.trial_id, lr=lr, params={"lr": lr, **{k: v for k, v in folder.params.items()
                                                            if k != "lr" and k not in BOOKKEEPING_PARAMS}},
        outcome=outcome, reason=str(reason), stop_step=step or None, curve=curve,
        wall_time_s=wall, checkpoint_dir=folder.path / "checkpoints",
        periodic_checkpoints=tuple(folder.periodic_checkpoints()), config=config,
        stage=str(folder.params.get("stage") or "grid"), seed=_whole(folder.params.get("seed")), rule=rule,
        continued_from_tokens=folder.continued_from_tokens, continue_from=folder.params.get("continue_from"),
        variant=folder.params.get("variant"),
    )


def _start_time(sweep_dir: Path) -> float:
    try:
        return datetime.strptime(SweepRecord.read(sweep_dir).start_time, "%Y-%m-%dT%H:%M:%S%z").timestamp()
    except (LmtuneError, ValueError, TypeError):
        return (sweep_dir / SWEEP_FILE).stat().st_mtime


def _whole(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and float(value).is_integer() \
        else None


def _count(value: Any) -> int | None:
    """A count (a step): a whole number a run can have written, as in metrics.csv (None for anything else)."""
    whole = _whole(value)
    return whole if whole is not None and is_count(whole) else None


def _positive(value: Any) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and value > 0 else None
