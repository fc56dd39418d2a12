"""lmtune's benchmarks: scripts run as ``python benchmarks/NAME.py`` (each puts the checkout on sys.path)."""

from __future__ import annotations

import json
from pathlib import Path


def append_row(jsonl: str | Path | None, benchmark: str, row: dict) -> None:
    """One result row, named by its benchmark, appended to ``jsonl`` (nothing when None: the table printed is all)."""
    if jsonl:
        with open(jsonl, "a") as handle:
            handle.write(json.dumps({"benchmark": benchmark, **row}) + "\n")
