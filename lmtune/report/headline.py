"""The few lines both CLIs print about what a sweep concluded (``run`` at its end, ``analyze`` after its
report): the best LR with its spread and interval, the edge bracket, and their ratio as a range. Takes
the keys of lmtune.sweep.runs.conclude (which summary.json also carries)."""

from __future__ import annotations

from typing import Any


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """What both CLIs print of a sweep's summary (summary.json's keys): its best LR with its spread and
    interval, the regions above it, the edge and the ratio, and the best trial."""
    lines = horizon_lines(summary) if "predicted_lr" in summary else []
    if lines:
        at = "the target" if summary.get("compared_at_tokens") == summary.get("target_tokens") else "the largest"
        lines.append(f"at {at} budget's {summary.get('compared_at_tokens') or 0:,} tokens:")
    if summary.get("candidate_tokens"):
        fewest, most = summary["candidate_tokens"]
        lines.append(f"best lr {summary['best_lr']:.3g}: val loss {summary['best_val_loss']:.4f}, but not at equal "
                     f"token counts: no trial trained its whole budget ({fewest:,} to {most:,} tokens)")
    elif summary.get("best_lr") is None:
        lines.append("best lr: none (no trial that neither diverged nor errored trained its whole budget yet)")
    lines += conclusion_lines(summary, summary.get("compared_at_tokens"))
    if summary.get("best_trial"):
        lines.append(f"best trial: {summary['best_trial']}")
    return lines


def horizon_lines(summary: dict[str, Any]) -> list[str]:
    """A horizon search: each budget's best LR, the fit, the prediction at the target and what the target's
    runs showed."""
    lines = []
    for b in summary["budgets"][:-1]:
        if b.get("best_lr") is None:
            lines.append(f"{b['steps']} steps ({b['tokens']:,} tokens): no LR trained it through yet")
            continue
        losses = b.get("best_lr_seed_losses") or []
        spread = f" ± {b['best_lr_spread']:.4f} ({len(losses)} seeds)" if len(losses) > 1 else " (one seed)"
        edge = (f"; edge between {_g(b['edge_lr_low'])} (trained through) and {_g(b['divergence_lr'])} (failed)"
                if b.get("divergence_lr") else "; no LR tried failed")
        lines.append(f"{b['steps']} steps ({b['tokens']:,} tokens): best lr {b['best_lr']:.3g}, val "
                     f"{b['best_lr_mean_loss']:.4f}{spread}{edge}")
    fit = summary.get("horizon_fit")
    if fit is None:
        lines.append(f"no fit: {summary.get('fit_problem') or 'too few budgets have a best LR'}")
        return lines
    low, high = fit["beta_interval"]
    lines.append(f"fit: best lr ∝ tokens^-beta, beta {fit['beta']:.2f} (90% interval {low:.2f} to {high:.2f}, from the "
                 "seeds and the grid's spacing)")
    low, high = summary["predicted_lr_interval"]
    lines.append(f"predicted best lr at {summary['target_tokens']:,} tokens (the target): "
                 f"{summary['predicted_lr']:.3g} (90% interval {low:.3g} to {high:.3g})")
    confirmed = summary.get("confirmed") or {}
    if confirmed.get("losses"):
        runs = ", ".join(f"{r['lr']:.3g}: {r['mean']:.4f}" for r in confirmed["losses"])
        lines.append(f"target runs: {runs}")
        if confirmed.get("predicted_excess") is not None:
            se = (f" ± {confirmed['predicted_excess_se']:.4f} (SE, from {confirmed['se_from']})"
                  if confirmed.get("predicted_excess_se") else "")
            lines.append(f"  the predicted lr is {confirmed['predicted_excess']:.4f} nats{se} above the best of them "
                         f"({confirmed['best_lr']:.3g}, {confirmed['best_over_predicted']:.2g}x the prediction)")
    return lines


def conclusion_lines(c: dict[str, Any], tokens: int | None) -> list[str]:
    losses = c.get("best_lr_seed_losses") or []
    lines = []
    if c.get("best_lr") is not None and losses:
        spread = f" ± {c['best_lr_spread']:.4f} (sd over {len(losses)} seeds)" if len(losses) > 1 else " (one seed)"
        at = f" at {tokens:,} tokens (the full budget)" if tokens else ""
        lines.append(f"best lr {c['best_lr']:.3g}: val loss {c['best_lr_mean_loss']:.4f}{spread}{at}")
        lines.append("  " + interval_line(*c["best_lr_interval"]))
        for contender in c.get("best_lr_contenders") or []:
            lines.append(f"  lr {contender['lr']:.3g} beat it on the seeds they share but has only "
                         f"{len(contender['losses'])}: not crowned (more seeds would settle it)")
    lines += region_lines(c)
    if c.get("divergence_lr") is None:
        lines.append("edge: no LR diverged; training breaks above the largest LR tried")
        return lines
    stable = (f"trains through its budget up to {c['edge_lr_low']:.3g}, " if c.get("edge_lr_low")
              else "no LR below it trained its whole budget, ")
    width = f" (bracket {c['bracket_ratio']:.2f} wide)" if c.get("bracket_ratio") else ""
    confirmed = (c.get("edge_confirmation") or {}).get("confirmed")
    how = "; confirmed by training without early stopping" if confirmed else "; not yet confirmed by training"
    lines.append(f"edge: {stable}fails to recover at {c['divergence_lr']:.3g}{width}{how}")
    if c.get("edge_ratio") is not None:
        reading = f": {c['edge_range_reading']}" if c.get("edge_range_reading") else ""
        lines.append(f"  edge / best lr: {ratio_range_text(*c['edge_ratio_range'])}{reading}")
    return lines


def region_lines(c: dict[str, Any]) -> list[str]:
    """The basin and the degraded region, one line each."""
    lines = []
    basin, degraded = c.get("basin"), c.get("degraded")
    if basin:
        low, high = basin["low"], basin["high"]
        lines.append(f"basin (within 2 SE of the best): lr {basin['lrs'][0]:.3g} to {basin['lrs'][-1]:.3g}; it ends "
                     f"below between {_g(low[0])} and {_g(low[1])}, above between {_g(high[0])} and {_g(high[1])}")
    if degraded:
        at = ", ".join(f"{excess:+.2f} at {factor}x" for factor, excess in degraded["excess_at"].items())
        lines.append(f"degraded: loss over the best's {at} the best LR (nats); {per_doubling(degraded)} above the "
                     "basin")
    return lines


def per_doubling(degraded: dict[str, Any]) -> str:
    """"+0.55 ± 0.08 nats per doubling of the LR" (the mean rate of the degraded region)."""
    error = f" ± {degraded['per_doubling_se']:.2f}" if degraded.get("per_doubling_se") is not None else ""
    return f"{degraded['per_doubling']:+.2f}{error} nats per doubling of the LR"


def _g(value: float | None) -> str:
    return "?" if value is None else f"{value:.3g}"


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
