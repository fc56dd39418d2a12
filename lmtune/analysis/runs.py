"""What a sweep's runs show, Ray-free: each trial as a ``Run``, their losses compared at equal token
counts, and the best LR crowned on as many seeds as the LRs it beats. Where training fails is
lmtune.analysis.bracket, the regions above the best LR lmtune.analysis.landscape, and what it all concludes
lmtune.analysis.conclusion. The edge searcher decides from these functions while the sweep runs; the report and
the ``run`` command's last lines read the same ones afterwards.

A run is judged by what its loss did (lmtune.training.divergence): *diverged* when it went non-finite or
did not come back below its initial loss within the recovery window (or ended its budget above it);
every comparison of losses is at one token count; an LR's full-budget loss is the mean over its seeds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any

from lmtune.analysis.rungs import Rungs
from lmtune.files import JsonObject
from lmtune.training.config import RunConfig
from lmtune.training.divergence import NON_FINITE, Spike

# Two LRs closer than this ratio are one LR (a refinement LR next to a coarse one adds nothing).
SAME_LR = 1.02
# An LR is "clearly worse" than the best when its mean loss is more than this many standard errors above.
SIGNIFICANCE_SE = 2.0
# The run-to-run spread is pooled over LRs with several seeds within this factor of the best LR: near the
# optimum. Far above it runs differ much more from seed to seed (measured on the built-in corpus, seed
# standard deviations of 0.01-0.06 within 4x of the best LR, 0.2-0.3 at 10x), which would widen the basin.
SPREAD_WITHIN = 4.0
# The reason recorded for a trial a search planned again after a driver restart (the ledger never got it).
INTERRUPTED = ("interrupted: the sweep's driver stopped while it ran, before Ray recorded the trial; the search "
               "ran its plan again in another trial")



def same_lr(a: float, b: float) -> bool:
    """Two LRs closer than SAME_LR: one LR."""
    return max(a, b) / min(a, b) < SAME_LR


@dataclass(frozen=True)
class AshaBudget:
    """ASHA's rungs in tokens: the first at ``grace_period``, each ``reduction_factor`` x the last, up to ``max_t``."""

    max_t: int
    """The last rung: no trial is judged past this many tokens."""
    grace_period: int
    """The first rung: tokens every trial trains before ASHA may cut it."""
    reduction_factor: float
    """Each rung keeps the best 1 / reduction_factor of the trials that reached it."""


@dataclass(frozen=True)
class Budget:
    """What the analysis needs of the sweep's base config."""

    steps: int
    warmup_steps: int
    tokens_per_step: int
    seed: int
    """The base seed: seed 0 of the search; further seeds are seed + 1, seed + 2, ..."""
    rungs: tuple[int, ...]
    """Token counts at which LRs are compared (ASHA's rungs), the last one the full budget."""
    schedule: str = "cosine"
    """The LR schedule (cosine | wsd): under WSD a run of one budget can continue another's (lmtune.training.fork)."""
    d_model: int = 0
    """The model's width (the width search's target; 0: not recorded)."""
    d_ff: int = 0
    """Its feed-forward width (a narrower model of the width search keeps d_ff / d_model)."""
    n_heads: int = 0
    """Its attention heads (a narrower model keeps the head dimension d_model / n_heads)."""
    unigram_loss: float | None = None
    """The data's unigram baseline (lmtune.data.dataset.unigram_loss): a run that ends no better did not train
    (None: not recorded, and no run is judged by it)."""
    batch_size: int = 0
    """Sequences per step (a compare search's batch-size variant scales its steps by it; 0: not recorded)."""
    asha_rungs: bool = True
    """The comparison points below the full budget are ASHA's rungs (False: other points, such as the fractions of
    the budget ``analyze --runs`` compares runs at, which had no rungs)."""

    @classmethod
    def of_run(cls, config: RunConfig, asha: AshaBudget | None, unigram_loss: float | None = None) -> Budget:
        """The budget of a RunConfig (its tokens: RunConfig's own), compared at ASHA's rungs (None: at its end), its
        runs judged against the data's ``unigram_loss``."""
        t, m = config.train, config.model
        return cls(t.steps, t.warmup_steps, config.tokens_per_step, t.seed,
                   comparison_rungs(config.total_tokens, asha), t.schedule, m.d_model, m.d_ff, m.n_heads,
                   unigram_loss, t.batch_size)

    @property
    def full_tokens(self) -> int:
        return self.steps * self.tokens_per_step

    def at_steps(self, steps: int) -> Budget:
        """The same runs over ``steps`` steps, compared at their full token count only."""
        return replace(self, steps=steps, rungs=(steps * self.tokens_per_step,))


