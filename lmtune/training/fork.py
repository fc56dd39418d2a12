"""One budget from another's run: under a warmup-stable-decay schedule two runs of one LR, seed, warm-up,
batch and model train identically until the shorter one's cooldown begins, so either can start from the
other's checkpoint at (or before) that step: a shorter run trains only its cooldown from a longer run's
checkpoint, and a longer run continues from a shorter run's stable.pt (the state where its stable phase ends).

    fork_run(parent_checkpoint, config, out_dir)  # config: the run to train (schedule: wsd)
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

from lmtune.errors import LmtuneError
from lmtune.training.checkpoint import load_checkpoint
from lmtune.training.config import RunConfig
from lmtune.training.loop import RunResult, resolve_config, train
from lmtune.training.metrics import METRICS_FILE, write_metrics
from lmtune.training.schedule import stable_until

# What may differ between a run and the longer run it forks from: the budget and its bookkeeping. Anything
# else (LR, seed, warm-up, batch, model, the cooldown's floor) would make the shared prefix a different run.
MAY_DIFFER = {"steps", "run_steps", "cooldown_fraction", "log_interval", "eval_interval", "checkpoint_interval",
              "keep_checkpoints", "cooldown_shape", "device", "compile", "compile_backend", "compile_mode"}


def fork_run(parent_checkpoint: Path, config: RunConfig, out_dir: Path, **train_kwargs) -> RunResult:
    """Train ``config`` (a WSD run) from ``parent_checkpoint`` of another WSD run, writing a whole run into
    ``out_dir``: the parent's metrics rows up to the fork, then this run's own. Refused, in one line, when
    the two runs would not have trained identically up to the checkpoint."""
    saved = load_checkpoint(Path(parent_checkpoint))
    parent = RunConfig.from_dict(saved["config"])
    config = resolve_config(config, Path(config.data_dir))  # the data's vocabulary, as the parent has it
    step = int(saved["step"])
    check_forkable(parent, config, step, Path(parent_checkpoint))
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise LmtuneError(f"{out_dir} already holds files; fork into a new folder")
    out_dir.mkdir(parents=True, exist_ok=True)
    write_metrics(out_dir / METRICS_FILE, [row for row in saved.get("history", []) if row["step"] <= step])
    return train(config, out_dir, resume_from=Path(parent_checkpoint), **train_kwargs)


def check_forkable(parent: RunConfig, child: RunConfig, step: int, where: Path) -> None:
    """One line when ``child`` trained from ``parent``'s checkpoint at ``step`` would not be the run ``child``
    trains from scratch."""
    t, p = child.train, parent.train
    if t.schedule != "wsd" or p.schedule != "wsd":
        raise LmtuneError(f"{where}: only warmup-stable-decay runs fork (schedule: wsd on both runs)")
    differ = sorted(k for k, v in asdict(replace(p, **{k: getattr(t, k) for k in MAY_DIFFER})).items()
                    if v != getattr(t, k))
    if differ or asdict(parent.model) != asdict(child.model) or parent.data_dir != child.data_dir:
        what = ", ".join(differ) or "the model or data"
        raise LmtuneError(f"{where}: the runs differ in {what}; a fork shares everything but the budget")
    last = min(stable_until(p), stable_until(t))
    if step - 1 > last:  # step k's update used the LR of 0-based index k - 1
        raise LmtuneError(f"{where} is at step {step}, after step {last + 1}, where the shorter run's cooldown "
                          "begins; fork from an earlier checkpoint")
