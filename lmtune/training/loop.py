"""The training loop: one model, from a fresh start or a checkpoint, to the end of its budget.

``train()`` is what the CLI (python -m lmtune.train), a sweep's trials and the tests call. Per run it
writes into ``out_dir``: config.json, metrics.csv, TensorBoard events, training.log, checkpoints/,
summary.json, loss_curves.png and lr_schedule.png; for the CLI, with the user's code, code_files.json.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from lmtune.data.batches import BatchSampler, DeviceBatches, fixed_val_batches
from lmtune.data.dataset import load_data, read_meta
from lmtune.files import JsonObject, atomic_write_json, atomic_write_text, writer_lock
from lmtune.training.checkpoint import Checkpointer
from lmtune.training.config import RunConfig, TrainConfig
from lmtune.training.device import configure_backend, peak_flops, resolve_device
from lmtune.training.divergence import DEFAULT_RULE, NON_FINITE, WHOLE_RUN, DivergenceRule, LossWatch
from lmtune.training.figures import write_run_figures
from lmtune.training.lm import ModelSize
from lmtune.training.memory import check_fits, out_of_memory
from lmtune.training.metrics import CsvSink, IntervalMeter, MetricsSink, Row, TensorBoardSink
from lmtune.training.spec import TrainSpec, lmtune_spec
from lmtune.training.state import TrainState
from lmtune.training.step import Runtime, evaluate, train_step

log = logging.getLogger(__name__)

# Called before each optimizer step with the 1-based step number and the model (instrumentation, fault tests).
StepHook = Callable[[int, nn.Module], None]


@dataclass
class RunEnd:
    """How a run ended: completed, diverged (where, and how it was established) or stopped."""

    status: str = "completed"
    detail: str = ""
    """What ended it early, e.g. "non-finite loss"; for a completed run empty, or why it did not learn."""
    diverged_step: int | None = None
    divergence: str | None = None
    """How a divergence was established (lmtune.training.divergence: NON_FINITE, BY_RULE, WHOLE_RUN)."""

    @property
    def reason(self) -> str:
        if self.divergence == NON_FINITE and self.diverged_step:
            return f"{self.detail} at step {self.diverged_step}"
        return self.detail

    @classmethod
    def non_finite(cls, what: str, step: int) -> RunEnd:
        return cls("diverged", f"non-finite {what}", step, NON_FINITE)


class Progress(Protocol):
    """What a run's summary needs of its state: a TrainState, or one member of a fused group."""

    step: int
    best_val_loss: float


@dataclass
class RunResult:
    status: str
    """completed | diverged | stopped (interrupted)"""
    summary: JsonObject
    """summary.json's content."""
    out_dir: Path
    history: list[Row] = field(default_factory=list)
    end: RunEnd = field(default_factory=RunEnd)


