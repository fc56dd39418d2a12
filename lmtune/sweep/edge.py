"""The edge search (``search: edge``): which LR is best for the budget, how the loss degrades above it,
and where training fails, decided step by step from what the sweep has trained. Ray-free: the Tune
Searcher that drives it is lmtune.sweep.edge_searcher; what the runs show is lmtune.sweep.runs.

The stages, in one sweep:

1. **range**: the LR range test (lmtune.training.lr_range): one short run with a rising LR gives the
   steepest-descent LR and the blow-up LR.
2. **coarse**: log-spaced LRs from well below the steepest descent to the blow-up, under ASHA, the most
   promising first (asynchronous ASHA can only cut against results already in).
3. **landscape**: every coarse LR above the best that ASHA cut is continued from its last checkpoint to
   the full budget (the cheapest full-budget points between the best LR and the edge): the loss above
   the best, and the first bracket of the edge.
4. **bisect**: full-budget probes, ``edge_seeds`` seeds each, between the largest LR whose every run
   trained through its budget and the smallest one at which a run diverged, until their ratio is at most
   ``tolerance``. Divergence is failure to recover (lmtune.training.divergence); the stopper may end a
   probe early only on that evidence.
5. **confirm**: the bracket's stable end gets the seeds it lacks (a landscape LR has one), and a diverged
   end that only the stopper's rule judged is trained again without any early stop; a seed that fails at
   the stable end moves the bracket down, a diverged end that recovers moves it up, and bisection goes on.
6. **refine**: LRs within ``refine_factor`` of the best full-budget LR and its coarse neighbours, to the
   full budget (a cut coarse LR is continued, not restarted); and every LR below it that ASHA cut within
   ``rerun_margin`` of its rung's leader.
7. **seeds**: the best ``seed_lrs`` LRs again with further seeds; then any LR that beats the crowned best
   seed for seed gets the same seeds before the crown is settled (lmtune.sweep.runs.crown).

Landscape, bisection, confirmation and refinement run side by side; the search ends when every stage is
done, the crown is settled and the bracket is resolved and confirmed (or cannot be).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from lmtune.errors import LmtuneError
from lmtune.sweep.runs import (
    SAME_LR,
    Budget,
    LrResult,
    Run,
    bisect_lrs,
    bracket,
    conclude,
    crown,
    crowned_ranking,
    effective_runs,
    format_tokens,
    full_budget_ranking,
    needs_confirmation,
)
from lmtune.training.divergence import BY_RULE, WHOLE_RUN

STAGES = ("range", "coarse", "landscape", "bisect", "confirm", "refine", "seeds")
ASHA_STAGES = frozenset({"coarse"})  # the only stage ASHA may cut
NO_EARLY_STOP_STAGES = frozenset({"confirm"})  # the stopper's divergence rule leaves these alone
WAIT, FINISHED = "wait", "finished"
# Bisection rounds before the search gives up on a bracket that keeps moving (noise near the edge).
MAX_BISECT_ROUNDS = 12
# The reason recorded for a trial that was planned again after a driver restart (EdgeSearch.requeue).
INTERRUPTED = ("interrupted: the sweep's driver stopped while it ran, before Ray recorded the trial; the search "
               "ran its plan again in another trial")
# Keys of the edge: section that earlier versions had (a space naming one is told what replaced it).
RETIRED_KEYS = {"horizon": "probes now train the full budget: divergence is failure to recover within the "
                           "stopper's recovery_window; remove it"}


@dataclass(frozen=True)
class EdgeSettings:
    """The ``edge:`` section of a space with ``search: edge``."""

    range_min_lr: float = 1e-5
    """The range test's first LR."""
    range_max_lr: float = 10.0
    """The range test's last LR, if the loss has not blown up before."""
    range_steps: int = 100
    """Steps of the range test (the LR is multiplied by the same factor at each)."""
    range_blowup_factor: float = 1.5
    """The range test stops when its smoothed loss exceeds this x its lowest value."""
    coarse_below: float = 10.0
    """The coarse grid starts this factor below the range test's steepest-descent LR."""
    coarse_above: float = 1.0
    """... and ends at the first LR at or above the blow-up LR x this."""
    coarse_ratio: float = 3.16
    """Neighbouring coarse LRs differ by this factor (3.16: two per decade)."""
    tolerance: float = 1.25
    """Bisection ends when smallest diverged LR / largest LR trained through <= this."""
    edge_seeds: int = 2
    """Seeds each bisection probe trains, and that must all train through at the bracket's stable end: the
    edge is where any seed fails (it moves from seed to seed; one seed would hide that)."""
    bisect_points: int = 1
    """Probes per bisection round (1: halve the bracket in log-LR; k: cut it into k + 1 parts)."""
    refine_factor: float = 2.0
    """Refinement LRs lie within best / refine_factor .. best x refine_factor."""
    refine_points: int = 4
    """Refinement LRs (log-spaced, half below and half above the best)."""
    rerun_margin: float = 0.05
    """An LR below the best that ASHA cut is re-run to the full budget when its val loss at its last
    rung was within this fraction of that rung's best."""
    seeds: int = 3
    """Runs per LR for the best LRs, the first seed included."""
    seed_lrs: int = 2
    """How many of the best LRs get the further seeds."""
    seed_rounds: int = 3
    """Further rounds of seeds for LRs that beat the crowned best seed for seed (each round: the seeds
    the best has, for every such LR)."""
    max_extensions: int = 3
    """When no LR diverged (or every LR did), probes this many times further out, coarse_ratio^2 apart."""

    def validate(self, where: str = "edge") -> None:
        """Raise LmtuneError (one line naming the key) for settings no search could use."""
        checks = [
            ("range_min_lr", self.range_min_lr > 0, "must be > 0, e.g. 1e-5"),
            ("range_max_lr", self.range_max_lr > self.range_min_lr,
             f"must be above range_min_lr ({self.range_min_lr:g})"),
            ("range_steps", self.range_steps >= 10, "must be at least 10"),
            ("range_blowup_factor", self.range_blowup_factor > 1, "must be above 1, e.g. 1.5"),
            ("coarse_below", self.coarse_below >= 1, "must be >= 1 (a factor below the steepest descent)"),
            ("coarse_above", self.coarse_above > 0, "must be > 0 (a factor on the blow-up LR)"),
            ("coarse_ratio", self.coarse_ratio > 1, "must be above 1, e.g. 3.16"),
            ("tolerance", 1 < self.tolerance <= self.coarse_ratio,
             f"must be above 1 and at most coarse_ratio ({self.coarse_ratio:g}), e.g. 1.25"),
            ("bisect_points", self.bisect_points >= 1, "must be at least 1"),
            ("edge_seeds", self.edge_seeds >= 1, "must be at least 1"),
            ("refine_factor", self.refine_factor > 1, "must be above 1, e.g. 2"),
            ("refine_points", self.refine_points >= 0 and self.refine_points % 2 == 0,
             "must be an even number >= 0 (half below the best, half above)"),
            ("rerun_margin", self.rerun_margin >= 0, "must be >= 0 (a fraction, e.g. 0.05)"),
            ("seeds", self.seeds >= 1, "must be at least 1 (1: no further seeds)"),
            ("seed_lrs", self.seed_lrs >= 1, "must be at least 1"),
            ("seed_rounds", self.seed_rounds >= 0, "must be >= 0"),
            ("max_extensions", self.max_extensions >= 0, "must be >= 0"),
        ]
        for key, ok, message in checks:
            if not ok:
                raise LmtuneError(f"{where}.{key}: {message} (got {getattr(self, key)!r})")

    @classmethod
    def of_space(cls, space: dict[str, Any]) -> EdgeSettings | None:
        """The settings sweep.json recorded for a search: edge (None for other searches)."""
        if space.get("search") != "edge":
            return None
        return cls(**{k: v for k, v in (space.get("edge") or {}).items() if k in cls.__dataclass_fields__})


