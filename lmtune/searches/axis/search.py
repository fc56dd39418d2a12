"""The engine of a search along an axis (``search: horizon``: token budgets; ``search: width``: model widths): the
best LR at the target point (the budget or the model the user will train), predicted from the best LR at points
they can afford and confirmed at the target. Ray-free: the Tune Searcher that drives it is lmtune.sweep.searcher
(DecidingSearcher); a search says its axis, its fit and their words (lmtune.searches.horizon.search,
lmtune.searches.width.conclusion).

Every run trains its point's whole budget with its own schedule (the cosine decays over that budget), and nothing
but a non-finite loss (or a run stuck above its initial loss for the stopper's recovery window) ends one
early: LRs are compared only at a point's full token count. The stages, per point, smallest first:

1. **grid**: LRs ``ratio`` apart: for the smallest point from lr_min to lr_max, for each larger one around
   the best LR of the point below it (LR* falls as the budget grows, so more of the grid lies below).
2. **extend**: one LR further out while the best LR lies at the grid's end.
3. **seeds**: the best LR and its two neighbours get ``seeds`` runs each; an LR with fewer seeds that beats
   the crowned best seed for seed gets them too before the point's best LR is settled (lmtune.analysis.runs.crown).
4. **refine**: the LRs halfway (in log) between the crowned best and its neighbours, ``seeds`` runs each, so
   that a quadratic through five LRs locates LR* between grid points (lmtune.analysis.locate).
5. **wall**: where no LR on one side of the best is clearly worse than it, one LR a grid step beyond those
   tried on that side (``walls`` at most): an LR* is bounded only between LRs clearly worse.
6. **edge**: probes above the highest LR that trained through, for where training fails at this point (one
   seed each: the report says so wherever it prints them).

Point k+1's grid starts once point k's grid is settled, so points overlap. When every point's best LR is
settled: **fit** ln LR* against ln of the axis through the located LR*s with its interval (the search's own), and
**target** (the confirmation): the predicted LR and it divided and multiplied by ``confirm_ratio``,
``confirm_seeds`` runs each, at the target, enough to say whether the prediction lies in the target's own basin.
The search ends when all have ended.
"""

from __future__ import annotations

import math
from typing import ClassVar

from lmtune.analysis.bracket import bracket
from lmtune.analysis.conclusion import conclude
from lmtune.analysis.landscape import best_lr_interval
from lmtune.analysis.runs import SAME_LR, Budget, Run, crown, full_budget_ranking, same_lr
from lmtune.files import JsonObject
from lmtune.searches.axis.axis import SearchAxis, SearchFit, runs_at
from lmtune.searches.axis.settings import LrSearchSettings
from lmtune.searches.deciding import DecidingSearch, Decision, Planned
from lmtune.searches.trial_order import TuneParams
from lmtune.training.config import MAX_LR, accepted_lr

STAGES = ("grid", "extend", "seeds", "refine", "wall", "edge", "target")  # target: the confirmation at the target
SETTLING = ("grid", "extend", "seeds", "refine", "wall")  # the stages that decide a point's LR*


