"""Comparing learning rates like with like: every loss the report compares is taken at one token count.

A trial ASHA stopped at a rung is compared with the others at the rungs it reached and nowhere
else; "final" losses are those at the end of the budget, from trials that trained all of it; the best
LR is the lowest mean full-budget loss over its seeds (lmtune.analysis.conclusion.conclude, the rule the sweep
itself prints). Works on the report's TrialRecords, turned into the search's Runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from lmtune.analysis.named_lrs import interpolated
from lmtune.analysis.runs import INTERRUPTED, Budget, Run, effective_runs
from lmtune.findings.stability import (
    ATTENTION_LOGITS,
    TrialRecord,
    classify,
    column,
    cut_above_initial,
    has_nonfinite_loss,
    judgement,
    spikes_of,
    tokens_spent,
    tokens_trained,
    val_points,
)
from lmtune.training.divergence import BY_RULE, NON_FINITE, WHOLE_RUN
from lmtune.training.metric_registry import probe_labels

# A stable run's attention logits above this are worth a warning: Wortsman et al. (2023) find
# attention-logit growth ahead of the instabilities qk-layernorm removes (their diverging runs reach
# 1e4 and more); healthy runs of the size lmtune trains stay in the tens to hundreds.
LOGIT_GROWTH_WARNING = 1e3

# first_growth: a probe "grew" once it exceeds this multiple of the best run's value at the same step. The
# probes it compares are the metrics registered as probes (lmtune.training.metric_registry.probe_labels).
GROWTH_FACTOR = 2.0

Pair = tuple[Run, TrialRecord]


def record_runs(records: Sequence[TrialRecord], budget: Budget) -> list[Pair]:
    """Each trial as a Run: its LR, seed, stage, how it ended (classify's diverged wins, with where and how
    its divergence was established), its tokens, evaluations and spikes, the loss it was cut at while above ℓ₀
    (cut_above_initial); budgets from its own config, else the sweep's."""
    pairs = []
    for record in records:
        if record.reason == INTERRUPTED:
            continue  # its plan ran again in full in another trial, which stands for it
        tokens, val = val_points(record)
        budget_tokens = record.budget_tokens or budget.full_tokens
        train = record.config.get("train") or {}
        steps, run_steps = train.get("steps"), train.get("run_steps")
        run_tokens = budget_tokens * run_steps // steps if run_steps and steps else budget_tokens
        outcome = "diverged" if classify(record) == "diverged" else record.outcome
        others = tuple(sorted((k, v) for k, v in record.params.items() if k != "lr"))
        run = Run(record.lr, record.seed if record.seed is not None else budget.seed, record.stage, budget_tokens,
                  run_tokens, None if outcome == "running" else outcome, tokens_trained(record) or 0,
                  {int(t): float(v) for t, v in zip(tokens, val, strict=True)}, others,
                  spikes=tuple(spikes_of(record)), trial_id=record.trial_id,
                  continue_from=record.continue_from, continued_tokens=record.continued_from_tokens,
                  baseline=budget.unigram_loss, cut_loss=cut_above_initial(record))
        if run.diverged:
            run.divergence, run.diverged_tokens = divergence_of(record, run, budget_tokens // max(steps or 1, 1))
        pairs.append((run, record))
    return pairs


def divergence_of(record: TrialRecord, run: Run, tokens_per_step: int) -> tuple[str, int]:
    """How a diverged trial's divergence was established, and at how many tokens: a non-finite value;
    its whole budget seen; or the stopper's rule (it stopped above ℓ₀ for the whole recovery window)."""
    watch = judgement(record)
    step = watch.verdict.step if watch is not None and watch.verdict.diverged else record.stop_step
    if has_nonfinite_loss(record) or "non-finite" in record.reason:
        how = NON_FINITE
    else:
        how = WHOLE_RUN if run.full else BY_RULE
    return how, (step * tokens_per_step if step else run.tokens)


def standing_pairs(pairs: Sequence[Pair]) -> list[Pair]:
    """The pairs whose run stands (lmtune.analysis.runs.effective_runs): each run of the sweep counted once."""
    standing = {id(run) for run in effective_runs(run for run, _ in pairs)}
    return [(run, record) for run, record in pairs if id(run) in standing]


@dataclass(frozen=True)
class EqualTokenLosses:
    """Every standing run's val loss at exactly each comparison point (ASHA's rungs and the whole budget), by LR:
    one loss per seed that reached it (lmtune.analysis.runs.equal_token_losses; diverged runs left out)."""

    table: Mapping[int, Mapping[float, Sequence[float]]]
    """Tokens -> LR -> the losses there."""

    def means_json(self) -> dict[str, dict[str, float]]:
        """summary.json's equal_token_losses: {tokens: {lr: mean loss over the trials that reached it}}."""
        return {str(tokens): {f"{lr:.4g}": float(np.mean(losses)) for lr, losses in by_lr.items()}
                for tokens, by_lr in self.table.items()}

    def trials_json(self) -> dict[str, dict[str, list[float]]]:
        """summary.json's equal_token_trials: {tokens: {lr: the loss of each trial that reached it}}."""
        return {str(tokens): {f"{lr:.4g}": list(losses) for lr, losses in by_lr.items()}
                for tokens, by_lr in self.table.items()}


def best_record(pairs: Sequence[Pair], best_lr: float | None) -> TrialRecord | None:
    """The trial at the best LR with the lowest full-budget loss (the one whose checkpoint to use)."""
    finals = [(run.full_loss(), record) for run, record in pairs if run.lr == best_lr and run.full_loss() is not None]
    return min(finals, key=lambda item: item[0])[1] if finals else None


# LR sensitivity is read on one fixed grid of LRs, the same for every sweep and every variant a report puts side by
# side (not over whichever LRs a search happened to train): half a decade apart from 1e-4 to 1, the LRs small
# Transformers train at with AdamW and past where they fail (the built-in corpus's runs fail above about 1.4).
SENSITIVITY_RANGE = (1e-4, 1.0)
SENSITIVITY_LRS = tuple(10.0 ** (k / 2) for k in range(-8, 1))


@dataclass(frozen=True)
class Sensitivity:
    """LR sensitivity (Wortsman et al. 2023) at the full budget, on the fixed grid SENSITIVITY_LRS."""

    value: float | None
    """S = mean over the grid's covered LRs of min(l(eta), l0) - l* (None: no full-budget loss, or no l0)."""
    lrs: int
    """How many of the grid's LRs it is over: those between two LRs that trained their budget (their loss
    interpolated in log LR), or at or above a diverged LR (l0)."""
    tokens: int | None
    """The full budget's tokens it is measured at."""
    points: int = len(SENSITIVITY_LRS)
    """The grid's LRs (SENSITIVITY_RANGE, half a decade apart)."""


def full_budget_sensitivity(pairs: Sequence[Pair], ell0: float | None) -> Sensitivity:
    """LR sensitivity (Wortsman et al. 2023) at the full budget on the fixed grid SENSITIVITY_LRS: S = mean over its
    LRs of min(l(eta), l0) - l*, with l(eta) the mean full-budget loss interpolated in log LR between the LRs that
    trained their budget, l0 at and above the smallest LR, above the lowest of those, at which a trial diverged, and
    grid LRs outside what was measured left out (``lrs`` says how many count); l* the lowest mean measured. An LR
    without a full-budget run is no point of the curve (a divergence below every LR that trained one included)."""
    if ell0 is None:
        return Sensitivity(None, 0, None)
    per_lr: dict[float, list[float]] = {}
    diverged, tokens = [], None
    for run, _ in pairs:
        if run.stage == "range":
            continue
        if run.diverged:
            diverged.append(run.lr)
        elif (loss := run.full_loss()) is not None:
            per_lr.setdefault(run.lr, []).append(loss)
            tokens = run.budget_tokens
    if not per_lr:
        return Sensitivity(None, 0, tokens)
    # A divergence below every LR that trained its budget is outside the measured curve, not where l0 begins
    first_diverged = min((lr for lr in diverged if lr > min(per_lr)), default=math.inf)
    curve = sorted((math.log(lr), min(float(np.mean(v)), ell0)) for lr, v in per_lr.items() if lr < first_diverged)
    best = min(y for _, y in curve)  # (never empty: the lowest LR with a full-budget loss lies below first_diverged)
    values = [ell0 if lr >= first_diverged else interpolated(curve, math.log(lr)) for lr in SENSITIVITY_LRS]
    covered = [v - best for v in values if v is not None]
    return Sensitivity(float(np.mean(covered)) if covered else None, len(covered), tokens)


@dataclass(frozen=True)
class ConvergenceRow:
    """How many tokens one trial that trained its whole budget needed to reach the common loss level."""

    trial_id: str
    """The trial."""
    lr: float
    """Its LR."""
    seed: int
    """Its seed."""
    status: str
    """Its status (lmtune.findings.stability.classify)."""
    tokens: float | None
    """Tokens to reach the level, interpolated between evaluations (None: never reached it)."""


@dataclass(frozen=True)
class Convergence:
    """Tokens each trial that trained its whole budget needed to reach one val loss."""

    level: float | None
    """The worst final loss of the basin's runs (None: no trial trained its whole budget)."""
    rows: tuple[ConvergenceRow, ...]
    """One per trial that trained its whole budget, by LR and seed."""
    budget_tokens: int | None
    """The budget those trials trained."""


def full_budget_convergence(pairs: Sequence[Pair], basin: Sequence[float] | None = None) -> Convergence:
    """Tokens each trial that trained its whole budget needed to reach one val loss, linearly interpolated
    between evaluations: the worst final loss of the basin's runs (so each of them reaches it, and the
    others show how far they are), or of all such trials when there is no basin."""
    full = [(run, record) for run, record in pairs if run.full_loss() is not None]
    reference = [run.full_loss() for run, _ in full if not basin or run.lr in basin]
    level = max(reference) if reference else None
    rows = tuple(ConvergenceRow(record.trial_id, run.lr, run.seed, classify(record),
                                _tokens_to_reach(run, level) if level is not None else None)
                 for run, record in sorted(full, key=lambda pair: (pair[0].lr, pair[0].seed)))
    return Convergence(level, rows, full[0][0].budget_tokens if full else None)


def _tokens_to_reach(run: Run, level: float) -> float | None:
    points = sorted(run.val.items())
    for i, (tokens, loss) in enumerate(points):
        if loss <= level:
            if i == 0:
                return float(tokens)
            (t0, v0) = points[i - 1]
            return float(t0 + (v0 - level) / (v0 - loss) * (tokens - t0))
    return None


@dataclass(frozen=True)
class LogitGrowth:
    """Trials that did not diverge but whose largest attention logit grew past a warning threshold."""

    threshold: float
    """The largest attention logit above which a stable run is worth a warning."""
    best: float | None
    """The best trial's largest attention logit, for scale (None: not logged)."""
    lrs: tuple[tuple[float, float], ...]
    """(LR, the largest attention logit any of its trials reached), ascending by LR."""


def logit_growth(pairs: Sequence[Pair], best: TrialRecord | None,
                 threshold: float = LOGIT_GROWTH_WARNING) -> LogitGrowth:
    """Trials that did not diverge but whose largest attention logit exceeded ``threshold``: by LR, the
    largest value any of its trials reached (and the best trial's, for scale). A run cut while above ℓ₀ is left
    out: whether it diverged is not known."""
    def peak(record: TrialRecord) -> float | None:
        values = column(record, ATTENTION_LOGITS)
        if values is None or not np.isfinite(values).any():
            return None
        return float(np.nanmax(np.abs(values[np.isfinite(values)])))

    grown: dict[float, float] = {}
    for run, record in pairs:
        value = peak(record)
        if not run.diverged and run.cut_loss is None and value is not None and value > threshold:
            grown[run.lr] = max(value, grown.get(run.lr, 0.0))
    return LogitGrowth(threshold, peak(best) if best is not None else None, tuple(sorted(grown.items())))


@dataclass(frozen=True)
class StageDecision:
    """One decision a deciding search recorded: the stage it planned and why."""

    stage: str
    """The stage the search planned."""
    why: str
    """Why, in the search's words."""


@dataclass(frozen=True)
class Stage:
    """One stage of the search: what it trained and why (a grid or Optuna sweep is one stage)."""

    name: str
    """The stage (range, coarse, landscape, bisect, confirm, refine, seeds; grid for a grid or Optuna sweep)."""
    lrs: tuple[float, ...]
    """Its LRs, ascending (none for the range test)."""
    tokens: int
    """Tokens its trials trained themselves."""
    trials: int
    """Trials it ran (the range test counts as one)."""
    why: tuple[str, ...]
    """The search's reasons for it, in the order it gave them."""


def stage_accounting(pairs: Sequence[Pair], decisions: Sequence[StageDecision] = (),
                     range_tokens: int | None = None) -> list[Stage]:
    """Per stage: its LRs, trials, tokens trained, and why (the search's ``decisions``); a grid or Optuna sweep
    is one stage. ``range_tokens``: the range test's (not a trial record of its own)."""
    lrs: dict[str, set[float]] = {}
    counts: dict[str, list[int]] = {}  # stage -> [trials, tokens]
    why: dict[str, list[str]] = {}
    if range_tokens is not None:
        lrs["range"], counts["range"], why["range"] = set(), [1, range_tokens], []
    for run, record in pairs:
        lrs.setdefault(run.stage, set())
        if run.stage != "range":
            lrs[run.stage].add(run.lr)
        count = counts.setdefault(run.stage, [0, 0])
        count[0] += 1
        count[1] += tokens_spent(record)
        why.setdefault(run.stage, [])
    for decision in decisions:
        lrs.setdefault(decision.stage, set())
        counts.setdefault(decision.stage, [0, 0])
        why.setdefault(decision.stage, []).append(decision.why)
    # In the order the search decided them (the range test first), then any it did not record a decision for.
    decided = ["range"] + [d.stage for d in decisions]
    order = {name: decided.index(name) for name in decided}
    names = sorted(lrs, key=lambda name: (order.get(name, len(order)), name))
    return [Stage(name, tuple(sorted(lrs[name])), counts[name][1], counts[name][0], tuple(why[name])) for name in names]


def first_growth(record: TrialRecord, best_record: TrialRecord | None, factor: float = GROWTH_FACTOR) -> str:
    """Which stability probe grew first relative to the best trial, as one sentence.

    For each registered probe (metric_registry.probe_labels: gradient norm, attention-logit max, output-logit
    max), find the first logged step where |value| exceeds ``factor`` times the best trial's |value| at that
    step (the best run's curve linearly interpolated onto this run's steps, within its logged range). Names
    the earliest one; a probe an old metrics.csv lacks is said not logged.
    """
    if best_record is None:
        return f"{record.trial_id}: no best trial to compare against."
    if record is best_record or record.trial_id == best_record.trial_id:
        return f"{record.trial_id} is the best trial."
    if column(record, "step") is None or column(best_record, "step") is None:
        return f"{record.trial_id}: no step column, so growth cannot be compared."
    found, missing = probe_crossings(record, best_record, factor)
    if not found:
        checked = [label for label in probe_labels().values() if label not in missing]
        if not checked:
            return f"{record.trial_id}: no stability probes logged ({', '.join(missing)} missing)."
        tail = f" ({', '.join(missing)} not logged)" if missing else ""
        return (f"{record.trial_id} (lr={record.lr:.3g}): none of {', '.join(checked)} exceeded "
                f"{factor:g}x the best trial's values{tail}.")
    order = list(probe_labels().values())
    found.sort(key=lambda item: (item[0], order.index(item[2])))
    quiet = [label for label in order if label not in missing and label not in {f[2] for f in found}]
    step = found[0][0]
    tied = sorted((f for f in found if f[0] == step), key=lambda f: -f[1])
    _, ratio, label = tied[0]
    ratio_text = "non-finite" if math.isinf(ratio) else f"{ratio:.1f}x the best trial's"
    if len(tied) > 1:
        # Crossing at the same logged step does not tell which came first; say so, and which grew most.
        sentence = (f"{record.trial_id} (lr={record.lr:.3g}): {', '.join(f[2] for f in tied)} all exceeded "
                    f"{factor:g}x at the same logged step {int(step)} (log more often to order them); "
                    f"{label} grew most, {ratio_text}")
    else:
        sentence = f"{record.trial_id} (lr={record.lr:.3g}): {label} grew first, {ratio_text} at step {int(step)}"
    later = [f"{lab} at step {int(s)}" for s, _, lab in found if s != step]
    if later:
        sentence += f"; then {', '.join(later)}"
    if quiet:
        sentence += f"; {', '.join(quiet)} stayed within {factor:g}x"
    if missing:
        sentence += f"; {', '.join(missing)} not logged"
    return sentence + "."


def probe_crossings(record: TrialRecord, best_record: TrialRecord,
                    factor: float) -> tuple[list[tuple[float, float, str]], list[str]]:
    """([(first step above factor x the best run, ratio there, probe label)], [labels not logged])."""
    steps, best_steps = column(record, "step"), column(best_record, "step")
    found: list[tuple[float, float, str]] = []
    missing = []
    for name, label in probe_labels().items():
        mine, theirs = column(record, name), column(best_record, name)
        ok = np.isfinite(theirs) & np.isfinite(best_steps) if theirs is not None else None
        if mine is None or ok is None or ok.sum() == 0:
            missing.append(label)
            continue
        ref_steps, ref_vals = best_steps[ok], np.abs(theirs[ok])
        inside = (steps >= ref_steps.min()) & (steps <= ref_steps.max())
        ref_at = np.interp(steps, ref_steps, ref_vals)
        # A non-finite probe (overflow) counts as growth: it is the most extreme growth there is.
        exceeded = inside & (~np.isfinite(mine) | (np.abs(mine) > factor * np.maximum(ref_at, 1e-12)))
        hits = np.nonzero(exceeded)[0]
        if hits.size:
            i = int(hits[0])
            ratio = abs(mine[i]) / max(ref_at[i], 1e-12) if np.isfinite(mine[i]) else math.inf
            found.append((float(steps[i]), ratio, label))
    return found, missing
