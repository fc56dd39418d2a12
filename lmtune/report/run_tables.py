"""A run log's rows as lmtune reads them (for lmtune.report.external_runs, ``analyze --runs``): a CSV or JSONL file as
a ``Table`` of cells with their line numbers, its rows as one run's points (``LoggedRun``), each column under the names
it goes by (COLUMN_NAMES), and a run's LR and seed from its name. Every problem is one LmtuneError naming the file,
its line and the column; nothing is written."""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from lmtune.errors import LmtuneError, shown

DOCS = "docs/analyze-runs.md"
SUFFIXES = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl"}

# Each column lmtune reads, and the names it goes by (the first one present wins): lmtune's own, Tune's
# (training_iteration, time_total_s) and W&B's history names (_step, _runtime).
COLUMN_NAMES: dict[str, tuple[str, ...]] = {
    "lr": ("lr", "learning_rate"),
    "seed": ("seed",),
    "run": ("run",),
    "step": ("step", "_step", "training_iteration"),
    "tokens": ("tokens",),
    "train_loss": ("train_loss", "loss", "train/loss"),
    "val_loss": ("val_loss", "eval_loss", "val/loss", "eval/loss"),
    "wall_time": ("wall_time", "time_total_s", "_runtime"),
    "vocab_size": ("vocab_size", "vocab"),
}
POINT_COLUMNS = ("step", "tokens", "train_loss", "val_loss", "wall_time")
LOSSES = ("train_loss", "val_loss")
NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
LR_IN_NAME = re.compile(rf"(?:^|[^a-z])(?:lr|learning_rate)[=:_]?{NUMBER}", re.IGNORECASE)
SEED_IN_NAME = re.compile(r"(?:^|[^a-z])seed[=:_]?([0-9]+)", re.IGNORECASE)


@dataclass(frozen=True)
class LoggedRun:
    """One run as its log has it."""

    name: str
    """Its name: the ``run`` column's, Tune's trial id, the W&B run's, or FILE:lr=..,seed=.."""
    lr: float
    """Its (peak) learning rate."""
    seed: int | None
    """Its seed (None: the input names none)."""
    points: pd.DataFrame
    """One row per logged point, columns of POINT_COLUMNS that the input has (NaN: not logged on that row; a
    non-finite loss: inf)."""
    source: str
    """The file its rows came from."""
    vocab_size: int | None = None
    """Its model's vocabulary, where the input names it (a vocab_size column, or Tune's params.json): ℓ₀ = ln of it."""


# ---------------------------------------------------------------------------------------------
# Tables: a CSV or JSONL file as rows of cells, each with its line number


@dataclass(frozen=True)
class Table:
    """A file's rows: its header (every column named) and (line number, cells) per row."""

    path: Path
    header: tuple[str, ...]
    rows: tuple[tuple[int, Mapping[str, object]], ...]

    def column(self, canonical: str) -> str | None:
        """The file's name for a column of COLUMN_NAMES (None: it has none)."""
        return next((name for name in COLUMN_NAMES[canonical] if name in self.header), None)

    def number(self, line: int, column: str, value: object) -> float | None:
        """A cell as a number (None: empty). ``nan``/``inf`` are numbers (a run that went non-finite)."""
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise LmtuneError(f"{self.path}, line {line}, column {column}: {shown(str(value))} is not a number; "
                          "fix or delete that row")


def read_table(path: Path) -> Table:
    """A .csv or .jsonl file as a Table; one line saying what is wrong with any other file."""
    kind = SUFFIXES.get(path.suffix.lower())
    if path.suffix.lower() == ".json":
        raise LmtuneError(f"{path} is a JSON file, not a run log; give JSON Lines (.jsonl: one object per logged "
                          f"point) or CSV ({DOCS})")
    if kind is None:
        raise LmtuneError(f"{path} is not a CSV or JSONL file (.csv, .jsonl); give a run log, a folder of them, a "
                          f"Tune experiment folder or a W&B CSV export ({DOCS})")
    data = path.read_bytes()
    if not data.strip():
        raise LmtuneError(f"{path} is empty; give a log with a header and one row per logged point ({DOCS})")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise LmtuneError(f"{path} is not a text file (an image or another binary file named {path.suffix}); "
                          f"give a CSV or JSONL run log ({DOCS})") from None
    if "\x00" in text:
        raise LmtuneError(f"{path} is not a text file (it holds NUL bytes); give a CSV or JSONL run log ({DOCS})")
    table = _csv_table(path, text) if kind == "csv" else _jsonl_table(path, text)
    if not table.rows:
        raise LmtuneError(f"{path} has no rows below its header; give a log with one row per logged point")
    return table


def _csv_table(path: Path, text: str) -> Table:
    if text.lstrip()[:1] in ("{", "["):
        raise LmtuneError(f"{path} holds JSON, not CSV; name it .jsonl if it is one JSON object per line ({DOCS})")
    reader = csv.reader(io.StringIO(text))
    header = tuple(cell.strip() for cell in next(reader))
    rows = []
    for cells in reader:
        if not any(cell.strip() for cell in cells):
            continue
        if len(cells) > len(header):
            raise LmtuneError(f"{path}, line {reader.line_num}: {len(cells)} cells under a header of {len(header)} "
                              "columns; fix that row")
        rows.append((reader.line_num, dict(zip(header, cells, strict=False))))
    return Table(path, header, tuple(rows))


