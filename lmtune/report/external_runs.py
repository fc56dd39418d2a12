"""Runs lmtune did not make, read for its report (``python -m lmtune.analyze --runs PATH``; docs/analyze-runs.md).

Three shapes are read, each into ``LoggedRun``s (one per run: its LR, seed and logged points):

- a **long-format log** (CSV or JSONL, or a folder of them): one row per logged point, columns ``lr``, ``seed``
  (optional), ``step`` and/or ``tokens``, ``train_loss`` and/or ``val_loss``, ``wall_time`` (optional); a ``run``
  column, where there is one, groups the rows (else ``lr`` and ``seed`` do);
- a **Ray Tune experiment folder** made without lmtune: each trial folder's ``progress.csv`` beside its
  ``params.json`` (the LR: params ``lr`` or ``learning_rate``);
- a **W&B panel export** (a line plot's "Export CSV"): a ``Step`` column, then ``<run name> - <metric>`` per run
  (``__MIN``/``__MAX`` columns left out); each run's LR from ``--lr-of NAME=LR`` or ``lr=VALUE`` in its name.

Each column may go by any of the names in lmtune.report.run_tables.COLUMN_NAMES. Only the columns used are parsed;
every problem found is one LmtuneError naming the file, its line and the column. Nothing is written."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from lmtune.errors import LmtuneError, shown
from lmtune.report.run_tables import (
    COLUMN_NAMES,
    DOCS,
    LOSSES,
    SUFFIXES,
    LoggedRun,
    Table,
    lr_cell,
    points_frame,
    read_table,
    require_columns,
    run_lr,
    seed_cell,
    seed_in_name,
    vocab_cell,
)

log = logging.getLogger(__name__)

WANDB_STEP = ("Step", "step", "_step")
WANDB_SEPARATOR = " - "


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

    def vocab_size(self) -> int | None:
        """The vocabulary the runs name (a vocab_size column, or params.json's): one for all of them (None: none
        names it); runs naming two are refused (their ℓ₀ differ: they are not one sweep)."""
        named = sorted({run.vocab_size for run in self.runs if run.vocab_size is not None})
        if len(named) > 1:
            sizes = ", ".join(map(str, named))
            raise LmtuneError(f"--runs {self.path}: the runs name {len(named)} vocabulary sizes ({sizes}), so they "
                              "share no initial loss ln(vocab); report the runs of one model together")
        return named[0] if named else None


# ---------------------------------------------------------------------------------------------
# Long-format logs


def log_runs(table: Table, lr_of: Mapping[str, float]) -> list[LoggedRun]:
    """The runs of a long-format log: grouped by its ``run`` column, else by (lr, seed). With a ``run`` column,
    a run's LR is the largest on its rows (a schedule's peak), else --lr-of's or the one its name gives."""
    run_column, lr_column, seed_column = table.column("run"), table.column("lr"), table.column("seed")
    require_columns(table, lr_known=run_column is not None)
    if run_column is None:
        return _runs_by_lr_and_seed(table, cast(str, lr_column), seed_column)  # (required without a run column)
    groups: dict[str, list[tuple[int, Mapping[str, object]]]] = {}
    for line, cells in table.rows:
        groups.setdefault(str(cells.get(run_column) or ""), []).append((line, cells))
    runs = []
    for key, rows in groups.items():
        name = key or f"{table.path.stem}:line {rows[0][0]}"
        lrs = [lr for line, cells in rows if (lr := lr_cell(table, line, lr_column, cells)) is not None]
        seed = _first_seed(table, seed_column, rows, name)
        lr = max(lrs) if lrs else run_lr(name, lr_of, table.path)
        runs.append(LoggedRun(name, lr, seed, points_frame(table, rows), str(table.path), vocab_cell(table, rows)))
    return runs