def train(config: RunConfig, out_dir: Path, *, resume: bool = False, resume_from: Path | None = None,
          sinks: Sequence[MetricsSink] = (), before_step: StepHook | None = None,
          divergence: DivergenceRule = DEFAULT_RULE, periodic_dir: Path | None = None,
          on_start: Callable[[Path], None] | None = None, spec: TrainSpec | None = None,
          figures: bool = True) -> RunResult:
    """Train one model as ``config`` says, writing everything to ``out_dir``.

    ``resume`` continues from the newest verified checkpoint in out_dir/checkpoints (a fresh start if
    there is none); ``resume_from`` names a checkpoint file. ``sinks`` receive every metrics row after
    metrics.csv and TensorBoard do, and the summary at the end (a sweep's Tune report, W&B).
    ``divergence`` judges the run's loss (spikes, failure to recover); the loop itself only ever ends a
    run at a non-finite value: stopping on the judgement is a sweep's decision. ``periodic_dir``: where the
    periodic checkpoints go and resume looks (default out_dir/checkpoints, beside best.pt; a sweep's trial
    stages them elsewhere and hands each to Ray Tune, which keeps the only copy). ``on_start``: called with
    out_dir once config.json is written (``lmtune train``: the record of the files of the user's code, what a
    ``train --resume`` may import unasked, lmtune.usercode.consent.write_run_record).
    ``spec``: how the run builds its model, optimizer and schedule (lmtune.usercode.spec.spec_for's; None:
    lmtune's own, lmtune.training.spec.LMTUNE). ``figures``: draw loss_curves.png and lr_schedule.png as the run
    ends (a sweep's trials do only when asked: the report draws every trial's curves).
    """
    out_dir = Path(out_dir)
    config = resolve_config(config, Path(config.data_dir))
    t = config.train
    data = load_data(Path(config.data_dir), config.model.context_length, config.model.vocab_size)
    device = resolve_device(t.device)
    spec = spec or lmtune_spec(config)
    check_fits(config, device, spec=spec)
    out_dir.mkdir(parents=True, exist_ok=True)  # only now: refused inputs leave no empty run folder behind
    with contextlib.ExitStack() as cleanup:
        cleanup.enter_context(writer_lock(out_dir, lambda pid: run_being_written(out_dir, pid)))
        configure_backend(device)
        state = TrainState.create(config, device, spec)
        checkpointer = Checkpointer(out_dir / "checkpoints", keep=t.keep_checkpoints, periodic_dir=periodic_dir)
        resumed_from = checkpointer.restore(state, path=resume_from, latest=resume)
        atomic_write_text(out_dir / "config.json", config.to_json())
        if on_start is not None:
            on_start(out_dir)
        cleanup.enter_context(training_log(out_dir))  # first, so it records the resume and everything after
        csv_sink = cleanup.enter_context(CsvSink(out_dir, resume_step=state.step,
                                                 history=checkpointer.restored_history))
        tensorboard = cleanup.enter_context(TensorBoardSink(out_dir, resume_step=state.step))
        if resumed_from is not None:
            log.info("resuming from %s (step %d)", resumed_from, state.step)
        runtime = Runtime.build(state.model, config, device, spec=spec)
        size = spec.model.size(config)
        log_run_start(config, device, size)
        sampler = BatchSampler(data.train, t.batch_size, config.model.context_length, t.seed, config.model.vocab_size)
        batches = cleanup.enter_context(DeviceBatches(sampler, device, start_step=state.step))
        val_batches = fixed_val_batches(data.val, t.batch_size, config.model.context_length, t.eval_batches)
        meter = IntervalMeter(device, config.tokens_per_step, size.flops_per_token,
                              peak_flops(device, runtime.amp_dtype or torch.float32),
                              elapsed_before_s=state.elapsed_s)
        watch = loss_watch(config, divergence, csv_sink.rows)
        lr_of_step = spec.schedule.lr_function(config)
        end = RunEnd()
        try:
            while state.step < t.stop_step:
                step = state.step + 1
                if before_step is not None:
                    before_step(step, state.model)
                x, y = batches.next()
                lr = lr_of_step(step - 1)
                with out_of_memory(config, step):
                    result = train_step(state, runtime, x, y, lr, t, measure=t.logs_at(step))
                if not result.applied:
                    end = RunEnd.non_finite("loss" if not math.isfinite(result.loss.item()) else "gradient norm", step)
                    break
                meter.add(step, result, batches.last_wait_s)
                if not t.logs_at(step):
                    continue
                # ---- a log interval: the loop's only host syncs ----
                row, end = interval_row(step, lr, x, state, runtime, meter, val_batches, watch, t, spec)
                if row is None:
                    break
                for sink in (csv_sink, tensorboard):  # before the checkpoint, which a resume keeps its rows to
                    sink.write(row, None)
                written = save_checkpoints(checkpointer, state, config, row, csv_sink.rows, meter)
                for sink in sinks:
                    sink.write(row, written)
                log_row(row, t.steps)
                meter.restart()
        except KeyboardInterrupt:
            end = RunEnd("stopped", f"interrupted at step {state.step}")
            log.warning("interrupted: the newest checkpoint is kept; continue with --resume")
        return finish_run(out_dir, config, state, end, csv_sink.rows, meter.elapsed_s(), sinks, watch, runtime,
                          spec, figures)