def _jsonl_table(path: Path, text: str) -> Table:
    header: dict[str, None] = {}
    rows = []
    for line_number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if not isinstance(row, dict):
            if _one_document(text):
                raise LmtuneError(f"{path} holds one JSON document, not JSON Lines; write one object per logged "
                                  f"point, one per line ({DOCS})")
            raise LmtuneError(f"{path}, line {line_number} is not a JSON object; JSON Lines holds one object per "
                              f"line, e.g. {{\"lr\": 0.001, \"step\": 10, \"val_loss\": 3.2}} ({DOCS})")
        header.update(dict.fromkeys(row))
        rows.append((line_number, row))
    return Table(path, tuple(header), tuple(rows))


def _one_document(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------------------------------------
# Points: the rows of one run as POINT_COLUMNS


def points_frame(table: Table, rows: list[tuple[int, Mapping[str, object]]]) -> pd.DataFrame:
    """The rows' points: each of POINT_COLUMNS the table has, numbers (NaN where empty); a row without a step or
    token count is refused."""
    names = {c: table.column(c) for c in POINT_COLUMNS if table.column(c) is not None}
    x_names = [names[c] for c in ("step", "tokens") if c in names]
    frame: dict[str, list[float]] = {c: [] for c in names}
    for line, cells in rows:
        values = {c: table.number(line, name, cells.get(name)) for c, name in names.items()}
        if all(values[c] is None for c in ("step", "tokens") if c in names):
            raise LmtuneError(f"{table.path}, line {line}: no value in {' or '.join(x_names)}; every row needs one")
        for c, value in values.items():
            frame[c].append(_point(table, line, names[c], c, value))
    return pd.DataFrame(frame, dtype=np.float64)


def _point(table: Table, line: int, name: str, column: str, value: float | None) -> float:
    """A cell of POINT_COLUMNS: NaN where empty; a non-finite loss as inf (NaN is 'not logged'); a step or token
    count must be a whole number from 0."""
    if value is None:
        return math.nan
    if column in LOSSES:
        return value if math.isfinite(value) else math.inf
    if column in ("step", "tokens") and not (math.isfinite(value) and value >= 0 and value.is_integer()):
        raise LmtuneError(f"{table.path}, line {line}, column {name}: {value:g} is not a {column} count (a whole "
                          "number from 0); fix or delete that row")
    return value if math.isfinite(value) else math.nan


def require_columns(table: Table, lr_known: bool = False) -> None:
    """Refuse a table without a step or token count, without a loss, or (``lr_known`` False) without an LR."""
    needed = [(("step", "tokens"), "a step or tokens column"), (LOSSES, "a train_loss or val_loss column")]
    if not lr_known:
        needed.insert(0, (("lr",), "an lr column"))
    for columns, what in needed:
        if not any(table.column(c) for c in columns):
            accepted = ", ".join(name for c in columns for name in COLUMN_NAMES[c])
            raise LmtuneError(f"{table.path} has no {what.removeprefix('a ').removeprefix('an ')} (columns: "
                              f"{', '.join(table.header) or 'none'}); name it one of: {accepted} ({DOCS})")


def lr_cell(table: Table, line: int, column: str | None, cells: Mapping[str, object]) -> float | None:
    """A row's LR cell: a positive number, or None where empty (or the table has no LR column)."""
    if column is None:
        return None
    value = table.number(line, column, cells.get(column))
    if value is not None and not (math.isfinite(value) and value > 0):
        raise LmtuneError(f"{table.path}, line {line}, column {column}: {value:g} is not a learning rate; an LR "
                          "is a positive number")
    return value


def seed_cell(table: Table, line: int, column: str | None, cells: Mapping[str, object]) -> int | None:
    """A row's seed cell: a whole number, or None where empty (or the table has no seed column)."""
    if column is None:
        return None
    value = table.number(line, column, cells.get(column))
    if value is not None and not (math.isfinite(value) and value.is_integer()):
        raise LmtuneError(f"{table.path}, line {line}, column {column}: {value:g} is not a seed (a whole number)")
    return None if value is None else int(value)


def run_lr(name: str, lr_of: Mapping[str, float], source: Path) -> float:
    """A named run's LR: --lr-of's, else the ``lr=VALUE`` in its name."""
    if name in lr_of:
        return lr_of[name]
    found = LR_IN_NAME.search(name)
    value = float(found.group(1)) if found else 0.0
    if not (math.isfinite(value) and value > 0):
        raise LmtuneError(f"{source}: run {shown(name)} has no LR; give --lr-of '{name}=LR', or put lr=VALUE in the "
                          "run's name")
    return value


def vocab_cell(table: Table, rows: list[tuple[int, Mapping[str, object]]]) -> int | None:
    """A run's vocabulary size: the first value in its rows' vocab_size column (None: no such column, or empty), a
    whole number from 2; a run whose rows name two is refused."""
    column = table.column("vocab_size")
    if column is None:
        return None
    found: int | None = None
    for line, cells in rows:
        value = table.number(line, column, cells.get(column))
        if value is None:
            continue
        if not (math.isfinite(value) and value.is_integer() and value >= 2):
            raise LmtuneError(f"{table.path}, line {line}, column {column}: {value:g} is not a vocabulary size (a "
                              "whole number from 2)")
        if found is not None and int(value) != found:
            raise LmtuneError(f"{table.path}, line {line}, column {column}: {int(value)}, where the run's earlier rows "
                              f"say {found}; a run has one vocabulary")
        found = int(value)
    return found


def seed_in_name(name: str) -> int | None:
    found = SEED_IN_NAME.search(name)
    return int(found.group(1)) if found else None
