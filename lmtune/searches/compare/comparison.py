"""What a compare search's runs say, Ray-free and file-free: each variant's conclusion at its own best LR
(lmtune.analysis.conclusion), its loss at the reference's best LR, and its difference to the reference with a
verdict at the 2-standard-error level (from the spread over seeds) and, where the seeds cannot tell, how many would.

The verdict's rule: two best mean losses differ where their difference exceeds a threshold of standard errors of a
difference; the threshold is Student's t at the level of 2 SE of a normal (95.4% two-sided, 2.3% a side) for
Welch-Satterthwaite's degrees of freedom of the difference (each side's pooled sd with its own degrees of freedom:
``welch_dof``), not their sum, which overstates them where one side's error dominates. Each best mean's error has
two parts: the noise of its seeds (its variant's pooled run-to-run sd over √seeds) and where its crowned LR landed
(LOCATION_SD sds, whatever the seeds: the search chooses the LR on one seed's losses, so its true loss lies a little
above its variant's optimum, by a different amount in every search: in the simulation below, the true losses at
two identical variants' crowned LRs differed by 0.021 nats sd, at 2 seeds and at 4).

Each best LR is the lowest of noisy means, so it also sits below its true loss (the winner's curse: -0.010 nats for
2 tied LRs at 2 seeds and the quick model's sd). That cancels in a difference only where both sides were chosen
alike, so every variant is crowned from its own search's runs, the same design as the reference's: a later
variant's runs at the reference's best LR are reported (``at_reference``) and measure its seed spread, but are no
candidate for its crown (as one, they gave later variants one more LR to crown from than the reference had, and
biased their differences by -0.01 nats).

LOCATION_SD and the level are calibrated by simulating the whole choose-best-then-compare procedure: the real compare
search crowning each variant from simulated runs at quick_ablations' settings and the quick model's run-to-run sd
(benchmarks/compare_verdicts.py, commit 845be5f). Two variants that are the same were called better / worse in
0.9% / 0.7% of 3000 comparisons at 2 seeds (1.3% / 0.5% where the later variants' curves are half as curved, so
that more near-tied LRs compete for their crown and their best still sits 0.006 nats low; 0.7% / 0.7% with ``start:
reference``), and in 1.5% / 1.2% at 4 seeds (flatter: 1.8% / 0.2%). LOCATION_SD is the smallest of 0, 0.3, 0.4,
0.5 and 0.7 that kept every one within 2.5% a side: at 0.4 the flatter 4-seed scenario reached 3.2%, without the
term 6.5%. (The rule before, a later variant crowned with its runs at the reference's best LR and t for the sum of
the dofs: a mean difference of -0.010 nats and 3.7% "better" at 2 seeds, 6.8% at 4.) The price is power: a true
0.05-nat difference was called in 12-13% of comparisons at 2 seeds and 31% at 4; 0.02 nats in 3-5%.
The truths' comparison (benchmarks/compare_truth.py) uses the same ``difference``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from lmtune.analysis.conclusion import Conclusion, conclude
from lmtune.analysis.locate import locate_best_lr, t_quantile
from lmtune.analysis.runs import (
    SAME_LR,
    SPREAD_WITHIN,
    Budget,
    LrResult,
    Run,
    effective_runs,
    full_budget_ranking,
    same_lr,
)
from lmtune.files import JsonObject
from lmtune.searches.compare.batch import BATCH_ONLY, BatchPoint, BatchScaling, fit_batches
from lmtune.searches.compare.search import AT_REFERENCE
from lmtune.searches.compare.settings import CompareSettings, Variant
from lmtune.searches.trial_order import RANGE_STAGE

# Differences count at the level of this many standard errors of a normal (the basin's SIGNIFICANCE_SE), made
# Student's t for Welch's degrees of freedom: the level the simulation of the whole procedure calibrated (above).
SIGNIFICANCE_SE = 2.0
# Where a crowned LR landed costs its mean this many run-to-run sds more error, whatever its seeds: the search
# chooses it on one seed's losses, so it lies a little off its variant's optimum, by a different amount in each
# search (calibrated by simulating the whole procedure: module docstring).
LOCATION_SD = 0.5
MAX_SEEDS_TO_RESOLVE = 1000
BETTER, WORSE, UNRESOLVED, NO_SPREAD = "better", "worse", "not distinguishable", "no seed spread measured"


@dataclass(frozen=True)
class AtReference:
    """A variant's runs at the reference's best LR: their losses (trained through) and how many diverged."""

    lr: float
    losses: tuple[float, ...]
    diverged: int

    @property
    def mean(self) -> float | None:
        return sum(self.losses) / len(self.losses) if self.losses else None

    def to_json(self) -> JsonObject:
        return {"lr": self.lr, "losses": list(self.losses), "diverged": self.diverged, "mean": self.mean}


@dataclass(frozen=True)
class Difference:
    """A variant's best mean loss minus the reference's, its standard error, and what it says."""

    value: float
    se: float | None
    verdict: str
    """BETTER, WORSE, UNRESOLVED or NO_SPREAD."""
    seeds_to_resolve: int | None
    """Seeds per variant at which the threshold would fall below the difference, where it is UNRESOLVED."""
    threshold: float | None = None
    """The size the difference had to exceed: Student's t at the 2-SE level for ``dof``, x se."""
    dof: float | None = None
    """Welch-Satterthwaite's degrees of freedom for the difference (welch_dof; None: no seed spread)."""

    def to_json(self) -> JsonObject:
        return {"value": self.value, "se": self.se, "threshold": self.threshold, "dof": self.dof,
                "verdict": self.verdict, "seeds_to_resolve": self.seeds_to_resolve}