# ---------------------------------------------------------------------------------------------
# The stages' choices


def coarse_lrs(steepest_lr: float | None, blowup_lr: float | None, settings: EdgeSettings) -> tuple[list[float], str]:
    """The coarse grid (most promising first) and why: from steepest / coarse_below up to the first LR
    at or above blowup x coarse_above, coarse_ratio apart. A range test without a steepest descent or a
    blow-up falls back to its own LR bounds on that side."""
    low = (steepest_lr or settings.range_min_lr * settings.coarse_below) / settings.coarse_below
    high = (blowup_lr or settings.range_max_lr) * settings.coarse_above
    count = max(2, math.ceil(math.log(high / low) / math.log(settings.coarse_ratio) - 1e-9) + 1)
    lrs = [low * settings.coarse_ratio ** k for k in range(count)]
    centre = steepest_lr or math.sqrt(low * high)
    lrs.sort(key=lambda lr: (abs(math.log(lr / centre)), lr))
    why = (f"{count} LRs a factor {settings.coarse_ratio:g} apart from {low:.3g} (the range test's steepest descent "
           f"{_g(steepest_lr)} / {settings.coarse_below:g}) up to {lrs and max(lrs):.3g} (at or above its blow-up "
           f"{_g(blowup_lr)} x {settings.coarse_above:g}); nearest the steepest descent first, so that ASHA's early "
           "rungs hold good results to cut the others against")
    return lrs, why


