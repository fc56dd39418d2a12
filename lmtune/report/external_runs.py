"""Runs lmtune did not make, read for its report (``python -m lmtune.analyze --runs PATH``; docs/analyze-runs.md).

Three shapes are read, each into ``LoggedRun``s (one per run: its LR, seed and logged points):

- a **long-format log** (CSV or JSONL, or a folder of them): one row per logged point, columns ``lr``, ``seed``
  (optional), ``step`` and/or ``tokens``, ``train_loss`` and/or ``val_loss``, ``wall_time`` (optional); a ``run``
  column, where there is one, groups the rows (else ``lr`` and ``seed`` do);
- a **Ray Tune experiment folder** made without lmtune: each trial folder's ``progress.csv`` beside its
  ``params.json`` (the LR: params ``lr`` or ``learning_rate``);
- a **W&B panel export** (a line plot's "Export CSV"): a ``Step`` column, then ``<run name> - <metric>`` per run
  (``__MIN``/``__MAX`` columns left out); each run's LR from ``--lr-of NAME=LR`` or ``lr=VALUE`` in its name.

Each column may go by any of the names in COLUMN_NAMES. Only the columns used are parsed; every problem found is
one LmtuneError naming the file, its line and the column. Nothing is written."""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Iterator, Mapping
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
}
POINT_COLUMNS = ("step", "tokens", "train_loss", "val_loss", "wall_time")
LOSSES = ("train_loss", "val_loss")
WANDB_STEP = ("Step", "step", "_step")
WANDB_SEPARATOR = " - "
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


@dataclass(frozen=True)
class RunsInput:
    """Everything read from ``--runs PATH``."""

    path: Path
    """PATH as given."""
    shape: str
    """"log" (long format), "tune" (a Tune experiment folder) or "wandb" (a W&B panel export)."""
    runs: tuple[LoggedRun, ...]
    """Every run, in the order read."""

    def has(self, column: str) -> bool:
        """Whether any run logged a value in ``column`` (a name of POINT_COLUMNS, or "seed")."""
        if column == "seed":
            return any(run.seed is not None for run in self.runs)
        return any(column in run.points and run.points[column].notna().any() for run in self.runs)


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
    count a whole number from 0."""
    if value is None:
        return math.nan
    if column in LOSSES:
        return value if math.isfinite(value) else math.inf
    if column in ("step", "tokens") and not (math.isfinite(value) and value >= 0):
        raise LmtuneError(f"{table.path}, line {line}, column {name}: {value:g} is not a {column} count (a number "
                          "from 0); fix or delete that row")
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


# ---------------------------------------------------------------------------------------------
# Long-format logs


def log_runs(table: Table, lr_of: Mapping[str, float]) -> list[LoggedRun]:
    """The runs of a long-format log: grouped by its ``run`` column, else by (lr, seed). With a ``run`` column,
    a run's LR is the largest on its rows (a schedule's peak), else --lr-of's or the one its name gives."""
    run_column, lr_column, seed_column = table.column("run"), table.column("lr"), table.column("seed")
    require_columns(table, lr_known=run_column is not None)
    if run_column is None:
        return _runs_by_lr_and_seed(table, lr_column, seed_column)
    groups: dict[str, list[tuple[int, Mapping[str, object]]]] = {}
    for line, cells in table.rows:
        groups.setdefault(str(cells.get(run_column) or ""), []).append((line, cells))
    runs = []
    for key, rows in groups.items():
        name = key or f"{table.path.stem}:line {rows[0][0]}"
        lrs = [lr for line, cells in rows if (lr := _lr_cell(table, line, lr_column, cells)) is not None]
        seed = _first_seed(table, seed_column, rows, name)
        lr = max(lrs) if lrs else run_lr(name, lr_of, table.path)
        runs.append(LoggedRun(name, lr, seed, points_frame(table, rows), str(table.path)))
    return runs


