"""The report's sections on how the sweep was run: the search and its compute, the LR range test, and the
definitions every number above is given by."""

from __future__ import annotations

from lmtune.analysis.named_lrs import USEFUL_TOLERANCE
from lmtune.analysis.runs import SIGNIFICANCE_SE
from lmtune.findings.baselines import BASELINE_GRID_RATIO
from lmtune.findings.stability import INITIAL_FROM_VOCAB
from lmtune.findings.summary import SweepFacts, SweepSummary
from lmtune.findings.text import fmt, initial_loss_text, lr, table, tokens
from lmtune.report.figures import RANGE_TEST


def search_and_compute(summary: SweepSummary, facts: SweepFacts) -> list[str]:
    compute = dict(facts.compute or {})
    description = facts.search_strategy
    spent = compute.get("tokens_spent")
    if spent is None:
        spent = sum(r.tokens or 0 for r in summary.trials)
    lines = ["## Search strategy and compute", "", description.strip() or "(no description given)", ""]
    stages = summary.stages
    if len(stages) > 1 or (stages and stages[0].name != "grid"):
        lines += table(["stage", "LRs", "trials", "tokens", "why"],
                       [[s.name, ", ".join(f"{v:.3g}" for v in s.lrs) or "—", str(s.trials),
                         tokens(s.tokens), " → ".join(s.why) or "—"] for s in stages]) + [""]
    lines += [f"- tokens trained: {tokens(spent)}"]
    full = compute.get("full_grid_tokens")
    if full and not stages or (stages and stages[0].name == "grid" and full):
        lines += [f"- a full grid without early stopping: {tokens(full)} tokens",
                  f"- saving: {100.0 * (1.0 - spent / full):.1f}%"]
    grid = summary.same_resolution_grid
    if grid and stages and stages[0].name != "grid":
        lines += [f"- a grid resolving the edge as finely (LRs {grid.low:.3g} to {grid.high:.3g}, "
                  f"{grid.ratio:.2f}x apart: {grid.points} LRs, each trained to the full budget once, no "
                  f"seeds) would train {tokens(grid.tokens)} tokens; saving: "
                  f"{100.0 * (1.0 - spent / grid.tokens):.1f}%"]
    baseline = summary.competent_baseline
    if baseline and stages and stages[0].name != "grid":
        lines += [f"- what a competent user would train by hand for the same answer (a grid {BASELINE_GRID_RATIO:g}x "
                  f"apart over the same LRs: {baseline.grid_points}; {baseline.bisections} bisection runs to the same "
                  f"bracket; {baseline.extra_seeds} more seeds at the best LR and the bracket's ends: "
                  f"{baseline.runs} runs, each to the full budget): {tokens(baseline.tokens)} tokens; this search "
                  f"trained {100.0 * spent / baseline.tokens:.0f}% of that"]
    careful = summary.careful_baseline
    if careful and stages and stages[0].name != "grid":
        lines += [f"- what a careful user would run with the same tools (the same {careful.grid_points}-LR grid under "
                  f"ASHA with this sweep's rungs: {' → '.join(map(str, careful.at_rungs))} LRs reaching each; "
                  f"{careful.continued} more near the best and the grid's {careful.bracket_ends} failing-bracket ends "
                  f"continued to the full budget; the same {careful.bisections} bisection runs and "
                  f"{careful.extra_seeds} seeds; an estimate from counts): {tokens(careful.tokens)} tokens; this "
                  f"search trained **{100.0 * spent / careful.tokens:.0f}%** of that"]
    lines += [f"- {key.replace('_', ' ')}: {fmt(value)}" for key, value in compute.items()
              if key not in ("tokens_spent", "full_grid_tokens")]
    return lines + [""]


def range_test(facts: SweepFacts) -> list[str]:
    found = facts.range_test
    if not found:
        return []
    whose = (f" (variant {found['variant']}'s, the reference; each other variant's placed its own coarse grid, as "
             "the decisions say)") if found.get("variant") else ""
    return ["## LR range test", "",
            f"One run{whose} of {found['steps']} steps ({tokens(found['tokens'])} tokens) with the LR rising "
            f"exponentially (Smith 2017): steepest descent at lr **{lr(found['steepest_lr'])}**, lowest loss at "
            f"{lr(found['min_loss_lr'])}, blow-up at **{lr(found['blowup_lr'], 'none')}** "
            f"({found['stopped_because']}). Each LR is held for one step only, so this blow-up is not the edge of a "
            f"full run; the search placed its coarse grid with it. Figure: `{RANGE_TEST.file}`.", ""]


