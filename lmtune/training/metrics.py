"""A run's metrics: the rows the loop emits, the sinks they go to, and metrics.csv.

This module alone opens metrics.csv, to write it (``CsvSink``) and to read it back (``read_metrics``,
``read_metrics_frame``, ``last_metrics_row``) for a resume, the report and diagnose. The loop hands
every row to a list of sinks: metrics.csv and TensorBoard for every run, Ray Tune's report in a
sweep (lmtune.sweep.reporting), and Weights & Biases when asked (lmtune.training.wandb_sink). What a
row may hold, and which of it goes where, is lmtune.training.metric_registry's.
"""

from __future__ import annotations

import atexit
import csv
import io
import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import torch

from lmtune.files import atomic_write_text
from lmtune.training.device import peak_memory_bytes, reset_peak_memory, synchronize
from lmtune.training.metric_registry import Row, check_row, csv_columns, is_count_column, metric_of, numbers

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.csv"
# The registered columns (a per-layer family: its max only; its layers follow once a row holds them).
METRIC_COLUMNS = csv_columns()
# A count (a COUNT metric) is a whole number from 0 to 2^53 (exact as a float, which is how the report reads it);
# a row holding another (an edited or damaged file: inf, 1e300, a step of -6) is left out, with a warning.
MAX_COUNT = 2**53


def is_count(number: float) -> bool:
    """Whether ``number`` can be a count a run wrote (a step, tokens, bytes): 0 to MAX_COUNT (NaN cannot)."""
    return 0 <= number <= MAX_COUNT


class MetricsSink(Protocol):
    """Where a run's rows go. ``write`` gets every row (and the checkpoint written with it, if any);
    ``close`` gets how the run ended (a lmtune.training.loop.RunResult) once, after the last row."""

    def write(self, row: Row, checkpoint: Path | None) -> None: ...

    def close(self, result: Any) -> None: ...


# ---------------------------------------------------------------------------------------------
# metrics.csv


class CsvSink:
    """metrics.csv. A resumed run keeps the rows up to the checkpoint it resumes from; later rows are
    logged again by the resumed run, so every step appears once. ``history``: the rows the checkpoint itself
    carries, taken instead where the file holds fewer (a folder copied from storage before its last rows
    reached it: a node lost between a checkpoint's upload and the sync of its folder). A row holding a key no
    metric is registered for is refused (metric_registry.UnregisteredMetric); a row bringing registered columns
    the header lacks (a per-layer family's, known from the first row that holds them) rewrites the file once
    with the wider header."""

    def __init__(self, out_dir: Path, resume_step: int = 0, history: list[Row] | None = None):
        self.path = Path(out_dir) / METRICS_FILE
        old = read_metrics(self.path) if resume_step and self.path.exists() else []
        kept = [row for row in old if row["step"] <= resume_step]
        saved = [dict(row) for row in history or () if row.get("step", 0) <= resume_step]
        self.rows: list[Row] = saved if len(saved) > len(kept) else kept
        self._file = None
        self._rewrite()

    def _rewrite(self) -> None:
        """The whole file again, with a header for every row so far; then open for appending."""
        if self._file is not None:
            self._file.close()
        self.columns = csv_columns(self.rows)
        write_metrics(self.path, self.rows, self.columns)
        self._file = open(self.path, "a", newline="")
        self._writer = csv.DictWriter(self._file, fieldnames=self.columns)

    def write(self, row: Row, checkpoint: Path | None = None) -> None:
        check_row(row)
        self.rows.append(row)
        cells = _csv_cells(row, self.columns)
        if len(cells) < sum(1 for key in row if metric_of(key).csv):
            self._rewrite()
        else:
            self._writer.writerow(cells)
        self._file.flush()

    def close(self, result: Any = None) -> None:
        self._file.close()

    def __enter__(self) -> CsvSink:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def write_metrics(path: Path, rows: list[Row], columns: list[str] | None = None) -> None:
    """A whole metrics.csv of these rows, written atomically (header: ``columns``, by default the rows')."""
    columns = columns or csv_columns(rows)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns)
    writer.writeheader()
    writer.writerows(_csv_cells(row, columns) for row in rows)
    atomic_write_text(Path(path), buffer.getvalue())


def _csv_cells(row: Mapping[str, object], columns: list[str]) -> Row:
    """The row's values that are columns of the file (a row's registered non-CSV fields stay out)."""
    wanted = set(columns)
    return {key: value for key, value in row.items() if key in wanted}


