"""What a sweep's runs at one budget conclude, Ray-free and typed: the best LR crowned on as many seeds as the
LRs it beats and its contenders, where it may lie, the top of its useful range, the failing LR's bracket and how it
was established, the divergence LR's bracket, the divergence / best ratio as a range, the landscape's regions and
the ranking. Computed once by ``conclude``; the edge searcher's state, the
report (summary.json, lr_sweep_analysis.md, the figures) and the CLIs' last lines read this one value.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

from lmtune.analysis.bracket import (
    Bracket,
    EdgeConfirmation,
    SeedDependence,
    bracket,
    edge_confirmation,
    seed_dependent_lrs,
)
from lmtune.analysis.landscape import (
    Gap,
    Landscape,
    LrRegion,
    Region,
    best_lr_interval,
    edge_ratio_range,
    landscape,
    lr_regions,
)
from lmtune.analysis.named_lrs import UsefulRange, divergence_bracket, useful_range
from lmtune.analysis.runs import (
    Budget,
    LrResult,
    Run,
    crown,
    crowned_ranking,
    effective_runs,
    full_budget_ranking,
    pooled_seed_spread,
)
from lmtune.files import JsonObject


@dataclass(frozen=True)
class NothingTrained:
    """No run beat the data's unigram baseline: predicting each token by its frequency did as well as every run, so
    nothing trained and no best LR is crowned."""

    lr: float
    """The LR of the lowest full-budget loss."""
    loss: float
    """That loss: the best any run that ran its whole budget ended at (nats)."""
    baseline: float
    """The data's unigram baseline it is no better than (nats)."""
    lrs: tuple[float, ...]
    """The LRs whose runs ran their whole budget without diverging, ascending (each ended no better than it)."""


def nothing_trained(runs: list[Run], ranking: list[LrResult]) -> NothingTrained | None:
    """Runs ran their whole budget, the unigram baseline is known, and none trained through (ended below it): the
    lowest of their losses against that baseline. None: a run trained, no baseline is known, or none ran its budget."""
    baselines = [r.baseline for r in runs if r.baseline is not None]
    if not ranking or not baselines or any(r.trained_through() for r in runs):
        return None
    lr, loss = min(((r.lr, loss) for r in ranking for loss in r.losses), key=lambda pair: (pair[1], pair[0]))
    return NothingTrained(lr, loss, min(baselines), tuple(sorted({r.lr for r in ranking})))


