"""The report's sections on where training fails: the bracket and how it was confirmed, the seeds that disagree,
the edge / best ratio and its reading, the spiked runs, attention-logit growth, and how each broken run broke. A run
cut while its loss stood above ℓ₀ (SweepSummary.unconfirmed) is said to leave what it bears on unknown, never
counted as not diverged."""

from __future__ import annotations

from collections.abc import Sequence

from lmtune.analysis.bracket import THROUGH, Bracket
from lmtune.analysis.named_lrs import USEFUL_TOLERANCE
from lmtune.findings.comparison import first_growth
from lmtune.findings.stability import AT_EDGE_BAND, CONSERVATIVE_ABOVE, CUT, NEAR_EDGE_BELOW, TrialRecord
from lmtune.findings.summary import SweepSummary
from lmtune.findings.text import lr, ratio_range_text, set_aside_text, table, tokens, too_wide
from lmtune.report.headline import none_below
from lmtune.training.divergence import describe_spikes


def edge(summary: SweepSummary) -> list[str]:
    lines = ["## Edge of stability", "", *_named_lrs(summary), *_what_edge_means()]
    bracket = summary.conclusion.edge
    set_aside = set_aside_text(summary.conclusion)
    if set_aside:
        lines += [f"{set_aside[:1].upper()}{set_aside[1:]}.", ""]
    if bracket.diverged_lr is None:
        cut = summary.cut_below(None)
        where = (f"training fails above the largest LR tried ({lr(bracket.stable_lr)} trained its whole budget). "
                 "Extend the range upward to locate it." if cut is None else
                 f"no LR tried is known to fail ({lr(bracket.stable_lr)} trained its whole budget), but a run at lr "
                 f"{cut:.3g} was cut while its loss stood above ℓ₀ (unconfirmed: see Above the best LR): training may "
                 "fail there. Retrain it without early stopping to settle it.")
        lines += [f"No {'other ' if set_aside else ''}run failed (none went non-finite, stayed above its initial "
                  "loss for the recovery window, or ended no better than the data's unigram baseline above an LR that "
                  f"trained): {where}", ""]
    else:
        low = bracket.stable_lr
        stable = (f"**{low:.3g}**, the largest LR that trained its whole budget without diverging and ended below "
                  "the data's unigram baseline" if low is not None
                  else f"an LR not yet located ({none_below(summary.conclusion, summary.unigram_loss)})")
        ratio = (f": a bracket **{bracket.ratio:.2f}** wide (the search's resolution, not a property of "
                 "training)" if bracket.ratio else "")
        cut = summary.cut_below(bracket.diverged_lr)
        below = (f" A run at lr {cut:.3g}, below it, was cut while its loss stood above ℓ₀ (unconfirmed): if it would "
                 "not have come back, training fails there already." if cut is not None else "")
        lines += [f"Training fails between {stable}, and **{bracket.diverged_lr:.3g}**, the smallest LR at "
                  f"which a run failed (Definitions){ratio}.{below}", "", *_confirmation(summary),
                  *_seed_dependence(summary)]
        if bracket.stable_above:
            lines += ["", "Not monotone: " + ", ".join(f"{v:.3g}" for v in bracket.stable_above)
                      + " trained through their budget above the smallest failed LR (another seed or chance "
                        "decided)."]
        lines += ["", *_edge_ratio(summary)]
    lines += ["", *_spiked(summary), *_logit_growth(summary), *_edge_rule()]
    return lines


def _named_lrs(summary: SweepSummary) -> list[str]:
    """The four LRs the report names (Definitions), one table row each, and what going above the best costs."""
    c = summary.conclusion
    if c.best is None:
        return []
    useful, failing, divergence = c.useful, c.edge, c.divergence
    seeds = len(c.best.losses)
    rows = [["best LR", f"**{c.best.lr:.3g}**", f"lowest mean full-budget loss, {c.best.mean:.4f} over {seeds} "
             f"seed{'s' * (seeds > 1)}"]]
    if useful is not None:
        above = (f"the next LR tried, {useful.next_lr:.3g}, is worse by more than {useful.margin:.3f} nats"
                 if useful.next_lr is not None else "no LR tried above it was worse")
        seeds = f", {useful.top_seeds} seed{'s' * (useful.top_seeds > 1)}" if useful.above_best else ""
        rows.append(["top of the useful range",
                     f"**{useful.top_lr:.3g}** ({useful.top_lr / c.best.lr:.2g}x the best{seeds})",
                     f"the largest LR within max(2 SE, {USEFUL_TOLERANCE:g} nats) of the best's loss; {above}"])
    rows.append(["failing LR", _end(failing, summary.cut_below(failing.diverged_lr)),
                 "above it a run diverged or ended no better than the data's unigram baseline (it did not train)"])
    rows.append(["divergence LR", _end(divergence, summary.divergence_unsettled),
                 "the first LR at which a run's loss went non-finite, or rose above ℓ₀ and did not come back"])
    lines = table(["named LR", "value", "what it is"], rows) + [""]
    costs = [f"{factor}x the best LR: {cost:+.2f} nats" for factor, cost in (useful.cost_at if useful else ())
             if cost is not None]
    if costs:
        lines += ["Going above the best LR costs (mean full-budget loss over the best's, between the LRs tried): "
                  + "; ".join(costs) + ".", ""]
    return lines


