"""A whole, consistent copy of Ray Tune's experiment state, for a --resume after the sweep was killed mid-write.

Ray 2.60 saves its experiment snapshot (experiment_state-*.json, the search generator's and searcher's state beside
it) into a staging folder on the driver with plain ``open(..., "w")``, then copies that folder into the experiment
folder in the background, file by file: nothing is atomic. A sweep killed while the copy runs (``kill -9``, an OOM
kill, a power cut) leaves a file cut short, or files of two different saves side by side. ``Tuner.restore`` then
logs "Failed to restore the run state" and starts the experiment anew over the old one, or restores a generator
that has already made trials the experiment state does not list (they never run).

So after each step of Tune's loop, when Ray saved in it, the driver copies the whole save, taken from the staging
folder (the save is complete there: it was written in the same step, by this thread) into one new folder,
decisions/ray_state/snapshot-N/, renamed into place once written; and a resume puts that set back over Ray's files
when one of them is cut short, or when they mix two saves. Only a sweep in a filesystem path needs it: an object
store takes a file whole or not at all.

Tune keeps one checkpoint per trial and deletes a trial's older one before the save that names the newer one: a
snapshot put back may name a checkpoint deleted since, and the trial would fail ("Could not recover from checkpoint
as it does not exist on storage anymore", Ray's Trainable.restore). So each set also holds hard links to the
running trials' Tune checkpoints of its moment (no bytes stored twice), and a resume puts back any of them Tune has
deleted since: the trial continues from the checkpoint the snapshot names.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import logging
import os
import pickletools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ray import tune

from lmtune.errors import LmtuneError
from lmtune.files import FULL_DISK_ERRNOS, DiskFullError, atomic_write_bytes, link_or_copy, remove_tree
from lmtune.private_apis import experiment_staging_dir
from lmtune.searches.state import decisions_dir

log = logging.getLogger(__name__)

BACKUP_DIR = "ray_state"
SET_PREFIX = "snapshot-"
CHECKPOINT_LINKS = "checkpoints"  # in a set: TRIAL_FOLDER/checkpoint_NNNNNN/, hard links to Tune's files
TUNE_CHECKPOINT_GLOB = "checkpoint_*"
EXPERIMENT_STATE_GLOB = "experiment_state-*.json"
ENDED_STATUSES = ("TERMINATED", "ERROR")  # (Tune's Trial.status of a trial that will not run again)
# Ray's snapshot files at the experiment's top level (its tuner.pkl, written once at the start, included).
# sweep.json is lmtune's own, written atomically.
RAY_STATE_SUFFIXES = (".json", ".pkl")
LMTUNE_TOP_LEVEL = ("sweep.json",)
PICKLE_PROTO = b"\x80"  # the first byte of every pickle of protocol 2 or later


def backup_dir(sweep_dir: Path) -> Path:
    return decisions_dir(sweep_dir) / BACKUP_DIR


def ray_state_files(folder: Path) -> list[Path]:
    """Ray's snapshot files at the top level of ``folder`` (an experiment folder, its staging folder, or a set)."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.suffix in RAY_STATE_SUFFIXES and not p.name.startswith(".")
                  and p.name not in LMTUNE_TOP_LEVEL and p.is_file())


def whole(path: Path) -> bytes | None:
    """The file's bytes when it reads whole (a pickle whose opcodes run to their STOP, walked without building any
    object; else JSON that parses), else None. Ray names some pickles *.json (basic-variant-state-*.json)."""
    try:
        data = path.read_bytes()
        if data.startswith(PICKLE_PROTO):
            for _ in pickletools.genops(data):
                pass
        else:
            json.loads(data)
    except (OSError, ValueError, EOFError):
        return None
    return data if data else None