def _untrained(unigram_loss: float | None) -> str:
    if unigram_loss is None:
        return ("(at an LR above one that trained) ended no better than the data's unigram baseline; this sweep did "
                "not record that baseline, so no run was judged by it.")
    return (f"at an LR above one that trained, trained its whole budget but ended no better than the data's unigram "
            f"baseline, {fmt(unigram_loss)} nats (each validation token predicted by its frequency in the training "
            "split, ignoring context: a run no better than that did not train).")


def _initial_loss(summary: SweepSummary) -> str:
    """The definition of ℓ₀ with its value, said as it was found (ln(vocab), or an estimate, never called ln(vocab))."""
    value = initial_loss_text(summary.initial_loss, summary.initial_loss_from)
    if summary.initial_loss_from == INITIAL_FROM_VOCAB:
        return f"- **ℓ₀**: the loss at initialisation, {value} (a fresh model predicts near-uniformly)."
    return f"- **ℓ₀**: the loss at initialisation: {value}."


def definitions(summary: SweepSummary) -> list[str]:
    rule = summary.divergence_rule
    window, threshold = rule.recovery_window, rule.spike_threshold
    return ["## Definitions", "",
            _initial_loss(summary),
            f"- **Diverged**: the run's loss went non-finite, or went above ℓ₀ and did not come back below it within "
            f"the recovery window ({fmt(window)} of the budget's steps), or its budget ended with the loss above ℓ₀. "
            "The stopper ends a run early only on that evidence (a non-finite value, or the loss above ℓ₀ for the "
            "whole window); a run it ended at the bracket's edge is retrained without early stopping to confirm it.",
            f"- **Failed**: diverged, or {_untrained(summary.unigram_loss)} **Trained through** (a bracket's stable "
            "end): its whole budget without diverging, ending below that baseline.",
            "- **Unconfirmed** (cut while above ℓ₀): cut early (by ASHA or the stopper; of runs lmtune did not make, "
            "a log that ends before the budget) while its train loss stood "
            "above ℓ₀ after climbing there (rising more than the spike threshold above its running minimum): it may "
            "have come back, or diverged, so it is counted as neither; an LR where no other run trained its budget or "
            "failed is marked unconfirmed, and a failing or divergence LR above it is not known (it may lie there).",
            f"- **Spiked**: not diverged, and the train loss (averaged over a log interval) rose more than "
            f"{100 * (threshold or 0):.0f}% above its running minimum (ℓ₀ included) at least once; each spike is "
            "given with its step, its height over the running minimum before it, and the steps until the loss was "
            "back within that margin.",
            "- **Equal token counts**: losses compared at one token count, each interpolated linearly between a "
            "trial's evaluations; the best LR is decided at the whole budget, on the mean over its seeds, and only "
            "an LR with as many seeds as any other can be crowned (one that beats it seed for seed with fewer seeds "
            "is a contender, given the seeds before the crown is settled).",
            f"- **Basin**: the LRs whose mean full-budget loss is within {SIGNIFICANCE_SE:g} standard errors of the "
            "best's. **Degraded**: above the basin, trained through without diverging, clearly worse. Each region's "
            "ends lie between two LRs tried: that interval is its uncertainty.",
            "- **LR sensitivity** (Wortsman et al. 2023): S = (1/|H|) Σ_{η∈H} [min(ℓ(η), ℓ₀) − ℓ*], where H is "
            "lmtune's fixed grid (1e-4 to 1, half a decade apart: the same for every sweep and variant) less the "
            "LRs outside what was measured, ℓ(η) the mean full-budget val loss interpolated in log LR between the "
            "LRs that trained their budget (ℓ₀ at and above a diverged LR), ℓ* the lowest mean measured.",
            "- **Best LR**: the lowest mean full-budget loss, crowned on as many seeds as any LR it beats; none where "
            "no run ended better than the data's unigram baseline (nothing trained). "
            "**Top of the useful range**: the largest LR above the best, reached through tried LRs that all "
            f"qualify, whose mean full-budget loss is within max({SIGNIFICANCE_SE:g} standard errors of the "
            "difference, "
            f"{USEFUL_TOLERANCE:g} nats) of the best's; with the cost (loss over the best's) at 2x and 4x the best LR, "
            "interpolated in log LR between the LRs tried. **Failing LR**: the smallest LR, above one that trained "
            "through and not below the best, at which a run failed (above). **Divergence LR**: the smallest such LR "
            "at which a run diverged (above); a run can fail without diverging, so the failing LR lies at or below "
            "it. A run that failed below those (where no smaller LR trained, or below the best) broke for another "
            "reason than a large LR: it is said apart, not named.",
            "- **Edge ratio** (the practitioners' rubric): divergence LR / best LR; its range: the largest LR below it "
            "that ran its budget without diverging / the best LR's upper bound, to the divergence LR / its lower "
            "bound. Read \"conservative\" above 4 only where the top of the useful range lies above the best LR.",
            ""]
