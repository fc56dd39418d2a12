"""The report's sections on the best LR and the landscape above it: where the best LR lies, its contenders, and
the basin, degraded and failed regions, the runs cut while above ℓ₀, and the full-budget loss of every LR with the
region it stands in (lmtune.analysis.landscape.lr_regions: what the figure draws too)."""

from __future__ import annotations

import math
from typing import cast

from lmtune.analysis.landscape import Region
from lmtune.analysis.runs import SIGNIFICANCE_SE, LrResult
from lmtune.findings.summary import SweepSummary
from lmtune.findings.text import (
    between,
    fmt,
    interval_line,
    lr,
    nothing_trained_text,
    per_doubling,
    set_aside_text,
    table,
    tokens,
)
from lmtune.report.figures import LR_VS_LOSS

HEADING = "## Above the best LR: basin, degraded, failed"


def best_lr(summary: SweepSummary) -> list[str]:
    lines = ["## Best learning rate", ""]
    if summary.nothing_trained is not None:
        said = nothing_trained_text(summary.nothing_trained)
        return lines + [f"{said[:1].upper()}{said[1:]}.", ""]
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
              if c.best and len(losses) > 1 else " (one seed: its spread is not measured)")
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
    lines = [HEADING, ""]
    regions = summary.conclusion.landscape
    basin, degraded = regions.basin, regions.degraded
    if basin is None:
        none = ("No run ended better than the data's unigram baseline (Best learning rate), so there is no basin to "
                "compare LRs around." if summary.nothing_trained is not None else
                "No LR trained its whole budget without diverging, so the loss cannot be compared across LRs at the "
                "full budget.")
        return lines + [none, *_failed(summary), *_unconfirmed(summary), ""]
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
    lines += [*_failed(summary), *_unconfirmed(summary)]
    found = _landscape_table(summary)
    return lines + ["", *found, ""] if found else lines + [""]


def _failed(summary: SweepSummary) -> list[str]:
    """The failed region (from the failing LR up) and the LRs above it whose runs trained through."""
    c = summary.conclusion
    region = c.landscape.diverged
    set_aside = set_aside_text(c)
    if region is None and set_aside:
        return [f"- **Failed**: no LR tried failed at or above the best LR; {set_aside}."]
    if region is None:
        return ["- **Failed**: no LR tried failed (none diverged, nor ended no better than the data's unigram "
                "baseline above an LR that trained)."]
    lines = [f"- **Failed** (a run diverged, or ended no better than the data's unigram baseline above an LR that "
             f"trained: Definitions): from the failing LR up; it begins {between(*region)}. LRs with a failed run: "
             f"{', '.join(lr(v) for v in c.lrs_in(Region.FAILED))} (see the edge of stability below)."]
    above = c.lrs_in(Region.ABOVE_FAILING)
    if above:
        lines.append(f"- **Trained through above the failing LR**: lr {', '.join(lr(v) for v in above)} (failure is "
                     "not monotone here: another seed or chance decided).")
    return lines


def _unconfirmed(summary: SweepSummary) -> list[str]:
    """The runs cut while their loss stood above ℓ₀: neither diverged nor spiked, not known."""
    runs = sorted(summary.unconfirmed, key=lambda u: (u.lr, u.seed))
    if not runs:
        return []
    each = "; ".join(f"lr {u.lr:.3g} seed {u.seed} (cut at {tokens(u.tokens)} tokens, its train loss "
                     f"{u.loss:.3g}" + (f" = {u.over_initial:.3g}× ℓ₀" if math.isfinite(u.over_initial) else "") + ")"
                     for u in runs)
    alone = summary.conclusion.lrs_in(Region.UNCONFIRMED)
    where = (f" An LR where no other run trained its budget or failed is marked unconfirmed: lr "
             f"{', '.join(lr(v) for v in alone)}." if alone else "")
    return [f"- **{Region.UNCONFIRMED.value[0].upper()}{Region.UNCONFIRMED.value[1:]}**: {each}. A run cut early (by "
            "ASHA or the stopper, or its log ending before the budget) with its loss above ℓ₀ may have come back, or "
            "diverged: it counts as neither."
            f"{where} Retrain without early stopping to settle it."]


def _pooled(summary: SweepSummary) -> str:
    basin = summary.conclusion.landscape.basin
    lrs = basin.spread_lrs if basin else ()
    return f"pooled over the seeds of lr {', '.join(lr(v) for v in sorted(lrs))}" if lrs else "pooled over seeds"


def _landscape_table(summary: SweepSummary) -> list[str]:
    ranking = sorted(summary.conclusion.ranking, key=lambda r: r.lr)
    if len(ranking) < 2 or summary.best_lr is None:
        return []
    c = summary.conclusion
    best, crowned = summary.best_lr, cast(LrResult, c.best)  # (a best LR: one crowned)
    regions = {(r.lr, r.others): r.region for r in c.regions}
    rows = []
    for r in ranking:
        region = "best" if r is crowned else str(regions.get((r.lr, r.others), "—"))
        rows.append([f"{r.lr:.4g}", f"{r.lr / best:.3g}", str(len(r.losses)), f"{r.mean:.4f}", fmt(r.spread, 3),
                     f"{r.mean - crowned.mean:+.4f}", region])
    ranked = {(r.lr, r.others) for r in ranking}
    for found in c.regions:
        if (found.lr, found.others) not in ranked:  # (a diverged run's LR, or one whose runs were only cut)
            rows.append([f"{found.lr:.4g}", f"{found.lr / best:.3g}", "—", "—", "—", "—", str(found.region)])
    rows.sort(key=lambda row: float(row[0]))
    return ["Full-budget val loss by LR (the mean over seeds) and the region each LR stands in, as above and in "
            f"`{LR_VS_LOSS.file}`; an LR where a run diverged, or whose runs were only cut while above ℓ₀, has no "
            "full-budget loss (—):", "",
            *table(["lr", "× best", "seeds", "mean val loss", "sd", "vs best", "region"], rows)]
