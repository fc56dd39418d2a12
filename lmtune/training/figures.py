"""Where a run's figures are drawn: loss_curves.png and lr_schedule.png, from its metrics rows; and
``save_figure``, through which every PNG lmtune writes (the report's too) is written atomically."""

from __future__ import annotations

import io
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from lmtune.files import atomic_write_bytes  # noqa: E402
from lmtune.training.config import RunConfig  # noqa: E402
from lmtune.training.lr_function import step_lr_function  # noqa: E402


def write_run_figures(out_dir: Path, rows: list[dict], config: RunConfig) -> None:
    t = config.train
    plot_loss_curves(rows, out_dir / "loss_curves.png", title=f"lr={t.lr:g} ({config.budget})")
    stride = max(1, t.steps // 500)
    steps = list(range(0, t.steps, stride)) + [t.steps - 1]
    lr_of_step = step_lr_function(config)
    plot_lr_schedule([s + 1 for s in steps], [lr_of_step(s) for s in steps], out_dir / "lr_schedule.png")


def save_figure(fig, path: Path) -> Path:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())
    return path


def plot_loss_curves(rows: list[dict], path: Path, title: str = "") -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
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


def plot_lr_schedule(steps: list[int], lrs: list[float], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(steps, lrs, color="tab:green")
    ax.set_xlabel("step")
    ax.set_ylabel("learning rate")
    ax.set_title("learning-rate schedule (linear warm-up, cosine decay)")
    ax.grid(alpha=0.3)
    return save_figure(fig, path)


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def plot_range_test(result, path: Path) -> Path:
    """The LR range test (a lmtune.training.lr_range.RangeTestResult): train loss against the rising
    LR, raw and smoothed, with the steepest-descent, lowest-loss and blow-up LRs marked."""
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
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