def refine_lrs(best: LrResult, runs: list[Run], edge_lr: float | None, settings: EdgeSettings,
               budget: Budget, queued: tuple[float, ...] = ()) -> list[float]:
    """refine_points LRs log-spaced within best / refine_factor .. best x refine_factor, and the coarse
    grid's neighbours of the best (best / coarse_ratio, best x coarse_ratio: they bound where the best
    LR can lie, and ASHA may have cut them early), leaving out LRs at or above a known divergence and
    LRs that already have (or will have: ``queued``) a full-budget run at the first seed."""
    half = settings.refine_points // 2
    candidates = [best.lr * settings.refine_factor ** (k / half) for k in range(-half, half + 1) if k] if half else []
    candidates += [best.lr / settings.coarse_ratio, best.lr * settings.coarse_ratio]
    tried = sorted({r.lr for r in runs})
    covered = [r.lr for r in runs if _full_budget_at_first_seed(r, budget.seed)] + list(queued)
    chosen: list[float] = []
    for lr in sorted(_snap(lr, tried) for lr in candidates):
        if edge_lr is not None and lr >= edge_lr:
            continue
        if not any(max(lr, other) / min(lr, other) < SAME_LR for other in covered + chosen):
            chosen.append(lr)
    return chosen


def _snap(lr: float, tried: list[float]) -> float:
    """An LR already tried within SAME_LR of ``lr`` (so a re-run shares its LR exactly), else ``lr``."""
    return next((other for other in tried if max(lr, other) / min(lr, other) < SAME_LR), lr)


def _full_budget_at_first_seed(run: Run, seed: int) -> bool:
    """A first-seed run that trained, or will train, the whole budget (a coarse one only if ASHA let it)."""
    if run.seed != seed or run.diverged:
        return False
    return run.full if run.stage == "coarse" else run.run_tokens >= run.budget_tokens


def rerun_lrs(best: LrResult, runs: list[Run], settings: EdgeSettings, budget: Budget) -> list[tuple[float, str]]:
    """Coarse LRs below the best that ASHA cut while within rerun_margin of their last rung's leader:
    (lr, why) each, to be trained to the full budget."""
    chosen = []
    for run in runs:
        if run.stage != "coarse" or run.outcome != "stopped_early" or run.lr >= best.lr:
            continue
        rung = max((r for r in budget.rungs if run.loss_at(r) is not None), default=None)
        if rung is None:
            continue
        leader = min(loss for other in runs if (loss := None if other.diverged else other.loss_at(rung)) is not None)
        mine = run.loss_at(rung)
        if mine <= leader * (1 + settings.rerun_margin):
            chosen.append((run.lr, f"ASHA cut lr {run.lr:.3g} at {format_tokens(rung)} tokens with val {mine:.4f}, "
                                   f"within {100 * (mine / leader - 1):.1f}% of that rung's best {leader:.4f}"))
    return chosen