def comparison_rungs(full_tokens: int, asha: AshaBudget | None) -> tuple[int, ...]:
    """The token counts at which LRs are compared: ASHA's rungs (lmtune.analysis.rungs, the one rung rule) below
    max_t and the full budget; without ASHA, the full budget alone."""
    if asha is None:
        return (int(full_tokens),)
    end = min(asha.max_t, full_tokens) - 0.5  # (max_t itself, and the full budget, end the list once)
    rungs = Rungs.of(float(asha.grace_period), float(asha.reduction_factor), float(asha.max_t))
    return (*(int(round(m)) for m in rungs.milestones if m < end), int(full_tokens))


def format_tokens(tokens: float) -> str:
    """1.2M, 30.5k, 800: token counts in the search's and the sweep's messages."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if tokens >= scale:
            return f"{tokens / scale:.1f}{unit}"
    return f"{tokens:.0f}"


# ---------------------------------------------------------------------------------------------
# One trial


class Outcome(StrEnum):
    """Why a trial ended, as the ledger records it."""

    COMPLETED = "completed"  # trained its whole budget
    PROBED = "probed"  # trained the run_steps it was asked for (less than its budget) without diverging
    RANGE_TEST = "range_test"  # the edge search's LR range test ended (it stops itself at the blow-up)
    DIVERGED = "diverged"  # non-finite, or failed to recover below its initial loss (lmtune.training.divergence)
    STOPPED_EARLY = "stopped_early"  # cut by ASHA at a rung
    TOO_SLOW = "too_slow"  # projected past the time budget, or under the throughput floor (the stopper)
    ERROR = "error"  # raised, and ran out of retries


@dataclass
class Run:
    """One trial as the search (and the report) sees it."""

    lr: float
    seed: int
    stage: str
    budget_tokens: int
    """Tokens of its whole schedule (the budget)."""
    run_tokens: int
    """Tokens it was planned to train (the budget, unless a search asked for less)."""
    outcome: str | None = None
    """None while it runs; then the ledger's outcome (completed, diverged, stopped_early, ...)."""
    tokens: int = 0
    """Tokens trained so far."""
    val: dict[int, float] = field(default_factory=dict)
    """Val loss by tokens, at each evaluation."""
    others: tuple[tuple[str, Any], ...] = ()
    """The other parameters a grid varied (batch_size, ...): runs are grouped by LR and these."""
    diverged_tokens: int | None = None
    """Where its divergence was decided (a diverged run)."""
    divergence: str | None = None
    """How its divergence was established: NON_FINITE, BY_RULE or WHOLE_RUN (a diverged run)."""
    spikes: tuple[Spike, ...] = ()
    """Its spikes (the report's runs: lmtune.training.divergence judged its losses)."""
    trial_id: str = ""
    continue_from: str | None = None
    """The trial id of the (ASHA-cut) run this one continues: that run's rows are the first of this one's."""
    continued_tokens: int = 0
    """Tokens of those first rows, which the run it continues trained (0 for a run of its own)."""
    baseline: float | None = None
    """The data's unigram baseline (Budget.unigram_loss): ending no better than it, the run did not train."""
    cut_loss: float | None = None
    """The train loss it stood at when it was cut early (by ASHA or the stopper) above its initial loss ℓ₀, having
    climbed there (lmtune.findings.stability.cut_above_initial): whether it would have come back is not known, so
    it is neither diverged nor spiked but unconfirmed (None: it was not cut so)."""

    @property
    def done(self) -> bool:
        return self.outcome is not None

    @property
    def diverged(self) -> bool:
        return self.outcome == "diverged"

    @property
    def spent_tokens(self) -> int:
        """Tokens this run itself trained: ``tokens`` less the rows it copied from the run it continues."""
        return max(self.tokens - self.continued_tokens, 0)

    @property
    def full(self) -> bool:
        """Trained its whole budget (its whole trajectory is known)."""
        return self.tokens >= self.budget_tokens

    def loss_at(self, tokens: int) -> float | None:
        return loss_at_tokens(self.val, tokens)

    def full_loss(self) -> float | None:
        """Its val loss at the end of its budget, if it trained that far without diverging."""
        return None if self.diverged or not self.full else self.loss_at(self.budget_tokens)

    def trained_through(self) -> bool:
        """Trained its whole budget without diverging and ended better than the data's unigram baseline: proven
        to train at this budget."""
        return self.ran_its_budget() and not self.ended_untrained()

    def ran_its_budget(self) -> bool:
        """Trained its whole budget without diverging, however well (its checkpoints can be continued)."""
        return self.done and not self.diverged and self.full

    def ended_untrained(self) -> bool:
        """Trained its whole budget without diverging but ended no better than predicting each token by its
        frequency (the baseline): it did not train at this LR, though nothing went non-finite or climbed."""
        loss = self.full_loss()
        return self.done and self.baseline is not None and loss is not None and loss >= self.baseline

    def divergence_confirmed(self) -> bool:
        """Diverged on evidence no rule supplied: a non-finite value, or its whole budget seen."""
        return self.diverged and (self.divergence == NON_FINITE or self.full)

    def to_json(self) -> JsonObject:
        return {**asdict(self), "val": [[t, v] for t, v in sorted(self.val.items())], "others": list(self.others),
                "spikes": [asdict(s) for s in self.spikes]}

    @classmethod
    def from_json(cls, data: JsonObject) -> Run:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**{**known, "val": {int(t): float(v) for t, v in data.get("val", [])},
                      "others": tuple(tuple(pair) for pair in data.get("others", [])),
                      "spikes": tuple(Spike(**s) for s in data.get("spikes", []))})


