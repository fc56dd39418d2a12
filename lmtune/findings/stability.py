"""Each trial as the report reads it (``TrialRecord``), its status, and the sweep-level numbers of the
edge-of-stability report. Everything here works on in-memory records (metrics.csv rows as a DataFrame), so the report
is computed and tested without Ray Tune or disk. Literature behind the numbers: Cohen et al. 2021 and 2022 (the edge
of stability), Wortsman et al. 2023 (small-scale proxies for Transformer training instabilities, LR sensitivity).
Whether a run diverged or only spiked is lmtune.training.divergence's judgement, with the sweep's own rule.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lmtune.analysis.named_lrs import UsefulRange
from lmtune.analysis.runs import Outcome
from lmtune.errors import LmtuneError
from lmtune.files import JsonObject
from lmtune.training.config import RunConfig, run_config_of
from lmtune.training.divergence import DivergenceRule, LossWatch, Spike, judge
from lmtune.training.metric_registry import probe_labels

log = logging.getLogger(__name__)

# Beyond the ledger's outcomes: "running", and "ended" for a trial Tune ended whose reason the ledger lacks.
OUTCOMES = (*(str(o) for o in Outcome), "running", "ended")
STATUSES = ("completed", "probed", "spiked", "diverged", "stopped_early", "too_slow", "error", "ended", "running")

# Edge-ratio readings (divergence LR / best LR), the rule of thumb LR-sweep users apply: > 4
# conservative, < 2 near the edge, ~1 at the edge. "~1" is taken as [0.8, 1.25] (one grid step of a
# fine sweep either side); 2..4, which the rule leaves unnamed, reads "moderately below the edge".
AT_EDGE_BAND = (0.8, 1.25)
NEAR_EDGE_BELOW = 2.0
CONSERVATIVE_ABOVE = 4.0

# first_growth: a probe "grew" once it exceeds this multiple of the best run's value at the same step. The
# probes it compares are the metrics registered as probes (lmtune.training.metric_registry.probe_labels).
GROWTH_FACTOR = 2.0


@dataclass
class TrialRecord:
    """One trial of a sweep as the report sees it."""

    trial_id: str
    lr: float
    params: JsonObject  # every varied hyperparameter of the trial (its Tune params), lr included
    outcome: str  # how the sweep ended it: one of OUTCOMES
    reason: str = ""  # e.g. "diverged at step 412, loss nan" / "stopped by ASHA at 2.6M tokens"
    stop_step: int | None = None
    # metrics.csv rows (lmtune.training.metrics.METRIC_COLUMNS); val_loss is NaN where not evaluated
    curve: pd.DataFrame = field(default_factory=pd.DataFrame)
    wall_time_s: float | None = None
    checkpoint_dir: Path | None = None  # the run's checkpoints/ folder (best.pt)
    periodic_checkpoints: tuple[Path, ...] = ()  # its step_XXXXXXXX.pt files left, oldest first (for sharpness)
    config: JsonObject = field(default_factory=dict)  # the trial's RunConfig as a dict (config.json)
    stage: str = "grid"  # an edge search's stage (coarse, bisect, refine, seeds); "grid" for other searches
    seed: int | None = None  # the trial's seed when the search set one
    rule: DivergenceRule = field(default_factory=DivergenceRule)  # the sweep's divergence rule
    continued_from_tokens: int = 0  # a run continued from another: tokens its copied first rows stand for
    continue_from: str | None = None  # ... and that run's trial id
    variant: str | None = None  # a compare search's variant the trial trained
    _judged: Any = field(default=None, repr=False, compare=False)  # judgement()'s answer, once computed
    _run: RunConfig | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def run(self) -> RunConfig | None:
        """The trial's config.json as a RunConfig (None when it is not one), parsed once."""
        return self._run

    @property
    def budget_tokens(self) -> int | None:
        """The tokens the trial's config would train to the end, when it has a config."""
        return budget_tokens(self.run)

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise LmtuneError(f"trial {self.trial_id}: unknown outcome {self.outcome!r}; expected one of "
                              f"{', '.join(OUTCOMES)}")
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise LmtuneError(f"trial {self.trial_id}: lr must be a positive number (got {self.lr!r})")
        self._run = run_config_of(self.config)
        if "step" in self.curve.columns:
            self.curve = self.curve.sort_values("step", kind="stable").reset_index(drop=True)


def budget_tokens(config: RunConfig | None) -> int | None:
    """The tokens a config trains to the end of its schedule (RunConfig.total_tokens; None without a config)."""
    return config.total_tokens if config is not None else None



# ---------------------------------------------------------------------------------------------
# Curve access

# The attention-logit probe's column (lmtune.training.metric_registry): logged by a model whose layers lmtune reaches.
ATTENTION_LOGITS = "attn_logit_max"


