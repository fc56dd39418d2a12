"""Atomic, verifiable checkpoints.

A checkpoint is one file ``step_XXXXXXXX.pt`` written to a temp name, fsynced and renamed, with a
sidecar ``.sha256`` written the same way afterwards: a file without a matching checksum is
incomplete or corrupt and is never loaded. Loading uses ``torch.load(weights_only=True)``, so a
checkpoint file can never execute code.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import pickle
import re
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

PERIODIC = re.compile(r"^step_(\d{8})\.pt$")
BEST_NAME = "best.pt"


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see either the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:  # some filesystems cannot fsync a directory; the rename is still atomic
        pass


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def checksum_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def save_checkpoint(state: dict[str, Any], path: Path) -> Path:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    data = buffer.getvalue()
    atomic_write_bytes(path, data)
    atomic_write_text(checksum_path(path), hashlib.sha256(data).hexdigest() + "\n")
    return path


def load_checkpoint(path: Path) -> dict[str, Any]:
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


def load_latest(directory: Path) -> tuple[dict[str, Any], Path] | None:
    """The newest checkpoint that verifies; corrupt or partial ones are logged and skipped."""
    for candidate in reversed(periodic_checkpoints(directory)):
        try:
            return load_checkpoint(candidate), candidate
        # UnpicklingError: a file whose checksum matches but that torch.load refuses (corrupt before
        # it was hashed, or holding objects weights_only=True will not build) is unusable too.
        except (ValueError, RuntimeError, EOFError, OSError, pickle.UnpicklingError) as err:
            log.warning("skipping unusable checkpoint %s: %s", candidate, err)
    return None
