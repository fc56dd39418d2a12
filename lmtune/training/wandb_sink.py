"""Weights & Biases for one training run (python -m lmtune.train --wandb PROJECT).

An optional extra: ``pip install -e '.[wandb]'``. Runs without network with ``WANDB_MODE=offline``
(wandb's own switch); ``wandb sync`` uploads them later. A sweep uses Ray Tune's own
WandbLoggerCallback instead (lmtune.sweep.runner).
"""

from __future__ import annotations

import math
import secrets
from pathlib import Path
from typing import Any

from lmtune.errors import LmtuneError
from lmtune.files import atomic_write_text
from lmtune.training.config import RunConfig
from lmtune.training.metric_registry import Row, numbers


def import_wandb():
    try:
        import wandb
    except ImportError:
        raise LmtuneError("--wandb needs the wandb package; install it with pip install -e '.[wandb]' "
                          "or drop --wandb") from None
    return wandb


class WandbSink:
    """Every row's finite numbers (metric_registry.numbers) as a W&B history step, the summary as the run's
    summary. The W&B run starts with the first row, so a run refused before it trains leaves nothing behind;
    a resumed run continues the same W&B run (its id is kept in out_dir/wandb/run_id)."""

    def __init__(self, project: str, config: RunConfig, out_dir: Path):
        self.wandb = import_wandb()
        self.project, self.config, self.out_dir = project, config, Path(out_dir)
        self.run: Any = None  # (a wandb Run, from the first row on)

    def _start(self) -> None:
        folder = self.out_dir / "wandb"
        folder.mkdir(parents=True, exist_ok=True)
        id_file = folder / "run_id"
        run_id = id_file.read_text().strip() if id_file.is_file() else secrets.token_hex(4)
        atomic_write_text(id_file, run_id + "\n")
        self.run = self.wandb.init(project=self.project, id=run_id, resume="allow", name=self.out_dir.name,
                                   dir=str(self.out_dir), config=self.config.to_dict())

    def write(self, row: Row, checkpoint: Path | None = None) -> None:
        values = numbers(row)  # (refuses a key no metric is registered for, before W&B starts)
        if self.run is None:
            self._start()
        # commit: each row is whole when written; with a step given, wandb otherwise holds it until a later step or
        # the run's finish flushes it, and a finish under load lost the last one (its history came back empty)
        self.run.log(values, step=row["step"], commit=True)

    def close(self, result: Any) -> None:
        if self.run is None:
            self._start()
        summary = result.summary
        self.run.summary.update({k: v for k, v in summary.items() if isinstance(v, str) or _finite_number(v)})
        self.run.finish(exit_code=0 if summary["status"] == "completed" else 1)


def _finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
