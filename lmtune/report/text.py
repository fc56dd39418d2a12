"""How the report writes its numbers in words: LRs, losses, token counts, markdown tables, the intervals the
conclusions are given with. Shared by lr_sweep_analysis.md, the CLIs' last lines and the figures' labels."""

from __future__ import annotations

import math
from collections.abc import Sequence

from lmtune.sweep.landscape import Degraded

Cell = float | int | bool | str | None


def fmt(value: Cell, digits: int = 4) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "—"
        return f"{value:.{digits}g}"
    return str(value)


def tokens(value: float | None) -> str:
    if value is None:
        return "—"
    value = float(value)
    if value >= 1e6:
        return f"{value / 1e6:.2f}M"
    if value >= 1e3:
        return f"{value / 1e3:.1f}k"
    return f"{value:.0f}"


def lr(value: float | None, missing: str = "—") -> str:
    return missing if value is None else f"{value:.3g}"


def rate(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def between(low: float | None, high: float | None) -> str:
    """Where a region's boundary lies, between two tried LRs."""
    if low is not None and high is not None:
        return f"between {low:.3g} and {high:.3g}"
    if low is not None:
        return f"above {low:.3g} (no LR tried beyond it)"
    if high is not None:
        return f"below {high:.3g} (no LR tried beyond it)"
    return "where no LR was tried"


def per_doubling(degraded: Degraded) -> str:
    """"+0.55 ± 0.08 nats per doubling of the LR" (the mean rate of the degraded region)."""
    error = f" ± {degraded.per_doubling_se:.2f}" if degraded.per_doubling_se is not None else ""
    return f"{degraded.per_doubling:+.2f}{error} nats per doubling of the LR"


def interval_line(low: float | None, high: float | None) -> str:
    """Where the best LR lies, between the nearest LRs on either side that were clearly worse."""
    if low is not None and high is not None:
        return f"the best LR lies between {low:.3g} and {high:.3g} (the nearest LRs clearly worse)"
    if high is not None:
        return f"the best LR lies below {high:.3g} (no smaller LR tried was clearly worse)"
    if low is not None:
        return f"the best LR lies above {low:.3g} (no larger LR tried was clearly worse)"
    return "no LR tried was clearly worse than the best: the optimum may lie outside the LRs tried"


def ratio_range_text(smallest: float | None, largest: float | None) -> str:
    """The edge / best ratio as a range; an open end where the best LR's interval is open."""
    if smallest is not None and largest is not None:
        return f"between {smallest:.3g} and {largest:.3g}"
    if smallest is not None:
        return f"at least {smallest:.3g} (no upper bound: the best LR's interval is open below)"
    if largest is not None:
        return f"at most {largest:.3g} (no lower bound: the best LR's interval is open above)"
    return "unbounded either way (the best LR's interval is open on both sides)"