@dataclass(frozen=True)
class Spread:
    """A run-to-run sd pooled over the LRs with several seeds near a best LR, and its degrees of freedom."""

    sd: float
    dof: int


@dataclass(frozen=True)
class VariantResult:
    """One variant as the comparison reads it."""

    variant: Variant
    budget: Budget
    conclusion: Conclusion
    runs: int
    tokens: int
    """Tokens its runs trained (its search's cost)."""
    at_reference: AtReference | None
    """Its runs at the reference's best LR (None: the reference itself, or none trained there)."""
    difference: Difference | None
    """Against the reference (None: the reference itself, or a side without a best LR)."""

    @property
    def name(self) -> str:
        return self.variant.name

    def optimum_moved(self, reference: VariantResult) -> bool | None:
        """Whether this variant's basin and the ``reference``'s share no tried LR span (None: either has none). Both
        basins, not one best LR against the other's basin: each best is only known to its basin (the first rule,
        the reference's best outside the variant's basin, called a move the truths did not show: benchmarks/README.md,
        "Variants each at its own best LR")."""
        mine, theirs = self.conclusion.landscape.basin, reference.conclusion.landscape.basin
        if mine is None or theirs is None:
            return None
        return mine.lrs[-1] * SAME_LR < theirs.lrs[0] or theirs.lrs[-1] * SAME_LR < mine.lrs[0]

    def to_json(self) -> JsonObject:
        best = self.conclusion.best
        return {"name": self.name, "settings": self.variant.given, "steps": self.budget.steps,
                "batch_size": self.budget.batch_size, "runs": self.runs, "tokens": self.tokens,
                "best_lr": self.conclusion.best_lr, "best_lr_mean_loss": best.mean if best else None,
                "best_lr_seeds": list(best.seeds) if best else [], "seed_spread": self.conclusion.seed_spread,
                "basin": self.conclusion.landscape.basin.to_json() if self.conclusion.landscape.basin else None,
                "failing_lr_low": self.conclusion.edge.stable_lr, "failing_lr": self.conclusion.edge.diverged_lr,
                "divergence_lr": self.conclusion.divergence.diverged_lr,
                "at_reference": self.at_reference.to_json() if self.at_reference else None,
                "difference": self.difference.to_json() if self.difference else None}


