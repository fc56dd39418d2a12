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

import itertools
import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import cast

import numpy as np

from lmtune.errors import LmtuneError, shown
from lmtune.report.run_points import RunRows, point_names, run_points
from lmtune.report.run_tables import (
    COLUMN_NAMES,
    DOCS,
    LOSSES,
    SUFFIXES,
    LoggedRun,
    Table,
    check_room,
    lr_cell,
    read_table,
    require_columns,
    run_lr,
    seed_cell,
    seed_in_name,
)
from lmtune.training.config import MAX_LR, accepted_lr

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
    """The runs of a long-format log: grouped by its ``run`` column, else by (lr, seed). With a ``run`` column, rows
    are kept apart by name, seed and LR (runs_of_name): a run's LR is the largest on its rows (a schedule's peak),
    else --lr-of's or the one its name gives."""
    run_column, lr_column, seed_column = table.column("run"), table.column("lr"), table.column("seed")
    require_columns(table, lr_known=run_column is not None)
    if run_column is None:
        return _runs_by_lr_and_seed(table, cast(str, lr_column), seed_column)  # (required without a run column)
    names, vocab = point_names(table), table.column("vocab_size")
    named: dict[str, str] = {}
    groups: dict[tuple[str, int | None, float | None], RunRows] = {}
    for line, cells in table.rows():
        key = str(cells.get(run_column) or "")
        name = named.setdefault(key, key or f"{table.path.stem}:line {line}")
        lr, seed = lr_cell(table, line, lr_column, cells), seed_cell(table, line, seed_column, cells)
        if (key, seed, lr) not in groups:
            groups[key, seed, lr] = RunRows(table, names, name, vocab)
        groups[key, seed, lr].add(line, cells)
    by_name: dict[tuple[str, int | None], list[tuple[float | None, RunRows]]] = {}
    for (key, seed, lr), part in groups.items():
        by_name.setdefault((key, seed), []).append((lr, part))
    runs = []
    for (key, seed), parts in by_name.items():
        name = named[key]
        for members in runs_of_name(parts, "step" if "step" in names else "tokens"):
            lrs = [lr for lr, _ in members if lr is not None]
            lr = max(lrs) if lrs else run_lr(name, lr_of, table.path)
            kept = [rows for _, rows in members]
            runs.append(LoggedRun(name, lr, seed if seed is not None else seed_in_name(name),
                                  run_points(kept, name), str(table.path), _one_vocab(kept, name)))
    return runs


def runs_of_name(parts: list[tuple[float | None, RunRows]], x: str) -> list[list[tuple[float | None, RunRows]]]:
    """The runs among one name's (and seed's) rows at each LR: one run (a schedule's LRs) where no step (or token)
    count is logged at two LRs, else one run per LR (runs sharing a name, told apart by their LR)."""
    if len(parts) == 1:
        return [parts]
    counts = [rows.counts(x) for _, rows in parts]
    shared = sum(len(c) for c in counts) > len(np.unique(np.concatenate(counts)))
    return [[part] for part in parts] if shared else [parts]


def _one_vocab(parts: list[RunRows], name: str) -> int | None:
    named = sorted({rows.vocab_size for rows in parts if rows.vocab_size is not None})
    if len(named) > 1:
        raise LmtuneError(f"{parts[0].table.path}: run {shown(name)} names vocabulary sizes {named[0]} and "
                          f"{named[1]}; a run has one vocabulary")
    return named[0] if named else None


def _runs_by_lr_and_seed(table: Table, lr_column: str, seed_column: str | None) -> list[LoggedRun]:
    """The runs of a log without a ``run`` column: its rows grouped by (lr, seed)."""
    names, vocab = point_names(table), table.column("vocab_size")
    groups: dict[tuple[float, int | None], RunRows] = {}
    for line, cells in table.rows():
        lr = lr_cell(table, line, lr_column, cells)
        if lr is None:
            raise LmtuneError(f"{table.path}, line {line}, column {lr_column}: empty; every row needs its run's LR")
        seed = seed_cell(table, line, seed_column, cells)
        if (lr, seed) not in groups:
            name = f"{table.path.stem}:lr={lr:g}" + (f",seed={seed}" if seed is not None else "")
            groups[lr, seed] = RunRows(table, names, name, vocab)
        groups[lr, seed].add(line, cells)
    return [LoggedRun(rows.run, lr, seed, run_points([rows], rows.run), str(table.path), rows.vocab_size)
            for (lr, seed), rows in groups.items()]


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
    lrs = {run: run_lr(run, lr_of, table.path) for run in by_run}
    parts = {run: RunRows(table, {"step": table.header[0], **columns}, run) for run, columns in by_run.items()}
    for line, cells in table.rows():
        for run, columns in by_run.items():
            if any(str(cells.get(col) or "").strip() for col in columns.values()):
                parts[run].add(line, cells)
    # (a run the panel lists with no point in its range is left out)
    runs = [LoggedRun(run, lrs[run], seed_in_name(run), run_points([rows], run), str(table.path))
            for run, rows in parts.items() if len(rows.lines)]
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
        with (trial / "progress.csv").open(errors="replace") as handle:
            lines = list(itertools.islice((line for line in handle if line.strip()), 2))
        if len(lines) < 2:
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
    if not (isinstance(lr, (int, float)) and not isinstance(lr, bool) and accepted_lr(lr)):
        raise LmtuneError(f"{params_file}: no lr or learning_rate that is a learning rate, a positive number at most "
                          f"{MAX_LR:g} (got {shown(str(lr))}); the trainable's config must name its LR lr or "
                          "learning_rate")
    seed, vocab = params.get("seed"), params.get("vocab_size")
    if vocab is not None and not (isinstance(vocab, int) and not isinstance(vocab, bool) and vocab >= 2):
        raise LmtuneError(f"{params_file}: vocab_size {shown(str(vocab))} is not a vocabulary size (a whole number "
                          "from 2)")
    table = read_table(trial / "progress.csv")
    require_columns(table, lr_known=True)
    rows, trial_id = RunRows(table, point_names(table), trial.name, table.column("vocab_size")), None
    for line, cells in table.rows():
        trial_id = trial_id or cells.get("trial_id")
        rows.add(line, cells)
    name = str(trial_id) if trial_id else trial.name
    return LoggedRun(name, float(lr), seed if isinstance(seed, int) and not isinstance(seed, bool) else None,
                     run_points([rows], name), str(trial / "progress.csv"),
                     vocab if vocab is not None else rows.vocab_size)


