"""The edge search (``search: edge``): which LR is best for the budget, how the loss degrades above it,
and where training fails, decided step by step from what the sweep has trained. Ray-free: the Tune
Searcher that drives it is lmtune.sweep.searcher; what the runs show is lmtune.analysis.runs;
its settings and what each stage picks are lmtune.searches.edge.settings.

The stages, in one sweep:

1. **range**: the LR range test (lmtune.training.lr_range): one short run with a rising LR gives the
   steepest-descent LR and the blow-up LR. A search started from another's answer (``start``: a compare search's
   later variant, from its reference's) runs none: its coarse grid lies around that answer (settings.warm_lrs).
2. **coarse**: log-spaced LRs from well below the steepest descent to the blow-up, under ASHA, the most
   promising first (asynchronous ASHA can only cut against results already in).
3. **landscape**: the coarse LRs above the best's coarse neighbour that ASHA cut are continued from their last
   checkpoint to the full budget one at a time, by bisection over them, until the failing end lies between two
   neighbouring coarse LRs: its first bracket for about log2 of their number continuations (the LRs left out only
   said how bad the loss is far above the best). The highest cut LR is not continued while nothing has failed:
   bisection probes the middle between it and the largest LR that trained through instead, and where that probe
   fails, the highest LR's run would have decided nothing.
4. **bisect**: full-budget probes on the first seed, between the largest LR whose every run trained through its
   budget (or, while nothing has failed, the highest cut coarse LR above it) and the smallest one at which a run
   failed, until their ratio is at most ``tolerance``. One failing seed places the edge below a probe, so a
   failed probe needs no second seed; the seeds every stable end needs are the confirmation's. Divergence is
   failure to recover (lmtune.training.divergence); the stopper may end a probe early only on that evidence.
5. **confirm**: the bracket's stable end gets the ``edge_seeds`` it lacks, and a diverged end that only the
   stopper's rule judged is trained again without any early stop; a seed that fails at the stable end moves the
   bracket down, a diverged end that recovers moves it up, and bisection goes on.
6. **refine**: the best full-budget LR's neighbours ``refine_factor`` apart and the multiples of it whose cost the
   report states (2x and 4x: the useful range), to the full budget (a cut coarse LR is continued, not restarted);
   every LR below it that ASHA cut within ``rerun_margin`` of its rung's leader; and, beside the seeds, where no
   full-budget LR below (above) the best is clearly worse than it, one more ``refine_factor`` further out (a cut
   coarse LR there is continued), so that the best LR's interval is closed on both sides.
7. **seeds**: the best ``seed_lrs`` LRs again with further seeds; then any LR that beats the crowned best
   seed for seed gets the same seeds before the crown is settled (lmtune.analysis.runs.crown).

Landscape, bisection, confirmation and refinement run side by side; the search ends when every stage is
done, the crown is settled and the bracket is resolved and confirmed (or cannot be).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from lmtune.analysis.bracket import Bracket, bisect_lrs, bracket, needs_confirmation
from lmtune.analysis.conclusion import conclude
from lmtune.analysis.named_lrs import COST_AT
from lmtune.analysis.runs import SAME_LR, Budget, LrResult, Run, crown, effective_runs, full_budget_ranking, same_lr
from lmtune.files import JsonObject
from lmtune.searches.deciding import DecidingSearch, Decision, Planned
from lmtune.searches.edge.settings import EdgeSettings, bound_lr, coarse_lrs, refine_lrs, rerun_lrs, seed_lrs, warm_lrs
from lmtune.searches.trial_order import RANGE_STAGE, TuneParams, TuneResult

STAGES = (RANGE_STAGE, "coarse", "landscape", "bisect", "confirm", "refine", "seeds")
ASHA_STAGES = frozenset({"coarse"})  # the only stage ASHA may cut
NO_EARLY_STOP_STAGES = frozenset({"confirm"})  # the stopper's divergence rule leaves these alone
# Bisection rounds before the search gives up on a bracket that keeps moving (noise near the edge).
MAX_BISECT_ROUNDS = 12
# Refinement LRs planned one at a time beyond a best LR that no full-budget LR bounds on one side.
MAX_BOUND_ROUNDS = 3


# ---------------------------------------------------------------------------------------------
# The search, stage by stage


@dataclass(frozen=True)
class RangeFinding:
    """What the range test found (its LRs None where its curve showed none), how it ended and its tokens."""

    steepest_lr: float | None
    min_loss_lr: float | None
    blowup_lr: float | None
    outcome: str
    tokens: int


@dataclass(frozen=True)
class WarmStart:
    """Another search's answer this one starts from (a compare search's reference's, for a later variant): its best
    LR and its edge bracket's ends."""

    best_lr: float
    stable_lr: float | None
    diverged_lr: float | None


