"""An intact copy of Ray Tune's experiment state, for a --resume after the sweep was killed mid-write.

Ray 2.60 writes its experiment snapshot (experiment_state-*.json, the search generator's and searcher's state
beside it) with a plain ``open(..., "w")`` in its staging folder and then copies it into the experiment folder:
neither step is atomic. A sweep killed while the copy runs (``kill -9``, an OOM kill, a power cut) leaves a file
cut short, and ``Tuner.restore`` then logs "Failed to restore the run state" and starts the experiment anew over
the old one. So the driver keeps the newest copy of each file that reads whole in decisions/ray_state/ (written
atomically), and a resume first puts back any of Ray's files that is cut short. Only a sweep in a filesystem path
needs it: an object store takes a file whole or not at all.
"""

from __future__ import annotations

import json
import logging
import pickletools
from pathlib import Path
from typing import Any

from ray import tune

from lmtune.errors import LmtuneError
from lmtune.files import atomic_write_bytes
from lmtune.searches.state import decisions_dir

log = logging.getLogger(__name__)

BACKUP_DIR = "ray_state"
# Ray's snapshot files at the experiment's top level (its tuner.pkl, written once at the start, included).
# sweep.json is lmtune's own, written atomically.
RAY_STATE_SUFFIXES = (".json", ".pkl")
LMTUNE_TOP_LEVEL = ("sweep.json",)
PICKLE_PROTO = b"\x80"  # the first byte of every pickle of protocol 2 or later


def backup_dir(sweep_dir: Path) -> Path:
    return decisions_dir(sweep_dir) / BACKUP_DIR


def ray_state_files(folder: Path) -> list[Path]:
    """Ray's snapshot files at the top level of ``folder`` (an experiment folder, or the backup folder)."""
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
    """After each step of Tune's loop, copies each of Ray's snapshot files that changed since its last copy and
    reads whole into decisions/ray_state/. A file caught while Ray still copies it is taken at a later step."""

    def __init__(self, sweep_dir: Path):
        self.sweep_dir = Path(sweep_dir)
        self._copied: dict[str, tuple[int, int]] = {}  # file name -> (mtime_ns, size) of the copy kept

    def __getstate__(self) -> dict[str, Any]:
        return {"sweep_dir": str(self.sweep_dir)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Restored by Tune on --resume: the folder this driver resumes in (lmtune.sweep.record.rebased).
        from lmtune.sweep.record import rebased

        sweep_dir = Path(state["sweep_dir"])
        self.sweep_dir, self._copied = rebased(sweep_dir, sweep_dir) or sweep_dir, {}

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        self.keep()

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        self.keep()

    def keep(self) -> None:
        for path in ray_state_files(self.sweep_dir):
            try:
                stat = path.stat()
            except OSError:
                continue
            seen = (stat.st_mtime_ns, stat.st_size)
            if self._copied.get(path.name) == seen:
                continue
            data = whole(path)
            if data is not None:
                atomic_write_bytes(backup_dir(self.sweep_dir) / path.name, data, mirror=False)
                self._copied[path.name] = seen


def repair_ray_state(sweep_dir: Path) -> list[str]:
    """Put back from decisions/ray_state/ each of Ray's snapshot files in ``sweep_dir`` that is cut short; the
    names put back. Refused in one line when one is cut short and no whole copy of it was kept."""
    sweep_dir = Path(sweep_dir)
    repaired = []
    for path in ray_state_files(sweep_dir):
        if whole(path) is not None:
            continue
        name, kept = path.name, backup_dir(sweep_dir) / path.name
        copy = whole(kept) if kept.is_file() else None
        if copy is None:
            raise LmtuneError(f"--resume: Ray's experiment state {path} is cut short (the sweep was "
                              "killed while Ray wrote it) and no whole copy of it was kept; analyze the sweep as it "
                              "is (python -m lmtune.analyze), or start a new one")
        atomic_write_bytes(path, copy, mirror=False)
        repaired.append(name)
    if repaired:
        log.warning("Ray's experiment state was cut short when the sweep was killed; put back its newest whole copy "
                    "(%s): trials that ended since then stay ended (the ledger)", ", ".join(repaired))
    return repaired
