"""A run log's rows as lmtune reads them (for lmtune.report.external_runs, ``analyze --runs``): a CSV or JSONL file as
a ``Table`` whose rows stream with their line numbers (a file is never held whole; lmtune.report.run_points keeps one
run's rows as numbers as they come and checks them into its points), a run as ``LoggedRun``, each column under the
names it goes by (COLUMN_NAMES), and a run's LR and seed from its name. Every problem is one
LmtuneError naming the file, its line and the column; nothing is written."""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from lmtune.errors import LmtuneError, format_bytes, shown
from lmtune.training.config import MAX_LR, accepted_lr

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
# Tables: a CSV or JSONL file's rows, streamed with their line numbers (a file is never held whole: a row's cells
# live only while it is read, and what is kept of them is numbers, in RunRows)

MAX_JSON_LINE = 16 * 2**20  # (a JSON Lines row longer than this is not a logged point: refused before it is parsed)
SMALL_FILE = 64 * 2**20  # (the most of a file read whole, to say what it is, on the error path only)


# Memory a report of logs takes, per byte of log: a 1.1 GB log (23 M rows) peaked at 4.29 GB resident
# (docs/analyze-runs.md). The rows stream (Table.rows), but the report keeps each run's curve.
MEMORY_PER_LOG_BYTE = 4


def available_memory() -> int | None:
    """Bytes of memory this machine has available now (Linux's MemAvailable), or None where it is not said."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_room(option: str, files: list[Path]) -> None:
    """Refuse, in one line and before reading, logs whose report would take more memory than is available."""
    size = sum(file.stat().st_size for file in files)
    free = available_memory()
    if free is not None and size * MEMORY_PER_LOG_BYTE > free:
        raise LmtuneError(f"{option}: {format_bytes(size)} of logs would take about "
                          f"{format_bytes(size * MEMORY_PER_LOG_BYTE)} of memory to report (about "
                          f"{MEMORY_PER_LOG_BYTE}x their size) and {format_bytes(free)} is available; report fewer "
                          "runs at a time (one log per run or per few runs), or log fewer rows")


@dataclass(frozen=True)
class Table:
    """A file's header (every column named) and its rows, streamed anew by ``rows()`` as (line number, cells)."""

    path: Path
    header: tuple[str, ...]
    kind: str = "csv"
    """"csv" or "jsonl": how ``rows()`` reads the file."""

    def column(self, canonical: str) -> str | None:
        """The file's name for a column of COLUMN_NAMES (None: it has none)."""
        return next((name for name in COLUMN_NAMES[canonical] if name in self.header), None)

    def rows(self) -> Iterator[tuple[int, Mapping[str, object]]]:
        """Each row below the header, with its line number (blank lines skipped)."""
        return _csv_rows(self) if self.kind == "csv" else _jsonl_rows(self.path)

    def number(self, line: int, column: str, value: object) -> float | None:
        """A cell as a number (None: empty). ``nan``/``inf`` are numbers (a run that went non-finite)."""
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        if isinstance(value, int) and not isinstance(value, bool):  # (a JSON integer: any number of digits)
            return float(value) if abs(value) < 2**1023 else (math.inf if value > 0 else -math.inf)
        if isinstance(value, float):
            return value
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise LmtuneError(f"{self.path}, line {line}, column {column}: {shown(str(value))} is not a number; "
                          "fix or delete that row")


def read_table(path: Path) -> Table:
    """A .csv or .jsonl file as a Table; one line saying what is wrong with any other file. A CSV file's first row
    is read here, a JSONL file through (its rows' keys make its header); each ``rows()`` reads it again."""
    kind = SUFFIXES.get(path.suffix.lower())
    if path.suffix.lower() == ".json":
        raise LmtuneError(f"{path} is a JSON file, not a run log; give JSON Lines (.jsonl: one object per logged "
                          f"point) or CSV ({DOCS})")
    if kind is None:
        raise LmtuneError(f"{path} is not a CSV or JSONL file (.csv, .jsonl); give a run log, a folder of them, a "
                          f"Tune experiment folder or a W&B CSV export ({DOCS})")
    header = _csv_header(path) if kind == "csv" else _jsonl_header(path)
    return Table(path, header, kind)


@contextmanager
def _lines(path: Path) -> Iterator[Iterator[str]]:
    """The file's text lines, one at a time: a binary file (bad UTF-8, or NUL bytes) is refused as it is met."""
    def checked() -> Iterator[str]:
        try:
            for line in handle:
                if "\x00" in line:
                    raise LmtuneError(f"{path} is not a text file (it holds NUL bytes); give a CSV or JSONL run log "
                                      f"({DOCS})")
                yield line
        except UnicodeDecodeError:
            raise LmtuneError(f"{path} is not a text file (an image or another binary file named {path.suffix}); "
                              f"give a CSV or JSONL run log ({DOCS})") from None

    with path.open(encoding="utf-8-sig", newline="") as handle:
        yield checked()


def _csv_reader(path: Path, lines: Iterator[str]) -> Iterator[tuple[int, list[str]]]:
    """csv.reader's rows with the line each ends on; a malformed one (a cell past csv's field limit) is one line."""
    reader = csv.reader(lines)
    try:
        for cells in reader:
            yield reader.line_num, cells
    except csv.Error as error:
        raise LmtuneError(f"{path}, line {reader.line_num}: not a CSV row ({error}); fix or delete that row") from None


