"""The width search's settings (the ``width:`` section of a space with ``search: width``) and the models they give.
Ray-free and stateless; lmtune.searches.width.conclusion decides when.

The target is the space's own model (its d_model, d_ff and n_heads: e.g. the CS336 model at d_model 512); the
proxies are the same architecture at the narrower ``widths``, d_ff kept in proportion to d_model and the head
dimension d_model / n_heads kept (more heads as the model widens), every other setting the target's: the same
token budget, schedule, data and parametrization (``parametrization: sp | mup`` of the space's set).
Why two or three proxies, each twice the next: a line through ln LR* against ln width needs two points and shows
its residual with three; under SP the best Adam LR falls as a power of the width (about 1/width for the hidden
layers, so by up to 2x per doubling: a 1.5x grid resolves it), under μP it should not move at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lmtune.analysis.fit import LINE, SURFACE
from lmtune.analysis.runs import Budget
from lmtune.errors import LmtuneError
from lmtune.searches.axis.settings import MAX_BUDGETS, LrSearchSettings
from lmtune.searches.trial_order import TuneParams

WIDTH_FITS = (LINE, SURFACE)


@dataclass(frozen=True)
class WidthSettings(LrSearchSettings):
    """The ``width:`` section of a space with ``search: width``."""

    widths: tuple[int, ...] = field(default_factory=tuple)
    """The proxies' d_model, each below the target's (the space's d_model), e.g. [64, 128, 256] for 512."""
    fit: str = LINE
    """How ln LR* is fitted against ln width: ``line`` (through the proxies' located LR*s) or ``surface`` (one loss
    surface through every proxy's runs: a 1.5x narrower interval and 40% less error where one power law holds, but
    62-79% coverage, against the line's 90-92%, where the law bends between the widths; benchmarks/README.md,
    "One joint fit for the width search")."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "widths", tuple(self.widths))  # (a list from YAML or sweep.json)

    def point_checks(self) -> list[tuple[str, bool, str]]:
        widths = list(self.widths)
        return [("widths", len(widths) >= 2,
                 "must list at least 2 proxy widths (d_model) below the target's, e.g. [64, 128, 256] for a 512 "
                 "target: a line needs two"),
                ("widths", all(isinstance(w, int) and w > 0 for w in widths),
                 "must be positive whole numbers (d_model of each proxy)"),
                ("widths", len(set(widths)) == len(widths), "must not repeat a width"),
                ("fit", self.fit in WIDTH_FITS, f"must be {' or '.join(WIDTH_FITS)}")]

    def point_bounds(self) -> list[tuple[str, bool, str]]:
        return [("widths", len(self.widths) <= MAX_BUDGETS,
                 f"must list at most {MAX_BUDGETS} widths (each is an LR search of its own)")]


def proxy_shape(target: Budget, width: int) -> TuneParams:
    """The model at ``width``: the target's architecture with d_ff in proportion and the head dimension kept."""
    head_dim = target.d_model // target.n_heads
    return {"d_model": width, "d_ff": round(target.d_ff * width / target.d_model), "n_heads": width // head_dim}


def check_widths(settings: WidthSettings, target: Budget) -> None:
    """One line when a proxy width is not below the target's, or does not hold a whole number of heads."""
    if not target.d_model:
        raise LmtuneError("width: the space's model has no d_model recorded; set d_model in the space's set")
    head_dim = target.d_model // target.n_heads
    for width in settings.widths:
        if width >= target.d_model:
            raise LmtuneError(f"width.widths: {width} is not below the target's d_model ({target.d_model}); "
                              "list narrower proxies only (the target is trained by the confirmation)")
        if width % head_dim:
            raise LmtuneError(f"width.widths: {width} is not a multiple of the head dimension {head_dim} (d_model "
                              f"{target.d_model} / n_heads {target.n_heads}); give multiples of {head_dim}")
