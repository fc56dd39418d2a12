"""The few lines both CLIs print about what a sweep concluded (``run`` at its end, ``analyze`` after its
report): the best LR with its spread and interval, the edge bracket, and their ratio as a range. Takes
the keys of lmtune.sweep.edge.conclude (which summary.json also carries)."""

from __future__ import annotations

from typing import Any


def conclusion_lines(c: dict[str, Any], tokens: int | None) -> list[str]:
    losses = c.get("best_lr_seed_losses") or []
    lines = []
    if c.get("best_lr") is not None and losses:
        spread = f" ± {c['best_lr_spread']:.4f} (sd over {len(losses)} seeds)" if len(losses) > 1 else " (one seed)"
        at = f" at {tokens:,} tokens (the full budget)" if tokens else ""
        lines.append(f"best lr {c['best_lr']:.3g}: val loss {c['best_lr_mean_loss']:.4f}{spread}{at}")
        lines.append("  " + interval_line(*c["best_lr_interval"]))
    if c.get("divergence_lr") is None:
        lines.append("edge: no LR diverged; training breaks above the largest LR tried")
        return lines
    stable = f"stable up to {c['edge_lr_low']:.3g}, " if c.get("edge_lr_low") else "no LR below it proven stable, "
    width = f" (bracket {c['bracket_ratio']:.2f} wide)" if c.get("bracket_ratio") else ""
    lines.append(f"edge: {stable}diverged at {c['divergence_lr']:.3g}{width}")
    if c.get("edge_ratio") is not None:
        reading = f": {c['edge_range_reading']}" if c.get("edge_range_reading") else ""
        lines.append(f"  edge / best lr: {ratio_range_text(*c['edge_ratio_range'])}{reading}")
    return lines


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
