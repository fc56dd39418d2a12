"""A sweep's own records on disk, readable without Ray.

    results/NAME/sweep.json                     what was run (SweepRecord), written at start and on resume
    results/NAME/decisions/trial_outcomes.json  why each trial ended (written by lmtune.sweep.stopping)
    results/NAME/decisions/asha_state.json      ASHA's rung records (PersistentASHA)
    results/NAME/<trial folder>/trial.json      which Tune trial a folder holds, and its parameters

The live decision files sit in a subfolder on purpose: when Ray restores an experiment it copies the
*.json files at the experiment's top level into its staging folder and uploads them back at every
snapshot (Ray 2.60, ``sync_down_experiment_state``, top level only), which would revert decisions
written since the restore. Shared by the sweep and by the readers (analyze, diagnose).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from lmtune.errors import LmtuneError
from lmtune.files import atomic_write_json

SWEEP_FILE = "sweep.json"
DECISIONS_DIR = "decisions"
LEDGER_NAME = "trial_outcomes.json"
ASHA_STATE_NAME = "asha_state.json"
TRIAL_FILE = "trial.json"


class Outcome(StrEnum):
    """Why a trial ended, as the ledger records it."""

    COMPLETED = "completed"  # trained its whole budget
    DIVERGED = "diverged"  # non-finite, or its loss exploded (the stopper)
    STOPPED_EARLY = "stopped_early"  # cut by ASHA at a rung
    TOO_SLOW = "too_slow"  # projected past the time budget, or under the throughput floor (the stopper)
    ERROR = "error"  # raised, and ran out of retries


@dataclass
class SweepRecord:
    """sweep.json: what a sweep ran, on which data and machine, with which versions."""

    name: str = ""
    space: dict[str, Any] = field(default_factory=dict)
    """The search space as validated (name, search, params, scheduler, stopper, num_trials, its YAML)."""
    budget: str = ""
    base_config: dict[str, Any] = field(default_factory=dict)
    """The RunConfig every trial starts from (budget + the space's fixed settings + --set)."""
    asha: dict[str, Any] | None = None
    """ASHA's resolved budget in tokens: max_t, grace_period, reduction_factor (None without ASHA)."""
    data: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    hardware: dict[str, Any] = field(default_factory=dict)
    resources_per_trial: dict[str, float] = field(default_factory=dict)
    max_concurrent: int | None = None
    time_budget_s: float | None = None
    address: str | None = None
    start_time: str = ""
    command: list[str] = field(default_factory=list)
    resumed_at: list[str] = field(default_factory=list)

    @property
    def num_trials(self) -> int | None:
        value = self.space.get("num_trials")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def write(self, sweep_dir: Path) -> None:
        atomic_write_json(Path(sweep_dir) / SWEEP_FILE, dataclasses.asdict(self))

    @classmethod
    def read(cls, sweep_dir: Path) -> SweepRecord:
        """sweep.json of ``sweep_dir``; keys it does not know are ignored, missing ones take defaults."""
        path = Path(sweep_dir) / SWEEP_FILE
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise LmtuneError(f"{sweep_dir} is not an lmtune sweep (no {SWEEP_FILE}); give results/NAME, a folder "
                              "written by python -m lmtune.run") from None
        except (OSError, ValueError) as err:
            raise LmtuneError(f"{path} (the sweep's record) is unreadable ({type(err).__name__}: {err}); "
                              "restore it or re-run the sweep") from None
        if not isinstance(raw, dict):
            raise LmtuneError(f"{path} is not a JSON object; restore it or re-run the sweep")
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})


def is_sweep_dir(path: Path) -> bool:
    return (Path(path) / SWEEP_FILE).is_file()


def decisions_dir(sweep_dir: Path) -> Path:
    return Path(sweep_dir) / DECISIONS_DIR


def ledger_path(sweep_dir: Path) -> Path:
    return decisions_dir(sweep_dir) / LEDGER_NAME


def asha_state_path(sweep_dir: Path) -> Path:
    return decisions_dir(sweep_dir) / ASHA_STATE_NAME


def read_outcomes(sweep_dir: Path) -> dict[str, dict[str, Any]]:
    """The ledger: trial id -> {outcome, reason, step, tokens, time}. Sweeps written before lmtune kept
    it at the top of the sweep folder; that copy is read when there is no other."""
    for path in (ledger_path(sweep_dir), Path(sweep_dir) / LEDGER_NAME):
        if path.exists():
            try:
                return json.loads(path.read_text())
            except (OSError, ValueError) as err:
                raise LmtuneError(f"{path} (the trial outcome ledger) is unreadable ({type(err).__name__}: "
                                  f"{err}); restore it or re-run the sweep") from None
    return {}


# ---------------------------------------------------------------------------------------------
# Trial folders


def write_trial_file(out_dir: Path, trial_id: str, params: dict[str, Any]) -> None:
    """trial.json: the trial a folder holds, written by the trial itself when it starts."""
    atomic_write_json(Path(out_dir) / TRIAL_FILE, {"trial_id": trial_id, "params": params})


@dataclass
class TrialFolder:
    """One trial's folder in a sweep, as the readers see it."""

    path: Path
    trial_id: str
    params: dict[str, Any]

    def read_json(self, name: str) -> dict[str, Any]:
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
    has not started yet holds neither and is left out.
    """
    found = []
    for path in sorted(p for p in Path(sweep_dir).iterdir() if p.is_dir()):
        trial_id = trial_id_in(path)
        if trial_id:
            own = _read_json(path / TRIAL_FILE)
            params = own.get("params") if own.get("trial_id") else _read_json(path / "params.json")
            found.append(TrialFolder(path, trial_id, dict(params or {})))
    return found


def trial_id_in(folder: Path) -> str | None:
    """The Tune trial id of a trial folder: its trial.json, else (older sweeps) Ray's result.json."""
    own = _read_json(Path(folder) / TRIAL_FILE).get("trial_id")
    return str(own) if own else _first_result_trial_id(Path(folder))


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _first_result_trial_id(folder: Path) -> str | None:
    try:
        with (folder / "result.json").open() as handle:
            first = handle.readline()
        trial_id = json.loads(first).get("trial_id") if first.strip() else None
    except (OSError, ValueError, AttributeError):
        return None
    return trial_id if isinstance(trial_id, str) and trial_id else None
