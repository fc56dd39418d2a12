"""One run's rows as ``analyze --runs`` reads them (lmtune.report.run_tables streams them): each of POINT_COLUMNS kept
as a compact column of numbers as the rows come (``RunRows``: a file is never held whole), checked (a count that goes
down or comes again with another loss, a negative loss) and turned into the run's points (``run_points``)."""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import cast

import numpy as np
import pandas as pd

from lmtune.errors import LmtuneError, shown
from lmtune.report.run_tables import LOSSES, POINT_COLUMNS, Table


class RunRows:
    """One run's rows as they are read: each of POINT_COLUMNS the file has, as a compact column of numbers (8 bytes a
    cell, not a row of strings), with each row's line (to name it) and the run's vocabulary (vocab_cell's rule)."""

    def __init__(self, table: Table, names: Mapping[str, str], run: str, vocab_column: str | None = None):
        self.table, self.names, self.run, self.vocab_column = table, dict(names), run, vocab_column
        self.columns = {c: array("d") for c in names}
        self.lines = array("q")
        self.vocab_size: int | None = None

    def add(self, line: int, cells: Mapping[str, object]) -> None:
        """A row's points: a row without a step or token count is refused, as is a negative loss."""
        values = {c: self.table.number(line, name, cells.get(name)) for c, name in self.names.items()}
        if all(values[c] is None for c in ("step", "tokens") if c in values):
            counts = " or ".join(self.names[c] for c in ("step", "tokens") if c in self.names)
            raise LmtuneError(f"{self.table.path}, line {line}: no value in {counts}; every row needs one")
        for c, value in values.items():
            self.columns[c].append(self._point(line, c, value))
        self.lines.append(line)
        if self.vocab_column is not None:
            self._vocab(line, cells.get(self.vocab_column))

    def _point(self, line: int, column: str, value: float | None) -> float:
        """A cell of POINT_COLUMNS: NaN where empty; a non-finite loss as inf (NaN is 'not logged'); a step or token
        count must be a whole number from 0, a loss a number from 0."""
        name = self.names[column]
        if value is None:
            return math.nan
        if column in LOSSES:
            if value < 0:
                raise LmtuneError(f"{self.table.path}, line {line}, column {name}: {value:g} is a negative loss (run "
                                  f"{shown(self.run)}); a cross-entropy loss is never below 0: fix or delete that row")
            return value if math.isfinite(value) else math.inf
        if column in ("step", "tokens") and not (math.isfinite(value) and value >= 0 and value.is_integer()):
            raise LmtuneError(f"{self.table.path}, line {line}, column {name}: {value:g} is not a {column} count (a "
                              "whole number from 0); fix or delete that row")
        return value if math.isfinite(value) else math.nan

    def _vocab(self, line: int, cell: object) -> None:
        column = cast(str, self.vocab_column)
        value = self.table.number(line, column, cell)
        if value is None:
            return
        if not (math.isfinite(value) and value.is_integer() and value >= 2):
            raise LmtuneError(f"{self.table.path}, line {line}, column {column}: {value:g} is not a vocabulary size "
                              "(a whole number from 2)")
        if self.vocab_size is not None and int(value) != self.vocab_size:
            raise LmtuneError(f"{self.table.path}, line {line}, column {column}: {int(value)}, where the run's "
                              f"earlier rows say {self.vocab_size}; a run has one vocabulary")
        self.vocab_size = int(value)

    def frame(self) -> pd.DataFrame:
        """The points as a frame (NaN: not logged on that row), in the order read."""
        return pd.DataFrame({c: np.frombuffer(values, dtype=np.float64) if len(values) else np.empty(0)
                             for c, values in self.columns.items()}, dtype=np.float64)

    def counts(self, column: str) -> np.ndarray:
        """The distinct step (or token) counts logged (empty: the column is not read)."""
        values = np.frombuffer(self.columns[column], dtype=np.float64) if column in self.columns else np.empty(0)
        return np.unique(values[~np.isnan(values)]) if len(values) else values


def point_names(table: Table) -> dict[str, str]:
    """The file's name for each of POINT_COLUMNS it has."""
    return {c: name for c in POINT_COLUMNS if (name := table.column(c)) is not None}


def check_counts(points: pd.DataFrame, lines: np.ndarray, run: str, path: Path) -> None:
    """Refuse a run whose step (or token) counts go down in the order its rows are given, or that logs a count again
    with another value of the same loss: a run restarted from a checkpoint, or two runs under one name (sorting them
    would pair each loss with another point's count). A count given again with the other loss, or the same, is one
    point logged on two rows."""
    for column in ("step", "tokens"):
        if column not in points:
            continue
        values = points[column].to_numpy()
        known = ~np.isnan(values)
        counts, at = values[known], lines[known]
        down = np.flatnonzero(np.diff(counts) < 0)
        if down.size:
            i = int(down[0]) + 1
            raise LmtuneError(f"{path}, line {at[i]}: run {shown(run)} logs {column} {counts[i]:g} after "
                              f"{counts[i - 1]:g}; a run's counts only grow (a restarted run, or two runs sharing "
                              "a name?): give each run its own name, or delete the rows logged again")
        same = np.flatnonzero(np.diff(counts) == 0)
        for loss in (c for c in LOSSES if c in points):
            known_loss = points[loss].to_numpy()[known]
            before, after = known_loss[same], known_loss[same + 1]
            clash = ~np.isnan(before) & ~np.isnan(after) & (before != after)
            if clash.any():
                i = int(same[np.flatnonzero(clash)[0]])
                raise LmtuneError(f"{path}, line {at[i + 1]}: run {shown(run)} logs {column} {counts[i]:g} again, "
                                  f"with {loss} {after[clash][0]:g} where line {at[i]} logged {before[clash][0]:g} (a "
                                  "restarted run, or two runs sharing a name?): give each run its own name, or delete "
                                  "the rows logged again")


def run_points(parts: Sequence[RunRows], run: str) -> pd.DataFrame:
    """One run's points from the RunRows its rows went to (several: a schedule's LRs), in file order, checked by
    check_counts."""
    frames = [part.frame() for part in parts]
    lines = np.concatenate([np.frombuffer(part.lines, dtype=np.int64) for part in parts])
    for part in parts:  # (its numbers are in the frame now: a log is held once, not twice)
        part.columns, part.lines = {}, array("q")
    points = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
    if len(parts) > 1:
        order = np.argsort(lines, kind="stable")
        points, lines = points.iloc[order].reset_index(drop=True), lines[order]
    check_counts(points, lines, run, parts[0].table.path)
    return points

