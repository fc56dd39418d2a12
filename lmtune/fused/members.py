"""What each member of a fused group writes, exactly as an unfused run does: its own folder with
config.json, metrics.csv, TensorBoard, training.log, checkpoints/ (ordinary single-model
checkpoints), summary.json and figures; and the interval meter that turns the group's steps into
each member's row.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from lmtune.files import atomic_write_text
from lmtune.fused.step import MemberStepResult
from lmtune.training.checkpoint import Checkpointer
from lmtune.training.config import RunConfig
from lmtune.training.device import peak_memory_bytes, reset_peak_memory, synchronize
from lmtune.training.divergence import DivergenceRule, LossWatch
from lmtune.training.loop import RunEnd, RunResult, finish_run, loss_watch
from lmtune.training.metrics import CsvSink, Row, TensorBoardSink

log = logging.getLogger(__name__)


@dataclass
class Member:
    """One member of a fused group: its config, its folder and the sinks writing it."""

    index: int
    """Its place in the group (the order of ``configs``), fixed for the whole run."""
    config: RunConfig
    out_dir: Path
    checkpointer: Checkpointer
    step: int = 0
    """Steps it trained (the group's step while it runs)."""
    best_val_loss: float = float("inf")
    elapsed_s: float = 0.0
    csv: CsvSink | None = None
    tensorboard: TensorBoardSink | None = None
    watch: LossWatch | None = None
    """Its loss judged as an unfused run's (lmtune.training.divergence)."""
    result: RunResult | None = None
    """How it ended, once it has."""
    rows: list[Row] = field(default_factory=list)

    @classmethod
    def of(cls, index: int, config: RunConfig, out_dir: Path) -> Member:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        return cls(index, config, out_dir, Checkpointer(out_dir / "checkpoints", keep=config.train.keep_checkpoints))

    @property
    def label(self) -> str:
        return f"lr {self.config.train.lr:.3g}"

    def open(self, stack: contextlib.ExitStack, resume_step: int, rule: DivergenceRule) -> None:
        atomic_write_text(self.out_dir / "config.json", self.config.to_json())
        self.csv = stack.enter_context(CsvSink(self.out_dir, resume_step=resume_step))
        self.tensorboard = stack.enter_context(TensorBoardSink(self.out_dir, resume_step=resume_step))
        self.watch = loss_watch(self.config, rule, self.csv.rows)

    def judge(self, row: Row) -> None:
        """The row's train loss through the member's LossWatch (its spike and divergence fields added)."""
        self.watch.see(row["step"], row["train_loss"])
        row.update(self.watch.row_fields())

    def write(self, row: Row) -> None:
        for sink in (self.csv, self.tensorboard):
            sink.write(row, None)

    def finish(self, end: RunEnd, wall_time_s: float, runtime=None) -> RunResult:
        """summary.json and figures, as an unfused run of this config ending so would write them."""
        self.result = finish_run(self.out_dir, self.config, self, end, self.csv.rows, wall_time_s, (), self.watch,
                                 runtime)
        log.info("member %s (%s) ended: %s %s", self.index, self.label, end.status, end.reason)
        return self.result


class MemberMeter:
    """The group's steps between two rows, accumulated on the device per member (no host sync per step)."""

    def __init__(self, members: int, device: torch.device, tokens_per_step: int, flops_per_token: float,
                 peak_flops: float | None, elapsed_before_s: float = 0.0):
        self.device = device
        self.tokens_per_step, self.flops_per_token, self.peak_flops = tokens_per_step, flops_per_token, peak_flops
        self.run_start = time.perf_counter() - elapsed_before_s
        self.loss_sum = torch.zeros(members, device=device)
        self.grad_norm = torch.zeros(members, device=device)
        self.first_bad = torch.full((members,), -1, dtype=torch.long, device=device)
        self.steps, self.wait_s = 0, 0.0
        reset_peak_memory(device)
        self.restart()

    def restart(self) -> None:
        self.interval_start = time.perf_counter()

    def add(self, step: int, result: MemberStepResult, wait_s: float) -> None:
        self.loss_sum += result.loss.float()
        self.grad_norm = result.grad_norm.float()
        bad = ~result.finite & (self.first_bad < 0)
        self.first_bad = torch.where(bad, torch.full_like(self.first_bad, step), self.first_bad)
        self.steps += 1
        self.wait_s += wait_s

    def first_nonfinite_steps(self) -> list[int | None]:
        """Per position, the first step whose loss or gradient norm was not finite (a host sync)."""
        return [s if s >= 0 else None for s in self.first_bad.tolist()]

    def keep(self, positions: list[int]) -> None:
        index = torch.tensor(positions, dtype=torch.long, device=self.device)
        self.loss_sum, self.grad_norm, self.first_bad = (
            t.index_select(0, index) for t in (self.loss_sum, self.grad_norm, self.first_bad))

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.run_start

    def take(self, step: int) -> list[Row]:
        """Each position's row at ``step``. A member's tokens/s is its own (the group's aggregate over K)."""
        synchronize(self.device)
        wall = time.perf_counter() - self.interval_start
        tokens_per_s = self.steps * self.tokens_per_step / wall
        common = {
            "step": step, "tokens": step * self.tokens_per_step, "tokens_per_s": tokens_per_s,
            "mfu": tokens_per_s * self.flops_per_token / self.peak_flops if self.peak_flops else None,
            "data_wait_s": self.wait_s / self.steps, "compute_s": (wall - self.wait_s) / self.steps,
            "peak_memory_bytes": peak_memory_bytes(self.device),
            "elapsed_s": self.elapsed_s(),
        }
        losses, norms = (self.loss_sum / self.steps).tolist(), self.grad_norm.tolist()
        self.loss_sum.zero_()
        self.steps, self.wait_s = 0, 0.0
        return [{**common, "train_loss": loss, "grad_norm": norm} for loss, norm in zip(losses, norms, strict=True)]