def read_metrics(path: Path) -> list[Row]:
    """metrics.csv as typed rows (None where a cell is empty). A last line without its newline is a write
    that was cut (the process died mid-row): it is left out, with a warning, whatever it parses to."""
    with open(path, newline="") as handle:
        text = handle.read()
    if text and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
        log.warning("%s ends mid-row (a write was cut short): its last row is left out", path)
    rows, out_of_range = [], []
    for line, raw in enumerate(csv.DictReader(io.StringIO(text, newline="")), start=2):
        try:
            row = _parse_row(raw)
        except _OutOfRange as err:
            out_of_range.append(f"line {line}: {err}")
            continue
        if row is not None:
            rows.append(row)
    if out_of_range:
        log.warning("%s: %d row(s) with a count out of range left out (%s)", path, len(out_of_range),
                    "; ".join(out_of_range[:3]))
    return rows


def last_metrics_row(path: Path) -> Row | None:
    """The newest row of metrics.csv, or None when it has none (or cannot be read)."""
    try:
        rows = read_metrics(path)
    except (OSError, csv.Error):
        return None
    return rows[-1] if rows else None


def read_metrics_frame(path: Path):
    """metrics.csv as a pandas DataFrame of numbers (empty cells NaN); an empty frame when the file is
    missing, empty or unreadable."""
    import pandas as pd

    try:
        rows = read_metrics(path) if Path(path).is_file() else []
    except (OSError, csv.Error, UnicodeDecodeError) as err:
        log.warning("ignoring unreadable %s: %s", path, err)
        rows = []
    if not rows:
        return pd.DataFrame()
    return pd.DataFrame(rows).apply(pd.to_numeric, errors="coerce")


def _parse_row(raw: dict[str, str | None]) -> Row | None:
    row: Row = {}
    try:
        for key, value in raw.items():
            if key is None or value is None:  # a torn line: too few or too many fields
                return None
            if value == "":
                row[key] = None
            elif is_count_column(key):
                number = float(value)
                if not is_count(number):
                    raise _OutOfRange(f"{key} {value}")
                row[key] = int(number)
            else:
                row[key] = float(value)
    except ValueError:
        return None
    return row if row.get("step") is not None else None


class _OutOfRange(Exception):
    """A count in a metrics row that no run can have written."""


# ---------------------------------------------------------------------------------------------
# TensorBoard


class TensorBoardSink:
    """Every finite number of every row (metric_registry.numbers) as a TensorBoard scalar (out_dir/tensorboard).
    Without tensorboardX installed (a bare GPU box) it writes nothing and says so once per process."""

    _told = False
    lock = threading.Lock()
    """Held to write and to close: a sweep's trial writes and closes from its training thread, while the process may
    be exiting (Ray ending the worker) and closing every writer from its main thread."""

    def __init__(self, out_dir: Path, resume_step: int = 0):
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            self.writer = None
            if not TensorBoardSink._told:
                TensorBoardSink._told = True
                log.warning("tensorboardX is not installed: no TensorBoard events are written (metrics.csv has every "
                            "row; pip install tensorboardX to have them)")
            return
        # purge_step: a resumed run's events past its checkpoint are dropped, as metrics.csv's rows are.
        self.writer = SummaryWriter(str(Path(out_dir) / "tensorboard"), purge_step=resume_step or None)
        # tensorboardX closes its writers at exit too (atexit), checking first whether each is closed: a trial's
        # thread closing the same writer at that moment raced that check, and a "flush of closed file" traceback
        # reached the sweep's console. This sink closes it at exit first (the last registered runs first), under
        # the lock the thread's own close takes, so tensorboardX's finds it closed.
        atexit.register(self.close)

    def write(self, row: Row, checkpoint: Path | None = None) -> None:
        with self.lock:
            if self.writer is None:
                return
            for key, value in numbers(row).items():
                self.writer.add_scalar(key, value, row["step"])
            self.writer.flush()

    def close(self, result: Any = None) -> None:
        with self.lock:
            writer, self.writer = self.writer, None
            if writer is not None:
                writer.close()
        atexit.unregister(self.close)

    def __enter__(self) -> TensorBoardSink:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------
# The figures of one log interval