class AxisSearch(DecidingSearch[Planned, Decision]):
    """A search along an axis: its state and decisions. Deterministic and JSON-serializable: the Tune Searcher feeds
    it results and asks it for trials; a test can drive it the same way without Ray. A search sets ``name``,
    ``settings_class``, ``axis_columns`` and ``fit_class``, and says its axis (``make_axis``), its fit (``_fit``) and
    the fit's words (``_fit_words``)."""

    planned_class = Planned
    decision_class = Decision
    renamed = {"steps": "point"}  # (a horizon state file of an earlier version)
    whole_budget_only = True
    fit_class: ClassVar[type]
    """What its fit is (restored from the state file as this)."""

    def __init__(self, settings: LrSearchSettings, budget: Budget, max_pending: int = 1):
        super().__init__(settings, budget, max_pending)
        self.axis: SearchAxis = self.make_axis()
        self.seed_rounds: dict[int, int] = {}  # point -> further seed rounds given
        self.fit: SearchFit | None = None
        self.fit_problem: str | None = None

    def make_axis(self) -> SearchAxis:
        """The points searched and the target (the search's own)."""
        raise NotImplementedError

    # -- what Tune asks and tells ------------------------------------------------------------

    def _replan(self) -> None:
        decided = len(self.decisions)
        self._decide()  # every suggest: budgets overlap (each stage is planned once, so this is safe)
        while not self.queue and not self.finished and len(self.decisions) > decided:
            decided = len(self.decisions)  # a stage whose LRs were all left out (_plan) planned nothing: the next may
            self._decide()

    def _next_planned(self) -> Planned:
        # Edge probes only when nothing on the way to the prediction waits: they do not feed the fit.
        return next((p for p in self.queue if p.stage != "edge"), self.queue[0])

    def _start(self, trial_id: str, planned: Planned) -> Run:
        planned.fork_from = self._fork_source(planned)
        tokens = self.axis.budget_at(planned.point).full_tokens
        return Run(planned.lr, planned.seed, planned.stage, tokens, tokens, others=self.axis.others(planned.point),
                   trial_id=trial_id, baseline=self.budget.unigram_loss)

    def _order(self, planned: Planned) -> TuneParams:
        return {**planned.config(), **self.axis.params(planned.point)}

    def _fork_source(self, planned: Planned) -> str | None:
        """The trial id of a run whose stable phase this one continues (lmtune.training.fork), or None: a run trains
        from scratch unless its search says otherwise (the horizon search, under WSD)."""
        return None

    # -- what the runs show ------------------------------------------------------------------

    def runs_at(self, point: int) -> list[Run]:
        return runs_at(self.axis, self.runs.values(), point)

    # -- deciding ----------------------------------------------------------------------------

    def _decide(self) -> None:
        points = self.axis.points
        for i, point in enumerate(points):
            if not self._planned("grid", point):
                if i == 0:
                    self._first_grid(point)
                elif self._grid_settled(points[i - 1]):
                    self._next_grid(points[i - 1], point)
                continue
            if self._busy(point, "grid", "extend"):
                continue
            if not self._grid_settled(point):
                self._extend(point)
            elif not self._planned("seeds", point):
                self._seeds(point)
            elif not self._busy(point, "seeds", "refine", "wall"):  # (a half-run refine LR is no contender)
                self._reseed(point)
                # refine and walls around the crown as it stands once its contenders have their seeds
                if not self._busy(point, "seeds") and not self._contenders(point):
                    if not self._planned("refine", point):
                        self._refine(point)
                    else:
                        self._wall(point)
            self._edge(point)
        if not self._planned("target", self.axis.target) and all(self._settled(s) for s in points):
            self._confirm()
        if self._planned("target", self.axis.target) and not self.queue and not self._busy():
            self.finished = True

    def _plan(self, stage: str, point: int, planned: list[Planned], why: str) -> None:
        known = {p.lr for p in [*self.plans.values(), *self.queue]}
        # A larger budget's grid, its probes and the confirmation follow results and may step past the LRs a trial
        # accepts (the settings bound only the smallest budget's): those are left out, and the decision says so.
        outside = sorted({p.lr for p in planned if not accepted_lr(p.lr)})
        if outside:
            planned = [p for p in planned if accepted_lr(p.lr)]
            why += (f"; left out: lr {', '.join(f'{lr:.3g}' for lr in outside)}, outside the LRs a trial accepts "
                    f"(above 0, at most {MAX_LR:g})")
        for p in planned:
            p.why = why
            # readable, and one LR is one number at every budget and seed (so a run can continue another's)
            p.lr = next((lr for lr in known if same_lr(lr, p.lr)), float(f"{p.lr:.4g}"))
        self.queue += planned
        self.decisions.append(Decision(stage, [p.lr for p in planned], why, point))

    def _planned(self, stage: str, point: int) -> bool:
        return self._decided(stage, point) > 0

    def _decided(self, stage: str, point: int) -> int:
        """How often ``stage`` was decided at ``point`` (an extension, a wall or an edge probe each time)."""
        return sum(d.stage == stage and d.point == point for d in self.decisions)

    def _busy(self, point: int | None = None, *stages: str) -> bool:
        """A trial at ``point`` (any, if None) of one of ``stages`` (any, if none) is queued or running."""
        def matches(stage: str, at: int) -> bool:
            return (point is None or at == point) and (not stages or stage in stages)

        running = [(self.plans[tid].stage, self.plans[tid].point) for tid, r in self.runs.items()
                   if not r.done and tid in self.plans]
        return any(matches(p.stage, p.point) for p in self.queue) or any(matches(*s) for s in running)

    def _tried(self, point: int) -> list[float]:
        return sorted({p.lr for p in [*self.plans.values(), *self.queue] if p.point == point})

    def _best(self, point: int):
        return crown(full_budget_ranking(self.runs_at(point)))

    def _grid_settled(self, point: int) -> bool:
        """Its grid (and extensions) ran, and its best LR is not at an end that may still be extended."""
        if not self._planned("grid", point) or self._busy(point, "grid", "extend"):
            return False
        return self._extension(point) is None

    def _settled(self, point: int) -> bool:
        """Its best LR is decided: grid, extensions and seeds ran, and no LR with fewer seeds contends."""
        return (self._grid_settled(point) and self._planned("seeds", point) and self._planned("refine", point)
                and not self._busy(point, *SETTLING) and not self._contenders(point) and self._wall_lr(point) is None)

    def _first_grid(self, point: int) -> None:
        s = self.settings
        lrs = s.first_grid()
        self._plan("grid", point, [Planned("grid", lr, self.budget.seed, point=point) for lr in lrs],
                   f"{len(lrs)} LRs {s.ratio:g}x apart from {s.lr_min:g} to {lrs[-1]:.3g} at the smallest "
                   f"{self.axis.name}")

    def _next_grid(self, smaller: int, point: int) -> None:
        best, _ = self._best(smaller)
        if best is None:
            lrs = self.settings.first_grid()
            self._plan("grid", point, [Planned("grid", lr, self.budget.seed, point=point) for lr in lrs],
                       f"no LR trained the {self.axis.label(smaller)} through: the smallest {self.axis.name}'s "
                       "grid again")
            return
        lrs = self.settings.grid_around(best.lr)
        self._plan("grid", point, [Planned("grid", lr, self.budget.seed, point=point) for lr in lrs],
                   f"{len(lrs)} LRs {self.settings.ratio:g}x apart around the {self.axis.label(smaller)}'s best "
                   f"({best.lr:.3g}), {self.settings.below} below and {self.settings.above} above it: the best LR "
                   f"falls as the {self.axis.name} grows")

    def _extension(self, point: int) -> float | None:
        """The LR beyond the grid's end when the best lies there and extensions remain (None otherwise)."""
        best, _ = self._best(point)
        lrs = self._tried(point)
        extended = self._decided("extend", point)
        if best is None or extended >= self.settings.max_extensions or len(lrs) < 2:
            return None
        if same_lr(best.lr, lrs[0]):
            beyond = lrs[0] / self.settings.ratio
        elif same_lr(best.lr, lrs[-1]) and not any(r.diverged for r in self.runs_at(point)):
            beyond = lrs[-1] * self.settings.ratio
        else:
            return None
        return beyond if accepted_lr(beyond) else None  # no trial trains past the LR limits: the grid ends there

    def _extend(self, point: int) -> None:
        lr = self._extension(point)
        if lr is None:
            return
        self._plan("extend", point, [Planned("extend", lr, self.budget.seed, point=point)],
                   f"the best LR lies at the grid's end: one more LR, {lr:.3g}")

    def _neighbours(self, point: int, lr: float) -> list[float]:
        """``lr`` and the next lower and higher LRs that trained this budget through."""
        lrs = sorted(r.lr for r in full_budget_ranking(self.runs_at(point)))
        i = next(k for k, x in enumerate(lrs) if same_lr(x, lr))
        return lrs[max(0, i - 1): i + 2]

    def _seeds(self, point: int) -> None:
        best, _ = self._best(point)
        seeds = self._seeds_of(self.settings.seeds)[1:]
        if best is None or not seeds:
            why = "one seed per LR (seeds: 1)" if not seeds else f"no LR trained this {self.axis.name} through"
            self._plan("seeds", point, [], why)
            return
        lrs = self._neighbours(point, best.lr)
        self._plan("seeds", point, [Planned("seeds", lr, s, point=point) for lr in lrs for s in seeds],
                   f"the best LR ({best.lr:.3g}) and its neighbours again with seeds {', '.join(map(str, seeds))}: "
                   "the best is chosen on the mean, and the seed spread is the fit's uncertainty")

    def _contenders(self, point: int):
        if self.settings.seeds == 1 or self.seed_rounds.get(point, 0) >= self.settings.seed_rounds:
            return []
        return self._best(point)[1]

    def _reseed(self, point: int) -> None:
        contenders = self._contenders(point)
        if not contenders:
            return
        best, _ = self._best(point)
        self.seed_rounds[point] = self.seed_rounds.get(point, 0) + 1
        planned = [Planned("seeds", r.lr, s, point=point) for r in contenders for s in best.seeds if s not in r.seeds]
        self._plan("seeds", point, planned,
                   ", ".join(f"lr {r.lr:.3g}" for r in contenders) + f" beat the best ({best.lr:.3g}) on the seeds "
                   f"they share: given its seeds before the {self.axis.name}'s best LR is settled")

    def _seeds_of(self, count: int) -> list[int]:
        """The first ``count`` seeds of the search: the base seed, then base + 1, ..."""
        return [self.budget.seed + k for k in range(count)]

    def _refine(self, point: int) -> None:
        """The LRs halfway (in log) between the crowned best and its neighbours, ``seeds`` runs each: LR* is then
        located on five LRs sqrt(ratio) apart, not on the coarse grid's three."""
        best, _ = self._best(point)
        if best is None or not self.settings.refine:
            self._plan("refine", point, [], f"no LR trained this {self.axis.name} through" if best is None
                       else "refine: false (LR* located on the grid's own LRs)")
            return
        tried = self._tried(point)
        lrs = [math.sqrt(best.lr * lr) for lr in self._neighbours(point, best.lr) if not same_lr(lr, best.lr)]
        lrs = [lr for lr in lrs if not any(same_lr(lr, t) for t in tried)]
        seeds = self._seeds_of(self.settings.seeds)
        self._plan("refine", point, [Planned("refine", lr, s, point=point) for lr in lrs for s in seeds],
                   f"LR* located between grid points: {', '.join(f'{lr:.3g}' for lr in lrs)}, halfway (in log) "
                   f"between the best ({best.lr:.3g}) and its neighbours, {len(seeds)} seed"
                   f"{'s' * (len(seeds) > 1)} each")

    def _wall_lr(self, point: int) -> float | None:
        """One LR beyond the LRs tried on a side where none is clearly worse than the best, while walls remain: LR*
        is bounded only between LRs clearly worse (lmtune.analysis.landscape.best_lr_interval). None: no wall needed."""
        walls = self._decided("wall", point)
        if not self._planned("refine", point) or walls >= self.settings.walls:
            return None
        # the LRs as the fit sees them (no edge probes: budgets.locate_budgets), and beyond those trained through:
        # a wall past an LR that failed would fail too
        ranking = full_budget_ranking(r for r in self.runs_at(point) if r.stage != "edge")
        if not ranking:
            return None
        low, high = best_lr_interval(ranking)
        lrs = sorted(r.lr for r in ranking)
        beyond = (lrs[0] / self.settings.ratio if low is None else
                  lrs[-1] * self.settings.ratio if high is None else None)
        failed = bracket(self.runs_at(point)).diverged_lr
        if beyond is None or not accepted_lr(beyond) or (failed is not None and beyond * SAME_LR >= failed):
            return None
        return beyond

    def _wall(self, point: int) -> None:
        lr = self._wall_lr(point)
        if lr is None:
            return
        seeds = self._seeds_of(self.settings.seeds)
        side = "below" if lr < min(self._tried(point)) else "above"
        self._plan("wall", point, [Planned("wall", lr, s, point=point) for s in seeds],
                   f"no LR {side} the best is clearly worse than it: {lr:.3g}, one grid step beyond the LRs tried, "
                   f"so that LR* is bounded {side}")

    def _edge(self, point: int) -> None:
        """The next probe for where training fails at this budget, once its grid is settled. The edge moves
        little from one budget to the next, so the smaller budget's bracket is probed first."""
        if self._edge_done(point) or self._busy(point, "edge") or not self._grid_settled(point):
            return
        i = self.axis.points.index(point)
        if i > 0 and not self._edge_done(self.axis.points[i - 1]):
            return  # its bracket is the best first guess of this one's
        edge = bracket(self.runs_at(point))
        if edge.diverged_lr is None:
            lr = next((x for x in self._smaller_bracket(point) if x > edge.stable_lr * SAME_LR), None)
            why = f"every LR up to {edge.stable_lr:.3g} trained through: "
            why += (f"{lr:.3g}, an end of the smaller {self.axis.name}'s bracket" if lr is not None
                    else f"a probe {self.settings.edge_ratio:g}x above")
            lr = lr or edge.stable_lr * self.settings.edge_ratio
        else:
            lr = math.sqrt(edge.stable_lr * edge.diverged_lr)
            why = f"bracket [{edge.stable_lr:.3g}, {edge.diverged_lr:.3g}] {edge.ratio:.2f} wide: its midpoint"
        self._plan("edge", point, [Planned("edge", lr, self.budget.seed, point=point)], why)

    def _edge_done(self, point: int) -> bool:
        """No further edge probe at this budget: its bracket is resolved, or it cannot be, or probes ran out."""
        probes = self._decided("edge", point)
        edge = bracket(self.runs_at(point))
        return (probes >= self.settings.edge_probes or edge.stable_lr is None
                or edge.resolved(self.settings.edge_tolerance)) and not self._busy(point, "edge")

    def _smaller_bracket(self, point: int) -> list[float]:
        """The next smaller budget's edge bracket (its ends that are known), low end first."""
        i = self.axis.points.index(point)
        if i == 0:
            return []
        edge = bracket(self.runs_at(self.axis.points[i - 1]))
        return [lr for lr in (edge.stable_lr, edge.diverged_lr) if lr is not None]

    def _confirm(self) -> None:
        target = self.axis.target
        self.fit, self.fit_problem = self._fit()
        if self.fit is None:
            self._plan("target", target, [], f"no fit: {self.fit_problem}")
            return
        lrs = self.settings.confirmation_lrs(self.fit.predicted_lr)
        low, high = self.fit.predicted_lr_interval
        seeds = self._seeds_of(self.settings.confirm_seeds)
        slope, where = self._fit_words(self.fit)
        self._plan("target", target, [Planned("target", lr, s, point=target) for lr in lrs for s in seeds],
                   f"the fit predicts {self.fit.predicted_lr:.3g} (interval {low:.3g}-{high:.3g}, {slope}) at "
                   f"{where}: it and {self.settings.confirm_ratio:g}x either side, trained at the target with "
                   f"{len(seeds)} seed{'s' * (len(seeds) > 1)}")

    def _fit(self) -> tuple[SearchFit | None, str | None]:
        """The power law through the searched points' LR*s (None and why, where there is none): the search's own."""
        raise NotImplementedError

    def _fit_words(self, fit: SearchFit) -> tuple[str, str]:
        """The fit's slope and where it predicts, for the confirmation's reason (the search's own)."""
        raise NotImplementedError

    # -- state -------------------------------------------------------------------------------

    def conclusion(self) -> JsonObject:
        """Per point, what its runs show (best LR, seeds, edge), the fit and the confirmation."""
        per_point = {str(p): conclude(self.runs_at(p), self.axis.budget_at(p)).to_json()
                     for p in [*self.axis.points, self.axis.target]}
        return {f"{self.axis.name}s": per_point, "fit": self.fit.to_json() if self.fit else None,
                "fit_problem": self.fit_problem}

    def to_json(self) -> JsonObject:
        return {**super().to_json(), "seed_rounds": {str(k): v for k, v in self.seed_rounds.items()},
                "fit": self.fit.to_json() if self.fit else None, "fit_problem": self.fit_problem}

    def _restore(self, data: JsonObject) -> None:
        self.seed_rounds = {int(k): int(v) for k, v in (data.get("seed_rounds") or {}).items()}
        self.fit = self.fit_class.from_json(data["fit"]) if data.get("fit") else None
        self.fit_problem = data.get("fit_problem")

