"""Where a run's figures are drawn: loss_curves.png and lr_schedule.png, from its metrics rows; and
``save_figure``, through which every PNG lmtune writes (the report's too) is written atomically.

matplotlib is imported when a figure is drawn, not with this module: a machine without it (a bare GPU box) still
trains, and its runs say once that they drew no figures (``drawable``)."""

from __future__ import annotations

import importlib.util
import io
import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lmtune.files import atomic_write_bytes
from lmtune.training.config import RunConfig
from lmtune.training.spec import ScheduleSpec

log = logging.getLogger(__name__)
_told = False


def pyplot():
    """matplotlib's pyplot on its file-only backend (Agg: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def drawable(what: str) -> bool:
    """Whether matplotlib is installed; said once per process where it is not (``what``: the figures skipped)."""
    global _told
    if importlib.util.find_spec("matplotlib") is not None:
        return True
    if not _told:
        _told = True
        log.warning("matplotlib is not installed: %s not drawn (pip install matplotlib to have them)", what)
    return False


def write_run_figures(out_dir: Path, rows: list[dict], config: RunConfig, schedule: ScheduleSpec) -> None:
    """loss_curves.png and lr_schedule.png (the LR of each step by the run's ``schedule``)."""
    if not drawable("a run's loss_curves.png and lr_schedule.png"):
        return
    t = config.train
    plot_loss_curves(rows, out_dir / "loss_curves.png", title=f"lr={t.lr:g} ({config.budget})")
    stride = max(1, t.steps // 500)
    steps = list(range(0, t.steps, stride)) + [t.steps - 1]
    lr_of_step = schedule.lr_function(config)
    shape = schedule.describe(t)
    plot_lr_schedule([s + 1 for s in steps], [lr_of_step(s) for s in steps], out_dir / "lr_schedule.png",
                     f"learning-rate schedule ({shape})")


_MARKS: list[str] = []


@contextmanager
def figures_marked(text: str) -> Iterator[None]:
    """While it lasts every figure ``save_figure`` writes carries ``text`` in red above it (a report of a sweep read
    while trials ran: its figures may still change, and must not pass for a finished sweep's); '' marks nothing."""
    _MARKS.append(text)
    try:
        yield
    finally:
        _MARKS.pop()


def mark_figure(fig, text: str) -> None:
    """``text`` above ``fig``'s own titles (a suptitle included), where no plot hides it."""
    fig.text(0.5, 1.0, text, ha="center", va="bottom", color="tab:red", fontsize=11, fontweight="bold")


def save_figure(fig, path: Path) -> Path:
    if _MARKS and _MARKS[-1]:  # (here, so a search section's own figures are marked as lmtune's are)
        mark_figure(fig, _MARKS[-1])
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    pyplot().close(fig)
    atomic_write_bytes(path, buffer.getvalue())
    return path


# A wall-clock axis is drawn in one unit, the one its longest run reads best in: (unit, seconds in it, the longest
# run it is used up to).
WALL_UNITS = (("s", 1.0, 120.0), ("min", 60.0, 120 * 60.0), ("h", 3600.0, math.inf))


def wall_unit(seconds: float) -> tuple[str, float]:
    """The one unit (and its length in seconds) of a wall-clock axis whose longest run took ``seconds``: seconds up
    to 2 minutes, minutes up to 2 hours, hours beyond; every tick of the axis is in it."""
    return next((name, scale) for name, scale, below in WALL_UNITS if seconds < below)


def readable_lr_axis(ax, axis: str = "x") -> None:
    """A log LR axis (``axis``: x or y) labelled 0.005, 0.01, 0.02 (readable LRs), no minor labels."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    getattr(ax, f"set_{axis}scale")("log")
    lr_axis = ax.xaxis if axis == "x" else ax.yaxis
    lr_axis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
    lr_axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    lr_axis.set_minor_formatter(NullFormatter())


def plot_loss_curves(rows: list[dict], path: Path, title: str = "") -> Path:
    fig, ax = pyplot().subplots(figsize=(7, 4.5))
    train = [(r["tokens"], r["train_loss"]) for r in rows if _finite(r.get("train_loss"))]
    val = [(r["tokens"], r["val_loss"]) for r in rows if _finite(r.get("val_loss"))]
    if train:
        ax.plot(*zip(*train, strict=True), label="train loss", color="tab:blue", alpha=0.6)
    if val:
        ax.plot(*zip(*val, strict=True), "o-", label="val loss", color="tab:orange")
    ax.set_xlabel("tokens")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(title or "loss curves")
    ax.grid(alpha=0.3)
    if train or val:  # a run that diverged before its first row has no curve to label
        ax.legend()
    return save_figure(fig, path)


def plot_lr_schedule(steps: list[int], lrs: list[float], path: Path,
                     title: str = "learning-rate schedule") -> Path:
    fig, ax = pyplot().subplots(figsize=(7, 3.5))
    ax.plot(steps, lrs, color="tab:green")
    ax.set_xlabel("step")
    ax.set_ylabel("learning rate")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    return save_figure(fig, path)


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def plot_range_test(result, path: Path) -> Path:
    """The LR range test (a lmtune.training.lr_range.RangeTestResult): train loss against the rising
    LR, raw and smoothed, with the steepest-descent, lowest-loss and blow-up LRs marked."""
    fig, ax = pyplot().subplots(figsize=(7.5, 4.5))
    raw = [(lr, v) for lr, v in zip(result.lrs, result.losses, strict=True) if _finite(v)]
    smooth = [(lr, v) for lr, v in zip(result.lrs, result.smoothed, strict=True) if _finite(v)]
    if raw:
        ax.plot(*zip(*raw, strict=True), color="tab:blue", alpha=0.3, linewidth=0.8, label="train loss")
    if smooth:
        ax.plot(*zip(*smooth, strict=True), color="tab:blue", linewidth=2, label="smoothed")
        low = min([v for _, v in smooth] + [v for _, v in raw])
        high = max(v for _, v in smooth)
        ax.set_ylim(low - 0.05 * (high - low + 1e-3), high + 0.15 * (high - low + 1e-3))
    for lr, color, label in ((result.steepest_lr, "tab:green", "steepest descent"),
                             (result.min_loss_lr, "tab:orange", "lowest loss"),
                             (result.blowup_lr, "red", "blow-up")):
        if lr:
            ax.axvline(lr, color=color, linestyle=":", linewidth=1.5, label=f"{label} {lr:.3g}")
    ax.set_xscale("log")
    ax.set_xlabel("learning rate (rising exponentially, one step each)")
    ax.set_ylabel("train loss (nats/token)")
    ax.set_title("LR range test")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return save_figure(fig, path)
