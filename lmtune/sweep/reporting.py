"""A run as Ray Tune sees it: its rows as Tune results with its checkpoints (``TuneSink``), and the checkpoint
Tune restores a trial from put back where the run's own resume looks.

A periodic checkpoint has one home: Tune's. The run writes it, hands it to ``tune.report`` (which persists it
into the trial's ``checkpoint_NNNNNN/`` folder in the sweep's storage before it returns) and deletes its own
copy; Tune's CheckpointConfig then decides how many stay, and a trial restored on any node gets it from there.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import ray
from ray import tune

from lmtune.files import link_or_copy
from lmtune.searches.trial_order import TuneResult
from lmtune.training.checkpoint import checksum_path, rotate
from lmtune.training.config import RunConfig
from lmtune.training.loop import RunResult
from lmtune.training.metric_registry import Row, check_row


class TuneSink:
    """A run's rows as Tune results, each with the checkpoint written at it; the run ends with one more
    result saying how its loss was judged (its spikes; and a divergence, which the sweep's stopper turns
    into the trial's outcome). ``early_stop`` False marks every result ``no_early_stop`` (the stopper's
    divergence rule then leaves the trial alone: an edge search's confirmation run)."""

    def __init__(self, config: RunConfig, early_stop: bool = True):
        self.config = config
        self.early_stop = early_stop
        # What a diverged trial is worth to a searcher: the loss of a uniform guess.
        self.uniform_loss = math.log(config.model.vocab_size)
        self.latest_val = self.uniform_loss
        # Every result carries val_loss, as Tune's metric checks and searchers expect: the latest evaluation,
        # measured at val_step (before the first, ln vocab at step 0: a fresh model's loss). Readers that compare
        # losses at equal tokens take it only where val_step is the result's own step (evaluated_val_loss).
        self.measured: tuple[float, int] = (self.uniform_loss, 0)
        # (node_ip is shared by raylets on one host; outside Ray, e.g. a sink built in a test, there is none)
        self.node_id = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None

    def result(self, values: TuneResult) -> TuneResult:
        """The Tune result of ``values`` (a row, or a group's): its values that are set, the latest evaluation
        and what the sweep's stopper, searchers and ledger read."""
        if values.get("val_loss") is not None:
            self.measured = (values["val_loss"], values["step"])
        measured = {"val_loss": self.measured[0], "val_step": self.measured[1]}
        return {**{k: v for k, v in values.items() if v is not None}, **measured, "objective": self.latest_val,
                "total_tokens": self.config.total_tokens, "run_tokens": self.config.run_tokens,
                "uniform_loss": self.uniform_loss,
                # The last warm-up step runs at the peak LR: judged like the rest (ASHA may cut there).
                "in_warmup": values["step"] < self.config.train.warmup_steps,
                **({} if self.node_id is None else {"node_id": self.node_id}),
                **({} if self.early_stop else {"no_early_stop": True})}

    def write(self, row: Row, checkpoint: Path | None) -> None:
        """A run's row (registered metrics only: metric_registry.check_row) as a Tune result."""
        check_row(row)
        files = {} if checkpoint is None else {p.name: p for p in (checkpoint, checksum_path(checkpoint))}
        self.report(row, files)

    def report(self, values: TuneResult, files: dict[str, Path]) -> None:
        """One Tune result; with ``files`` (name in the checkpoint -> path), a tune.Checkpoint of them, handed
        over: once Tune has stored them, the run's own periodic checkpoints in their folders are deleted."""
        if values.get("val_loss") is not None and math.isfinite(values["val_loss"]):
            self.latest_val = values["val_loss"]
        metrics = self.result(values)
        if not files:
            tune.report(metrics)
            return
        folders = {path.parent for path in files.values()}
        with tempfile.TemporaryDirectory(prefix="lmtune-ckpt-", dir=min(folders)) as staging:
            for name, path in files.items():
                link_or_copy(path, Path(staging) / name)  # (a link: Tune copies it into storage from here)
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(staging))
        for folder in folders:  # stored by Tune now: the run's copies would be the same bytes twice
            rotate(folder, keep=0)

    def refuse(self, error: str) -> None:
        """The trial's only result: it ends as an error before training (``error``, one line), without the
        exception that would have Tune retry what fails the same way every time."""
        tune.report(self.result({"step": 0, "tokens": 0, "error": error}))

    def close(self, result: RunResult) -> None:
        """A run that diverged ends with one more result saying where and how (the stopper's, and the
        ledger's, reason); any other run's last row was its last result."""
        if result.status != "diverged":
            return
        step = result.end.diverged_step
        self.latest_val = self.uniform_loss
        tune.report(self.result({"step": result.summary["steps"], "tokens": result.summary["tokens"],
                                   "diverged": True, "diverged_because": result.end.detail, "diverged_step": step,
                                   "diverged_tokens": step * self.config.tokens_per_step,
                                   "divergence": result.end.divergence}))


def restore_tune_checkpoint(periodic_dir: Path) -> None:
    """Put the checkpoint Tune restores this trial from (a retry, or --resume on a new node) into
    ``periodic_dir``, where the loop's resume looks (a hard link where Tune's copy is on this filesystem)."""
    restored = tune.get_checkpoint()
    if restored is None:
        return
    with restored.as_directory() as directory:
        for path in Path(directory).glob("step_*.pt*"):
            if not (periodic_dir / path.name).exists():
                link_or_copy(path, periodic_dir / path.name)