def _csv_header(path: Path) -> tuple[str, ...]:
    """A CSV file's header: its first non-blank row, each column named once (a name read twice would keep one of
    its two columns and drop the other's values)."""
    with _lines(path) as lines:
        cells = next((cells for _, cells in _csv_reader(path, lines) if any(c.strip() for c in cells)), None)
    if cells is None:
        raise LmtuneError(f"{path} is empty; give a log with a header and one row per logged point ({DOCS})")
    if cells[0].lstrip()[:1] in ("{", "["):
        raise LmtuneError(f"{path} holds JSON, not CSV; name it .jsonl if it is one JSON object per line ({DOCS})")
    header = tuple(cell.strip() for cell in cells)
    first: dict[str, int] = {}
    for index, name in enumerate(header, start=1):
        if name and name in first:
            raise LmtuneError(f"{path}: its header names column {shown(name)} twice (columns {first[name]} and "
                              f"{index}), so one of the two would be lost; rename or delete one of them")
        first.setdefault(name, index)
    return header


def _csv_rows(table: Table) -> Iterator[tuple[int, Mapping[str, object]]]:
    header, found = table.header, False
    with _lines(table.path) as lines:
        rows = _csv_reader(table.path, lines)
        next((row for row in rows if any(c.strip() for c in row[1])), None)  # (the header)
        for line, cells in rows:
            if not any(cell.strip() for cell in cells):
                continue
            if len(cells) > len(header):
                raise LmtuneError(f"{table.path}, line {line}: {len(cells)} cells under a header of {len(header)} "
                                  "columns; fix that row")
            found = True
            yield line, dict(zip(header, cells, strict=False))
    if not found:
        raise LmtuneError(f"{table.path} has no rows below its header; give a log with one row per logged point")


class _RepeatedKey(Exception):
    """A JSON object naming a key twice (json keeps the last, dropping the first's value)."""


def _object(pairs: list[tuple[str, object]]) -> dict[str, object]:
    found: dict[str, object] = {}
    for key, value in pairs:
        if key in found:
            raise _RepeatedKey(key)
        found[key] = value
    return found


def _jsonl_rows(path: Path) -> Iterator[tuple[int, Mapping[str, object]]]:
    """Each JSON object of a JSON Lines file, with its line number; anything else on a line is one line."""
    with _lines(path) as lines:
        for number, line in enumerate(lines, start=1):
            if line.strip():
                yield number, _json_row(path, number, line)


def _json_row(path: Path, number: int, line: str) -> dict[str, object]:
    where = f"{path}, line {number}"
    try:
        row = json.loads(line, object_pairs_hook=_object) if len(line) <= MAX_JSON_LINE else None
    except _RepeatedKey as repeated:
        raise LmtuneError(f"{where} names key {shown(str(repeated))} twice, so one of its two values would be lost; "
                          "give each key once") from None
    except RecursionError:
        raise LmtuneError(f"{where} holds JSON nested too deeply to be a logged point; a row is one flat object, "
                          "e.g. {\"lr\": 0.001, \"step\": 10, \"val_loss\": 3.2}") from None
    except ValueError:
        row = None
    if not isinstance(row, dict):
        if _one_document(path):
            raise LmtuneError(f"{path} holds one JSON document, not JSON Lines; write one object per logged "
                              f"point, one per line ({DOCS})")
        raise LmtuneError(f"{where} is not a JSON object; JSON Lines holds one object per line, e.g. {{\"lr\": "
                          f"0.001, \"step\": 10, \"val_loss\": 3.2}} ({DOCS})")
    return row


def _jsonl_header(path: Path) -> tuple[str, ...]:
    """A JSON Lines file's header: every key of its rows, in the order met (every row checked on the way)."""
    header: dict[str, None] = {}
    rows = 0
    for _, row in _jsonl_rows(path):
        header.update(dict.fromkeys(row))
        rows += 1
    if not rows:
        raise LmtuneError(f"{path} is empty; give a log with one JSON object per logged point ({DOCS})")
    return tuple(header)


def _one_document(path: Path) -> bool:
    """Whether the file (a small one: on the error path only) is one JSON document spread over its lines."""
    if path.stat().st_size > SMALL_FILE:
        return False
    try:
        json.loads(path.read_text(encoding="utf-8-sig"))
    except (ValueError, RecursionError):
        return False
    return True


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
    if value is not None and not accepted_lr(value):
        raise LmtuneError(f"{table.path}, line {line}, column {column}: {value:g} is not a learning rate; an LR "
                          f"is a positive number at most {MAX_LR:g}")
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
    if not found or value <= 0:
        raise LmtuneError(f"{source}: run {shown(name)} has no LR; give --lr-of '{name}=LR', or put lr=VALUE in the "
                          "run's name")
    if not accepted_lr(value):
        raise LmtuneError(f"{source}: run {shown(name)}'s name gives lr {value:g}, not a learning rate (a positive "
                          f"number at most {MAX_LR:g}); give --lr-of '{name}=LR'")
    return value


def seed_in_name(name: str) -> int | None:
    found = SEED_IN_NAME.search(name)
    return int(found.group(1)) if found else None
