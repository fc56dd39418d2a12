"""The few lines both CLIs print about what a sweep concluded (``run`` at its end, ``analyze`` after its
report): the best LR with its spread and interval, the regions above it, the edge bracket, and their ratio as a
range; a search with a report section of its own (horizon) says its part first. Reads the typed summary
(lmtune.findings.summary.SweepSummary), the one summary.json is written from."""

from __future__ import annotations

import json

from lmtune.analysis.bracket import EdgeConfirmation
from lmtune.analysis.conclusion import Conclusion
from lmtune.analysis.landscape import Landscape
from lmtune.analysis.named_lrs import UsefulRange
from lmtune.findings.summary import SweepFacts, SweepSummary
from lmtune.findings.text import (
    basin_ends,
    basin_lrs,
    interval_line,
    lr_list,
    nothing_trained_text,
    per_doubling,
    ratio_range_text,
    set_aside_text,
)
from lmtune.report.sections import section_for


def running_trials(summary: SweepSummary) -> int:
    """How many of the sweep's trials were still running when it was read (no ending in the ledger, in their own
    summary.json or in Tune's result.json: lmtune.report.reader.trial_record)."""
    return int(summary.status_counts.get("running", 0))


def unfinished_mark(summary: SweepSummary) -> str:
    """"unfinished (N trials running)" for a sweep read while trials ran; "" for one whose every trial ended."""
    running = running_trials(summary)
    return f"unfinished ({running} trial{'s' * (running != 1)} running)" if running else ""


def unfinished_figure_mark(summary: SweepSummary) -> str:
    """What every figure of a sweep read while trials ran carries ("" once every trial ended), as the text's
    ``unfinished_mark`` says it."""
    running = running_trials(summary)
    return (f"sweep unfinished ({running} of {len(summary.trials)} trials running): re-run analyze when it ends"
            if running else "")


def summary_lines(summary: SweepSummary) -> list[str]:
    """What both CLIs print of a sweep's summary: its search's own lines, its best LR with its spread and
    interval, the regions above it, the edge and the ratio, and the best trial; each marked "[unfinished]" while
    trials run (a verdict they may still overturn)."""
    return marked_unfinished(summary, _verdict_lines(summary))


def marked_unfinished(summary: SweepSummary, lines: list[str]) -> list[str]:
    """``lines`` each marked "[unfinished]" while trials of the sweep run (a verdict they may still overturn)."""
    return [f"[unfinished] {line}" for line in lines] if running_trials(summary) else lines


def _verdict_lines(summary: SweepSummary) -> list[str]:
    lines = list(section_for(summary.search).headline(summary))
    if summary.candidate_tokens:
        fewest, most = summary.candidate_tokens
        lines.append(f"best lr {summary.best_lr:.3g}: val loss {summary.best_val_loss:.4f}, but not at equal "
                     f"token counts: no trial trained its whole budget ({fewest:,} to {most:,} tokens)")
    elif summary.nothing_trained is not None:
        lines.append(nothing_trained_text(summary.nothing_trained))
    elif summary.best_lr is None:
        lines.append("best lr: none (no trial that neither diverged nor errored trained its whole budget yet)")
    lines += conclusion_lines(summary)
    if summary.best_trial:
        lines.append(f"best trial: {summary.best_trial}")
    return lines


def no_best_lines(summary: SweepSummary | None) -> list[str]:
    """What ``run`` prints at a sweep's end that names no best trial: where runs ran their budget but none beat the
    data's unigram baseline, that nothing trained (summary_lines, which say why); else that no trial reported a
    finite validation loss."""
    if summary is not None and summary.nothing_trained is not None:
        return summary_lines(summary)
    return ["no trial that neither errored nor diverged reported a finite validation loss"]


def best_trial_lines(facts: SweepFacts, stored: str | None = None) -> list[str]:
    """What both CLIs print under "best trial: ID": its folder, its varied settings and the checkpoint to sample
    (``lmtune sample`` takes it, or the sweep's folder for the same one); ``stored``: where that checkpoint is when it
    is not in the folder read (a sweep in object storage: its URI)."""
    if facts.best_trial_dir is None:
        return []
    checkpoint = stored or facts.best_checkpoint or "none kept (its folder holds no checkpoints/best.pt)"
    return [f"  folder: {facts.best_trial_dir}", f"  config: {json.dumps(facts.best_config)}",
            f"  checkpoint: {checkpoint}"]


