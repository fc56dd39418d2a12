"""What each member of a fused group writes, exactly as an unfused run does: its own folder with
config.json, metrics.csv, TensorBoard, training.log, checkpoints/ (ordinary single-model
checkpoints), summary.json and figures.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path

from lmtune.files import atomic_write_text
from lmtune.training.checkpoint import Checkpointer
from lmtune.training.config import RunConfig
from lmtune.training.divergence import DivergenceRule, LossWatch
from lmtune.training.loop import RunEnd, RunResult, finish_run, loss_watch
from lmtune.training.metrics import CsvSink, Row, TensorBoardSink
from lmtune.training.spec import TrainSpec

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
    spec: TrainSpec | None = None
    """The group's training spec (its schedule draws the member's lr_schedule.png; None: lmtune's own)."""
    figures: bool = True
    """Whether it draws its own loss_curves.png and lr_schedule.png as it ends (finish_run's ``figures``)."""

    @classmethod
    def of(cls, index: int, config: RunConfig, out_dir: Path, spec: TrainSpec | None = None,
           figures: bool = True) -> Member:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        return cls(index, config, out_dir, Checkpointer(out_dir / "checkpoints", keep=config.train.keep_checkpoints),
                   spec=spec, figures=figures)

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
                                 runtime, self.spec, figures=self.figures)
        log.info("member %s (%s) ended: %s %s", self.index, self.label, end.status, end.reason)
        return self.result
