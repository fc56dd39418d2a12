"""What the reports of the searches along an axis (lmtune.searches.horizon.report, lmtune.searches.width.report)
print alike: a located LR* and a crowned LR's loss as table cells, the confirmation at the target as markdown, and
the figure of the best LR against the axis (``LrAgainstAxis``). Each search's report gives its own words (what a
point is, its fit, its rule); these draw and print them the same way."""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib
import numpy as np

matplotlib.use("Agg")
from matplotlib.ticker import NullFormatter  # noqa: E402

from lmtune.analysis.conclusion import Conclusion  # noqa: E402
from lmtune.analysis.locate import LocatedLr  # noqa: E402
from lmtune.analysis.runs import LrResult, standard_error  # noqa: E402
from lmtune.findings.text import fmt, lr, table  # noqa: E402
from lmtune.searches.axis.report_confirmation import TargetConfirmation  # noqa: E402


def located_text(at: LocatedLr | None) -> str:
    """"0.0087 (90%: 0.0061–0.012)" (LR* and its 90% interval), or why it was not located."""
    if at is None:
        return "—"
    if at.located:
        low, high = at.interval()
        return f"{at.lr:.3g} (90%: {low:.2g}–{high:.2g})"
    return f"not located: {at.why}" + ("" if at.usable else "; not fitted")


def best_loss_text(c: Conclusion) -> str:
    """The crowned LR's mean loss ± its sd over seeds (the seeds), for a table cell."""
    if c.best is None or not c.best.losses:
        return "—"
    losses = c.best.losses
    spread = f" ± {c.best.spread:.4f}" if len(losses) > 1 else ""
    return f"{fmt(c.best.mean)}{spread} ({len(losses)})"


def confirmation_markdown(confirmed: TargetConfirmation, predicted: float | None, cost: str, where: str) -> list[str]:
    """The confirmation's runs (each LR's loss above the crowned best ± SE), its verdict and ``cost`` (in words),
    at ``where`` ("the target budget")."""
    if not confirmed.losses:
        return [f"**Confirmation**: {confirmed.verdict}.", ""]
    best = next((r for r in confirmed.losses if r.lr == confirmed.best_lr), None)

    def above(r: LrResult) -> str:
        se = standard_error(r, best, confirmed.seed_sd) if best else None
        return "—" if best is None else f"{r.mean - best.mean:+.4f}" + (f" ± {se:.4f}" if se else "")

    rows = [[lr(r.lr), f"{r.lr / predicted:.2g}x" if predicted else "—", ", ".join(f"{v:.4f}" for v in r.losses),
             fmt(r.mean), above(r)] for r in confirmed.losses]
    return [f"**Confirmation** at {where} (each LR's loss above the crowned best ± the SE of the "
            "difference, from the target runs' own seeds):", "",
            *table(["lr", "of the prediction", "val loss per seed", "mean", "above the best ± SE"], rows), "",
            f"**Verdict**: {confirmed.verdict}. Its cost: {cost}.", ""]


def plot_located(ax, points: list[tuple[float, float, LocatedLr | None]], what: str) -> None:
    """Each searched point's crowned grid LR (an open circle) and its located LR* with its 90% interval (a point
    that could not be located: a grey diamond over the span it may lie in), at x; ``what``: "budget", "proxy"."""
    for x, crowned, at in points:
        ax.plot([x], [crowned], "o", mfc="none", color="tab:blue", markersize=9)
        if at is not None and at.usable:
            low, high = at.interval()
            ax.errorbar([x], [at.lr], yerr=[[at.lr - low], [high - at.lr]], capsize=4,
                        fmt="o" if at.located else "D", color="tab:blue" if at.located else "tab:gray")
    ax.plot([], [], "o", mfc="none", color="tab:blue", markersize=9, label=f"crowned grid LR of a {what}")
    ax.errorbar([], [], yerr=[], fmt="o", color="tab:blue", capsize=4, label="located LR* (90% interval)")
    if any(at is not None and not at.located and at.usable for _, _, at in points):
        ax.errorbar([], [], yerr=[], fmt="D", color="tab:gray", capsize=4,
                    label="LR* not located: carried as the span it may lie in")


@dataclass(frozen=True)
class LrAgainstAxis:
    """A search along an axis's figure of the best LR against its axis (token budget or width)."""

    points: list[tuple[float, float, LocatedLr | None]]
    """Each searched point's (position, crowned best LR, located LR*)."""
    what: str
    """What a point is, for the legend ("searched budget", "proxy")."""
    target: float
    curve: tuple[np.ndarray, np.ndarray, str] | None
    """The fitted law's (xs, LR*s, legend label), or None: no fit."""
    predicted: tuple[float, tuple[float, float], str] | None
    """The predicted LR at the target, its interval and what to call that (interval_words), or None."""
    confirmed_best: float | None
    """The crowned best of the target's own runs, or None."""
    star: dict
    """How that crowned best is drawn."""
    ticks: list[float]
    formatter: object
    xlabel: str
    title: str


def draw_lr_against_axis(ax, plot: LrAgainstAxis) -> None:
    """``plot`` on ``ax``: the located LR*s, the fitted law, the prediction and the target runs' best."""
    plot_located(ax, plot.points, plot.what)
    if plot.curve is not None:
        xs, ys, label = plot.curve
        ax.plot(xs, ys, "-", color="tab:blue", alpha=0.7, label=label)
    if plot.predicted is not None:
        lr, (low, high), words = plot.predicted
        ax.errorbar([plot.target], [lr], yerr=[[lr - low], [high - lr]], fmt="s", color="tab:orange", capsize=5,
                    label=f"predicted at the target ({words})")
    if plot.confirmed_best:
        ax.plot([plot.target], [plot.confirmed_best], "*", label="crowned best of the target runs", **plot.star)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(plot.ticks)  # the points themselves, labelled
    ax.xaxis.set_major_formatter(plot.formatter)
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(plot.xlabel)
    ax.set_ylabel("best learning rate")
    ax.set_title(plot.title, fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