@dataclass(frozen=True)
class CompareResult:
    """Every variant, the reference first, and its batch-size variants read together (lmtune.searches.compare.batch;
    None: fewer than two batch sizes, or not read yet)."""

    variants: tuple[VariantResult, ...]
    batch: BatchScaling | None = None

    @property
    def reference(self) -> VariantResult:
        return self.variants[0]

    def to_json(self) -> JsonObject:
        return {"compare": [{**v.to_json(), "optimum_moved": None if i == 0 else v.optimum_moved(self.reference)}
                            for i, v in enumerate(self.variants)],
                "compare_batch": self.batch.to_json() if self.batch else None}


def compare_variants(runs_by_variant: dict[str, Sequence[Run]], settings: CompareSettings,
                     budget: Budget) -> CompareResult:
    """Each variant's conclusion from its own search's runs (``runs_by_variant``: by name; the range test's left
    out), at its own budget (the reference's ``budget`` as the variant has it), against the reference's. A later
    variant's runs at the reference's best LR (stage AT_REFERENCE) are its ``at_reference`` and add to the seed
    spread its difference is judged with, but are no candidate for its crown: every variant is crowned from the
    same search design as the reference, so the same number of candidate LRs (module docstring)."""
    concluded = []
    for variant in settings.variants:
        runs = [r for r in runs_by_variant.get(variant.name, ()) if r.stage != RANGE_STAGE]
        vbudget = variant.budget(budget)
        conclusion = conclude([r for r in runs if r.stage != AT_REFERENCE], vbudget)
        concluded.append((variant, vbudget, runs, conclusion))
    _, _, _, reference = concluded[0]
    results = [VariantResult(variant, vbudget, conclusion, len(runs), sum(r.spent_tokens for r in runs),
                             None if i == 0 else at_lr(runs, reference.best_lr),
                             None if i == 0 else difference(conclusion, reference,
                                                            pooled_spread(full_budget_ranking(runs), conclusion.best)))
               for i, (variant, vbudget, runs, conclusion) in enumerate(concluded)]
    return CompareResult(tuple(results))


def with_batches(result: CompareResult, speeds: Mapping[str, float | None]) -> CompareResult:
    """``result`` with its batch-size variants (the reference and every variant changing only its batch) read
    together (lmtune.searches.compare.batch), where they hold two or more batch sizes. ``speeds``: each variant's
    tokens per second."""
    batch_variants = [v for v in result.variants if set(v.variant.given) <= BATCH_ONLY]
    if len({v.budget.batch_size for v in batch_variants}) < 2:
        return result
    return replace(result, batch=fit_batches([_batch_point(v, speeds.get(v.name)) for v in batch_variants]))


def _batch_point(v: VariantResult, tokens_per_s: float | None) -> BatchPoint:
    c = v.conclusion
    best = c.best
    return BatchPoint(v.name, v.budget.batch_size, locate_best_lr(c.ranking, v.budget.full_tokens, c.edge),
                      best.lr if best else None, best.mean if best else None,
                      best.spread if best and len(best.losses) > 1 else None, len(best.losses) if best else 0,
                      tokens_per_s)


def at_lr(runs: Iterable[Run], lr: float | None) -> AtReference | None:
    """The runs at ``lr`` (None: no LR, or no run there) that ended: their losses at their full budget and how
    many diverged."""
    if lr is None:
        return None
    there = [r for r in effective_runs(runs) if same_lr(r.lr, lr) and r.done]
    if not there:
        return None
    losses = tuple(loss for r in there if not r.diverged and (loss := r.full_loss()) is not None)
    return AtReference(lr, losses, sum(r.diverged for r in there))


