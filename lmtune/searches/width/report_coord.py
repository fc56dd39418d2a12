"""A width search's coord check (lmtune.training.coord_check): per-layer activation and update scales over the first
steps at the search's widths and the model's parametrization, the check μP's authors prescribe before an LR is
trusted to transfer across width. Measured once per sweep, at its first report, and kept in the sweep's folder
(coord_check.json, a new file, written atomically); read back from there after."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import matplotlib

from lmtune.errors import LmtuneError
from lmtune.files import JsonObject
from lmtune.training.config import RunConfig
from lmtune.training.coord_check import CoordCheck, Verdict, coord_check, read_checks, verdict, write_checks
from lmtune.usercode.spec import spec_for

log = logging.getLogger(__name__)

COORD_CHECK_FILE = "coord_check.json"


@dataclass(frozen=True)
class SweepCoordCheck:
    """The coord check of a width search's model across its widths, or why there is none."""

    check: CoordCheck | None
    """The check (None: it could not be measured; ``note`` says why)."""
    note: str
    """Where it came from, or why it is missing."""

    @property
    def verdict(self) -> Verdict | None:
        return verdict(self.check) if self.check else None

    def to_json(self) -> JsonObject:
        """summary.json's ``coord_check``."""
        if self.check is None:
            return {"flat": None, "note": self.note}
        v = verdict(self.check)
        return {"parametrization": self.check.parametrization, "widths": list(self.check.widths),
                "steps": self.check.steps, "lr": self.check.lr, "seeds": self.check.seeds, "flat": v.flat,
                "verdict": v.reason, "note": self.note,
                "slopes": {layer.name: {"activation": layer.activation_slope, "update": layer.update_slope}
                           for layer in self.check.layers}}


def sweep_coord_check(sweep_dir: Path | None, base: RunConfig, widths: list[int]) -> SweepCoordCheck:
    """The sweep's coord check at ``widths`` (the proxies and the target) under its model's parametrization:
    read from the sweep's coord_check.json, else measured now and kept there."""
    path = Path(sweep_dir) / COORD_CHECK_FILE if sweep_dir is not None else None
    parametrization = base.model.parametrization
    if path is not None and path.is_file():
        try:
            found = [c for c in read_checks(path) if c.parametrization == parametrization]
        except (OSError, ValueError, KeyError, TypeError) as err:
            return SweepCoordCheck(None, f"{path} is unreadable ({err}); delete it to measure again")
        if found:
            return SweepCoordCheck(found[0], f"measured at the first report, kept in {path}")
    if not spec_for(base).model.exposes_layers:  # (its per-layer hooks are written for lmtune's model, as μP is)
        return SweepCoordCheck(None, f"not measured for this model: the coord check measures lmtune's own model's "
                                     f"layers, not {base.code.model}'s")
    if not base.data_dir or not Path(base.data_dir).is_dir():
        return SweepCoordCheck(None, f"not measured: the sweep's data dir {base.data_dir or '(none)'} is not here")
    log.info("coord check: %s at d_model %s, 5 steps, 3 seeds", parametrization, ", ".join(map(str, widths)))
    try:
        check = coord_check(base, widths, parametrization)
    except LmtuneError as err:
        return SweepCoordCheck(None, f"not measured: {err}")
    if path is not None:
        try:
            write_checks(path, [check])
        except OSError as err:  # (a read-only results folder: the report still has it)
            log.warning("coord check: cannot keep it in %s (%s)", path, err)
    return SweepCoordCheck(check, f"measured at the first report, kept in {path}" if path else "measured now")


matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

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