def loss_at_tokens(val: dict[int, float], tokens: float) -> float | None:
    """The val loss at exactly ``tokens``: linear interpolation between the evaluations either side;
    None outside the evaluated range (a trial stopped at a rung has no loss beyond it)."""
    points = sorted((t, v) for t, v in val.items() if math.isfinite(v))
    if not points or tokens < points[0][0] or tokens > points[-1][0]:
        return None
    for (t0, v0), (t1, v1) in zip(points, points[1:], strict=False):
        if t0 <= tokens <= t1:
            return v0 if t1 == t0 else v0 + (v1 - v0) * (tokens - t0) / (t1 - t0)
    return points[-1][1]


def effective_runs(runs: Iterable[Run]) -> list[Run]:
    """The runs that stand (the range test left out): a run continued by another is that other run (its rows
    are the first of the continuation's), and a finished confirmation run replaces the stopped run it
    retrained without early stopping (same LR, seed and other settings)."""
    runs = [r for r in runs if r.stage != "range"]
    continued = {r.continue_from for r in runs if r.continue_from}
    confirmed = {(r.lr, r.seed, r.others) for r in runs if r.stage == "confirm" and r.done and r.outcome != "error"}
    return [r for r in runs if (not r.trial_id or r.trial_id not in continued)
            and (r.stage == "confirm" or (r.lr, r.seed, r.others) not in confirmed)]


def equal_token_losses(runs: Iterable[Run], rungs: Iterable[int]) -> dict[int, dict[float, list[float]]]:
    """For every rung, the val loss at exactly that token count of every run that reached it, by LR
    (a list: one per seed). Diverged runs are left out (they are marked apart)."""
    runs = effective_runs(runs)
    table: dict[int, dict[float, list[float]]] = {}
    for rung in rungs:
        by_lr: dict[float, list[float]] = {}
        for run in runs:
            loss = None if run.diverged else run.loss_at(rung)
            if loss is not None:
                by_lr.setdefault(run.lr, []).append(loss)
        table[int(rung)] = dict(sorted(by_lr.items()))
    return table


# ---------------------------------------------------------------------------------------------
# The best LR, on as many seeds as the LRs it beats


@dataclass(frozen=True)
class LrResult:
    """The full-budget val losses of one LR, by seed (the seeds that trained the whole budget)."""

    lr: float
    losses: tuple[float, ...]
    others: tuple[tuple[str, Any], ...] = ()
    """The other varied parameters these runs share (a grid over more than the LR)."""
    seeds: tuple[int, ...] = ()
    """The seed of each loss, in the same order."""

    @property
    def mean(self) -> float:
        return sum(self.losses) / len(self.losses)

    @property
    def spread(self) -> float | None:
        """Sample standard deviation over seeds (None with one seed)."""
        n = len(self.losses)
        if n < 2:
            return None
        return math.sqrt(sum((v - self.mean) ** 2 for v in self.losses) / (n - 1))

    def to_json(self) -> JsonObject:
        """A row of summary.json's ranking: the LR, the other varied parameters, its seeds, losses and mean."""
        return {"lr": self.lr, **dict(self.others), "seeds": list(self.seeds), "losses": list(self.losses),
                "mean": self.mean}

    def mean_over(self, seeds: set[int]) -> float | None:
        values = [v for v, s in zip(self.losses, self.seeds, strict=True) if s in seeds]
        return sum(values) / len(values) if values else None


