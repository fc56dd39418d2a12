"""The report's sections on the best LR and the landscape above it: where the best LR lies, its contenders, and
the basin, degraded and diverged regions with the full-budget loss of every LR."""

from __future__ import annotations

from lmtune.analysis.runs import SIGNIFICANCE_SE
from lmtune.findings.summary import SweepSummary
from lmtune.findings.text import between, fmt, interval_line, lr, per_doubling, table, tokens


def best_lr(summary: SweepSummary) -> list[str]:
    lines = ["## Best learning rate", ""]
    if summary.best_lr is None:
        return lines + ["No trial that neither diverged nor errored was evaluated, so there is no best LR.", ""]
    if summary.candidate_tokens:
        fewest, most = summary.candidate_tokens
        return lines + [
            f"No trial trained its whole budget, so no LR can be compared at equal tokens. The lowest val loss "
            f"at any token count is **{summary.best_val_loss:.4f}**, by lr {summary.best_lr:.3g} (trial "
            f"`{summary.best_trial}`), but the candidates trained {tokens(fewest)} to {tokens(most)} tokens: "
            "**not at equal token counts**, and a loss after fewer tokens is higher for reasons other than the LR.", ""]
    c = summary.conclusion
    losses = c.best.losses if c.best else ()
    each = ", ".join(f"{v:.4f}" for v in losses)
    spread = (f" ± {c.best.spread:.4f} (standard deviation over {len(losses)} seeds: {each})"
              if len(losses) > 1 else " (one seed: its spread is not measured)")
    below, above = c.best_lr_interval
    sigma = c.seed_spread
    noise = (f"a mean full-budget loss more than 2 standard errors above the best's (run-to-run standard "
             f"deviation {sigma:.4f}, {_pooled(summary)})" if sigma is not None else
             "any higher full-budget loss (no LR has several seeds, so the run-to-run noise is unknown and "
             "this interval is only as fine as the LRs tried)")
    interval = interval_line(below, above)
    lines += [f"Best LR **{summary.best_lr:.3g}**: val loss **{summary.best_val_loss:.4f}**{spread} at "
              f"{tokens(summary.compared_at_tokens)} tokens, the whole budget. Only LRs whose every trial "
              "trained the whole budget without diverging compete, on their mean over seeds; the checkpoint to use "
              f"is trial `{summary.best_trial}`'s.", "",
              f"{interval[:1].upper() + interval[1:]}. \"Clearly worse\": {noise}.", "",
              *_contenders(summary)]
    return lines


def _contenders(summary: SweepSummary) -> list[str]:
    contenders = summary.conclusion.contenders
    if not contenders:
        return []
    return [", ".join(f"lr {c.lr:.3g} ({len(c.losses)} seed{'s' * (len(c.losses) > 1)})" for c in contenders)
            + " beat the best on the seeds they share but did not get as many seeds, so none is crowned over it: "
              "more seeds would settle it.", ""]


def landscape(summary: SweepSummary) -> list[str]:
    lines = ["## Above the best LR: basin, degraded, diverged", ""]
    regions = summary.conclusion.landscape
    basin, degraded = regions.basin, regions.degraded
    if basin is None:
        return lines + ["No LR trained its whole budget without diverging, so the loss cannot be compared across "
                        "LRs at the full budget.", ""]
    sigma = basin.seed_spread
    noise = (f"within {SIGNIFICANCE_SE:g} standard errors of the best's mean (run-to-run standard deviation "
             f"{sigma:.4f}, {_pooled(summary)})" if sigma is not None else
             "no worse than the best's (no LR has several seeds: the run-to-run noise is unknown, so the basin is "
             "only as wide as the LRs tried and it says nothing about how flat the optimum is)")
    lines += [f"- **Basin** (full-budget loss {noise}): lr {', '.join(lr(v) for v in basin.lrs)}. Its lower end "
              f"lies {between(*basin.low)}, its upper end {between(*basin.high)}."]
    if degraded:
        worst = degraded.points[-1]
        at = ", ".join(f"**{excess:+.2f}** at {factor}×" for factor, excess in degraded.excess_at)
        single = all(p.seeds == 1 for p in degraded.points)
        lines += [f"- **Degraded** (trains through its budget without diverging, loss clearly worse): from the basin's "
                  f"upper end to the edge, lr {lr(degraded.points[0].lr)} … {lr(worst.lr)}"
                  + (" (one seed each: every point is uncertain by at least the run-to-run spread above)" if single
                     else "") + (f". The full-budget loss over the best's: {at} the best LR (nats, interpolated "
                                 "in log LR between the LRs tried)" if at else "")
                  + f"; {per_doubling(degraded)} (a least-squares mean rate: the "
                  f"curve is not a straight line), and {worst.excess:+.3f} nats at {worst.ratio_to_best:.3g}× "
                  "the best LR, the last LR before the edge."]
    else:
        lines += ["- **Degraded**: no LR between the basin and the edge trained its whole budget, so how fast the loss "
                  "degrades above the basin is not measured."]
    region = regions.diverged
    lines += [f"- **Diverged**: from the edge up; it begins {between(*region)} (see below)." if region else
              "- **Diverged**: no LR tried diverged."]
    found = _landscape_table(summary)
    return lines + ["", *found, ""] if found else lines + [""]


def _pooled(summary: SweepSummary) -> str:
    basin = summary.conclusion.landscape.basin
    lrs = basin.spread_lrs if basin else ()
    return f"pooled over the seeds of lr {', '.join(lr(v) for v in sorted(lrs))}" if lrs else "pooled over seeds"


def _landscape_table(summary: SweepSummary) -> list[str]:
    ranking = sorted(summary.conclusion.ranking, key=lambda r: r.lr)
    if len(ranking) < 2 or summary.best_lr is None:
        return []
    basin_found = summary.conclusion.landscape.basin
    best, basin = summary.best_lr, set(basin_found.lrs if basin_found else ())
    best_mean = next(r.mean for r in ranking if r.lr == best)
    rows = []
    for r in ranking:
        region = "best" if r.lr == best else "basin" if r.lr in basin else \
            "degraded" if r.lr > best else "below the basin"
        rows.append([f"{r.lr:.4g}", f"{r.lr / best:.3g}", str(len(r.losses)), f"{r.mean:.4f}", fmt(r.spread, 3),
                     f"{r.mean - best_mean:+.4f}", region])
    for diverged in sorted({row.lr for row in summary.trials if row.status == "diverged"}):
        rows.append([f"{diverged:.4g}", f"{diverged / best:.3g}", "—", "—", "—", "—", "diverged"])
    rows.sort(key=lambda row: float(row[0]))
    return ["Full-budget val loss by LR (the mean over seeds; LRs with a diverged run are marked, not ranked):", "",
            *table(["lr", "× best", "seeds", "mean val loss", "sd", "vs best", "region"], rows)]
