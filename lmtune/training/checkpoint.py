"""Atomic, verifiable checkpoints, and the Checkpointer a training run saves and resumes through.

A checkpoint is one file ``step_XXXXXXXX.pt`` written to a temp name, fsynced and renamed, with a
sidecar ``.sha256`` written the same way afterwards: a file without a matching checksum is
incomplete or corrupt and is never loaded. Loading uses ``torch.load(weights_only=True)``, so a
checkpoint file can never execute code.
"""

from __future__ import annotations

import hashlib
import io
import logging
import pickle
import re
import shlex
from pathlib import Path
from typing import TypedDict

import torch

from lmtune.errors import LmtuneError, first_line
from lmtune.files import DiskFullError, JsonObject, atomic_write_bytes, atomic_write_text, full_disk, plain
from lmtune.training.config import RunConfig
from lmtune.training.metrics import Row
from lmtune.training.state import TrainState, TrainStateDict, check_same_parameters

log = logging.getLogger(__name__)

PERIODIC = re.compile(r"^step_(\d{8})\.pt$")
BEST_NAME = "best.pt"
# A WSD run's state where its stable phase ends (TrainConfig.fork_step): a longer budget continues from it.
STABLE_NAME = "stable.pt"


class SamplerPosition(TypedDict):
    """Where the batch sampler stands: its stream is a function of the seed and the step."""

    seed: int
    """The run's seed."""
    next_step: int
    """The step whose batch comes next."""


class RunCheckpoint(TrainStateDict):
    """A periodic checkpoint (or stable.pt): everything a resume or a fork needs."""

    sampler: SamplerPosition
    """Where the batch sampler stands."""
    history: list[Row]
    """The metrics rows so far (what metrics.csv held when it was written)."""
    config: JsonObject
    """The run's config (RunConfig.to_dict: its JSON form)."""


class BestCheckpoint(TypedDict):
    """best.pt: the model alone, at the lowest validation loss."""

    model: dict[str, torch.Tensor]
    """The model's state_dict."""
    step: int
    """The step it was saved at."""
    val_loss: float
    """Its validation loss."""
    config: JsonObject
    """The run's config (RunConfig.to_dict: its JSON form)."""


Checkpoint = RunCheckpoint | BestCheckpoint


def checksum_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def save_checkpoint(state: Checkpoint, path: Path) -> Path:
    buffer = io.BytesIO()
    torch.save(plain(state), buffer)
    data = buffer.getvalue()
    atomic_write_bytes(path, data)
    atomic_write_text(checksum_path(path), hashlib.sha256(data).hexdigest() + "\n")
    return path


def load_checkpoint(path: Path) -> Checkpoint:
    """Load a verified checkpoint; raises ValueError when it is incomplete or corrupt."""
    data = Path(path).read_bytes()
    expected = checksum_path(path)
    if not expected.exists():
        raise ValueError(f"{path}: no checksum file (incomplete write)")
    if hashlib.sha256(data).hexdigest() != expected.read_text().strip():
        raise ValueError(f"{path}: checksum mismatch (truncated or corrupted)")
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def periodic_checkpoints(directory: Path) -> list[Path]:
    """Periodic checkpoints in ``directory``, oldest first."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if PERIODIC.match(p.name))


def periodic_path(directory: Path, step: int) -> Path:
    return directory / f"step_{step:08d}.pt"


def rotate(directory: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` periodic checkpoints."""
    for old in periodic_checkpoints(directory)[:-keep]:
        old.unlink(missing_ok=True)
        checksum_path(old).unlink(missing_ok=True)


def disk_full_in_run(err: BaseException, out_dir: Path) -> DiskFullError | None:
    """The full disk that stopped ``lmtune train`` into ``out_dir`` (None: ``err`` is no full disk), with the run's way
    on: --resume from its newest checkpoint written whole, or, where none was, a new start."""
    if (full := full_disk(err, out_dir)) is None:
        return None
    whole = [p for p in periodic_checkpoints(Path(out_dir) / "checkpoints") if checksum_path(p).exists()]
    if whole:
        command = shlex.join(["python", "-m", "lmtune.train", "--resume", "--out", str(out_dir)])
        fix = f"free space, then continue the run from its step {checkpoint_step(whole[-1])} checkpoint: {command}"
    else:
        fix = f"free space, then train again: no checkpoint was written yet to resume from (delete {out_dir}, or " \
              "give another --out)"
    return DiskFullError(full.path, full.size, fix=fix)


def checkpoint_step(path: Path) -> int:
    """The step a periodic checkpoint's file name holds."""
    return int(PERIODIC.match(path.name).group(1))


def load_latest(directory: Path) -> tuple[Checkpoint, Path] | None:
    """The newest checkpoint in ``directory`` that verifies; corrupt or partial ones are logged and skipped."""
    return load_newest(periodic_checkpoints(directory))