def seed_lrs(ranking: list[LrResult], settings: EdgeSettings) -> list[LrResult]:
    return crowned_ranking(ranking)[: settings.seed_lrs] if settings.seeds > 1 else []


def _g(value: float | None) -> str:
    return "—" if value is None else f"{value:.3g}"


# ---------------------------------------------------------------------------------------------
# The search, stage by stage


@dataclass
class Planned:
    """A trial the search asks for, and why."""

    stage: str
    lr: float | None
    seed: int
    why: str = ""
    continue_from: str | None = None
    """The trial id of an ASHA-cut run this one continues from its newest checkpoint."""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Planned:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})

    def config(self) -> dict[str, Any]:
        """The trial's Tune config: its stage, LR and seed (and the trial it continues)."""
        config: dict[str, Any] = {"stage": self.stage, "seed": self.seed}
        if self.lr is not None:
            config["lr"] = self.lr
        if self.continue_from:
            config["continue_from"] = self.continue_from
        if self.stage in NO_EARLY_STOP_STAGES:
            config["early_stop"] = False
        return config


class EdgeSearch:
    """The edge search's state and decisions: which trial to run next, given what has been seen.

    Ray-free and deterministic: the Tune Searcher (lmtune.sweep.edge_searcher) feeds it results and
    asks it for trials; a test can drive it the same way without Ray. Its whole state is JSON."""

    def __init__(self, settings: EdgeSettings, budget: Budget, max_pending: int = 1):
        self.settings, self.budget, self.max_pending = settings, budget, max_pending
        self.runs: dict[str, Run] = {}
        self.plans: dict[str, dict[str, Any]] = {}  # trial id -> the Planned it got, as JSON
        self.queue: list[Planned] = []
        self.decisions: list[dict[str, Any]] = []  # {stage, lrs, why}, in the order decided
        self.range: dict[str, Any] | None = None  # the range test's finding, once it ended
        self.bisect_rounds = 0
        self.extensions = 0
        self.seed_rounds = 0
        self.finished = False
        self.interrupted: dict[str, str] = {}  # trial id -> why its plan was run again in another trial

    # -- what Tune asks and tells ------------------------------------------------------------

    def suggest(self, trial_id: str) -> dict[str, Any] | str:
        """The next trial's config, WAIT (nothing to start now) or FINISHED."""
        if self.finished:
            return FINISHED
        if sum(not r.done for r in self.runs.values()) >= self.max_pending:
            return WAIT
        if not self.queue:
            self._decide()
        if not self.queue:
            return FINISHED if self.finished else WAIT
        planned = self.queue.pop(0)
        self.runs[trial_id] = Run(planned.lr or 0.0, planned.seed, planned.stage, self.budget.full_tokens,
                                  self.budget.full_tokens, trial_id=trial_id, continue_from=planned.continue_from)
        self.plans[trial_id] = asdict(planned)
        return planned.config()

    def observe(self, trial_id: str, result: dict[str, Any]) -> None:
        """A result the trial reported: its tokens and, at an evaluation, its val loss."""
        run = self.runs.get(trial_id)
        if run is None:
            return
        tokens = result.get("tokens")
        if isinstance(tokens, (int, float)) and math.isfinite(tokens):
            run.tokens = max(run.tokens, int(tokens))
            loss = result.get("val_loss")
            if isinstance(loss, (int, float)) and math.isfinite(loss):
                run.val[int(tokens)] = float(loss)

    def complete(self, trial_id: str, outcome: str, result: dict[str, Any] | None = None) -> None:
        """The trial ended with ``outcome`` (the ledger's word for it). ``result`` may say how a divergence
        was established (``divergence``, ``diverged_tokens``); for the range test it carries its finding
        (steepest_lr, min_loss_lr, blowup_lr)."""
        run = self.runs.get(trial_id)
        if run is None:
            return
        result = result or {}
        self.observe(trial_id, result)
        run.outcome = outcome
        if run.diverged:
            run.divergence = result.get("divergence") or (WHOLE_RUN if run.full else BY_RULE)
            step = result.get("diverged_step")
            run.diverged_tokens = result.get("diverged_tokens") or (
                int(step) * self.budget.tokens_per_step if isinstance(step, (int, float)) else run.tokens)
        if run.stage == "range":
            found = {k: result.get(k) for k in ("steepest_lr", "min_loss_lr", "blowup_lr")}
            self.range = {**found, "outcome": outcome, "tokens": run.tokens}

    def requeue(self, trial_id: str, why: str) -> None:
        """A trial that can never report (its driver died before Tune's snapshot knew of it): forget its
        run and plan it again, first."""
        self.runs.pop(trial_id, None)
        plan = self.plans.pop(trial_id, None)
        if plan is not None:
            self.queue.insert(0, Planned.from_json(plan))
        self.interrupted[trial_id] = why

    # -- deciding ----------------------------------------------------------------------------

    def _decide(self) -> None:
        started = {d["stage"] for d in self.decisions}
        if "range" not in started:
            s = self.settings
            self._plan("range", [Planned("range", None, self.budget.seed)],
                       f"one run with the LR rising from {s.range_min_lr:g} to {s.range_max_lr:g} over "
                       f"{s.range_steps} steps, stopped when its smoothed loss exceeds {s.range_blowup_factor:g}x "
                       "its lowest")
            return
        if self.range is None:
            return
        if "coarse" not in started:
            steepest, blowup = self.range.get("steepest_lr"), self.range.get("blowup_lr")
            lrs, why = coarse_lrs(steepest, blowup, self.settings)
            if self.range.get("outcome") == "error":
                why = "the range test failed, so its LR bounds are used: " + why
            self._plan("coarse", [Planned("coarse", lr, self.budget.seed) for lr in lrs], why)
            return
        if self._busy("coarse"):
            return
        if "landscape" not in started:
            self._landscape()
        if not self._busy("landscape"):
            self._edge()
        if "refine" not in started:
            self._refine()
        elif "seeds" not in started and not self._busy("refine"):
            self._seeds()
        elif "seeds" in started and not self._busy("seeds") and not self._busy("refine"):
            self._reseed()
        if not self.queue and not self._busy() and "seeds" in started and self._bracket_settled() \
                and not self._contenders():
            self.finished = True

    def _plan(self, stage: str, planned: list[Planned], why: str, first: bool = False) -> None:
        for p in planned:
            p.why = why
            if p.lr is not None:  # 4 significant digits: readable, and seeds of one LR share it exactly
                p.lr = float(f"{p.lr:.4g}")
        self.queue = planned + self.queue if first else self.queue + planned
        self.decisions.append({"stage": stage, "lrs": [p.lr for p in planned if p.lr is not None], "why": why})

    def _busy(self, stage: str | None = None) -> bool:
        """A trial of ``stage`` (of any, if None) is queued or running."""
        return any(p.stage == stage or stage is None for p in self.queue) or any(
            not r.done and (r.stage == stage or stage is None) for r in self.runs.values())

    def _lr_runs(self) -> list[Run]:
        return [r for r in self.runs.values() if r.stage != "range"]

    def _cut_runs(self) -> dict[float, str]:
        """LR -> the trial id of a first-seed coarse run ASHA cut (a run to continue, not restart)."""
        return {r.lr: tid for tid, r in self.runs.items()
                if r.stage == "coarse" and r.outcome == "stopped_early" and r.seed == self.budget.seed}

    def _landscape(self) -> None:
        best, _ = crown(full_budget_ranking(self._lr_runs()))
        if best is None:
            self._plan("landscape", [], "no coarse LR trained the full budget: nothing to continue above it")
            return
        edge = bracket(self._lr_runs())
        cut = {lr: tid for lr, tid in self._cut_runs().items()
               if lr > best.lr and (edge.diverged_lr is None or lr < edge.diverged_lr)}
        planned = [Planned("landscape", lr, self.budget.seed, continue_from=cut[lr]) for lr in sorted(cut)]
        why = (f"the coarse LRs above the best ({best.lr:.3g}) that ASHA cut, continued from their last checkpoint "
               "to the full budget: the loss between the best LR and the edge, and the edge's first bracket"
               if planned else f"every coarse LR above the best ({best.lr:.3g}) already trained the full budget "
                               "or diverged")
        self._plan("landscape", planned, why)

    def _unconfirmed(self, edge) -> list[Planned]:
        """What the bracket's ends still need: the diverged end's rule-judged runs retrained, the stable end's
        missing seeds (a run planned once is not planned again, even if it errored)."""
        tried = {(r.lr, r.seed) for r in self.runs.values() if r.stage == "confirm"}
        retrain = [Planned("confirm", r.lr, r.seed) for r in needs_confirmation(self._lr_runs(), edge)]
        seeded = {r.seed for r in effective_runs(self._lr_runs()) if r.lr == edge.stable_lr and r.trained_through()}
        missing = [Planned("confirm", edge.stable_lr, self.budget.seed + k) for k in range(self.settings.edge_seeds)
                   if self.budget.seed + k not in seeded] if edge.stable_lr is not None else []
        return [p for p in retrain + missing if (p.lr, p.seed) not in tried]

    def _bracket_settled(self) -> bool:
        runs = self._lr_runs()
        edge = bracket(runs)
        if self.bisect_rounds >= MAX_BISECT_ROUNDS:
            return True
        if edge.resolved(self.settings.tolerance):
            return not self._unconfirmed(edge)
        return (edge.diverged_lr is None or edge.stable_lr is None) and self.extensions >= self.settings.max_extensions

    def _edge(self) -> None:
        """The next bisection probe or confirmation run, when the bracket needs one and none is under way."""
        if self._busy("bisect") or self._busy("confirm") or self._bracket_settled():
            return
        runs = self._lr_runs()
        edge = bracket(runs)
        tried = sorted({r.lr for r in runs})
        if edge.diverged_lr is None:
            lrs = [max(tried) * self.settings.coarse_ratio ** 2]
            why = f"no LR diverged up to {max(tried):.3g}: a probe further up"
            self.extensions += 1
        elif edge.stable_lr is None:
            lrs = [min(tried) / self.settings.coarse_ratio ** 2]
            why = f"every LR diverged down to {min(tried):.3g}: a probe further down"
            self.extensions += 1
        elif not edge.resolved(self.settings.tolerance):
            lrs = bisect_lrs(edge, self.settings.bisect_points)
            self.bisect_rounds += 1
            why = f"bracket [{edge.stable_lr:.3g}, {edge.diverged_lr:.3g}] {edge.ratio:.2f} wide"
        else:
            pending = self._unconfirmed(edge)
            why = [f"lr {edge.stable_lr:.3g}, the bracket's stable end, with seed {p.seed}: every seed must train "
                   "through it" for p in pending if p.lr == edge.stable_lr]
            why += [f"lr {p.lr:.3g} seed {p.seed}, the bracket's diverged end, judged by the stopper's rule alone: "
                    "trained again to the full budget without any early stop, to see whether it recovers"
                    for p in pending if p.lr != edge.stable_lr]
            self._plan("confirm", pending, "; ".join(why), first=True)
            return
        if not any(d["stage"] == "bisect" for d in self.decisions):
            why += (f" (probes train the full budget with {self.settings.edge_seeds} seeds each; the stopper ends "
                    "one early only if it cannot recover)")
        seeds = [self.budget.seed + k for k in range(self.settings.edge_seeds)]
        self._plan("bisect", [Planned("bisect", lr, seed) for lr in lrs for seed in seeds], why, first=True)

    def _refine(self) -> None:
        runs = self._lr_runs()
        best, _ = crown(full_budget_ranking(runs))
        if best is None:
            self._plan("refine", [], "no LR trained the full budget without diverging: nothing to refine around")
            return
        edge = bracket(runs)
        queued = tuple(p.lr for p in self.queue if p.lr is not None and p.seed == self.budget.seed)
        lrs = refine_lrs(best, runs, edge.diverged_lr, self.settings, self.budget, queued)
        reruns = rerun_lrs(best, runs, self.settings, self.budget)
        why = (f"{len(lrs)} LRs around the best full-budget LR {best.lr:.3g} (val {best.mean:.4f}): within "
               f"{self.settings.refine_factor:g}x of it, and its coarse neighbours {self.settings.coarse_ratio:g}x "
               "away to bound it; trained to the full budget without early cuts (a coarse LR ASHA cut is "
               "continued from its last checkpoint)")
        if reruns:
            why += "; re-run to the full budget: " + "; ".join(reason for _, reason in reruns)
        extra = [lr for lr, _ in reruns if not any(max(lr, x) / min(lr, x) < SAME_LR for x in lrs)]
        cut = self._cut_runs()
        planned = [Planned("refine", lr, self.budget.seed, continue_from=cut.get(lr)) for lr in sorted(lrs + extra)]
        self._plan("refine", planned, why)

    def _seeds(self) -> None:
        ranking = full_budget_ranking(self._lr_runs())
        chosen = seed_lrs(ranking, self.settings)
        seeds = [self.budget.seed + k for k in range(1, self.settings.seeds)]
        if not chosen:
            why = ("one seed per LR (seeds: 1)" if self.settings.seeds == 1
                   else "no LR trained the full budget without diverging: no seeds to add")
            self._plan("seeds", [], why)
            return
        why = (f"the best {len(chosen)} LRs by full-budget val loss ("
               + ", ".join(f"{r.lr:.3g}: {r.mean:.4f}" for r in chosen)
               + f") again with seeds {', '.join(map(str, seeds))}: the best LR is chosen on the mean")
        self._plan("seeds", [Planned("seeds", r.lr, s) for r in chosen for s in seeds], why)

    def _contenders(self) -> list[LrResult]:
        """LRs with fewer seeds that beat the crowned best seed for seed, while seed rounds remain."""
        if self.settings.seeds == 1 or self.seed_rounds >= self.settings.seed_rounds:
            return []
        return crown(full_budget_ranking(self._lr_runs()))[1]

    def _reseed(self) -> None:
        """Give every contender the seeds the crowned best has, so it is compared on as many."""
        contenders = self._contenders()
        if not contenders or self._busy():
            return
        best, _ = crown(full_budget_ranking(self._lr_runs()))
        planned = [Planned("seeds", r.lr, s) for r in contenders for s in best.seeds if s not in r.seeds]
        self.seed_rounds += 1
        self._plan("seeds", planned,
                   ", ".join(f"lr {r.lr:.3g} ({len(r.losses)} seed{'s' * (len(r.losses) > 1)})" for r in contenders)
                   + f" beat the best, lr {best.lr:.3g}, on the seeds they share: given seeds "
                   + ", ".join(str(s) for s in best.seeds) + " before the best LR is settled")

    # -- state -------------------------------------------------------------------------------

    def conclusion(self) -> dict[str, Any]:
        return conclude(effective_runs(self._lr_runs()), self.budget)

    def to_json(self) -> dict[str, Any]:
        return {
            "settings": asdict(self.settings), "budget": asdict(self.budget), "max_pending": self.max_pending,
            "runs": {tid: run.to_json() for tid, run in self.runs.items()}, "plans": self.plans,
            "queue": [asdict(p) for p in self.queue], "decisions": self.decisions, "range": self.range,
            "bisect_rounds": self.bisect_rounds, "extensions": self.extensions, "seed_rounds": self.seed_rounds,
            "finished": self.finished, "interrupted": self.interrupted, "conclusion": self.conclusion(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EdgeSearch:
        budget = data["budget"]
        settings = {k: v for k, v in data["settings"].items() if k in EdgeSettings.__dataclass_fields__}
        search = cls(EdgeSettings(**settings), Budget(**{**budget, "rungs": tuple(budget["rungs"])}),
                     data.get("max_pending", 1))
        search.runs = {tid: Run.from_json(run) for tid, run in data["runs"].items()}
        search.plans = data["plans"]
        search.queue = [Planned.from_json(p) for p in data["queue"]]
        search.decisions = data["decisions"]
        search.range = data["range"]
        search.bisect_rounds, search.extensions = data["bisect_rounds"], data["extensions"]
        search.seed_rounds = data.get("seed_rounds", 0)
        search.finished = data["finished"]
        search.interrupted = dict(data.get("interrupted") or {})
        return search
