"""coord_check.png: the coordinate check at its last step, a column per parametrization (activation scales above,
update scales below, rows sharing their y axis so the parametrizations compare at a glance), width on a log x
axis and each layer's scale on a log y axis: flat lines are μP's promise, rising ones SP's drift."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from lmtune.training.coord_check import CoordCheck  # noqa: E402
from lmtune.training.figures import save_figure  # noqa: E402


def plot_coord_check(checks: list[CoordCheck], path: Path) -> Path:
    fig, axes = plt.subplots(2, len(checks), figsize=(5.5 * len(checks), 8), sharey="row", squeeze=False,
                             layout="constrained")
    colors = plt.get_cmap("viridis")
    for column, check in enumerate(checks):
        for row, kind in enumerate(("activation", "update")):
            ax = axes[row][column]
            for i, layer in enumerate(check.layers):
                table = layer.activation if kind == "activation" else layer.update
                slope = layer.activation_slope if kind == "activation" else layer.update_slope
                ax.plot(check.widths, [scales[-1] for scales in table], "o-", color=colors(i / len(check.layers)),
                        label=f"{layer.name} (slope {slope:+.2f})")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(check.widths, [str(w) for w in check.widths])
            ax.set_xlabel("width (d_model)")
            ax.set_ylabel(f"{kind} RMS after step {check.steps}")
            ax.set_title(f"{check.parametrization}: {kind} scale (lr {check.lr:g}, {check.seeds} seeds)")
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=7)
    fig.suptitle("coordinate check: slope of ln(scale) vs ln(width); about 0 is flat")
    return save_figure(fig, path)
