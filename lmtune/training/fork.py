"""One budget from another's run: under a warmup-stable-decay schedule two runs of one LR, seed, warm-up,
batch and model train identically until the shorter one's cooldown begins, so either can start from the
other's checkpoint at (or before) that step: a shorter run trains only its cooldown from a longer run's
checkpoint, and a longer run continues from a shorter run's stable.pt (the state where its stable phase ends).

    fork_run(parent_checkpoint, config, out_dir)  # config: the run to train (schedule: wsd)
"""

from __future__ import annotations

import pickle
from dataclasses import asdict, replace
from pathlib import Path

from lmtune.errors import LmtuneError
from lmtune.files import check_destination
from lmtune.training.checkpoint import RunCheckpoint, load_checkpoint
from lmtune.training.config import RunConfig
from lmtune.training.loop import RunResult, resolve_config, train
from lmtune.training.metrics import METRICS_FILE, write_metrics
from lmtune.training.schedule import first_lr_difference
from lmtune.training.spec import TrainSpec, lmtune_spec

# What may differ between a run and the longer run it forks from: the budget and its bookkeeping. Anything
# else (LR, seed, warm-up, batch, model, the cooldown's floor) would make the shared prefix a different run.
MAY_DIFFER = {"steps", "run_steps", "cooldown_fraction", "log_interval", "eval_interval", "checkpoint_interval",
              "keep_checkpoints", "cooldown_shape", "device", "compile", "compile_backend", "compile_mode"}


def fork_run(parent_checkpoint: Path, config: RunConfig, out_dir: Path, spec: TrainSpec | None = None,
             **train_kwargs) -> RunResult:
    """Train ``config`` (a WSD run) from ``parent_checkpoint`` of another WSD run, writing a whole run into
    ``out_dir``: the parent's metrics rows up to the fork, then this run's own. Refused, in one line, when
    the two runs would not have trained identically up to the checkpoint. ``spec``: both runs' (a fork shares
    their code; None: lmtune's own)."""
    spec = spec or lmtune_spec(config)
    out_dir = check_destination(Path(out_dir), "out_dir", fix="fork into a new folder")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise LmtuneError(f"{out_dir} already holds files; fork into a new folder")
    saved = read_parent(Path(parent_checkpoint))
    parent = RunConfig.from_dict(saved["config"])
    config = resolve_config(config, Path(config.data_dir))  # the data's vocabulary, as the parent has it
    step = int(saved["step"])
    check_forkable(parent, config, step, Path(parent_checkpoint), spec)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_metrics(out_dir / METRICS_FILE, [row for row in saved.get("history", []) if row["step"] <= step])
    return train(config, out_dir, resume_from=Path(parent_checkpoint), spec=spec, **train_kwargs)


def read_parent(path: Path) -> RunCheckpoint:
    """The parent's checkpoint (a periodic checkpoint or stable.pt: it carries the config and the rows), or one
    line saying why it cannot be forked from."""
    if not path.is_file():
        what = "is a folder" if path.is_dir() else "does not exist"
        raise LmtuneError(f"parent checkpoint {path} {what}; give a checkpoint file of the run to fork "
                          "(its checkpoints/step_NNNNNNNN.pt or stable.pt)")
    try:
        saved = load_checkpoint(path)
    except (ValueError, RuntimeError, EOFError, OSError, pickle.UnpicklingError) as err:
        raise LmtuneError(f"parent checkpoint {path} is unusable ({err}); fork from another checkpoint") from None
    if not isinstance(saved, dict) or not {"config", "step", "optimizer"} <= saved.keys():
        raise LmtuneError(f"parent checkpoint {path} holds no run state (best.pt holds the model alone); "
                          "fork from a periodic checkpoint or stable.pt")
    return saved


def same_data(a: str, b: str) -> bool:
    """Two data folders are one when their paths resolve to the same place (a relative path and an absolute
    one, or a symlink, name the same data)."""
    return Path(a).resolve() == Path(b).resolve()


def check_forkable(parent: RunConfig, child: RunConfig, step: int, where: Path, spec: TrainSpec) -> None:
    """One line when ``child`` trained from ``parent``'s checkpoint at ``step`` would not be the run ``child``
    trains from scratch (their LRs by ``spec``'s schedule, which the same code makes both runs')."""
    t, p = child.train, parent.train
    if t.schedule != "wsd" or p.schedule != "wsd":
        raise LmtuneError(f"{where}: only warmup-stable-decay runs fork (schedule: wsd on both runs)")
    differ = sorted(k for k, v in asdict(replace(p, **{k: getattr(t, k) for k in MAY_DIFFER})).items()
                    if v != getattr(t, k))
    if differ or asdict(parent.model) != asdict(child.model) or parent.code != child.code \
            or not same_data(parent.data_dir, child.data_dir):
        what = ", ".join(differ) or "the model, its code or the data"
        raise LmtuneError(f"{where}: the runs differ in {what}; a fork shares everything but the budget")
    first = first_lr_difference(spec.schedule.lr_function(parent), spec.schedule.lr_function(child), step)
    if first is not None:  # (only their cooldowns can differ here)
        raise LmtuneError(f"{where} is at step {step}, after step {first[0] - 1}, where the shorter run's cooldown "
                          "begins; fork from an earlier checkpoint")
