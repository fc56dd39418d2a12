"""Atomic file writes: a reader sees the old file or the whole new one, never half of either.

Every file lmtune writes (checkpoints, metrics, the sweep's records, the report) goes through here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path``: a temp file beside it, fsynced, then renamed over it."""
    path = Path(path)
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


def atomic_write_json(path: Path, value: Any) -> None:
    """``value`` as indented JSON (numpy scalars and paths as their plain values)."""
    atomic_write_text(path, json.dumps(value, indent=2, default=_plain) + "\n")


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    return str(value)