def load_newest(candidates: list[Path],
                failures: list[tuple[Path, BaseException]] | None = None) -> tuple[Checkpoint, Path] | None:
    """The newest of ``candidates`` (periodic checkpoints, oldest first) that verifies; each one skipped is warned
    of, or added to ``failures`` where given (the caller says what it makes of them)."""
    for candidate in reversed(candidates):
        try:
            return load_checkpoint(candidate), candidate
        # UnpicklingError: a file whose checksum matches but that torch.load refuses (corrupt before
        # it was hashed, or holding objects weights_only=True will not build) is unusable too.
        except (ValueError, RuntimeError, EOFError, OSError, pickle.UnpicklingError) as err:
            if failures is None:
                log.warning("skipping unusable checkpoint %s: %s", candidate, why_unusable(err))
            else:
                failures.append((candidate, err))
    return None


def why_unusable(err: BaseException) -> str:
    """Why a checkpoint did not load, in one line: torch's weights_only refusal spans a dozen lines, whose own
    reason is the one naming the object it would not build."""
    for line in str(err).splitlines():
        if "WeightsUnpickler error:" in line:
            reason = line.split(":", 1)[1].split(". Please")[0].strip()
            return f"torch.load(weights_only=True) refused it: {reason[:200]}"
    return re.sub(r"\x1b\[[0-9;]*m", "", first_line(err))


def refuse_unloadable(directory: Path, failures: list[tuple[Path, BaseException]]) -> None:
    """Refuse, in one line, a resume where no periodic checkpoint of ``directory`` loads though one was written whole
    (its checksum file there): a restart from step 0 is not what --resume asked for. A folder of writes cut short
    only (no checksum file: killed mid-write) starts afresh, as it always has."""
    whole = [(path, err) for path, err in failures if checksum_path(path).exists()]
    if whole:
        path, err = whole[0]
        raise LmtuneError(f"--resume: none of the {len(failures)} checkpoint(s) in {directory} can be loaded (the "
                          f"newest, {path.name}: {why_unusable(err)}), so nothing would resume; start a new run with "
                          f"another --out, or delete {directory} to train again from step 0")
    for path, err in failures:
        log.warning("skipping unusable checkpoint %s: %s", path, why_unusable(err))


class Checkpointer:
    """A run's checkpoints folder: periodic checkpoints (the newest ``keep``), best.pt, and resuming.

    ``periodic_dir``: where the periodic checkpoints go when not beside best.pt (a sweep's trial writes them to a
    staging folder and hands each to Ray Tune, which then stores the only copy)."""

    def __init__(self, directory: Path, keep: int, periodic_dir: Path | None = None):
        self.directory = Path(directory)
        self.periodic_dir = Path(periodic_dir) if periodic_dir is not None else self.directory
        self.keep = keep
        self.restored_history: list[Row] = []
        """The metrics rows the checkpoint a run resumed from carries (what its metrics.csv held then)."""

    def restore(self, state: TrainState, *, path: Path | None = None, latest: bool = False) -> Path | None:
        """Load ``path`` (Ray Tune's restore names one) or, with ``latest``, the newest checkpoint that
        verifies into ``state``. Returns the file loaded; None means a fresh start."""
        if path is None and latest:
            failures: list[tuple[Path, BaseException]] = []
            found = load_newest(periodic_checkpoints(self.periodic_dir), failures)
            if found is None:
                refuse_unloadable(self.periodic_dir, failures)
            else:
                for skipped, err in failures:
                    log.warning("skipping unusable checkpoint %s: %s", skipped, why_unusable(err))
            saved, path = found if found else (None, None)
        else:
            saved = load_checkpoint(path) if path is not None else None
        if saved is not None:
            check_same_parameters(state.model, saved["model"], str(path))
            state.load_state_dict(saved)
            self.restored_history = list(saved.get("history") or [])
        return path

    def save(self, state: TrainState, config: RunConfig, history: list[Row],
             stable: bool = False) -> Path:
        """A periodic checkpoint at ``state.step`` (everything a resume needs), then rotation; ``stable``:
        stable.pt instead, which rotation leaves alone."""
        saved: RunCheckpoint = {**state.state_dict(), "sampler": {"seed": config.train.seed, "next_step": state.step},
                                "history": [dict(row) for row in history], "config": config.to_dict()}
        if stable:
            return save_checkpoint(saved, self.directory / STABLE_NAME)
        path = save_checkpoint(saved, periodic_path(self.periodic_dir, state.step))
        rotate(self.periodic_dir, self.keep)
        return path

    def save_best(self, state: TrainState, config: RunConfig, val_loss: float) -> Path:
        """best.pt: the model alone, at the lowest validation loss so far."""
        best: BestCheckpoint = {"model": state.model.state_dict(), "step": state.step, "val_loss": val_loss,
                                "config": config.to_dict()}
        return save_checkpoint(best, self.directory / BEST_NAME)