def conclusion_lines(summary: SweepSummary) -> list[str]:
    c, tokens = summary.conclusion, summary.compared_at_tokens
    lines = []
    if c.best is not None:
        losses = c.best.losses
        spread = f" ± {c.best.spread:.4f} (sd over {len(losses)} seeds)" if len(losses) > 1 else " (one seed)"
        at = f" at {tokens:,} tokens (the full budget)" if tokens else ""
        lines.append(f"best lr {c.best.lr:.3g}: val loss {c.best.mean:.4f}{spread}{at}")
        lines.append("  " + interval_line(*c.best_lr_interval))
        for contender in c.contenders:
            lines.append(f"  lr {contender.lr:.3g} beat it on the seeds they share but has only "
                         f"{len(contender.losses)}: not crowned (more seeds would settle it)")
    lines += region_lines(c.landscape)
    lines += useful_lines(c.useful)
    set_aside = set_aside_text(c)
    lines += [set_aside] if set_aside else []
    edge = c.edge
    cut = sorted({run.lr for run in summary.unconfirmed})
    unconfirmed = (f"unconfirmed: lr {', '.join(f'{v:.3g}' for v in cut)} cut while above ℓ₀, whether "
                   f"{'it' if len(cut) == 1 else 'they'} would have come back is not known" if cut else "")
    if edge.diverged_lr is None:
        other = "other " if set_aside else ""
        lines.append(f"edge: no {other}LR is known to fail; {unconfirmed}" if cut else
                     f"edge: no {other}LR failed; training breaks above the largest LR tried")
        return lines
    stable = (f"trains through its budget up to {edge.stable_lr:.3g}, " if edge.stable_lr
              else f"{none_below(c, summary.unigram_loss)}, ")
    width = f" (bracket {edge.ratio:.2f} wide)" if edge.ratio else ""
    confirmed = c.edge_confirmation is not None and c.edge_confirmation.confirmed
    how = "; confirmed by training without early stopping" if confirmed else "; not yet confirmed by training"
    lines.append(f"failing lr {edge.diverged_lr:.3g}: {stable}{_fails(c.edge_confirmation, summary.unigram_loss)} at "
                 f"{edge.diverged_lr:.3g}{width}{how}")
    divergence = c.divergence
    if divergence.diverged_lr is None:
        lines.append(f"divergence lr: not known: no run was confirmed to diverge; {unconfirmed}" if cut else
                     "divergence lr: no run diverged (non-finite, or above its initial loss for good)")
        return lines
    below = f" ({divergence.stable_lr:.3g} ran its budget without diverging)" if divergence.stable_lr else ""
    lines.append(f"divergence lr {divergence.diverged_lr:.3g}: the first LR at which a run diverged{below}")
    if summary.divergence_unsettled is not None:
        lines.append(f"  unconfirmed: a run at lr {summary.divergence_unsettled:.3g}, below it, was cut while above "
                     "ℓ₀: the divergence lr may lie there")
    if summary.edge_ratio is not None:
        reading = f": {summary.edge_range_reading}" if summary.edge_range_reading else ""
        lines.append(f"  divergence / best lr: {ratio_range_text(*c.edge_ratio_range, summary.edge_range_reading)}"
                     f"{reading}")
    return lines


def none_below(c: Conclusion, unigram_loss: float | None) -> str:
    """Why the failing LR's bracket has no lower end: no LR below it trained its whole budget, or (where some did,
    though none trained through) they ended no better than the data's unigram baseline."""
    ran = [r.lr for r in c.ranking if c.edge.diverged_lr is not None and r.lr < c.edge.diverged_lr]
    if not ran or unigram_loss is None:
        return "no LR below it trained its whole budget"
    each = "it" if len(ran) == 1 else "they"
    return (f"no LR below it trained ({lr_list(sorted(ran))} ran {'its' if len(ran) == 1 else 'their'} whole budget "
            f"but ended no better than the data's unigram baseline, {unigram_loss:.4f} nats: {each} did not train)")


def useful_lines(useful: UsefulRange | None) -> list[str]:
    """The top of the useful range and what 2x and 4x the best LR cost, one line."""
    if useful is None:
        return []
    costs = ", ".join(f"{cost:+.2f} nats at {factor}x" for factor, cost in useful.cost_at if cost is not None)
    top = (f"{useful.top_lr:.3g} ({useful.top_lr / useful.best_lr:.2g}x the best)" if useful.above_best
           else f"{useful.top_lr:.3g}, the best LR itself")
    return [f"useful range: up to {top}, within {useful.margin:.3f} nats of the best"
            + (f"; going higher costs {costs}" if costs else "")]


def _fails(confirmation: EdgeConfirmation | None, unigram_loss: float | None) -> str:
    """How the bracket's failing end failed, in a few words."""
    ends = confirmation.diverged_end if confirmation is not None else ()
    if ends and all(end.untrained for end in ends):
        return f"ends no better than the data's unigram baseline ({unigram_loss:.2f} nats)"
    if ends and any(end.untrained for end in ends):
        return "fails (diverges, or ends no better than the data's unigram baseline)"
    return "fails to recover"


def region_lines(regions: Landscape) -> list[str]:
    """The basin and the degraded region, one line each."""
    lines = []
    basin, degraded = regions.basin, regions.degraded
    if basin:
        low, high = basin.low, basin.high
        lines.append(f"basin (within 2 SE of the best): {basin_lrs(basin.lrs)}; "
                     f"{basin_ends(low, high)}")
    if degraded:
        at = ", ".join(f"{excess:+.2f} at {factor}x" for factor, excess in degraded.excess_at)
        # (no round multiple of the best LR within the degraded LRs: only its rate is said)
        over = f"loss over the best's {at} the best LR (nats); " if at else ""
        lines.append(f"degraded: {over}{per_doubling(degraded)} above the basin")
    return lines
