"""The learning-rate range test (Smith 2017, "Cyclical learning rates"; fastai's ``lr_find``).

One short run whose learning rate rises exponentially from ``min_lr`` to ``max_lr``, one step at a
time, until the loss blows up. The smoothed train loss against the LR says where the model learns
fastest (the steepest descent) and where training breaks (the blow-up). It is cheap, a few hundred
steps of one model, but it is not the edge of stability of a full run: each LR is held for one step
only, so a run that stays at an LR (after warm-up) usually breaks somewhat below the blow-up LR. The
edge search uses it to place its coarse grid, not as its answer.

Writes into ``out_dir``: range_test.csv (step, lr, loss, smoothed loss), range_test.json
(``RangeTestResult``) and lr_range_test.png. ``python -m lmtune.lr_find`` runs it alone.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypedDict

import numpy as np

from lmtune.data.batches import BatchSampler, DeviceBatches
from lmtune.data.dataset import load_data
from lmtune.errors import LmtuneError
from lmtune.files import atomic_write_json, atomic_write_text
from lmtune.training.config import MAX_LR, RunConfig
from lmtune.training.device import configure_backend, resolve_device
from lmtune.training.figures import drawable, plot_range_test
from lmtune.training.loop import resolve_config
from lmtune.training.memory import check_fits
from lmtune.training.spec import TrainSpec, lmtune_spec
from lmtune.training.state import TrainState
from lmtune.training.step import Runtime, train_step

log = logging.getLogger(__name__)

RANGE_CSV, RANGE_JSON, RANGE_FIGURE = "range_test.csv", "range_test.json", "lr_range_test.png"
# Rows skipped before looking for the steepest descent: the first steps of a fresh model fall fast at
# any LR (the output layer learns the unigram distribution), which is not the LR's doing.
STEEPEST_SKIP_FRACTION = 0.1
# The range test's length: about 100 steps is the usual (fastai's, the edge search's); a hundred times that still
# ends within the hour for the quick model on 2 CPU cores (most stop at the blow-up far sooner), where a mistyped
# 1e9 would run for years.
MIN_RANGE_STEPS, MAX_RANGE_STEPS = 10, 10_000


@dataclass(frozen=True)
class RangeTestConfig:
    """How the range test ramps the LR and when it stops."""

    min_lr: float = 1e-5
    """The LR of the first step."""
    max_lr: float = 10.0
    """The LR of the last step, if the loss has not blown up before."""
    steps: int = 100
    """Steps from min_lr to max_lr (each step multiplies the LR by (max_lr/min_lr)^(1/(steps-1)))."""
    smoothing: float = 0.9
    """Exponential moving average of the train loss (bias-corrected), as fastai smooths it."""
    blowup_factor: float = 1.5
    """Blown up: the smoothed loss above this x its lowest value so far (or a non-finite loss)."""

    def validate(self, where: str = "range test") -> None:
        def need(ok: bool, message: str) -> None:
            if not ok:
                raise LmtuneError(f"{where}: {message}")

        need(math.isfinite(self.min_lr) and 0 < self.min_lr < MAX_LR,
             f"min_lr must be a positive number below {MAX_LR:g} (got {self.min_lr})")
        need(math.isfinite(self.max_lr) and self.min_lr < self.max_lr <= MAX_LR,
             f"max_lr must be a number above min_lr={self.min_lr:g} and at most {MAX_LR:g}, the largest lr a run takes "
             f"(got {self.max_lr})")
        need(MIN_RANGE_STEPS <= self.steps <= MAX_RANGE_STEPS, f"steps must be a whole number from {MIN_RANGE_STEPS} "
             f"to {MAX_RANGE_STEPS:,}; a range test takes about 100 (got {self.steps:,})")
        need(0 <= self.smoothing < 1, f"smoothing must be in [0, 1) (got {self.smoothing})")
        need(math.isfinite(self.blowup_factor) and self.blowup_factor > 1,
             f"blowup_factor must be a number above 1, e.g. 1.5 (got {self.blowup_factor})")

    def lr_at(self, index: int) -> float:
        """The LR of the (0-based) step ``index``."""
        return self.min_lr * (self.max_lr / self.min_lr) ** (index / (self.steps - 1))


class RangeTestJson(TypedDict):
    """range_test.json's content (``RangeTestResult.to_json``): RangeTestResult's fields, non-finite losses as
    null (the file adds the settings)."""

    lrs: list[float]
    losses: list[float | None]
    smoothed: list[float | None]
    steepest_lr: float | None
    min_loss_lr: float | None
    blowup_lr: float | None
    stopped_because: str
    tokens: int


class RangeRow(TypedDict):
    """A row the range test reports while it runs (a sweep's trial hands it to Tune)."""

    step: int
    """Steps done."""
    tokens: int
    """Tokens trained."""
    lr: float
    """The step's LR."""
    train_loss: float
    """The step's train loss."""
    smoothed_loss: float
    """The smoothed loss so far."""


@dataclass
class RangeTestResult:
    """What the range test found: the LRs and losses it saw, and the three LRs read from them."""

    lrs: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    """Train loss of each step (NaN where it was not finite)."""
    smoothed: list[float] = field(default_factory=list)
    steepest_lr: float | None = None
    """Where the smoothed loss fell fastest per unit of log LR, before its minimum."""
    min_loss_lr: float | None = None
    """Where the smoothed loss was lowest: beyond it, a larger LR no longer helps within one step."""
    blowup_lr: float | None = None
    """The first LR at which the loss blew up (None: it never did up to max_lr)."""
    stopped_because: str = ""
    tokens: int = 0
    """Tokens the test trained."""

    def to_json(self) -> RangeTestJson:
        """JSON-safe: non-finite losses as null."""
        return {**asdict(self), "losses": [v if math.isfinite(v) else None for v in self.losses],
                "smoothed": [v if math.isfinite(v) else None for v in self.smoothed]}

    @classmethod
    def from_json(cls, data: RangeTestJson) -> RangeTestResult:
        nan = float("nan")
        return cls(**{**data, "losses": [nan if v is None else float(v) for v in data.get("losses", [])],
                      "smoothed": [nan if v is None else float(v) for v in data.get("smoothed", [])]})

    def summary_line(self) -> str:
        blowup = f"blow-up at lr {self.blowup_lr:.3g}" if self.blowup_lr else "no blow-up up to the largest LR"
        steepest = f"steepest descent at lr {self.steepest_lr:.3g}" if self.steepest_lr else "no descent found"
        return f"{steepest}; lowest loss at lr {_g(self.min_loss_lr)}; {blowup}"


def _g(value: float | None) -> str:
    return "—" if value is None else f"{value:.3g}"


# ---------------------------------------------------------------------------------------------
# Reading the curve (pure)


def smooth_losses(losses: list[float], beta: float) -> list[float]:
    """Bias-corrected exponential moving average; a non-finite loss makes every later value NaN."""
    average, out = 0.0, []
    for i, loss in enumerate(losses, start=1):
        if not math.isfinite(loss) or (out and not math.isfinite(out[-1])):
            out.append(float("nan"))
            continue
        average = beta * average + (1 - beta) * loss
        out.append(average / (1 - beta ** i))
    return out


def blew_up(smoothed: list[float], factor: float) -> bool:
    """The newest smoothed loss is non-finite or above ``factor`` x the lowest one before it."""
    if not smoothed:
        return False
    newest = smoothed[-1]
    if not math.isfinite(newest):
        return True
    earlier = [v for v in smoothed[:-1] if math.isfinite(v)]
    return bool(earlier) and newest > factor * min(earlier)


def read_curve(lrs: list[float], smoothed: list[float]) -> tuple[float | None, float | None]:
    """(steepest-descent LR, lowest-loss LR) of a smoothed range-test curve.

    The steepest descent is the most negative d(smoothed loss)/d(log lr), searched from a tenth of
    the way in (STEEPEST_SKIP_FRACTION) up to the lowest point, so it can never lie beyond the
    minimum, let alone beyond the blow-up."""
    values = np.asarray(smoothed, dtype=np.float64)
    finite = np.isfinite(values)
    if finite.sum() < 3:
        return None, None
    last = int(np.nonzero(finite)[0][-1])
    low = int(np.nanargmin(values[: last + 1]))
    min_lr = float(lrs[low])
    start = min(int(STEEPEST_SKIP_FRACTION * len(values)), max(low - 2, 0))
    if low - start < 2:
        return None, min_lr
    slopes = np.gradient(values[start: low + 1], np.log(np.asarray(lrs[start: low + 1], dtype=np.float64)))
    steepest = int(np.argmin(slopes)) + start
    return (float(lrs[steepest]) if slopes.min() < 0 else None), min_lr


# ---------------------------------------------------------------------------------------------
# Running it

Report = Callable[[RangeRow], None]


def lr_range_test(config: RunConfig, settings: RangeTestConfig, out_dir: Path, report: Report | None = None,
                  report_every: int = 10, spec: TrainSpec | None = None) -> RangeTestResult:
    """Run the range test on ``config``'s model and data (its own lr and schedule are not used).

    ``report`` receives a row every ``report_every`` steps and the last one (a sweep's Tune report). ``spec``: how
    the run builds its model and optimizer (None: lmtune's own)."""
    settings.validate()
    out_dir = Path(out_dir)
    config = resolve_config(config, Path(config.data_dir))  # the data's vocabulary, as train uses
    t = config.train
    data = load_data(Path(config.data_dir), config.model.context_length, config.model.vocab_size)
    device = resolve_device(t.device)
    spec = spec or lmtune_spec(config)
    check_fits(config, device, spec=spec)
    out_dir.mkdir(parents=True, exist_ok=True)
    configure_backend(device)
    state = TrainState.create(config, device, spec)
    runtime = Runtime.build(state.model, config, device, spec=spec)
    sampler = BatchSampler(data.train, t.batch_size, config.model.context_length, t.seed, config.model.vocab_size)
    result = RangeTestResult()
    with DeviceBatches(sampler, device) as batches:
        for index in range(settings.steps):
            lr = settings.lr_at(index)
            x, y = batches.next()
            step = train_step(state, runtime, x, y, lr, t)
            loss = float(step.loss.item())  # one sync per step: the test reads every loss
            result.lrs.append(lr)
            result.losses.append(loss if math.isfinite(loss) else float("nan"))
            result.smoothed = smooth_losses(result.losses, settings.smoothing)
            done = blew_up(result.smoothed, settings.blowup_factor)
            if report is not None and (done or (index + 1) % report_every == 0 or index + 1 == settings.steps):
                report({"step": index + 1, "tokens": (index + 1) * config.tokens_per_step, "lr": lr,
                        "train_loss": loss, "smoothed_loss": result.smoothed[-1]})
            if done:
                result.blowup_lr = lr
                result.stopped_because = (f"the loss blew up at lr {lr:.3g} (non-finite)" if not math.isfinite(loss)
                                          else f"the smoothed loss rose above {settings.blowup_factor:g}x its lowest "
                                               f"value at lr {lr:.3g}")
                break
        else:
            result.stopped_because = f"reached max_lr {settings.max_lr:g} without blowing up"
    result.tokens = len(result.lrs) * config.tokens_per_step
    result.steepest_lr, result.min_loss_lr = read_curve(result.lrs, result.smoothed)
    write_range_test(out_dir, result, settings)
    log.info("LR range test: %s (%s)", result.summary_line(), result.stopped_because)
    return result


def write_range_test(out_dir: Path, result: RangeTestResult, settings: RangeTestConfig) -> None:
    """range_test.csv, range_test.json and lr_range_test.png."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["step", "lr", "loss", "smoothed_loss"])
    for i, (lr, loss, smooth) in enumerate(zip(result.lrs, result.losses, result.smoothed, strict=True), start=1):
        writer.writerow([i, f"{lr:.6g}", "" if not math.isfinite(loss) else f"{loss:.6f}",
                         "" if not math.isfinite(smooth) else f"{smooth:.6f}"])
    atomic_write_text(out_dir / RANGE_CSV, buffer.getvalue())
    atomic_write_json(out_dir / RANGE_JSON, {**result.to_json(), "settings": asdict(settings)})
    if drawable(RANGE_FIGURE):
        plot_range_test(result, out_dir / RANGE_FIGURE)


def read_range_test(directory: Path) -> RangeTestResult | None:
    """The range_test.json in ``directory``, or None (absent or unreadable, with a warning)."""
    path = Path(directory) / RANGE_JSON
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        data.pop("settings", None)
        return RangeTestResult.from_json(data)
    except (OSError, ValueError, TypeError) as err:
        log.warning("%s unreadable (%s); the range test is left out", path, err)
        return None