# ---------------------------------------------------------------------------------------------
# PATH


def read_runs(path: Path, lr_of: Mapping[str, float] | None = None) -> RunsInput:
    """Every run of ``--runs PATH``: a file (a long-format log or a W&B export), a Tune experiment folder, or a
    folder of logs (its .csv and .jsonl files; other files and subfolders are not read)."""
    path, lr_of = Path(path), dict(lr_of or {})
    if not path.exists():
        raise LmtuneError(f"--runs {path} does not exist; give a run log (CSV or JSONL), a folder of them, a Tune "
                          f"experiment folder or a W&B CSV export ({DOCS})")
    if not path.is_file() and not path.is_dir():  # (a FIFO, a device or a socket: nothing to read twice)
        raise LmtuneError(f"--runs {path} is not a file or a folder (a pipe, a device or a socket); give a run log "
                          f"(CSV or JSONL), a folder of them, a Tune experiment folder or a W&B CSV export ({DOCS})")
    if path.is_file():
        check_room(f"--runs {path}", [path])
        shape, runs = file_runs(path, lr_of)
    elif trials := tune_trial_folders(path):
        shape, runs = "tune", tune_runs(path, trials)
    else:
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in SUFFIXES)
        if not files:
            raise LmtuneError(f"--runs {path} holds no .csv or .jsonl file and no Tune trial folder (progress.csv "
                              f"with params.json); give a run log or a folder of them ({DOCS})")
        check_room(f"--runs {path}", files)
        shapes, runs = set(), []
        for file in files:
            found_shape, found = file_runs(file, lr_of)
            shapes.add(found_shape)
            runs += found
        shape = shapes.pop() if len(shapes) == 1 else "log"
    check_lr_of(lr_of, runs, path)
    return RunsInput(path, shape, tuple(distinct_names(runs)))


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


def distinct_names(runs: list[LoggedRun]) -> list[LoggedRun]:
    """The runs, each name that several share followed by what tells them apart (their LRs, seeds or files:
    "baseline (lr=0.001, seed=0)"), then #2, #3, ... where nothing does."""
    sharing: dict[str, list[LoggedRun]] = {}
    for run in runs:
        sharing.setdefault(run.name, []).append(run)
    named = []
    for run in runs:
        others = sharing[run.name]
        parts = [f"lr={run.lr:g}" if len({r.lr for r in others}) > 1 else "",
                 f"seed={run.seed}" if len({r.seed for r in others}) > 1 else "",
                 Path(run.source).name if len({r.source for r in others}) > 1 else ""]
        apart = ", ".join(p for p in parts if p)
        named.append(replace(run, name=f"{run.name} ({apart})") if len(others) > 1 and apart else run)
    seen: dict[str, int] = {}
    for index, run in enumerate(named):
        seen[run.name] = seen.get(run.name, 0) + 1
        if seen[run.name] > 1:
            named[index] = replace(run, name=f"{run.name}#{seen[run.name]}")
    return named


def parse_lr_of(items: list[str] | None) -> dict[str, float]:
    """--lr-of NAME=LR (repeated) as {name: lr}; the LR is after the last '=' (a name may hold '=')."""
    found: dict[str, float] = {}
    for item in items or ():
        name, sep, value = item.rpartition("=")
        try:
            lr = float(value)
        except ValueError:
            lr = math.nan
        if not sep or not name or not accepted_lr(lr):
            raise LmtuneError(f"--lr-of {shown(item)}: give RUN_NAME=LR with a positive LR at most {MAX_LR:g}, e.g. "
                              "--lr-of 'baseline=0.003'")
        if name in found and found[name] != lr:
            raise LmtuneError(f"--lr-of {shown(name)} is given twice ({found[name]:g}, then {lr:g}); give each run's "
                              "LR once")
        found[name] = lr
    return found