def interval_row(step: int, lr: float, x: torch.Tensor, state: TrainState, runtime: Runtime, meter: IntervalMeter,
                 val_batches, watch: LossWatch, t: TrainConfig, spec: TrainSpec) -> tuple[Row | None, RunEnd]:
    """The row of a log interval (its evaluation, the loss judged, the stability probes on ``x``), or None and
    how the run ended when a loss or gradient norm went non-finite."""
    if (bad_step := meter.first_nonfinite_step()) is not None:
        return None, RunEnd.non_finite("loss or gradient norm", bad_step)
    row = {**meter.take(step, lambda: spec.model.probes(state.model, x[:2])), "lr": lr, "val_loss": None}
    if t.evaluates_at(step):
        row["val_loss"] = evaluate(runtime, val_batches, t.grad_accum_steps)
        if not math.isfinite(row["val_loss"]):
            return None, RunEnd.non_finite("validation loss", step)
    watch.see(step, row["train_loss"])
    row.update(watch.row_fields())
    return row, RunEnd()


def resolve_config(config: RunConfig, data_dir: Path) -> RunConfig:
    """A copy of ``config`` (validated where it was made: the command line, a space, a trial's order) with
    vocab_size from the data's meta.json unless it was set."""
    meta = read_meta(data_dir)
    config = copy.deepcopy(config)
    if config.vocab_from_data:
        config.model.vocab_size = meta.vocab_size
    config.data_dir = str(data_dir)
    return config


def loss_watch(config: RunConfig, rule: DivergenceRule, history: Sequence[Row]) -> LossWatch:
    """The run's LossWatch (ℓ₀: ln vocab, the loss of the uniform guess a fresh model starts at), caught up
    on the rows a resumed run kept."""
    watch = LossWatch(math.log(config.model.vocab_size), config.train.steps, rule)
    for row in history:
        if row.get("train_loss") is not None:
            watch.see(row["step"], row["train_loss"])
    return watch


def judged_end(end: RunEnd, watch: LossWatch | None, steps: int) -> RunEnd:
    """How a run that ended by itself ends once its whole loss is judged: diverged when its loss climbed and
    did not come back below ℓ₀ within the recovery window, or its budget ended above ℓ₀; completed, with why
    as its detail, when it never climbed and simply did not learn within its budget (a stopped or cut run
    is left as it is: it did not show its whole trajectory)."""
    if watch is None or end.status != "completed":
        return end
    verdict = watch.finish(steps)
    if verdict.did_not_learn:
        return RunEnd("completed", verdict.reason)
    return RunEnd("diverged", verdict.reason, verdict.step, WHOLE_RUN) if verdict.diverged else end


def save_checkpoints(checkpointer: Checkpointer, state: TrainState, config: RunConfig, row: Row,
                     history: list[Row], meter: IntervalMeter) -> Path | None:
    """best.pt when the validation loss improved; stable.pt at a WSD run's fork step; a periodic checkpoint when
    one is due (returned)."""
    val_loss = row["val_loss"]
    if val_loss is not None and val_loss < state.best_val_loss:
        state.best_val_loss = val_loss
        checkpointer.save_best(state, config, val_loss)
    if state.step == config.train.fork_step:
        state.elapsed_s = meter.elapsed_s()
        checkpointer.save(state, config, history, stable=True)
    if not config.train.checkpoints_at(state.step):
        return None
    state.elapsed_s = meter.elapsed_s()
    return checkpointer.save(state, config, history)


def run_being_written(out_dir: Path, pid: str) -> str:
    """The one line refusing a second writer of a run folder that another ``train`` holds (pid: the holder's)."""
    return (f"{out_dir} is being written by another lmtune training run (pid {pid}); wait for it to end, or choose "
            "another --out")