def _end(bracket: Bracket, cut: float | None = None) -> str:
    """A named LR's value; ``cut``: the smallest LR below it (or with none found) at which a run was cut while above
    ℓ₀, which may be it instead."""
    unsettled = (f"; not known at {cut:.3g}, where a run was cut while above ℓ₀ (unconfirmed)" if cut is not None
                 else "")
    if bracket.diverged_lr is None:
        none = "none confirmed" if cut is not None else "none"
        return (f"{none} up to {bracket.stable_lr:.3g}" if bracket.stable_lr is not None else none) + unsettled
    low = f" (not at {bracket.stable_lr:.3g})" if bracket.stable_lr is not None else ""
    return f"**{bracket.diverged_lr:.3g}**{low}{unsettled}"


def _what_edge_means() -> list[str]:
    return ["What \"edge of stability\" means: in Cohen et al. (2021, 2022) it is a property of training that "
            "succeeds: the sharpness (the loss's top Hessian eigenvalue) rises to about 2/η (38/η preconditioned, "
            "for Adam at β₁ = 0.9) and hovers there; the sharpness figure (`analyze --sharpness`) shows it. The "
            "practitioners' rubric instead reads divergence LR / best LR (> 4: conservative). The practical question, "
            "how far above the best LR one can go before the loss degrades, is answered by the top of the useful range "
            "and the cost of 2x and 4x; where training blows up, by the failing and divergence LRs.", ""]


def _confirmation(summary: SweepSummary) -> list[str]:
    confirmation = summary.conclusion.edge_confirmation
    ends = confirmation.diverged_end if confirmation else ()
    if not ends:
        return []
    decided = confirmation.decided_at_tokens
    text = (f"The edge was decided at {tokens(decided)} tokens (where the failed end's run was judged). "
            if decided else "")
    how = "; ".join(f"seed {e.seed}: {e.how} ({e.stage}, {tokens(e.tokens)} tokens)" for e in ends)
    bracket = summary.conclusion.edge
    text += f"Failed end, lr {bracket.diverged_lr:.3g}: {how}."
    if bracket.stable_lr is not None and confirmation.stable_end:
        # each run as it ended: a run the scheduler cut at the stable LR proves nothing about it
        each = "; ".join(f"seed {e.seed}: {e.how}" + (f" ({tokens(e.tokens)} tokens)" if e.how == THROUGH else "")
                         for e in confirmation.stable_end)
        text += f" Stable end, lr {bracket.stable_lr:.3g}: {each}."
    if not confirmation.confirmed:
        text += " **Not confirmed by training**: a run that only the stopper's rule judged has not been retrained."
    return [text]


def _seed_dependence(summary: SweepSummary) -> list[str]:
    mixed = summary.conclusion.seed_dependent
    if not mixed:
        return []
    return ["", "**The edge moves with the seed**: " + "; ".join(
        f"at lr {m.lr:.3g} seed{'s' * (len(m.seeds_through) > 1)} {', '.join(map(str, m.seeds_through))} "
        f"trained through, seed{'s' * (len(m.seeds_diverged) > 1)} {', '.join(map(str, m.seeds_diverged))} "
        "did not" for m in mixed) + ". The bracket is where any seed fails; a single run near it can go either way."]


def _spiked(summary: SweepSummary) -> list[str]:
    if not summary.spiked:
        return []
    threshold = 100 * (summary.divergence_rule.spike_threshold or 0)
    lines = [f"Spiked, not diverged (the train loss rose more than {threshold:.0f}% above its running minimum; each "
             "spike with its height and the steps until it was back within that margin; every run here was below "
             "its initial loss ℓ₀ when it ended, while one cut above it is unconfirmed, not spiked):", ""]
    for run in sorted(summary.spiked, key=lambda r: (r.lr, r.seed or 0)):
        row = summary.trial(run.trial_id)
        cut = row is not None and row.status in CUT
        lines.append(f"- lr {run.lr:.3g}" + (f" seed {run.seed}" if run.seed is not None else "")
                     + ": " + describe_spikes(list(run.spikes), "not back when it was cut" if cut else "never back"))
    return lines + [""]