def column(record: TrialRecord, name: str) -> np.ndarray | None:
    """A curve column as float64 (None -> NaN), or None when the trial did not log it."""
    if name not in record.curve.columns:
        return None
    return pd.to_numeric(record.curve[name], errors="coerce").to_numpy(dtype=np.float64)


def logged(record: TrialRecord, name: str) -> bool:
    """Whether the trial logged a finite value of column ``name``."""
    values = column(record, name)
    return values is not None and bool(np.isfinite(values).any())


def val_points(record: TrialRecord) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, val_loss) of the rows where validation ran and gave a finite loss."""
    tokens, val = column(record, "tokens"), column(record, "val_loss")
    if tokens is None or val is None:
        return np.empty(0), np.empty(0)
    keep = np.isfinite(val) & np.isfinite(tokens)
    return tokens[keep], val[keep]


def best_val_loss(record: TrialRecord) -> float | None:
    _, val = val_points(record)
    return float(val.min()) if val.size else None


def final_val_loss(record: TrialRecord) -> float | None:
    _, val = val_points(record)
    return float(val[-1]) if val.size else None


def tokens_spent(record: TrialRecord) -> int:
    """Tokens this trial itself trained (a continued run's copied first rows were trained by another)."""
    return max((tokens_trained(record) or 0) - record.continued_from_tokens, 0)


def tokens_trained(record: TrialRecord) -> int | None:
    tokens = column(record, "tokens")
    if tokens is None or not np.isfinite(tokens).any():
        return None
    return int(np.nanmax(tokens))


def warmup_end_index(record: TrialRecord) -> int:
    """First row at the peak learning rate: the schedule's warm-up is over there."""
    lr = column(record, "lr")
    if lr is None or not np.isfinite(lr).any():
        return 0
    return int(np.nanargmax(lr))


# ---------------------------------------------------------------------------------------------
# Per-trial status


def initial_loss_of(record: TrialRecord) -> float | None:
    """ℓ₀ of the trial: ln vocab (the loss of the uniform guess a fresh model starts at), from its config."""
    vocab = (record.config.get("model") or {}).get("vocab_size")
    return math.log(vocab) if isinstance(vocab, int) and vocab > 1 else None


def judgement(record: TrialRecord) -> LossWatch | None:
    """The trial's train losses judged by the sweep's divergence rule (lmtune.training.divergence): its
    spikes, and whether it diverged; None without a config (no ℓ₀) or without logged losses."""
    if record._judged is None:
        record._judged = _judge(record) or False
    return record._judged or None


def _judge(record: TrialRecord) -> LossWatch | None:
    ell0, steps = initial_loss_of(record), (record.config.get("train") or {}).get("steps")
    step, train = column(record, "step"), column(record, "train_loss")
    if ell0 is None or not steps or step is None or train is None:
        return None
    rows = [(int(s), float(v)) for s, v in zip(step, train, strict=True) if math.isfinite(s)]
    finished = record.outcome in ("completed", "probed", "diverged", "stopped_early", "too_slow", "error", "ended")
    trained = tokens_trained(record)
    tokens_per_step = (record.budget_tokens or 0) // int(steps) if steps else 0
    steps_trained = trained // tokens_per_step if trained and tokens_per_step else 0
    return judge(rows, ell0, int(steps), steps_trained, record.rule, ended=finished)


def spikes_of(record: TrialRecord) -> list[Spike]:
    watch = judgement(record)
    return watch.all_spikes() if watch is not None else []


def has_nonfinite_loss(record: TrialRecord) -> bool:
    """A NaN/inf train loss, or an infinite val loss (a NaN val loss only means 'not evaluated')."""
    train, val = column(record, "train_loss"), column(record, "val_loss")
    if train is not None and not np.isfinite(train).all():
        return True
    return val is not None and bool(np.isinf(val).any())


def classify(record: TrialRecord) -> str:
    """Final status: diverged > spiked > the sweep's outcome.

    diverged: the sweep ended it as diverged (the stopper's divergence rule, a non-finite value, or its
    whole loss judged at its end), a loss went non-finite, or a run that trained its whole budget is
    judged diverged by the sweep's rule (it did not come back below ℓ₀ within the recovery window, or
    ended above it). spiked: trained what it was asked to without diverging, and its loss rose more than the
    rule's spike threshold above its running minimum at least once (lmtune.training.divergence.Spike); a
    run cut early keeps its outcome (its spikes are in its row). Otherwise the outcome stands (completed,
    probed, stopped_early, too_slow, error, running).
    """
    if record.outcome == "diverged" or has_nonfinite_loss(record):
        return "diverged"
    watch = judgement(record)
    if watch is not None and record.outcome == "completed" and watch.verdict.diverged:
        return "diverged"
    if watch is not None and record.outcome in ("completed", "probed") and watch.all_spikes():
        return "spiked"
    return record.outcome


# ---------------------------------------------------------------------------------------------
# Sweep-level numbers


def best_candidates(records: Sequence[TrialRecord]) -> list[TrialRecord]:
    """Trials that may be the best: evaluated, and neither diverged nor errored (an errored trial's loss
    is that of a run cut short by a crash, not by its learning rate), nor ended for a reason not recorded."""
    return [r for r in records if classify(r) not in ("diverged", "error", "ended") and best_val_loss(r) is not None]


def candidate_token_range(records: Sequence[TrialRecord]) -> tuple[int, int] | None:
    """(fewest, most) tokens the best-LR candidates trained: unequal when ASHA cut some of them early, so
    their best val losses are not at equal token counts."""
    tokens = [t for t in (tokens_trained(r) for r in best_candidates(records)) if t is not None]
    return (min(tokens), max(tokens)) if tokens else None


def divergence_lr(records: Sequence[TrialRecord]) -> float | None:
    """Smallest LR at which some trial diverged."""
    lrs = [r.lr for r in records if classify(r) == "diverged"]
    return min(lrs) if lrs else None


def edge_ratio(best_lr: float | None, div_lr: float | None) -> float | None:
    """Divergence LR / best LR: how far below the edge of stability the best LR sits."""
    if best_lr is None or div_lr is None or best_lr <= 0:
        return None
    return div_lr / best_lr


def edge_reading_range(smallest: float | None, largest: float | None, useful: UsefulRange | None = None) -> str | None:
    """The rule-of-thumb reading of a divergence / best ratio known only to lie in [smallest, largest]: given only
    when both ends read the same (None otherwise, or when an end is unbounded)."""
    if smallest is None or largest is None:
        return None
    low, high = edge_reading(smallest, useful), edge_reading(largest, useful)
    return low if low == high else None


def edge_reading(ratio: float | None, useful: UsefulRange | None = None) -> str:
    """Plain-words reading of the divergence LR / best LR ratio by the practitioners' rubric (thresholds: AT_EDGE_BAND,
    NEAR_EDGE_BELOW, CONSERVATIVE_ABOVE), held against the measured loss: "conservative" only where a larger LR than
    the best was measured to be as good (``useful``: lmtune.analysis.named_lrs; None: not measured)."""
    if ratio is None:
        return "no run diverged: the divergence LR lies above the largest LR tried"
    if AT_EDGE_BAND[0] <= ratio <= AT_EDGE_BAND[1]:
        return "at the edge"
    if ratio < AT_EDGE_BAND[0]:
        return ("below 1: a run diverged at a smaller LR than the best one "
                "(divergence depended on the other hyperparameters or on chance)")
    if ratio < NEAR_EDGE_BELOW:
        return "near the edge"
    if ratio > CONSERVATIVE_ABOVE:
        if useful is None:
            return "above 4, which the rubric calls conservative; no loss above the best LR measured to check it"
        if useful.measured_above_best:
            return (f"conservative: the best LR sits well below the edge, and {useful.top_lr:.3g} "
                    f"({useful.top_lr / useful.best_lr:.2g}x the best) was measured to be as good "
                    f"({useful.top_seeds} seeds)")
        if useful.above_best:
            return (f"far below divergence; whether conservative is not settled: {useful.top_lr:.3g} "
                    f"({useful.top_lr / useful.best_lr:.2g}x the best) came out as good on one seed, one draw of its "
                    "noise (more seeds there would settle it)")
        costs = ", ".join(f"{f}x the best LR costs {c:+.2f} nats" for f, c in useful.cost_at if c is not None)
        return ("far below divergence, yet not conservative: no larger LR was measured to be as good"
                + (f" ({costs})" if costs else ""))
    return "moderately below the edge"


def initial_loss(records: Sequence[TrialRecord]) -> float | None:
    """Median over trials of the first finite train loss each logged (all start from the same init)."""
    firsts = []
    for r in records:
        train = column(r, "train_loss")
        if train is not None:
            finite = train[np.isfinite(train)]
            if finite.size:
                firsts.append(float(finite[0]))
    return float(np.median(firsts)) if firsts else None


def tokens_to_reach(record: TrialRecord, level: float) -> float | None:
    """Tokens until the val loss first reached ``level``, linearly interpolated between evaluations."""
    tokens, val = val_points(record)
    hits = np.nonzero(val <= level)[0]
    if hits.size == 0:
        return None
    i = int(hits[0])
    if i == 0:
        return float(tokens[0])
    t0, t1, v0, v1 = tokens[i - 1], tokens[i], val[i - 1], val[i]
    return float(t0 + (v0 - level) / (v0 - v1) * (t1 - t0))


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
