"""The checkpoint ``lmtune sample PATH`` samples where PATH is a folder: a sweep's (results/NAME: its best trial's
checkpoint, as ``analyze`` and ``run`` name it, read from the sweep's records by the report's own reader), or a
trial's or a training run's (the checkpoint it kept: its checkpoints/best.pt, else its newest periodic one); each
folder that offers none, one line saying why and what to give instead. Nothing is imported of the code a sweep names:
what it finds is a file, which ``lmtune sample`` loads under the user's consent as any other."""

from __future__ import annotations

import math
from pathlib import Path

from lmtune.errors import LmtuneError
from lmtune.report.headline import running_trials
from lmtune.report.reader import kept_checkpoint, trial_record
from lmtune.report.writer import summarize_sweep
from lmtune.sweep.record import TRIAL_FILE, TrialFolder, is_sweep_dir, read_json_object, read_outcomes, trial_id_in
from lmtune.sweep.sweep_file import SweepRecord

WHAT_TO_GIVE = ("give a checkpoint file (a run's checkpoints/best.pt), a trial's folder or a sweep's folder "
                "(results/NAME)")


def checkpoint_in(folder: Path) -> tuple[Path, str]:
    """The checkpoint a sweep's or a run's ``folder`` offers, and a line saying which it is; one line (LmtuneError)
    where it offers none, or is neither."""
    if is_sweep_dir(folder):
        return best_checkpoint(folder)
    if (folder / "config.json").is_file() or (folder / TRIAL_FILE).is_file():
        found = kept_checkpoint(folder / "checkpoints", run_folder(folder).periodic_checkpoints())
        if found is None:
            raise LmtuneError(f"{folder} holds no checkpoint to sample: {no_checkpoint_why(run_folder(folder))}")
        return found, f"sampling {found}"
    raise LmtuneError(f"{folder} is a folder, but neither a sweep's (no sweep.json) nor a run's (no config.json): "
                      f"{WHAT_TO_GIVE}")


def best_checkpoint(sweep_dir: Path) -> tuple[Path, str]:
    """The checkpoint of the sweep's best trial, as the report names it (summary.json's best_checkpoint)."""
    report = summarize_sweep(sweep_dir)
    summary, facts = report.summary, report.facts
    if summary.best_trial is None or summary.candidate_tokens or facts.best_trial_dir is None:
        lowest = (f"; the lowest loss so far is {facts.best_trial_dir}'s: give that folder to sample it anyway"
                  if facts.best_trial_dir else "")
        raise LmtuneError(f"{sweep_dir} has no best trial yet: no trial that neither diverged nor errored trained its "
                          f"whole budget{lowest}; or give a trial's folder (results/NAME/TRIAL)")
    if facts.best_checkpoint is None:
        raise LmtuneError(f"{sweep_dir}: its best trial's folder {facts.best_trial_dir} holds no checkpoint (no "
                          "checkpoints/best.pt: a copy of the sweep without its checkpoints, as analyze makes of one "
                          "in object storage?); give the sweep's folder where it trained, or that trial's checkpoint")
    running = running_trials(summary)
    unfinished = (f"; the sweep is unfinished ({running} trial{'s' * (running != 1)} running): the best may change"
                  if running else "")
    return Path(facts.best_checkpoint), (f"sampling {facts.best_checkpoint}: the best trial of {sweep_dir} "
                                         f"({summary.best_trial}, lr {summary.best_lr:.3g}){unfinished}")


def missing_in_sweep(path: Path) -> str | None:
    """For a path that does not exist inside a sweep's folder (results/NAME/ID/checkpoints/best.pt, the trial named
    by its id alone): one line naming the trial's folder where ID begins exactly one, and the sweep's folder for its
    best trial; None where no sweep's folder holds the path."""
    for ancestor in path.parents:
        if ancestor.is_dir():
            break
    else:
        return None
    if not is_sweep_dir(ancestor):
        return None
    named = path.relative_to(ancestor).parts[0]
    trials = [p for p in ancestor.iterdir() if p.is_dir() and p.name.startswith(f"{named}_")]
    folder = (f"; the folder of trial {named} is {trials[0]} (its checkpoint: {trials[0] / 'checkpoints' / 'best.pt'})"
              if len(trials) == 1 else "")
    return (f"{path}: no such file{folder}; or give the sweep's folder {ancestor} to sample its best trial's "
            "checkpoint")


def run_folder(folder: Path) -> TrialFolder:
    """A trial's folder (or a training run's: its own id is its folder's name) as the sweep's readers see it."""
    params = read_json_object(folder / TRIAL_FILE).get("params")
    return TrialFolder(folder, trial_id_in(folder) or folder.name, dict(params) if isinstance(params, dict) else {})


def no_checkpoint_why(folder: TrialFolder) -> str:
    """Why a trial's (or a run's) folder holds no checkpoint, and what to give instead: still running, ended before
    any finite validation loss (so no best.pt), or its best.pt gone; and, where the sweep's ``--keep best`` removed a
    periodic checkpoint it had written, the setting that would have kept it."""
    sweep = folder.path.parent if is_sweep_dir(folder.path.parent) else None
    entry = (read_outcomes(sweep).get(folder.trial_id) or {}) if sweep is not None else {}
    record = trial_record(folder, entry)
    if record is None:
        return f"no checkpoints/best.pt; {WHAT_TO_GIVE}"
    if record.outcome == "running":
        return ("it is still running and writes checkpoints/best.pt at its first validation loss: sample it after "
                "that, or give another trial's folder")
    curve = record.curve
    losses = curve["val_loss"].dropna() if "val_loss" in curve.columns else ()
    if any(math.isfinite(float(loss)) for loss in losses):
        why = "its checkpoints/best.pt is gone (deleted, or the folder copied without its checkpoints)"
    else:
        why = f"it ended ({record.outcome}) before any finite validation loss, so it wrote no checkpoints/best.pt"
    steps = int(curve["step"].max()) if "step" in curve.columns and curve["step"].notna().any() else 0
    interval = (record.config.get("train") or {}).get("checkpoint_interval")
    if sweep is not None and _keep(sweep) == "best" and isinstance(interval, int) and 0 < interval <= steps:
        why += (", and the sweep's --keep best removed its periodic checkpoints when it ended (--keep last would have "
                "kept its newest)")
    return f"{why}; give another trial's folder, or the sweep's folder for its best trial"


def _keep(sweep_dir: Path) -> str | None:
    """The sweep's --keep (sweep.json's), or None where its sweep.json cannot be read."""
    try:
        return str(SweepRecord.read(sweep_dir).keep)
    except LmtuneError:
        return None