class RayStateBackup(tune.Callback):
    """After each step of Tune's loop in which Ray saved its experiment state, the whole save as one set in
    decisions/ray_state/ (the newest only), with links to the running trials' Tune checkpoints."""

    def __init__(self, sweep_dir: Path):
        self.sweep_dir = Path(sweep_dir)
        self._saved: tuple[int, int] | None = None  # (mtime_ns, size) of the experiment state last copied
        self._sets = 0

    def __getstate__(self) -> dict[str, Any]:
        return {"sweep_dir": str(self.sweep_dir)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Restored by Tune on --resume: the folder this driver resumes in (lmtune.sweep.record.rebased).
        from lmtune.sweep.record import rebased

        sweep_dir = Path(state["sweep_dir"])
        self.__init__(rebased(sweep_dir, sweep_dir) or sweep_dir)

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        self.keep(experiment_staging_dir(trials), trials)

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        self.keep(experiment_staging_dir(trials), trials)  # (Tune's last save came after the last step)

    def keep(self, staging: Path | None, trials: Sequence[Any] = ()) -> None:
        """Copy Ray's save from its ``staging`` folder when it changed, with links to the Tune checkpoints of the
        ``trials`` (Tune's, as its callbacks get them) that have not ended."""
        if staging is None or not (states := sorted(staging.glob(EXPERIMENT_STATE_GLOB))):
            return  # (no trial yet: nothing to resume)
        stat = states[-1].stat()
        if self._saved == (stat.st_mtime_ns, stat.st_size):
            return
        files = {p.name: whole(p) for p in ray_state_files(staging)}
        if any(data is None for data in files.values()):
            return  # (not a save of Ray's as it writes them: taken at a later step)
        running = [Path(t.path).name for t in trials if getattr(t, "status", None) not in ENDED_STATUSES]
        self._sets += 1
        write_set(self.sweep_dir, files, running, self._sets)
        self._saved = (stat.st_mtime_ns, stat.st_size)


def write_set(sweep_dir: Path, files: dict[str, bytes], trial_folders: Sequence[str], number: int) -> Path:
    """``files`` and links to the Tune checkpoints in ``trial_folders`` as the newest set; older sets go. A full disk
    raises DiskFullError (the set's bytes; the set cut short removed, the older one kept)."""
    root = backup_dir(sweep_dir)
    name = f"{SET_PREFIX}{os.getpid()}-{number:08d}"
    building = root / f".{name}"
    try:
        remove_tree(building)
        building.mkdir(parents=True)
        for file_name, data in files.items():
            (building / file_name).write_bytes(data)  # (the folder is renamed into place once whole)
        for folder in trial_folders:
            for checkpoint in (sweep_dir / folder).glob(TUNE_CHECKPOINT_GLOB):
                if checkpoint.is_dir():
                    link_tree(checkpoint, building / CHECKPOINT_LINKS / folder / checkpoint.name)
        building.rename(root / name)
    except OSError as err:
        remove_tree(building)
        if err.errno in FULL_DISK_ERRNOS:
            raise DiskFullError(root / name, sum(map(len, files.values()))) from err
        raise
    for older in root.iterdir():
        if older.name == name:
            continue
        if older.is_dir():
            remove_tree(older)
        else:
            older.unlink(missing_ok=True)
    return root / name


def newest_set(sweep_dir: Path) -> Path | None:
    sets = [p for p in backup_dir(sweep_dir).glob(f"{SET_PREFIX}*") if p.is_dir()]
    return max(sets, key=lambda p: p.stat().st_mtime_ns) if sets else None


def link_tree(source: Path, target: Path) -> None:
    """Each file under ``source`` that ``target`` lacks, linked there (files vanished meanwhile are skipped)."""
    for path in source.rglob("*"):
        to = target / path.relative_to(source)
        if path.is_file() and not to.exists():
            with contextlib.suppress(FileNotFoundError):  # (Tune deleted it as we went)
                link_or_copy(path, to)


def repair_ray_state(sweep_dir: Path) -> list[str]:
    """Before a resume: the newest kept set put back over Ray's snapshot files where they differ from it (cut short,
    half copied, or a save behind), and the Tune checkpoints it names that were deleted since; the file names put
    back. A set older than Ray's newest session (a resumed sweep killed before its first save) is left alone. Refused
    in one line when a file is cut short and no set holds it."""
    sweep_dir = Path(sweep_dir)
    kept = newest_set(sweep_dir)
    ours = {p.name: p.read_bytes() for p in ray_state_files(kept)} if kept else {}
    theirs = {p.name: whole(p) for p in ray_state_files(sweep_dir)}
    cut = [name for name, data in theirs.items() if data is None]
    if missing := [name for name in cut if name not in ours]:
        raise LmtuneError(f"--resume: Ray's experiment state {sweep_dir / missing[0]} is cut short (the sweep was "
                          "killed while Ray wrote it) and no whole copy of it was kept; analyze the sweep as it "
                          "is (python -m lmtune.analyze), or start a new one")
    current = bool(ours) and newest_state(ours) >= newest_state(theirs)
    put_back = sorted(name for name, data in ours.items() if theirs.get(name) != data) if current else []
    for name in put_back:
        atomic_write_bytes(sweep_dir / name, ours[name], mirror=False)
    if put_back:
        log.warning("Ray's experiment state was %s when the sweep was killed; put back the newest save lmtune kept "
                    "(%s): trials that ended since then stay ended (the ledger)",
                    "cut short" if cut else "not yet copied whole", ", ".join(put_back))
    if current and (restored := restore_checkpoints(sweep_dir, kept)):
        log.warning("put back %d Tune checkpoint(s) deleted after Ray's save named them (%s): those trials continue "
                    "from there", len(restored), ", ".join(restored))
    return put_back


def newest_state(files: dict[str, Any]) -> str:
    """The name of the newest experiment state among ``files`` (names end in their session's start time)."""
    return max((name for name in files if fnmatch.fnmatch(name, EXPERIMENT_STATE_GLOB)), default="")


def restore_checkpoints(sweep_dir: Path, kept: Path) -> list[str]:
    """Each Tune checkpoint linked in the set ``kept`` whose original is gone, linked back into its trial's folder;
    their paths in the sweep."""
    put_back = []
    for linked in sorted((kept / CHECKPOINT_LINKS).glob(f"*/{TUNE_CHECKPOINT_GLOB}")):
        original = sweep_dir / linked.parent.name / linked.name
        if original.parent.is_dir() and not original.exists():
            link_tree(linked, original)
            put_back.append(f"{linked.parent.name}/{linked.name}")
    return put_back
