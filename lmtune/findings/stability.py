"""Each trial as the report reads it (``TrialRecord``), its status, ℓ₀, and the sweep-level numbers of the
edge-of-stability report (which probe grew first: lmtune.findings.comparison.first_growth). Everything here works
on in-memory records (metrics.csv rows as a DataFrame), so the report is computed and tested without Ray Tune or
disk. Literature behind the numbers: Cohen et al. 2021 and 2022 (the edge of stability), Wortsman et al. 2023
(small-scale proxies for Transformer training instabilities, LR sensitivity).
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

log = logging.getLogger(__name__)

# Beyond the ledger's outcomes: "running", and "ended" for a trial Tune ended whose reason the ledger lacks.
OUTCOMES = (*(str(o) for o in Outcome), "running", "ended")
STATUSES = ("completed", "probed", "spiked", "diverged", "unconfirmed", "stopped_early", "too_slow", "error", "ended",
            "running")
# The outcomes of a run cut early, by ASHA (stopped_early) or by the stopper's time budget (too_slow): one cut while
# its loss stood above ℓ₀ is "unconfirmed" (cut_above_initial), neither diverged nor spiked.
CUT = ("stopped_early", "too_slow")

# Edge-ratio readings (divergence LR / best LR), the rule of thumb LR-sweep users apply: > 4
# conservative, < 2 near the edge, ~1 at the edge. "~1" is taken as [0.8, 1.25] (one grid step of a
# fine sweep either side); 2..4, which the rule leaves unnamed, reads "moderately below the edge".
AT_EDGE_BAND = (0.8, 1.25)
NEAR_EDGE_BELOW = 2.0
CONSERVATIVE_ABOVE = 4.0

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
    # Where its config names no vocabulary and no budget (analyze --runs): ℓ₀ (ln of the vocabulary given), and its
    # budget in the steps of its curve's step column, which its train losses are judged against (None: not known)
    ell0: float | None = None
    judged_steps: int | None = None
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
    """ℓ₀ of the trial: ln vocab (the loss of the uniform guess a fresh model starts at), from its config, else the
    one given with it (TrialRecord.ell0)."""
    vocab = (record.config.get("model") or {}).get("vocab_size")
    return math.log(vocab) if isinstance(vocab, int) and vocab > 1 else record.ell0


def judgement(record: TrialRecord) -> LossWatch | None:
    """The trial's train losses judged by the sweep's divergence rule (lmtune.training.divergence): its
    spikes, and whether it diverged; None without ℓ₀ and a budget (its config's, or given with it) or without
    logged losses."""
    if record._judged is None:
        record._judged = _judge(record) or False
    return record._judged or None


def _judge(record: TrialRecord) -> LossWatch | None:
    ell0, steps = initial_loss_of(record), (record.config.get("train") or {}).get("steps")
    step, train = column(record, "step"), column(record, "train_loss")
    if not steps and record.judged_steps:
        return _judge_given(record, ell0, record.judged_steps, step, train)
    if ell0 is None or not steps or step is None or train is None:
        return None
    rows = [(int(s), float(v)) for s, v in zip(step, train, strict=True) if math.isfinite(s)]
    finished = record.outcome in ("completed", "probed", "diverged", "stopped_early", "too_slow", "error", "ended")
    trained = tokens_trained(record)
    tokens_per_step = (record.budget_tokens or 0) // int(steps) if steps else 0
    steps_trained = trained // tokens_per_step if trained and tokens_per_step else 0
    return judge(rows, ell0, int(steps), steps_trained, record.rule, ended=finished)


def _judge_given(record: TrialRecord, ell0: float | None, steps: int, step: np.ndarray | None,
                 train: np.ndarray | None) -> LossWatch | None:
    """A run without a config (analyze --runs) judged against the ℓ₀ and budget given with it: a completed run
    trained its whole budget, any other as many steps as it logged."""
    if ell0 is None or step is None or train is None:
        return None
    rows = [(int(s), float(v)) for s, v in zip(step, train, strict=True) if math.isfinite(s) and not math.isnan(v)]
    if not rows:
        return None
    trained = steps if record.outcome == "completed" else max(s for s, _ in rows)
    return judge(rows, ell0, steps, trained, record.rule, ended=record.outcome != "running")


def spikes_of(record: TrialRecord) -> list[Spike]:
    watch = judgement(record)
    return watch.all_spikes() if watch is not None else []


def has_nonfinite_loss(record: TrialRecord) -> bool:
    """A NaN/inf train loss, or an infinite val loss (a NaN val loss only means 'not evaluated')."""
    train, val = column(record, "train_loss"), column(record, "val_loss")
    if train is not None and not np.isfinite(train).all():
        return True
    return val is not None and bool(np.isinf(val).any())


def cut_above_initial(record: TrialRecord) -> float | None:
    """The train loss a run cut early (by ASHA or the stopper: CUT) stood at when it was cut, where that was above
    its initial loss ℓ₀ and it had climbed there (risen more than the spike threshold above its running minimum,
    the rule's condition for diverging): whether it would have come back is not known, so it is neither diverged
    nor spiked. None: not such a run (or no ℓ₀ to judge it by)."""
    if record.outcome not in CUT or has_nonfinite_loss(record):
        return None
    watch = judgement(record)
    if watch is None or not watch.verdict.undecided or not watch.climbed or watch.last_loss is None:
        return None
    return watch.last_loss


def classify(record: TrialRecord) -> str:
    """Final status: diverged > unconfirmed > spiked > the sweep's outcome.

    diverged: the sweep ended it as diverged (the stopper's divergence rule, a non-finite value, or its
    whole loss judged at its end), a loss went non-finite, or a run that trained its whole budget is
    judged diverged by the sweep's rule (it did not come back below ℓ₀ within the recovery window, or
    ended above it). unconfirmed: cut early (by ASHA or the stopper) while its loss stood above ℓ₀, having
    climbed there (cut_above_initial): it may have come back or not. spiked: trained what it was asked to without
    diverging, and its loss rose more than the rule's spike threshold above its running minimum at least once
    (lmtune.training.divergence.Spike); a run cut early below ℓ₀ keeps its outcome (its spikes are in its row).
    Otherwise the outcome stands (completed, probed, stopped_early, too_slow, error, running). A run another
    continued is settled by that one: trial_statuses.
    """
    if record.outcome == "diverged" or has_nonfinite_loss(record):
        return "diverged"
    if cut_above_initial(record) is not None:
        return "unconfirmed"
    watch = judgement(record)
    if watch is not None and record.outcome == "completed" and watch.verdict.diverged:
        return "diverged"
    if watch is not None and record.outcome in ("completed", "probed") and watch.all_spikes():
        return "spiked"
    return record.outcome


def trial_statuses(records: Sequence[TrialRecord]) -> dict[str, str]:
    """Each trial's status by id (classify), except that a run cut while above ℓ₀ which another of ``records``
    continued (its rows the first of that one's) keeps its outcome: the continuation says whether it came back."""
    continued = {r.continue_from for r in records if r.continue_from}
    return {r.trial_id: (r.outcome if status == "unconfirmed" and r.trial_id in continued else status)
            for r in records for status in (classify(r),)}


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


def edge_reading(ratio: float | None, useful: UsefulRange | None = None, unconfirmed: float | None = None) -> str:
    """Plain-words reading of the divergence LR / best LR ratio by the practitioners' rubric (thresholds: AT_EDGE_BAND,
    NEAR_EDGE_BELOW, CONSERVATIVE_ABOVE), held against the measured loss: "conservative" only where a larger LR than
    the best was measured to be as good (``useful``: lmtune.analysis.named_lrs; None: not measured). ``unconfirmed``:
    the smallest LR at which a run was cut while above ℓ₀ (None: none): with no run diverged, the ratio is not known
    rather than above the largest LR tried."""
    if ratio is None and unconfirmed is not None:
        return (f"no run was confirmed to diverge, but a run at lr {unconfirmed:.3g} was cut while its loss stood "
                "above ℓ₀: whether the divergence LR lies there is not known (retrain it without early stopping)")
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


# How a summary's ℓ₀ was found (lmtune.findings.summary.SweepSummary.initial_loss_from): ln of the model's
# vocabulary, given as a number, or estimated by initial_loss (the vocabulary not known).
INITIAL_FROM_VOCAB = "ln(vocab)"
INITIAL_GIVEN = "given"
INITIAL_ESTIMATED = "median first train loss"


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


def initial_loss_found(records: Sequence[TrialRecord], ell0: float | None,
                       vocab_size: int | None) -> tuple[float | None, str | None]:
    """ℓ₀ and how it was found: as given, else ln(vocab), else estimated as the median over the trials of the first
    train loss each logged (initial_loss); (None, None) where none of these is known."""
    if ell0 is not None:
        return ell0, INITIAL_GIVEN
    if vocab_size:
        return math.log(vocab_size), INITIAL_FROM_VOCAB
    estimate = initial_loss(records)
    return estimate, INITIAL_ESTIMATED if estimate is not None else None
