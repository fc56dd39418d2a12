"""A sweep's own files on disk, readable without Ray: sweep.json (what was run) and the ledger
trial_outcomes.json (why each trial ended), and how a trial folder maps to its Tune trial id.

Shared by the sweep (run, stopper) and by the readers (analyze, diagnose), which must not import Ray.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from lmtune.checkpoint import atomic_write_text

SWEEP_FILE = "sweep.json"
LEDGER_NAME = "trial_outcomes.json"


def is_sweep_dir(path: Path) -> bool:
    return (Path(path) / SWEEP_FILE).is_file()


def read_outcomes(sweep_dir: Path) -> dict[str, dict[str, Any]]:
    path = Path(sweep_dir) / LEDGER_NAME
    return json.loads(path.read_text()) if path.exists() else {}


def record_outcome(ledger: Path, trial_id: str, outcome: str, reason: str, *, overwrite: bool = True,
                   **details: Any) -> None:
    """Write why a trial ended; the first decision wins unless ``overwrite``."""
    entries = json.loads(ledger.read_text()) if ledger.exists() else {}
    if trial_id in entries and not overwrite:
        return
    entries[trial_id] = {"outcome": outcome, "reason": reason, "time": time.time(), **details}
    atomic_write_text(ledger, json.dumps(entries, indent=2, default=float))


def trial_id_of(folder: Path, known_ids: list[str]) -> str:
    """The Tune trial id of a trial folder ``{trial_id}_{param}={value}_...`` (the id has an underscore)."""
    for trial_id in sorted(known_ids, key=len, reverse=True):
        if folder.name == trial_id or folder.name.startswith(trial_id + "_"):
            return trial_id
    try:
        with (folder / "result.json").open() as handle:
            first = handle.readline()
        trial_id = json.loads(first).get("trial_id") if first.strip() else None
        if isinstance(trial_id, str) and trial_id:
            return trial_id
    except (OSError, ValueError, AttributeError):
        pass
    parts = folder.name.split("_")
    return "_".join(parts[:2]) if len(parts) >= 2 else folder.name