def _edge_ratio(summary: SweepSummary) -> list[str]:
    cut = summary.divergence_unsettled
    if summary.edge_ratio is None:
        if summary.best_lr is None:
            return ["No best LR: no divergence / best ratio."]
        if cut is not None:
            return [f"No run was confirmed to diverge, but a run at lr {cut:.3g} was cut while its loss stood above "
                    "ℓ₀ (unconfirmed): the divergence LR, and so the divergence / best ratio, is not known."]
        return ["No run diverged: no divergence / best ratio (the divergence LR lies above the largest LR tried)."]
    smallest, largest = summary.conclusion.edge_ratio_range
    reading = summary.edge_range_reading
    text = (f"Divergence LR / best LR: {summary.conclusion.divergence.diverged_lr:.3g} / {summary.best_lr:.3g} = "
            f"**{summary.edge_ratio:.3g}** as a point value; with the bracket and the best LR's interval, it is "
            f"**{ratio_range_text(smallest, largest, reading)}**.")
    if cut is not None:
        text += (f" A run at lr {cut:.3g}, below the divergence LR, was cut while its loss stood above ℓ₀ "
                 f"(unconfirmed): if it would not have come back, the ratio is {cut / summary.best_lr:.3g}.")
    if reading:
        return [text + f" The whole range reads: **{reading}**."]
    if too_wide(smallest, largest):  # the text says what would resolve it
        return [text]
    return [text + " That range spans more than one reading of the rule of thumb below (or is open), so none is "
                   "given: more seeds, or LRs closer to the best, narrow it."]


def _logit_growth(summary: SweepSummary) -> list[str]:
    growth = summary.logit_growth
    if not growth.lrs:
        return []
    values = [peak for _, peak in growth.lrs]
    best = f" (the best trial's: {growth.best:.3g})" if growth.best else ""
    where = ", ".join(f"{grown:.3g}" for grown, _ in growth.lrs)
    return [f"**Early warning, attention-logit growth**: at lr {where}, which "
            f"did not diverge, the largest attention logit reached {min(values):.2g} to {max(values):.2g}, above "
            f"{growth.threshold:.0e}{best}. Wortsman et al. (2023) find this growth ahead of the "
            "instabilities that qk-layernorm removes (``--set qk_norm=true``): at a longer budget or a larger "
            "model these LRs may break.", ""]


def _edge_rule() -> list[str]:
    return [
        f"Reading of the divergence / best ratio (a practitioners' rule of thumb, not a law): > {CONSERVATIVE_ABOVE:g} "
        "the best LR is conservative (said here only where a larger LR was measured to be as good: the top of the "
        f"useful range above the best); {NEAR_EDGE_BELOW:g}–{CONSERVATIVE_ABOVE:g} moderately below the edge; < "
        f"{NEAR_EDGE_BELOW:g} near the edge; within [{AT_EDGE_BAND[0]:g}, {AT_EDGE_BAND[1]:g}] at the edge. For "
        "Adam, Cohen et al. (2022) find the preconditioned sharpness hovering near (2 + 2β₁)/((1 − β₁)η) = 38/η "
        "for β₁ = 0.9; for full-batch GD, Cohen et al. (2021) find the sharpness at about 2/η.", ""]


HOW_RUNS_BROKE = "## How the diverged, unconfirmed and spiked runs broke"
BROKEN = ("diverged", "unconfirmed", "spiked")


def how_runs_broke(summary: SweepSummary, records: Sequence[TrialRecord]) -> list[str]:
    by_id = {r.trial_id: r for r in records}
    best_record = by_id.get(summary.best_trial)
    broken = [by_id[r.trial_id] for r in summary.trials if r.status in BROKEN and r.trial_id in by_id]
    if not broken:
        return [HOW_RUNS_BROKE, "", "No run diverged, was cut while above ℓ₀ (unconfirmed) or spiked.", ""]
    return [HOW_RUNS_BROKE, "",
            "Which stability probe first exceeded 2× the best trial's value at the same step (attention-logit "
            "growth is what qk-layernorm fixes, output-logit divergence what z-loss fixes; Wortsman et al. 2023):",
            "", *[f"- {first_growth(r, best_record)}" for r in broken], ""]