def pooled_spread(ranking: Sequence[LrResult], best: LrResult | None) -> Spread | None:
    """The run-to-run sd pooled over the LRs of ``ranking`` with several seeds within SPREAD_WITHIN of ``best``
    (all with several seeds when none is that close), as lmtune.analysis.runs.pooled_seed_spread pools a
    conclusion's (None: no best, or no LR with several seeds)."""
    seeded = [r for r in ranking if len(r.losses) > 1]
    near = [r for r in seeded if best is not None and max(r.lr / best.lr, best.lr / r.lr) <= SPREAD_WITHIN]
    pool = near or seeded
    dof = sum(len(r.losses) - 1 for r in pool)
    if best is None or not dof:
        return None
    return Spread(math.sqrt(sum((len(r.losses) - 1) * r.spread ** 2 for r in pool) / dof), dof)


def welch_dof(a: float, b: float, dof_a: float, dof_b: float) -> float:
    """Welch-Satterthwaite's degrees of freedom of a difference of two means whose squared errors are ``a`` and
    ``b`` (sd^2 / seeds), each sd pooled with ``dof_a`` / ``dof_b`` degrees of freedom: (a + b)^2 / (a^2 / dof_a +
    b^2 / dof_b). Between the smaller dof and their sum; the sum only where a / dof_a = b / dof_b."""
    if a + b == 0:
        return dof_a + dof_b  # (no spread on either side: any threshold is 0)
    return (a + b) ** 2 / (a ** 2 / dof_a + b ** 2 / dof_b)


def _squared_error(spread: Spread, seeds: int) -> float:
    """The squared standard error of a crowned best LR's mean loss as its variant's best: the noise of its seeds (sd^2 /
    seeds) and where the crowned LR landed (LOCATION_SD sds, whatever the seeds)."""
    return spread.sd ** 2 * (1 / seeds + LOCATION_SD ** 2)


def difference(variant: Conclusion, reference: Conclusion, variant_spread: Spread | None = None) -> Difference | None:
    """The variant's best mean loss against the reference's, judged at Student's t for Welch-Satterthwaite's
    degrees of freedom at the 2-SE level. ``variant_spread``: the variant's seed spread where more runs than its
    conclusion's measure it (its runs at the reference's best LR); by default its conclusion's."""
    a, b = variant.best, reference.best
    if a is None or b is None:
        return None
    value = a.mean - b.mean
    sa = variant_spread or pooled_spread(variant.ranking, a)
    sb = pooled_spread(reference.ranking, b)
    if sa is None or sb is None:
        return Difference(value, None, NO_SPREAD, None)
    ea, eb = _squared_error(sa, len(a.losses)), _squared_error(sb, len(b.losses))
    dof = welch_dof(ea, eb, sa.dof, sb.dof)
    se = math.sqrt(ea + eb)
    threshold = t_quantile(dof, SIGNIFICANCE_SE) * se
    if abs(value) > threshold:
        return Difference(value, se, BETTER if value < 0 else WORSE, None, threshold, dof)
    return Difference(value, se, UNRESOLVED, _seeds_to_resolve(value, sa, sb, len(a.losses), len(b.losses)),
                      threshold, dof)


def _seeds_to_resolve(value: float, sa: Spread, sb: Spread, seeds_a: int, seeds_b: int) -> int | None:
    """Seeds n per variant at each best LR at which a difference this large would pass the threshold: each seed
    added a degree of freedom to its side's spread, the spreads as measured, the threshold the same rule's (Welch's
    degrees of freedom; None: none, or over MAX_SEEDS_TO_RESOLVE). The threshold falls as n grows (its error and its
    t both do), so the first such n is found by bisection."""

    def resolves(n: int) -> bool:
        ea, eb = _squared_error(sa, n), _squared_error(sb, n)
        dof = welch_dof(ea, eb, sa.dof + n - seeds_a, sb.dof + n - seeds_b)
        return t_quantile(dof, SIGNIFICANCE_SE) * math.sqrt(ea + eb) < abs(value)

    low, high = max(seeds_a, seeds_b) + 1, MAX_SEEDS_TO_RESOLVE
    if not value or low > high or not resolves(high):
        return None
    while low < high:  # resolves(high) holds throughout
        middle = (low + high) // 2
        low, high = (low, middle) if resolves(middle) else (middle + 1, high)
    return low
