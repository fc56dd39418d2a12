"""Where training fails, Ray-free: the bracket between the largest LR proven to train through its budget and
the smallest LR above it at which a run failed, the LRs whose seeds disagree about it, and how each of its ends was
established (by training, or only by the stopper's rule).

A run fails when it diverges (non-finite, or above its initial loss for good: lmtune.training.divergence) or when,
above an LR that trained, it trains its whole budget and ends no better than the data's unigram baseline
(Run.ended_untrained): predicting each token by its frequency would have done as well, so it did not train there.
Below every LR that trained, such a run is only too slow (an LR too small), not the edge; and a run that diverged
there broke for another reason than a large LR (its numerics, its seed, its data): the bracket sets it aside
(``failed_below``) rather than place the edge below LRs that train. The edge searcher bisects and confirms from these
while the sweep runs; the report reads them afterwards (lmtune.analysis.conclusion).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from lmtune.analysis.runs import Run, effective_runs
from lmtune.files import JsonObject
from lmtune.training.divergence import NON_FINITE

THROUGH = "trained its whole budget without diverging, ending below the data's unigram baseline"


@dataclass(frozen=True)
class Bracket:
    """Where training breaks: between the largest LR proven to train through its budget and the smallest
    LR at which a run diverged."""

    stable_lr: float | None
    """The largest LR below diverged_lr at which a run trained through its budget (Run.trained_through)."""
    diverged_lr: float | None
    """The smallest LR at which a run failed (diverged, or above an LR that trained, ended untrained)."""
    stable_above: tuple[float, ...] = ()
    """Stable LRs above diverged_lr (failure is not monotone in LR there: seed or chance)."""
    failed_below: tuple[float, ...] = ()
    """LRs at which a run failed below the bracket's floor (where no smaller LR trained through, or below the best
    LR): set aside, not the edge (not in summary.json: the trial table has their runs)."""

    @property
    def ratio(self) -> float | None:
        if self.stable_lr is None or self.diverged_lr is None:
            return None
        return self.diverged_lr / self.stable_lr

    def resolved(self, tolerance: float) -> bool:
        return self.ratio is not None and self.ratio <= tolerance


def failed_runs(runs: Iterable[Run]) -> list[Run]:
    """The runs that failed (of effective runs): diverged, or ended untrained at an LR above one that trained
    through."""
    runs = list(runs)
    lowest = min((r.lr for r in runs if r.trained_through()), default=None)
    return [r for r in runs if r.diverged or (lowest is not None and r.lr > lowest and r.ended_untrained())]


def bracket(runs: Iterable[Run], floor: float | None = None) -> Bracket:
    """The failing LR's bracket: the smallest LR, at or above ``floor``, at which a run failed, and the largest LR
    below it that trained through. ``floor``: the lowest LR that trained through, or ``floor`` where that is higher
    (the report gives the best LR); failures below it are ``failed_below``, not the edge."""
    runs = effective_runs(runs)
    through = {r.lr for r in runs if r.trained_through()}
    floor = bracket_floor(floor, min(through, default=None))
    failed = {r.lr for r in failed_runs(runs)}
    set_aside = tuple(sorted(lr for lr in failed if floor is not None and lr < floor))
    diverged = sorted(failed - set(set_aside))
    if not diverged:
        return Bracket(max(through) if through else None, None, failed_below=set_aside)
    edge = diverged[0]
    stable = through - set(diverged)
    below = [lr for lr in stable if lr < edge]
    return Bracket(max(below) if below else None, edge, tuple(sorted(lr for lr in stable if lr > edge)), set_aside)


def bracket_floor(given: float | None, lowest_through: float | None) -> float | None:
    """The lowest LR a bracket's failed end may lie at: the higher of ``given`` and the lowest LR that trained
    through (None: neither; then every failure counts)."""
    known = [lr for lr in (given, lowest_through) if lr is not None]
    return max(known) if known else None


@dataclass(frozen=True)
class SeedDependence:
    """An LR where one seed trained through its budget and another diverged: the edge moves with the seed."""

    lr: float
    """The LR both kinds of seed were trained at."""
    seeds_through: tuple[int, ...]
    """The seeds that trained the whole budget without diverging."""
    seeds_diverged: tuple[int, ...]
    """The seeds that failed (diverged, or ended untrained)."""

    def to_json(self) -> dict[str, float | list[int]]:
        return {"lr": self.lr, "seeds_through": list(self.seeds_through), "seeds_diverged": list(self.seeds_diverged)}


def seed_dependent_lrs(runs: Iterable[Run]) -> list[SeedDependence]:
    """LRs where one seed trained through its budget and another diverged: the edge moves with the seed there."""
    by_lr: dict[float, tuple[list[int], list[int]]] = {}
    runs = effective_runs(runs)
    failed = {id(r) for r in failed_runs(runs)}
    for run in runs:
        if id(run) in failed or run.trained_through():
            through, diverged = by_lr.setdefault(run.lr, ([], []))
            (diverged if id(run) in failed else through).append(run.seed)
    return [SeedDependence(lr, tuple(sorted(through)), tuple(sorted(diverged)))
            for lr, (through, diverged) in sorted(by_lr.items()) if through and diverged]


def bisect_lrs(edge: Bracket, points: int) -> list[float]:
    """``points`` LRs cutting [stable_lr, diverged_lr] into equal parts in log-LR."""
    lo, hi = edge.stable_lr, edge.diverged_lr
    return [lo * (hi / lo) ** (k / (points + 1)) for k in range(1, points + 1)]


def edge_runs(runs: Iterable[Run], edge: Bracket) -> tuple[list[Run], list[Run]]:
    """The runs at the bracket's two ends: (stable end's, failed end's, each of them whatever its outcome)."""
    runs = effective_runs(runs)
    return ([r for r in runs if r.lr == edge.stable_lr], [r for r in runs if r.lr == edge.diverged_lr])


