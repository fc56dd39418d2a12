"""What of a sweep's checkpoints stays on disk, and when the rest goes (``--keep``); and that a trial started again
keeps the Tune results it had (``TuneResultsKept``).

A periodic checkpoint has one home, Tune's ``checkpoint_NNNNNN/`` folder in the trial's folder (lmtune.sweep.
reporting hands each one over). While a trial runs, Tune keeps its newest (what a resume needs) and the run
keeps ``checkpoints/best.pt``. When it ends, ``prune_trial`` leaves what ``--keep`` asks for (lmtune.sweep.disk.
Keep) and what the search may still use (its strategy's ``held_checkpoints``: an edge search continues the LRs
ASHA cut, a horizon search forks longer budgets from stable.pt); ``prune_sweep`` removes those too once the
sweep has finished. Everything goes through a pyarrow filesystem, so the same rules hold on a local disk and
in object storage.
"""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
from ray import tune

from lmtune.files import atomic_write_bytes
from lmtune.sweep.disk import Keep
from lmtune.sweep.record import STAGING_DIR, read_outcomes, rebased
from lmtune.sweep.storage import SweepStorage, filesystem_of
from lmtune.training.checkpoint import PERIODIC, STABLE_NAME

log = logging.getLogger(__name__)

TUNE_CHECKPOINT_PREFIX = "checkpoint_"
TUNE_RESULT_FILES = ("result.json", "progress.csv")  # (Tune's JsonLoggerCallback's and CSVLoggerCallback's)


def _children(fs: pafs.FileSystem, path: str) -> list[pafs.FileInfo]:
    return fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))


def prune_trial(fs: pafs.FileSystem, trial_path: str, keep: Keep, held: frozenset[str] = frozenset()) -> int:
    """Delete what an ended trial no longer needs: Tune's checkpoints beyond what ``keep`` and ``held`` ask for,
    stable.pt unless held, and any periodic checkpoint of the run's own left behind by a hand-over that was
    interrupted (Tune holds those bytes). best.pt always stays. Returns the bytes freed."""
    if keep == Keep.ALL:
        return 0
    entries = _children(fs, trial_path)
    tune_dirs = sorted(e.path for e in entries if e.type == pafs.FileType.Directory
                       and e.base_name.startswith(TUNE_CHECKPOINT_PREFIX))
    keep_newest = keep == Keep.LAST or "periodic" in held
    doomed_dirs = tune_dirs[:-1] if keep_newest else tune_dirs
    own = posixpath.join(trial_path, "checkpoints")
    doomed_files = [e for e in _children(fs, own) if e.type == pafs.FileType.File and _prunable(e.base_name, held)]
    freed = sum(_size(fs, d) for d in doomed_dirs) + sum(e.size or 0 for e in doomed_files)
    for directory in doomed_dirs:
        fs.delete_dir(directory)
    for entry in doomed_files:
        fs.delete_file(entry.path)
    return freed


def _prunable(name: str, held: frozenset[str]) -> bool:
    """Whether a file of the run's own checkpoints/ folder goes when its trial ends."""
    stem = name.removesuffix(".sha256")
    if stem == STABLE_NAME:
        return "stable" not in held
    return bool(PERIODIC.match(stem))


def _size(fs: pafs.FileSystem, directory: str) -> int:
    infos = fs.get_file_info(pafs.FileSelector(directory, recursive=True, allow_not_found=True))
    return sum(i.size or 0 for i in infos if i.type == pafs.FileType.File)


def prune_sweep(storage_path: str, sweep_name: str, keep: Keep) -> int:
    """A finished sweep: every trial keeps only what ``keep`` asks for (nothing is held for the search any more),
    and the staging folder goes. Returns the bytes freed."""
    fs, sweep = SweepStorage(storage_path, sweep_name).filesystem()
    freed = 0
    for entry in _children(fs, sweep):
        if entry.type != pafs.FileType.Directory:
            continue
        if entry.base_name == STAGING_DIR:
            freed += _size(fs, entry.path)
            fs.delete_dir(entry.path)
        else:
            freed += prune_trial(fs, entry.path, keep)
    return freed


def drop_staged_duplicates(sweep_dir: Path) -> int:
    """A sweep stopped before its end (a full disk, a signal): each checkpoint left in the staging folder that Tune
    holds too (the same file in the trial's checkpoint_NNNNNN/) goes, so a full disk is not kept full by two
    copies; one only there (written, not yet handed to Tune) stays for --resume. Returns the bytes freed."""
    freed = 0
    staging = Path(sweep_dir) / STAGING_DIR
    for folder in staging.glob("*") if staging.is_dir() else ():
        held = {p.name for p in (Path(sweep_dir) / folder.name).glob("checkpoint_*/*")}
        for path in folder.iterdir():
            if path.name in held and path.is_file():
                freed += path.stat().st_size if path.stat().st_nlink == 1 else 0  # (a hard link frees nothing)
                path.unlink()
    return freed


class CheckpointPruner(tune.Callback):
    """Prunes each trial as it ends (lmtune.sweep.retention.prune_trial), keeping what the search still holds
    for a trial of its outcome (the ledger's word for how it ended). An errored trial is left whole: Tune
    retries it, and --resume too, from its newest checkpoint."""

    def __init__(self, storage_path: str, keep: Keep, held: Callable[[str], frozenset[str]], sweep_dir):
        self.fs, _ = filesystem_of(storage_path)
        self.keep, self.held, self.sweep_dir = keep, held, sweep_dir
        self.freed = 0

    def __setstate__(self, state: dict[str, object]) -> None:
        # Restored by Tune on --resume (its experiment snapshot pickles the callback): the ledger of the folder this
        # driver resumes in.
        self.__dict__.update(state, sweep_dir=rebased(state["sweep_dir"], state["sweep_dir"]))

    def on_trial_complete(self, iteration: int, trials: list, trial, **info: Any) -> None:
        outcome = str(read_outcomes(self.sweep_dir).get(trial.trial_id, {}).get("outcome") or "")
        try:
            self.freed += prune_trial(self.fs, trial.path, self.keep, self.held(outcome))
        except OSError as err:  # a checkpoint that could not be deleted costs disk, not the sweep
            log.warning("could not prune trial %s's checkpoints (%s)", trial.trial_id, err)


class TuneResultsKept(tune.Callback):
    """A trial's Tune results (result.json, progress.csv) in storage kept when a resumed sweep starts it again.

    Tune's loggers write them on the driver and upload them over the stored ones; they fetch the stored ones
    first only for a trial restored from a checkpoint (ray/tune/logger/logger.py, ``_restore_from_remote``). A
    trial started again without one, because Tune's last snapshot predates its first checkpoint or because the
    ledger says it ended (it then returns at once, lmtune.sweep.trainable), had its stored results replaced by the
    new driver's file: begun again, or empty. Listed before Tune's loggers, this fetches them first; the loggers
    append to them."""

    def __init__(self, storage_path: str):
        self.fs, _ = filesystem_of(storage_path)

    def on_trial_start(self, iteration: int, trials: list, trial, **info: Any) -> None:
        for name in TUNE_RESULT_FILES:
            local = Path(trial.local_path, name)
            if local.exists():  # (this driver has written it already: a retry of the trial's)
                continue
            try:
                with self.fs.open_input_stream(posixpath.join(trial.path, name)) as stream:
                    stored = stream.read()
            except FileNotFoundError:  # (a trial's first start)
                continue
            except OSError as err:
                log.warning("could not fetch trial %s's stored %s (%s); the resumed trial's replaces it",
                            trial.trial_id, name, err)
                continue
            atomic_write_bytes(local, stored, mirror=False)