def finish_run(out_dir: Path, config: RunConfig, state: Progress, end: RunEnd, rows: list[Row], wall_time: float,
               sinks: Sequence[MetricsSink], watch: LossWatch | None = None,
               runtime: Runtime | None = None, spec: TrainSpec | None = None, figures: bool = True) -> RunResult:
    """summary.json and the run's figures (``figures``: False draws none), then the sinks hear how it ended (``spec``:
    the run's, None: lmtune's)."""
    spec = spec or lmtune_spec(config)
    end = judged_end(end, watch, state.step)
    summary = run_summary(config, state, end, rows, wall_time, spec.model.size(config))
    if watch is not None:
        summary["divergence"] = watch.record()
    if runtime is not None:  # how it ran: compiled or eager (a failed compile falls back), in which precision
        summary.update(compiled=runtime.compiled, precision=str(runtime.amp_dtype or torch.float32).split(".")[-1])
    atomic_write_json(out_dir / "summary.json", summary)
    if figures:
        write_run_figures(out_dir, rows, config, spec.schedule)
    if end.status == "diverged":
        log.warning("run diverged: %s", end.reason)
    elif end.status == "completed" and end.detail:  # its loss never fell below where it started
        log.warning("run %s", end.detail)
    log.info("%s: %s", end.status, json.dumps({k: summary[k] for k in ("best_val_loss", "steps", "tokens_per_s")}))
    result = RunResult(end.status, summary, out_dir, rows, end)
    for sink in sinks:  # last: a sweep may end this process as soon as it hears how the run ended
        sink.close(result)
    return result


def run_summary(config: RunConfig, state: Progress, end: RunEnd, rows: list[Row], wall_time: float,
                size: ModelSize) -> dict:
    """summary.json: how the run ended, its losses, tokens and speed (``size``: its model's, by its spec)."""
    steps = end.diverged_step - 1 if end.divergence == NON_FINITE else state.step
    last_val = next((r["val_loss"] for r in reversed(rows) if r.get("val_loss") is not None), None)
    tokens = steps * config.tokens_per_step
    return {
        "status": end.status, "reason": end.reason,
        "best_val_loss": state.best_val_loss if math.isfinite(state.best_val_loss) else None,
        # final: at the end of the whole schedule (a run stopped at run_steps has none)
        "final_val_loss": last_val if end.status == "completed" and steps == config.train.steps else None,
        # the val loss where the budget ended, whatever the run's status (a diverged run that trained through)
        "end_val_loss": last_val if steps == config.train.steps else None,
        "last_val_loss": last_val, "steps": steps, "run_steps": config.train.stop_step, "tokens": tokens,
        "wall_time_s": wall_time,
        "tokens_per_s": tokens / wall_time if wall_time > 0 else None,
        "diverged_step": end.diverged_step, "diverged_how": end.divergence, "budget": config.budget,
        "lr": config.train.lr, "model": config.code.describe(),
        "params_non_embedding": size.non_embedding, "params_total": size.total,
        "flops_per_token": size.flops_per_token, "flops_estimated": size.estimated,
        "flops_counted": size.counted,
    }


@contextlib.contextmanager
def training_log(out_dir: Path):
    """training.log: every record of the "lmtune" loggers at INFO and above, while the run lasts."""
    handler = logging.FileHandler(out_dir / "training.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    package_log = logging.getLogger("lmtune")
    package_log.addHandler(handler)
    if package_log.getEffectiveLevel() > logging.INFO:
        package_log.setLevel(logging.INFO)
    try:
        yield
    finally:
        package_log.removeHandler(handler)
        handler.close()


def _flops_how(size) -> str:
    return " (counted)" if size.counted else " (estimated by formula)" if size.estimated else ""


def log_run_start(config: RunConfig, device, size: ModelSize) -> None:
    log.info("device=%s params: non-embedding %.2fM, total %.2fM; %.1f MFLOP/token%s; %d steps x %d tokens; model %s",
             device, size.non_embedding / 1e6, size.total / 1e6, size.flops_per_token / 1e6,
             _flops_how(size), config.train.steps, config.tokens_per_step,
             config.code.describe())


def log_row(row: Row, total_steps: int) -> None:
    val = f" val {row['val_loss']:.4f}" if row["val_loss"] is not None else ""
    log.info("step %d/%d loss %.4f%s lr %.3g gnorm %.3g %.0f tok/s", row["step"], total_steps, row["train_loss"],
             val, row["lr"], row["grad_norm"], row["tokens_per_s"])