class EdgeSearch(DecidingSearch[Planned, Decision]):
    """The edge search's state and decisions: which trial to run next, given what has been seen.

    Ray-free and deterministic: the Tune Searcher (lmtune.sweep.searcher) feeds it results and
    asks it for trials; a test can drive it the same way without Ray. Its whole state is JSON."""

    name = "edge"
    settings_class = EdgeSettings
    planned_class = Planned
    decision_class = Decision

    def __init__(self, settings: EdgeSettings, budget: Budget, max_pending: int = 1):
        super().__init__(settings, budget, max_pending)
        self.range: RangeFinding | None = None  # the range test's finding, once it ended
        self.start: WarmStart | None = None  # set before its first trial: no range test, a grid around its answer
        self.bisect_rounds = 0
        self.extensions = 0
        self.seed_rounds = 0
        self.bound_rounds = 0
        self.landscape_done = False

    # -- what Tune asks and tells ------------------------------------------------------------

    def _start(self, trial_id: str, planned: Planned) -> Run:
        return Run(planned.lr or 0.0, planned.seed, planned.stage, self.budget.full_tokens, self.budget.full_tokens,
                   trial_id=trial_id, continue_from=planned.continue_from, baseline=self.budget.unigram_loss)

    def _order(self, planned: Planned) -> TuneParams:
        return planned.config(early_stop=planned.stage not in NO_EARLY_STOP_STAGES)

    def complete(self, trial_id: str, outcome: str, result: TuneResult | None = None) -> Run | None:
        """As every deciding search's; for the range test ``result`` carries its finding (steepest_lr,
        min_loss_lr, blowup_lr)."""
        run = super().complete(trial_id, outcome, result)
        result = result or {}
        if run is not None and run.stage == RANGE_STAGE:
            self.range = RangeFinding(result.get("steepest_lr"), result.get("min_loss_lr"), result.get("blowup_lr"),
                                      outcome, run.tokens)
        return run

    # -- deciding ----------------------------------------------------------------------------

    def _decide(self) -> None:
        started = {d.stage for d in self.decisions}
        if self.start is not None and "coarse" not in started:
            lrs, why = warm_lrs(self.start.best_lr, self.start.stable_lr, self.start.diverged_lr, self.settings)
            self._plan("coarse", [Planned("coarse", lr, self.budget.seed) for lr in lrs], why)
            return
        if RANGE_STAGE not in started and self.start is None:
            s = self.settings
            self._plan(RANGE_STAGE, [Planned(RANGE_STAGE, None, self.budget.seed)],
                       f"one run with the LR rising from {s.range_min_lr:g} to {s.range_max_lr:g} over "
                       f"{s.range_steps} steps, stopped when its smoothed loss exceeds {s.range_blowup_factor:g}x "
                       "its lowest")
            return
        if self.range is None and self.start is None:
            return
        if "coarse" not in started:
            lrs, why = coarse_lrs(self.range.steepest_lr, self.range.blowup_lr, self.settings)
            if self.range.outcome == "error":
                why = "the range test failed, so its LR bounds are used: " + why
            self._plan("coarse", [Planned("coarse", lr, self.budget.seed) for lr in lrs], why)
            return
        if self._busy("coarse"):
            return
        if not self.landscape_done:
            self._landscape()
        if self.landscape_done:
            self._edge()
        if "refine" not in started:
            self._refine()
        elif not self._busy("refine"):
            self._bound_best()  # (beside the seeds: a bound that beats the best is a contender, seeded in turn)
            if "seeds" not in started:
                self._seeds()
            elif not self._busy("seeds") and not self._busy("refine"):
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
        self.decisions.append(Decision(stage, [p.lr for p in planned if p.lr is not None], why))

    def _busy(self, stage: str | None = None) -> bool:
        """A trial of ``stage`` (of any, if None) is queued or running."""
        return any(p.stage == stage or stage is None for p in self.queue) or any(
            not r.done and (r.stage == stage or stage is None) for r in self.runs.values())

    def _lr_runs(self) -> list[Run]:
        return [r for r in self.runs.values() if r.stage != RANGE_STAGE]

    def _cut_runs(self) -> dict[float, str]:
        """LR -> the trial id of a first-seed coarse run ASHA cut (a run to continue, not restart)."""
        return {r.lr: tid for tid, r in self.runs.items()
                if r.stage == "coarse" and r.outcome == "stopped_early" and r.seed == self.budget.seed}

    def _landscape(self) -> None:
        """The next cut coarse LR above the best's coarse neighbour to continue to the full budget, by bisection
        over those LRs (the middle one of those still between the largest that trained through and the smallest
        that failed); done when no cut LR is left between them: the failing end's first bracket, two coarse LRs
        apart, for about log2 of their number continuations instead of all of them. While nothing has failed, the
        highest cut LR is left to bisection (``_edge``): a fresh probe below it that fails makes its run moot."""
        if self._busy("landscape"):
            return
        best, _ = crown(full_budget_ranking(self._lr_runs()))
        if best is None:
            self._end_landscape("no coarse LR trained the full budget: nothing to continue above it")
            return
        edge, above = bracket(self._lr_runs()), best.lr * self.settings.coarse_ratio * SAME_LR
        low = max(above, edge.stable_lr or 0.0)
        cut = {lr: tid for lr, tid in self._cut_runs().items()
               if low < lr and (edge.diverged_lr is None or lr < edge.diverged_lr) and not self._continued(lr)}
        lrs = sorted(cut)
        if edge.diverged_lr is None:
            lrs = lrs[:-1]  # the highest: the ceiling bisection probes below (see _ceiling)
        if not lrs:
            self._end_landscape(f"no coarse LR above the best ({best.lr:.3g}) and its coarse neighbour is left to "
                                "continue between those that trained through and those that failed (the highest "
                                "ASHA cut, while none failed, is left to a bisection probe below it)")
            return
        lr = lrs[min(len(cut) // 2, len(lrs) - 1)]  # the middle of all the cut LRs (the highest left out above)
        self._plan("landscape", [Planned("landscape", lr, self.budget.seed, continue_from=cut[lr])],
                   f"lr {lr:.3g}: the middle of the {len(cut)} coarse LRs ASHA cut between the best's neighbour (or "
                   "the largest LR that trained through) and the smallest that failed, continued from its last "
                   "checkpoint to the full budget: the failing end's first bracket by bisection over the coarse grid")

    def _end_landscape(self, why: str) -> None:
        self.landscape_done = True
        if not any(d.stage == "landscape" for d in self.decisions):
            self._plan("landscape", [], why)

    def _continued(self, lr: float) -> bool:
        """A landscape or refinement run of ``lr`` at the first seed is planned or has run."""
        stages = ("landscape", "refine")
        return any(p.lr == lr and p.stage in stages for p in self.queue) or any(
            r.lr == lr and r.stage in stages and r.seed == self.budget.seed for r in self.runs.values())

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

    def _ceiling(self, stable_lr: float) -> tuple[float, str] | None:
        """The highest coarse LR, above ``stable_lr``, that ASHA cut and no stage continued (lr, its trial id): while
        nothing has failed, the upper end bisection probes below instead of continuing it (the landscape's
        leftover)."""
        above = {lr: tid for lr, tid in self._cut_runs().items()
                 if lr > stable_lr * SAME_LR and not self._continued(lr)}
        return max(above.items()) if above else None

    def _edge(self) -> None:
        """The next bisection probe or confirmation run, when the bracket needs one and none is under way."""
        if self._busy("bisect") or self._busy("confirm") or self._busy("landscape") or self._bracket_settled():
            return
        runs = self._lr_runs()
        edge = bracket(runs)
        tried = sorted({r.lr for r in runs})
        ceiling = self._ceiling(edge.stable_lr) if edge.diverged_lr is None and edge.stable_lr is not None else None
        if ceiling is not None:
            lr, trial_id = ceiling
            below = Bracket(edge.stable_lr, lr)
            if below.resolved(self.settings.tolerance):
                self._plan("landscape", [Planned("landscape", lr, self.budget.seed, continue_from=trial_id)],
                           f"lr {lr:.3g}, the highest coarse LR ASHA cut, continued from its last checkpoint to the "
                           f"full budget: every LR up to {edge.stable_lr:.3g}, {below.ratio:.2f}x below it, trained "
                           "through", first=True)
                return
            lrs = bisect_lrs(below, self.settings.bisect_points)
            self.bisect_rounds += 1
            why = (f"nothing failed up to {edge.stable_lr:.3g}; between it and {lr:.3g}, the highest coarse LR ASHA "
                   "cut (not continued: where a probe below it fails, its run decides nothing)")
        elif edge.diverged_lr is None:
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
        if not any(d.stage == "bisect" for d in self.decisions):
            why += (" (probes train the full budget on the first seed: one seed that fails places the edge below "
                    f"a probe; the stable end gets {self.settings.edge_seeds} seeds when the bracket is resolved; "
                    "the stopper ends a probe early only if it cannot recover)")
        self._plan("bisect", [Planned("bisect", lr, self.budget.seed) for lr in lrs], why, first=True)

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
               f"{self.settings.refine_factor:g}x of it to bound it, and "
               f"{' and '.join(f'{f}x' for f in COST_AT)} it, the costs of going higher the report states; trained "
               "to the full budget without early cuts (a coarse LR ASHA cut is continued from its last checkpoint)")
        if reruns:
            why += "; re-run to the full budget: " + "; ".join(reason for _, reason in reruns)
        extra = [lr for lr, _ in reruns if not any(same_lr(lr, x) for x in lrs)]
        cut = self._cut_runs()
        planned = [Planned("refine", lr, self.budget.seed, continue_from=cut.get(lr)) for lr in sorted(lrs + extra)]
        self._plan("refine", planned, why)

    def _bound_best(self) -> bool:
        """One more refinement LR where the best LR's interval is open on a side (settings.bound_lr); True if
        planned."""
        runs = self._lr_runs()
        ranking = full_budget_ranking(runs)
        best, _ = crown(ranking)
        if best is None or self.bound_rounds >= MAX_BOUND_ROUNDS:
            return False
        cut = self._cut_runs()
        bound = bound_lr(best, ranking, bracket(runs), tuple(cut), self.settings)
        if bound is None:
            return False
        self.bound_rounds += 1
        self._plan("refine", [Planned("refine", bound.lr, self.budget.seed, continue_from=cut.get(bound.lr))],
                   bound.why)
        return True

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

    def conclusion(self) -> JsonObject:
        """What the runs conclude, as the state file's JSON (lmtune.analysis.conclusion.Conclusion.to_json)."""
        return conclude(effective_runs(self._lr_runs()), self.budget).to_json()

    def to_json(self) -> JsonObject:
        return {**super().to_json(), "range": asdict(self.range) if self.range else None,
                "start": asdict(self.start) if self.start else None,
                "bisect_rounds": self.bisect_rounds, "extensions": self.extensions, "seed_rounds": self.seed_rounds,
                "bound_rounds": self.bound_rounds, "landscape_done": self.landscape_done}

    def _restore(self, data: JsonObject) -> None:
        self.range = RangeFinding(**data["range"]) if data.get("range") else None
        self.start = WarmStart(**data["start"]) if data.get("start") else None
        self.bisect_rounds, self.extensions = data["bisect_rounds"], data["extensions"]
        self.seed_rounds = data.get("seed_rounds", 0)
        self.bound_rounds = data.get("bound_rounds", 0)
        # (a search saved before the landscape went top down had planned all of it at once)
        self.landscape_done = data.get("landscape_done", any(d["stage"] == "landscape" for d in data["decisions"]))