@dataclass(frozen=True)
class Conclusion:
    """The best LR, the edge and the landscape at one budget (every loss compared at its full token count)."""

    best: LrResult | None
    """The crowned best LR with its full-budget losses by seed (None: no LR trained its whole budget)."""
    contenders: tuple[LrResult, ...]
    """LRs with fewer seeds that beat the best on the seeds they share (more seeds would settle the crown)."""
    seed_spread: float | None
    """The run-to-run standard deviation near the best LR, pooled over seeds (None: no LR has several)."""
    best_lr_interval: Gap
    """The best LR lies strictly between these: the nearest LRs clearly worse (None: none on that side)."""
    edge: Bracket
    """Where training fails: the failing LR's bracket (a run diverged, or ended no better than the unigram
    baseline, above an LR that trained)."""
    divergence: Bracket
    """Where runs diverge (non-finite, or above their initial loss for good): the divergence LR's bracket."""
    useful: UsefulRange | None
    """How far above the best LR the loss stays as good, and what 2x and 4x cost (None: no best LR)."""
    seed_dependent: tuple[SeedDependence, ...]
    """LRs where one seed trained through and another diverged."""
    edge_confirmation: EdgeConfirmation | None
    """How the bracket's ends were established (None: no LR diverged)."""
    edge_ratio_range: Gap
    """The divergence LR / best LR ratio as a range carrying both uncertainties (None: unbounded on that side)."""
    landscape: Landscape
    """The basin, degraded and failed regions."""
    ranking: tuple[LrResult, ...]
    """Every LR that trained its whole budget without diverging, the crowned best first, the rest by mean."""
    regions: tuple[LrRegion, ...] = ()
    """The region every LR tried stands in (lmtune.analysis.landscape.lr_regions), by LR: what the report's text,
    its table and its figure call each LR."""
    nothing_trained: NothingTrained | None = None
    """No run beat the data's unigram baseline, so no best LR is crowned (None: a run trained, or no baseline known;
    not in summary.json, whose ranking and unigram_loss say it)."""

    def lrs_in(self, region: Region) -> tuple[float, ...]:
        """The LRs tried in ``region``, ascending."""
        return tuple(sorted({r.lr for r in self.regions if r.region == region}))

    @property
    def best_lr(self) -> float | None:
        return self.best.lr if self.best else None

    @property
    def edge_ratio(self) -> float | None:
        """The divergence LR (the smallest LR at which a run diverged) / the best LR, as a point value: the
        practitioners' rubric's ratio."""
        return self.divergence.diverged_lr / self.best.lr if self.best and self.divergence.diverged_lr else None

    def to_json(self) -> JsonObject:
        """summary.json's (and the edge search state's) keys for it."""
        best = self.best
        return {
            "best_lr": self.best_lr,
            "best_lr_seed_losses": list(best.losses) if best else [],
            "best_lr_seeds": list(best.seeds) if best else [],
            "best_lr_mean_loss": best.mean if best else None,
            "best_lr_spread": best.spread if best else None,
            "best_lr_contenders": [{"lr": r.lr, "seeds": list(r.seeds), "losses": list(r.losses)}
                                   for r in self.contenders],
            "seed_spread": self.seed_spread,
            "best_lr_interval": list(self.best_lr_interval),
            "failing_lr_low": self.edge.stable_lr,
            "failing_lr": self.edge.diverged_lr,
            "bracket_ratio": self.edge.ratio,
            "divergence_lr_low": self.divergence.stable_lr,
            "divergence_lr": self.divergence.diverged_lr,
            **(self.useful.to_json() if self.useful else {"useful_top_lr": None}),
            "stable_above_divergence": list(self.edge.stable_above),
            "seed_dependent": [cast(JsonObject, s.to_json()) for s in self.seed_dependent],
            "edge_confirmation": self.edge_confirmation.to_json() if self.edge_confirmation else None,
            "edge_ratio": self.edge_ratio,
            "edge_ratio_range": list(self.edge_ratio_range),
            **self.landscape.to_json(),
            "ranking": [r.to_json() for r in self.ranking],
            "lr_regions": [r.to_json() for r in self.regions],
        }


def conclude(runs: Iterable[Run], budget: Budget, crown_untrained: bool = True) -> Conclusion:
    """The best LR (crowned on as many seeds as it beats; none, with ``crown_untrained`` False, where no run beat
    the unigram baseline), where it may lie, the bracket (at or above the best LR) and how it was established, the
    ratio, and the landscape's regions. (``budget``: the runs' budget, for the caller's
    reading; every comparison here is at each run's own full budget.) ``crown_untrained``: where no run beat the
    unigram baseline, crown the best of them all the same (a search deciding what to train next, whose decisions must
    not move); False (the sweep's answer: lmtune.findings.summary) names none and says nothing trained."""
    runs = effective_runs(runs)
    ranking = full_budget_ranking(runs)
    untrained = None if crown_untrained else nothing_trained(runs, ranking)
    candidates = [] if untrained else ranking  # where nothing trained, no LR is a candidate for the crown
    best, contenders = crown(candidates)
    # The failing and divergence LRs lie at or above the best (a run that failed below it is set aside)
    floor = best.lr if best is not None else None
    edge, divergence = bracket(runs, floor), divergence_bracket(runs, floor)
    interval = best_lr_interval(candidates, edge)
    sigma = pooled_seed_spread(candidates)
    regions = landscape(candidates, edge)
    return Conclusion(best, tuple(contenders), sigma, interval, edge, divergence,
                      useful_range(candidates, best, sigma, edge), tuple(seed_dependent_lrs(runs)),
                      edge_confirmation(runs, edge) if edge.diverged_lr is not None else None,
                      edge_ratio_range(divergence, interval), regions,
                      tuple(crowned_ranking(ranking)) if best is not None else tuple(ranking),
                      lr_regions(runs, ranking, regions), untrained)