@dataclass(frozen=True)
class StableEnd:
    """A run at the bracket's stable end (at least one of them trained through; the others may not have)."""

    seed: int
    """The run's seed."""
    tokens: int
    """Tokens it trained (its whole budget where it trained through)."""
    how: str = THROUGH
    """What the run did, in words (THROUGH, or how it ended short of that)."""


@dataclass(frozen=True)
class DivergedEnd:
    """A diverged run at the bracket's diverged end."""

    seed: int
    """The run's seed."""
    tokens: int
    """Tokens it trained before it ended."""
    decided_at_tokens: int | None
    """Where its divergence was decided."""
    how: str
    """How its divergence was established, in words."""
    confirmed: bool
    """Established by training (a non-finite value, or its whole budget seen), not only by the stopper's rule."""
    stage: str
    """The search stage that trained it."""
    untrained: bool = False
    """It did not diverge: it ended no better than the data's unigram baseline (``how`` says so in words)."""


@dataclass(frozen=True)
class EdgeConfirmation:
    """How each end of the bracket was established."""

    stable_end: tuple[StableEnd, ...]
    """The runs at the stable end (each trained its whole budget without diverging)."""
    diverged_end: tuple[DivergedEnd, ...]
    """The diverged runs at the diverged end."""
    decided_at_tokens: int | None
    """The earliest token count at which a diverged end's run was judged."""
    confirmed: bool
    """Both ends have runs and every diverged end's run was confirmed by training."""

    def to_json(self) -> JsonObject:
        return {"stable_end": [{"seed": e.seed, "tokens": e.tokens, "how": e.how} for e in self.stable_end],
                "diverged_end": [{"seed": e.seed, "tokens": e.tokens, "decided_at_tokens": e.decided_at_tokens,
                                  "how": e.how, "confirmed": e.confirmed, "stage": e.stage} for e in self.diverged_end],
                "decided_at_tokens": self.decided_at_tokens, "confirmed": self.confirmed}


def edge_confirmation(runs: Iterable[Run], edge: Bracket) -> EdgeConfirmation:
    """How each end of the bracket was established: by training (the whole budget seen, or a non-finite
    value), or only by the stopper's rule (then it still needs a confirmation run)."""
    stable, at_edge = edge_runs(runs, edge)
    failing = {id(r) for r in failed_runs(effective_runs(runs))}
    failed = [r for r in at_edge if id(r) in failing]
    decided = min((_decided_at(r) for r in failed if _decided_at(r) is not None), default=None)
    return EdgeConfirmation(
        tuple(StableEnd(r.seed, r.tokens, _how_stable(r)) for r in stable),
        tuple(DivergedEnd(r.seed, r.tokens, _decided_at(r), _how_diverged(r), _confirmed(r), r.stage, not r.diverged)
              for r in failed),
        decided, bool(stable) and bool(failed) and all(_confirmed(r) for r in failed))


def _decided_at(run: Run) -> int | None:
    """Where a failed run's failure was decided: its divergence, or (ended untrained) its budget's end."""
    return run.diverged_tokens if run.diverged else run.tokens


def _confirmed(run: Run) -> bool:
    """A failure established by training: a confirmed divergence, or a whole budget that ended untrained."""
    return run.divergence_confirmed() if run.diverged else run.ended_untrained()


def _how_stable(run: Run) -> str:
    """What a run at the stable end did: only a run that trained through proves the LR trains through."""
    if run.trained_through():
        return THROUGH
    if run.ended_untrained():
        return _untrained(run)
    if run.diverged:
        return f"diverged at {run.tokens:,} tokens"
    if run.outcome is None:
        return f"still training ({run.tokens:,} tokens so far)"
    ended = {"stopped_early": "stopped early (cut by the scheduler)", "completed": "completed short of its budget"}
    return (f"{ended.get(run.outcome, f'ended ({run.outcome})')} at {run.tokens:,} of {run.budget_tokens:,} tokens: "
            "not a proof that it trains through")


def _untrained(run: Run) -> str:
    return (f"trained its whole budget without diverging but ended at {run.full_loss():.3f} nats, no better than "
            f"the data's unigram baseline ({run.baseline:.3f}: each token predicted by its frequency)")


def _how_diverged(run: Run) -> str:
    if not run.diverged:
        return _untrained(run)
    if run.divergence == NON_FINITE:
        return "its loss went non-finite (no run comes back from that)"
    if run.full:
        return "trained its whole budget without early stopping and did not recover"
    return "the stopper ended it (above its initial loss for the whole recovery window); not yet retrained"


def needs_confirmation(runs: Iterable[Run], edge: Bracket) -> list[Run]:
    """The diverged end's runs that only the stopper's rule judged: to be retrained without early stop."""
    _, diverged = edge_runs(runs, edge)
    return [r for r in diverged if r.diverged and not r.divergence_confirmed()]
