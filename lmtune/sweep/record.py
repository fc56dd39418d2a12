"""A sweep's own records on disk, readable without Ray.

    results/NAME/sweep.json                     what was run (lmtune.sweep.sweep_file.SweepRecord), written at start
                                                and on resume
    results/NAME/decisions/trial_outcomes.json  why each trial ended (written by lmtune.sweep.stopping's
                                                OutcomeRecorder)
    results/NAME/decisions/asha_state.json      ASHA's rung records (lmtune.sweep.asha_scheduler.PersistentASHA)
    results/NAME/decisions/edge_search.json     the edge search's state and decisions (search: edge)
    results/NAME/decisions/horizon_search.json  the horizon search's state and decisions (search: horizon)
    results/NAME/decisions/width_search.json    the width search's state and decisions (search: width)
    results/NAME/<trial folder>/trial.json      which Tune trial a folder holds, and its parameters
    results/NAME/.lmtune.lock                   held by the one process writing the sweep (its pid inside)

The live decision files sit in a subfolder on purpose: when Ray restores an experiment it copies the
*.json files at the experiment's top level into its staging folder and uploads them back at every
snapshot (Ray 2.60, ``sync_down_experiment_state``, top level only), which would revert decisions
written since the restore. Shared by the sweep and by the readers (analyze, diagnose).
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from lmtune.analysis.runs import Outcome
from lmtune.errors import LmtuneError
from lmtune.files import LOCK_FILE, JsonObject, atomic_write_json, remove_tree, writer_lock
from lmtune.searches.state import decisions_dir
from lmtune.searches.trial_order import ORDER_KEYS, TuneParams
from lmtune.training.checkpoint import checkpoint_step, periodic_checkpoints

log = logging.getLogger(__name__)

SWEEP_FILE = "sweep.json"
LEDGER_NAME = "trial_outcomes.json"
ASHA_STATE_NAME = "asha_state.json"
TRIAL_FILE = "trial.json"
# Periodic checkpoints on their way to Tune (lmtune.sweep.trainable.staging_dir); Tune keeps each in the trial
# folder's checkpoint_NNNNNN/ (a fused group's: one subfolder per member, named as the member's folder).
STAGING_DIR = ".staging"
TUNE_CHECKPOINT_GLOB = "checkpoint_*"
# Every trial parameter that says how a search ran a trial (its order's own keys, its seed, its probe's length),
# not which hyperparameters it compares.
BOOKKEEPING_PARAMS = (*ORDER_KEYS, "seed", "run_steps")




# The folder a resumed sweep's driver keeps its records in (set by lmtune.sweep.runner before Tune restores the
# experiment): the ledger's writer, ASHA and the searcher come back from Tune's pickles holding the first driver's
# paths, which on a new head or a laptop do not exist, and take this folder instead (``rebased``).
_RESUMED_SWEEP_DIR: list[Path] = []


@contextlib.contextmanager
def resuming_in(sweep_dir: Path) -> Iterator[None]:
    _RESUMED_SWEEP_DIR.append(Path(sweep_dir))
    try:
        yield
    finally:
        _RESUMED_SWEEP_DIR.pop()


def rebased(path: Path | None, sweep_dir: Path | None) -> Path | None:
    """``path`` (inside ``sweep_dir``, the folder a pickled object was made for) in the folder of the sweep now
    being resumed, if one is."""
    if path is None or sweep_dir is None or not _RESUMED_SWEEP_DIR:
        return path
    try:
        return _RESUMED_SWEEP_DIR[-1] / Path(path).relative_to(sweep_dir)
    except ValueError:
        return path




def is_sweep_dir(path: Path) -> bool:
    return (Path(path) / SWEEP_FILE).is_file()


@contextlib.contextmanager
def sole_writer(sweep_dir: Path, *, new: bool) -> Iterator[threading.Event]:
    """This process alone writes ``sweep_dir`` while the block runs (a run, or a resume).

    An exclusive ``flock`` on results/NAME/.lmtune.lock: the OS releases it when the process ends,
    however it ends, so a SIGKILLed driver never leaves a stale lock; a second writer is refused in
    one line naming the holder's pid. Readers (analyze, diagnose) never take it. ``new``: create the
    folder first, refused when it exists (also when a run with the same --name made it a moment ago);
    a new folder (and the empty folders above it it made) is removed again unless the run set the event the block
    gets (the sweep started: Tune runs it), so a start that failed (a refusal, an unreachable store, a signal
    during set-up) leaves no folder to block the name.
    """
    sweep_dir = Path(sweep_dir)
    made = [p for p in (sweep_dir, *sweep_dir.parents) if not p.exists()]  # (results/ too, on a first run)
    if new:
        try:
            sweep_dir.mkdir(parents=True)
        except FileExistsError:
            raise LmtuneError(f"{sweep_dir} already exists; pass --resume to continue it or choose another "
                              "--name") from None
    started = threading.Event()
    try:
        with writer_lock(sweep_dir, lambda pid: f"{sweep_dir} is being written by another lmtune run (pid {pid}); "
                                                "wait for it to end, or stop it, before you run or resume this sweep"):
            yield started
    finally:
        if new and not started.is_set():
            remove_tree(sweep_dir)
            for folder in made[1:]:  # the folders above it this start made, where nothing else was put since
                with contextlib.suppress(OSError):
                    folder.rmdir()




def running_writer(sweep_dir: Path) -> str | None:
    """The pid of the process writing ``sweep_dir`` now (the one holding its lock: a run or a resume), or None. The
    lock is looked at, not taken, and nothing is written (a folder never written by a run has no lock file)."""
    import fcntl  # POSIX only, as Ray's local clusters are

    try:
        handle = open(Path(sweep_dir) / LOCK_FILE)  # noqa: SIM115 - closed below
    except OSError:
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)  # (refused while a writer holds it exclusively)
        except BlockingIOError:
            return handle.read().strip() or "unknown"
        fcntl.flock(handle, fcntl.LOCK_UN)
    return None


def ledger_path(sweep_dir: Path) -> Path:
    return decisions_dir(sweep_dir) / LEDGER_NAME


def asha_state_path(sweep_dir: Path) -> Path:
    return decisions_dir(sweep_dir) / ASHA_STATE_NAME


def read_outcomes(sweep_dir: Path) -> dict[str, JsonObject]:
    """The ledger: trial id -> {outcome, reason, step, tokens, time}. Sweeps written before lmtune kept
    it at the top of the sweep folder; that copy is read when there is no other.

    A ledger that is not valid JSON, or not a mapping of trial ids to entries with a known outcome, is
    reported in a warning and its unusable part ignored: readers then go by the trials' own files.
    """
    for path in (ledger_path(sweep_dir), Path(sweep_dir) / LEDGER_NAME):
        if path.exists():
            return _valid_entries(path)
    return {}


def _valid_entries(path: Path) -> dict[str, JsonObject]:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        log.warning("ignoring the trial outcome ledger %s (%s: %s); trial outcomes come from the trials' own "
                    "files", path, type(err).__name__, err)
        return {}
    if not isinstance(raw, dict):
        log.warning("ignoring the trial outcome ledger %s: a JSON %s, not a mapping of trial ids", path,
                    type(raw).__name__)
        return {}
    known = {str(o) for o in Outcome}
    valid = {k: v for k, v in raw.items() if isinstance(v, dict) and v.get("outcome") in known}
    if len(valid) < len(raw):
        log.warning("ignoring %d malformed entries of the trial outcome ledger %s", len(raw) - len(valid), path)
    return valid


# ---------------------------------------------------------------------------------------------
# Trial folders


def write_trial_file(out_dir: Path, trial_id: str, params: TuneParams, group: str | None = None,
                     continued_from_tokens: int | None = None) -> None:
    """trial.json: the trial a folder holds, written by the trial itself when it starts; ``group``: the
    fused trial it is a member of; ``continued_from_tokens``: where the run it continues had stopped (its
    first rows are that run's, copied, and not trained again)."""
    atomic_write_json(Path(out_dir) / TRIAL_FILE, {
        "trial_id": trial_id, "params": params, **({"group": group} if group else {}),
        **({"continued_from_tokens": continued_from_tokens} if continued_from_tokens else {})})


@dataclass
class TrialFolder:
    """One trial's folder in a sweep, as the readers see it."""

    path: Path
    trial_id: str
    params: JsonObject
    """The trial's Tune params as its trial.json (or, older sweeps, Ray's params.json) records them."""
    continued_from_tokens: int = 0
    """A continued run: the tokens its first rows (copied from the run it continues) stand for."""

    def periodic_checkpoints(self) -> list[Path]:
        """The run's periodic checkpoints, oldest first, wherever they are kept: Tune's checkpoint folders (its
        own, or its fused group's subfolder named after it) and the run's own checkpoints/ (a run outside Tune)."""
        member = glob.escape(self.path.name)
        found = [*periodic_checkpoints(self.path / "checkpoints"),
                 *self.path.glob(f"{TUNE_CHECKPOINT_GLOB}/step_*.pt"),
                 *self.path.parent.glob(f"*/{TUNE_CHECKPOINT_GLOB}/{member}/step_*.pt")]
        return sorted(found, key=lambda p: (checkpoint_step(p), str(p)))

    def read_json(self, name: str) -> JsonObject:
        """One of the trial's JSON files (config.json, summary.json); {} while missing or half-written."""
        try:
            value = json.loads((self.path / name).read_text())
        except (OSError, ValueError):
            return {}
        return value if isinstance(value, dict) else {}


def trial_folders(sweep_dir: Path) -> list[TrialFolder]:
    """Every folder of ``sweep_dir`` a trial has started in, by name.

    The trial id comes from the trial's own trial.json; folders of sweeps written before lmtune wrote
    one are read from Ray's result.json and params.json instead. A folder Ray made for a trial that
    has not started yet holds neither and is left out, and so is a fused trial's own folder: its
    members, each in a folder of its own, are the trials. Only the sweep's own folders are walked (own_folders):
    none through a link, none of a sweep inside it.
    """
    found = []
    for path in own_folders(Path(sweep_dir)):
        trial_id = trial_id_in(path)
        own = read_json_object(path / TRIAL_FILE)
        params = own.get("params") if own.get("trial_id") else read_json_object(path / "params.json")
        if trial_id and "members" not in own and "members" not in (params or {}):
            found.append(TrialFolder(path, trial_id, dict(params or {}), int(own.get("continued_from_tokens") or 0)))
    return found


def own_folders(folder: Path) -> list[Path]:
    """The folders directly in ``folder`` that are its own, by name: not a link (``up -> ..``, or a second name for
    one of its trials, which would be read twice), and not a sweep (a sweep stored inside another is not its
    trials)."""
    return sorted(p for p in Path(folder).iterdir() if not p.is_symlink() and p.is_dir() and not is_sweep_dir(p))


def readable_trial(folder: Path) -> bool:
    """Whether a trial folder holds a readable config.json (its budget and settings); one without is warned about
    and left out (not counted as running) by analyze and diagnose alike."""
    if read_json_object(Path(folder) / "config.json"):
        return True
    problem = "unreadable config.json" if (Path(folder) / "config.json").is_file() else "no config.json"
    log.warning("%s: unreadable trial folder (%s); left out of the sweep's trials, not counted as running",
                folder, problem)
    return False


def trial_id_in(folder: Path) -> str | None:
    """The Tune trial id of a trial folder: its trial.json, else (older sweeps) Ray's result.json."""
    own = read_json_object(Path(folder) / TRIAL_FILE).get("trial_id")
    return str(own) if own else _first_result_trial_id(Path(folder))




def read_json_object(path: Path) -> JsonObject:
    """A JSON object file; {} while missing, half-written or not an object."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def tune_ended(folder: Path) -> bool:
    """Whether Ray Tune's result.json says the trial in ``folder`` is done (its last result has done: true)."""
    try:
        with (Path(folder) / "result.json").open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 65536))
            lines = handle.read().decode("utf-8", "replace").strip().splitlines()
        return bool(lines) and json.loads(lines[-1]).get("done") is True
    except (OSError, ValueError, AttributeError):
        return False


def _first_result_trial_id(folder: Path) -> str | None:
    try:
        with (folder / "result.json").open() as handle:
            first = handle.readline()
        trial_id = json.loads(first).get("trial_id") if first.strip() else None
    except (OSError, ValueError, AttributeError):
        return None
    return trial_id if isinstance(trial_id, str) and trial_id else None