def _runs_by_lr_and_seed(table: Table, lr_column: str, seed_column: str | None) -> list[LoggedRun]:
    """The runs of a log without a ``run`` column: its rows grouped by (lr, seed)."""
    groups: dict[tuple[float, int | None], list[tuple[int, Mapping[str, object]]]] = {}
    for line, cells in table.rows:
        lr = lr_cell(table, line, lr_column, cells)
        if lr is None:
            raise LmtuneError(f"{table.path}, line {line}, column {lr_column}: empty; every row needs its run's LR")
        groups.setdefault((lr, seed_cell(table, line, seed_column, cells)), []).append((line, cells))
    return [LoggedRun(f"{table.path.stem}:lr={lr:g}" + (f",seed={seed}" if seed is not None else ""), lr, seed,
                      points_frame(table, rows), str(table.path), vocab_cell(table, rows))
            for (lr, seed), rows in groups.items()]


def _first_seed(table: Table, column: str | None, rows: list[tuple[int, Mapping[str, object]]],
                name: str) -> int | None:
    seeds = [s for line, cells in rows if (s := seed_cell(table, line, column, cells)) is not None]
    return seeds[0] if seeds else seed_in_name(name)


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
        rows: list[tuple[int, Mapping[str, object]]] = [
            (line, {"step": cells.get(step), **{c: cells.get(col) for c, col in columns.items()}})
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


def tune_runs(folder: Path, trials: list[Path]) -> list[LoggedRun]:
    """The runs of a Tune experiment's trial folders; a trial whose progress.csv holds no row (it reported nothing
    before it failed) is skipped, with a warning."""
    runs = []
    for trial in trials:
        if len((trial / "progress.csv").read_text(errors="replace").strip().splitlines()) < 2:
            log.warning("skipped %s: its progress.csv holds no row (the trial reported nothing)", trial.name)
            continue
        runs.append(tune_run(trial))
    if not runs:
        raise LmtuneError(f"--runs {folder}: no Tune trial in it reported a row (every progress.csv is empty)")
    return runs


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
    seed, vocab = params.get("seed"), params.get("vocab_size")
    if vocab is not None and not (isinstance(vocab, int) and not isinstance(vocab, bool) and vocab >= 2):
        raise LmtuneError(f"{params_file}: vocab_size {shown(str(vocab))} is not a vocabulary size (a whole number "
                          "from 2)")
    table = read_table(trial / "progress.csv")
    require_columns(table, lr_known=True)
    trial_ids = [cells.get("trial_id") for _, cells in table.rows if cells.get("trial_id")]
    name = str(trial_ids[0]) if trial_ids else trial.name
    return LoggedRun(name, float(lr), seed if isinstance(seed, int) and not isinstance(seed, bool) else None,
                     points_frame(table, list(table.rows)), str(trial / "progress.csv"),
                     vocab if vocab is not None else vocab_cell(table, list(table.rows)))


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
    elif trials := tune_trial_folders(path):
        shape, runs = "tune", tune_runs(path, trials)
    else:
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in SUFFIXES)
        if not files:
            raise LmtuneError(f"--runs {path} holds no .csv or .jsonl file and no Tune trial folder (progress.csv "
                              f"with params.json); give a run log or a folder of them ({DOCS})")
        shapes, runs = set(), []
        for file in files:
            found_shape, found = file_runs(file, lr_of)
            shapes.add(found_shape)
            runs += found
        shape = shapes.pop() if len(shapes) == 1 else "log"
    check_lr_of(lr_of, runs, path)
    return RunsInput(path, shape, tuple(unique_names(runs)))


def check_lr_of(lr_of: Mapping[str, float], runs: list[LoggedRun], path: Path) -> None:
    """Refuse an --lr-of naming no run read (a typo would leave its run's LR to its name, or refuse it)."""
    names = {run.name for run in runs}
    unknown = [name for name in lr_of if name not in names]
    if unknown:
        listed = ", ".join(shown(name) for name in sorted(names)[:8]) + (", ..." if len(names) > 8 else "")
        raise LmtuneError(f"--lr-of {shown(unknown[0])}: no run of that name in {path} (its runs: {listed})")


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
                                                         run.points, run.source, run.vocab_size)


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
        if name in found and found[name] != lr:
            raise LmtuneError(f"--lr-of {shown(name)} is given twice ({found[name]:g}, then {lr:g}); give each run's "
                              "LR once")
        found[name] = lr
    return found
