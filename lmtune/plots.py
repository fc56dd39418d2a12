"""Per-run figures: loss curves and the learning-rate schedule."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from lmtune.checkpoint import atomic_write_bytes  # noqa: E402


def save_figure(fig, path: Path) -> Path:
    import io

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