def full_budget_ranking(runs: Iterable[Run]) -> list[LrResult]:
    """LRs (with the other varied parameters) by their mean full-budget val loss, lowest first. An LR at
    which any trial diverged is left out (whatever its other seeds did), as are trials that did not
    train their whole budget. A seed trained twice (a refinement re-run) counts once, the first time."""
    runs = effective_runs(runs)
    diverged = {(r.lr, r.others) for r in runs if r.diverged}
    losses: dict[tuple[float, tuple], dict[int, float]] = {}
    for run in runs:
        loss = run.full_loss()
        if loss is not None and (run.lr, run.others) not in diverged:
            losses.setdefault((run.lr, run.others), {}).setdefault(run.seed, loss)
    ranked = [LrResult(lr, tuple(by_seed.values()), others, tuple(by_seed))
              for (lr, others), by_seed in losses.items()]
    return sorted(ranked, key=lambda r: (r.mean, r.lr))


def beats(challenger: LrResult, holder: LrResult) -> bool:
    """The challenger's loss is lower than the holder's on the seeds both have (a one-seed LR is compared
    seed for seed, never one draw against a mean); without a common seed, on their means."""
    common = set(challenger.seeds) & set(holder.seeds)
    if not common:
        return challenger.mean < holder.mean
    return challenger.mean_over(common) < holder.mean_over(common)


def crown(ranking: list[LrResult]) -> tuple[LrResult | None, list[LrResult]]:
    """The best LR and its contenders. Only an LR with as many seeds as any other can be crowned (the
    lowest mean among them); an LR with fewer seeds that beats it seed for seed is a contender, which
    must be given the seeds before the crown is settled."""
    if not ranking:
        return None, []
    most = max(len(r.losses) for r in ranking)
    best = min((r for r in ranking if len(r.losses) == most), key=lambda r: (r.mean, r.lr))
    contenders = [r for r in ranking if len(r.losses) < most and beats(r, best)]
    return best, contenders


def crowned_ranking(ranking: list[LrResult]) -> list[LrResult]:
    """The ranking with the crowned best first (the rest by mean)."""
    best, _ = crown(ranking)
    return [best, *[r for r in ranking if r is not best]] if best is not None else []


def spread_lrs(ranking: list[LrResult]) -> list[LrResult]:
    """The LRs the run-to-run spread is pooled over: those with several seeds within SPREAD_WITHIN of the
    crowned best (all LRs with several seeds when none is that close)."""
    seeded = [r for r in ranking if len(r.losses) > 1]
    best, _ = crown(ranking)
    near = [r for r in seeded if best is not None and max(r.lr / best.lr, best.lr / r.lr) <= SPREAD_WITHIN]
    return near or seeded


def pooled_seed_spread(ranking: list[LrResult]) -> float | None:
    """The run-to-run standard deviation of the full-budget loss near the best LR (spread_lrs), pooled."""
    squares, dof = 0.0, 0
    for result in spread_lrs(ranking):
        squares += (len(result.losses) - 1) * result.spread ** 2
        dof += len(result.losses) - 1
    return math.sqrt(squares / dof) if dof else None


def standard_error(result: LrResult, best: LrResult, sigma: float | None) -> float | None:
    """The standard error of (its mean - the best's mean), from the pooled run-to-run spread."""
    return None if sigma is None else sigma * math.sqrt(1 / len(result.losses) + 1 / len(best.losses))


def clearly_worse(result: LrResult, best: LrResult, sigma: float | None) -> bool:
    """Its mean is more than SIGNIFICANCE_SE standard errors of the difference above the best's
    (with no seed spread measured, any higher loss counts)."""
    error = standard_error(result, best, sigma)
    if error is None:
        return result.mean > best.mean
    return result.mean - best.mean > SIGNIFICANCE_SE * error