class IntervalMeter:
    """Accumulates the steps between two rows on the device (no host sync per step) and turns them into
    a row's numbers: mean train loss, tokens/s, MFU, data wait and compute time per step, the gradient norm,
    and what the row's step measured (``StepResult.measured``: metrics a step takes at log steps only). With
    ``members``, a fused group's: every tensor has the members first, and ``take_each`` gives a row per member."""

    def __init__(self, device: torch.device, tokens_per_step: int, flops_per_token: float,
                 peak_flops: float | None, elapsed_before_s: float = 0.0, members: int | None = None):
        self.device = device
        self.tokens_per_step = tokens_per_step
        self.flops_per_token = flops_per_token
        self.peak_flops = peak_flops
        self.run_start = time.perf_counter() - elapsed_before_s
        shape = () if members is None else (members,)
        self.loss_sum = torch.zeros(shape, device=device)
        self.first_bad = torch.full(shape, -1, dtype=torch.long, device=device)
        self.grad_norm = torch.zeros(shape, device=device)
        self.measured: dict[str, torch.Tensor] = {}
        self.steps, self.wait_s = 0, 0.0
        reset_peak_memory(device)
        self.restart()

    def restart(self) -> None:
        """The next interval's clock starts now (evaluation and checkpoints are not counted in it)."""
        self.interval_start = time.perf_counter()

    def add(self, step: int, result, wait_s: float) -> None:
        """One step's result (a StepResult, or a fused group's with a value per member)."""
        self.loss_sum += result.loss.float()
        self.grad_norm = result.grad_norm.float()
        if result.measured:
            self.measured = dict(result.measured)
        bad = ~result.finite & (self.first_bad < 0)
        self.first_bad = torch.where(bad, torch.full_like(self.first_bad, step), self.first_bad)
        self.steps += 1
        self.wait_s += wait_s

    def first_nonfinite_step(self) -> int | None:
        """The first step since the run started whose loss or gradient norm was not finite (a host sync)."""
        step = int(self.first_bad.item())
        return step if step >= 0 else None

    def first_nonfinite_steps(self) -> list[int | None]:
        """Per member, ``first_nonfinite_step`` (one host sync)."""
        return [s if s >= 0 else None for s in self.first_bad.tolist()]

    def keep(self, positions: list[int]) -> None:
        """Keep the members at ``positions`` (a fused group shrinking)."""
        index = torch.tensor(positions, dtype=torch.long, device=self.device)
        self.loss_sum, self.grad_norm, self.first_bad = (
            t.index_select(0, index) for t in (self.loss_sum, self.grad_norm, self.first_bad))
        self.measured = {name: t.index_select(0, index) for name, t in self.measured.items()}

    def elapsed_s(self) -> float:
        """Wall time of the run, earlier processes of a resumed run included."""
        return time.perf_counter() - self.run_start

    def take(self, step: int, probes: Probes | None = None) -> Row:
        """The interval's numbers for the row at ``step``; the interval's sums start again from zero."""
        return self.take_each(step, probes)[0]

    def take_each(self, step: int, probes: Probes | None = None) -> list[Row]:
        """A row per member at ``step`` (one row without members): the interval's numbers, what its last step
        measured, and ``probes()`` (device tensors by metric name, computed once the interval's clock has
        stopped), all read to the host at once. A member's tokens/s is its own: the group's aggregate over
        the members."""
        synchronize(self.device)  # the queued steps finish before the clock is read (CUDA, MPS)
        wall = time.perf_counter() - self.interval_start
        tokens_per_s = self.steps * self.tokens_per_step / wall
        common = {
            "step": step, "tokens": step * self.tokens_per_step, "tokens_per_s": tokens_per_s,
            "mfu": tokens_per_s * self.flops_per_token / self.peak_flops if self.peak_flops else None,
            "data_wait_s": self.wait_s / self.steps, "compute_s": (wall - self.wait_s) / self.steps,
            "peak_memory_bytes": peak_memory_bytes(self.device),
            "elapsed_s": self.elapsed_s(),
        }
        tensors = {"train_loss": self.loss_sum / self.steps, "grad_norm": self.grad_norm, **self.measured,
                   **(probes() if probes is not None else {})}
        values = host_values(tensors, self.loss_sum.numel())
        self.loss_sum.zero_()
        self.steps, self.wait_s, self.measured = 0, 0.0, {}
        return [{**common, **member} for member in values]


# Device tensors by metric name, computed on demand (a row's stability probes).
Probes = Callable[[], Mapping[str, torch.Tensor]]


def host_values(tensors: Mapping[str, torch.Tensor], members: int = 1) -> list[dict[str, float]]:
    """Device tensors by registered metric name as each member's row values, in one host transfer: each tensor
    holds ``members`` values (the members first), a per-layer family's one per layer, expanded to its columns."""
    check_row(tensors)
    flat = [t.detach().reshape(members, -1) for t in tensors.values()]
    dtype = torch.float64 if any(t.dtype == torch.float64 for t in flat) else torch.float32
    table = torch.cat([t.to(dtype) for t in flat], dim=1).tolist()  # the one host sync
    rows = []
    for numbers_of_member in table:
        row, start = {}, 0
        for name, t in zip(tensors, flat, strict=True):
            row.update(metric_of(name).expand(numbers_of_member[start:start + t.shape[1]]))
            start += t.shape[1]
        rows.append(row)
    return rows