def _runs_by_lr_and_seed(table: Table, lr_column: str, seed_column: str | None) -> list[LoggedRun]:
    """The runs of a log without a ``run`` column: its rows grouped by (lr, seed)."""
    groups: dict[tuple[float, int | None], list[tuple[int, Mapping[str, object]]]] = {}
    for line, cells in table.rows:
        lr = _lr_cell(table, line, lr_column, cells)
        if lr is None:
            raise LmtuneError(f"{table.path}, line {line}, column {lr_column}: empty; every row needs its run's LR")
        groups.setdefault((lr, _seed_cell(table, line, seed_column, cells)), []).append((line, cells))
    return [LoggedRun(f"{table.path.stem}:lr={lr:g}" + (f",seed={seed}" if seed is not None else ""), lr, seed,
                      points_frame(table, rows), str(table.path)) for (lr, seed), rows in groups.items()]


def _lr_cell(table: Table, line: int, column: str | None, cells: Mapping[str, object]) -> float | None:
    if column is None:
        return None
    value = table.number(line, column, cells.get(column))
    if value is not None and not (math.isfinite(value) and value > 0):
        raise LmtuneError(f"{table.path}, line {line}, column {column}: {value:g} is not a learning rate; an LR "
                          "is a positive number")
    return value


def _seed_cell(table: Table, line: int, column: str | None, cells: Mapping[str, object]) -> int | None:
    if column is None:
        return None
    value = table.number(line, column, cells.get(column))
    if value is not None and not (math.isfinite(value) and value.is_integer()):
        raise LmtuneError(f"{table.path}, line {line}, column {column}: {value:g} is not a seed (a whole number)")
    return None if value is None else int(value)


def _first_seed(table: Table, column: str | None, rows: list[tuple[int, Mapping[str, object]]],
                name: str) -> int | None:
    seeds = [s for line, cells in rows if (s := _seed_cell(table, line, column, cells)) is not None]
    return seeds[0] if seeds else seed_in_name(name)


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


def seed_in_name(name: str) -> int | None:
    found = SEED_IN_NAME.search(name)
    return int(found.group(1)) if found else None


# ---------------------------------------------------------------------------------------------
# W&B panel exports


def is_wandb_export(table: Table) -> bool:
    """A W&B line plot's CSV export: a step column first, then ``<run> - <metric>`` columns."""
    return bool(table.header) and table.header[0] in WANDB_STEP and any(
        WANDB_SEPARATOR in name for name in table.header[1:])


def wandb_runs(table: Table, lr_of: Mapping[str, float]) -> list[LoggedRun]:
    """One run per ``<run> - <loss>`` column pair of a W&B export (``__MIN``/``__MAX`` and other metrics left
    out), its points at the export's steps where it has a value."""
    by_run: dict[str, dict[str, str]] = {}
    for name in table.header[1:]:
        run, _, metric = name.rpartition(WANDB_SEPARATOR)
        loss = next((c for c in LOSSES if metric.strip() in COLUMN_NAMES[c]), None)
        if run and loss and not metric.endswith(("__MIN", "__MAX")):
            by_run.setdefault(run.strip(), {})[loss] = name
    if not by_run:
        accepted = ", ".join(name for c in LOSSES for name in COLUMN_NAMES[c])
        raise LmtuneError(f"{table.path} (a W&B export) has no '<run> - <loss>' column; export a panel plotting one "
                          f"of: {accepted} ({DOCS})")
    step = table.header[0]
    runs = []
    for run, columns in by_run.items():
        lr = run_lr(run, lr_of, table.path)
        rows = [(line, {"step": cells.get(step), **{c: cells.get(col) for c, col in columns.items()}})
                for line, cells in table.rows if any(str(cells.get(col) or "").strip() for col in columns.values())]
        if not rows:  # (a run the panel lists with no point in its range)
            continue
        shaped = Table(table.path, ("step", *columns), ())
        runs.append(LoggedRun(run, lr, seed_in_name(run), points_frame(shaped, rows), str(table.path)))
    if not runs:
        raise LmtuneError(f"{table.path} (a W&B export) has no value in any run's loss column; export the panel "
                          "again with its runs' points")
    return runs


# ---------------------------------------------------------------------------------------------
# Tune experiment folders


def tune_trial_folders(folder: Path) -> list[Path]:
    """The folders under ``folder`` holding a Tune trial's progress.csv, in name order."""
    return sorted({p.parent for p in folder.rglob("progress.csv") if p.is_file()})


def tune_run(trial: Path) -> LoggedRun:
    """A Tune trial folder's run: its LR (and seed) from params.json, its points from progress.csv."""
    params_file = trial / "params.json"
    try:
        params = json.loads(params_file.read_text())
    except FileNotFoundError:
        raise LmtuneError(f"{trial} has a progress.csv but no params.json, so its LR is unknown; copy the trial "
                          "folder whole") from None
    except (ValueError, UnicodeDecodeError):
        params = None
    if not isinstance(params, dict):
        raise LmtuneError(f"{params_file} is not a JSON object of the trial's config; copy Tune's own file")
    lr = next((params[k] for k in COLUMN_NAMES["lr"] if k in params), None)
    if not (isinstance(lr, (int, float)) and not isinstance(lr, bool) and math.isfinite(lr) and lr > 0):
        raise LmtuneError(f"{params_file}: no positive lr or learning_rate (got {shown(str(lr))}); the trainable's "
                          "config must name its LR lr or learning_rate")
    seed = params.get("seed")
    table = read_table(trial / "progress.csv")
    require_columns(table, lr_known=True)
    trial_ids = [cells.get("trial_id") for _, cells in table.rows if cells.get("trial_id")]
    name = str(trial_ids[0]) if trial_ids else trial.name
    return LoggedRun(name, float(lr), seed if isinstance(seed, int) and not isinstance(seed, bool) else None,
                     points_frame(table, list(table.rows)), str(trial / "progress.csv"))


# ---------------------------------------------------------------------------------------------
# PATH


def read_runs(path: Path, lr_of: Mapping[str, float] | None = None) -> RunsInput:
    """Every run of ``--runs PATH``: a file (a long-format log or a W&B export), a Tune experiment folder, or a
    folder of logs (its .csv and .jsonl files; other files and subfolders are not read)."""
    path, lr_of = Path(path), dict(lr_of or {})
    if not path.exists():
        raise LmtuneError(f"--runs {path} does not exist; give a run log (CSV or JSONL), a folder of them, a Tune "
                          f"experiment folder or a W&B CSV export ({DOCS})")
    if path.is_file():
        shape, runs = file_runs(path, lr_of)
        return RunsInput(path, shape, tuple(unique_names(runs)))
    trials = tune_trial_folders(path)
    if trials:
        return RunsInput(path, "tune", tuple(unique_names(tune_run(trial) for trial in trials)))
    files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in SUFFIXES)
    if not files:
        raise LmtuneError(f"--runs {path} holds no .csv or .jsonl file and no Tune trial folder (progress.csv with "
                          f"params.json); give a run log or a folder of them ({DOCS})")
    shapes, runs = set(), []
    for file in files:
        shape, found = file_runs(file, lr_of)
        shapes.add(shape)
        runs += found
    return RunsInput(path, shapes.pop() if len(shapes) == 1 else "log", tuple(unique_names(runs)))


def file_runs(path: Path, lr_of: Mapping[str, float]) -> tuple[str, list[LoggedRun]]:
    table = read_table(path)
    if is_wandb_export(table):
        return "wandb", wandb_runs(table, lr_of)
    return "log", log_runs(table, lr_of)


def unique_names(runs: Iterator[LoggedRun] | list[LoggedRun]) -> Iterator[LoggedRun]:
    """The runs, a name that repeats an earlier one suffixed #2, #3, ..."""
    seen: dict[str, int] = {}
    for run in runs:
        seen[run.name] = seen.get(run.name, 0) + 1
        yield run if seen[run.name] == 1 else LoggedRun(f"{run.name}#{seen[run.name]}", run.lr, run.seed,
                                                         run.points, run.source)


def parse_lr_of(items: list[str] | None) -> dict[str, float]:
    """--lr-of NAME=LR (repeated) as {name: lr}; the LR is after the last '=' (a name may hold '=')."""
    found = {}
    for item in items or ():
        name, sep, value = item.rpartition("=")
        try:
            lr = float(value)
        except ValueError:
            lr = math.nan
        if not sep or not name or not (math.isfinite(lr) and lr > 0):
            raise LmtuneError(f"--lr-of {shown(item)}: give RUN_NAME=LR with a positive LR, e.g. --lr-of "
                              "'baseline=0.003'")
        found[name] = lr
    return found
