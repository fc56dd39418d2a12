"""The compare search (``search: compare``): every variant gets an LR search of its own (an edge search: its best LR,
how the loss degrades above it, where training fails), all in one sweep: one Tune experiment, one ledger, one state
file. Ray-free and deterministic, driven like any deciding search (lmtune.sweep.searcher).

How the variants share the sweep: a trial slot goes to the first variant, in the space's order (the reference
first), whose search has a trial to run; a variant waiting on its runs' results leaves the slot to the next. Each
trial carries its variant's name and settings (a batch-size variant its scaled steps); each variant's search sees only
its own runs, at its own budget (the same tokens). Under ASHA each variant's coarse grid is cut by an ASHA of the
variant's own (lmtune.sweep.variant_asha: one ASHA would judge one variant's runs against another's), at the same
rungs in tokens.

With ``start: reference`` a later variant's search waits for the reference's to finish and starts from its answer
(no range test; a grid around the reference's best LR and the ends of its edge bracket: EdgeSearch's WarmStart):
fewer runs where the variant's optimum stays near the reference's, the same stages after its first grid.

Once the reference's search has finished, every other variant whose search has finished also trains the reference's
best LR with the reference's seeds (stage ``at_reference``), where it lacks them: the variant's loss at the previous
optimal LR, which a comparison at each variant's own best LR does not show (does the no-norm model diverge there?).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import ClassVar

from lmtune.analysis.bracket import bracket
from lmtune.analysis.conclusion import conclude
from lmtune.analysis.runs import Budget, LrResult, Run, same_lr
from lmtune.files import JsonObject
from lmtune.searches.compare.settings import START_REFERENCE, CompareSettings, Variant
from lmtune.searches.deciding import FINISHED, WAIT
from lmtune.searches.edge.search import EdgeSearch, Planned, WarmStart
from lmtune.searches.trial_order import RANGE_STAGE, TrialOrder, TuneParams, TuneResult

# The stage of a variant's run at the reference's best LR.
AT_REFERENCE = "at_reference"


@dataclass(frozen=True)
class VariantDecision:
    """A stage one variant's search decided: the variant, the stage and why (as the sweep's log says it)."""

    stage: str
    """``VARIANT: STAGE`` (what the log and the report show)."""
    why: str
    variant: str


class CompareSearch:
    """The variants' searches and which trial is whose. Its whole state is JSON (``to_json``/``from_json``)."""

    name: ClassVar[str] = "compare"
    settings_class: ClassVar[type] = CompareSettings
    whole_budget_only: ClassVar[bool] = False
    axis_columns: ClassVar[tuple[str, ...]] = ("variant",)

    def __init__(self, settings: CompareSettings, budget: Budget, max_pending: int = 1):
        self.settings, self.budget = settings, budget
        self.searches: dict[str, EdgeSearch] = {
            v.name: EdgeSearch(settings.edge, v.budget(budget), max_pending) for v in settings.variants}
        self.owner: dict[str, str] = {}  # trial id -> its variant
        self.decisions: list[VariantDecision] = []
        self.interrupted: dict[str, str] = {}
        self._max_pending = max_pending

    @property
    def max_pending(self) -> int:
        return self._max_pending

    @max_pending.setter
    def max_pending(self, value: int) -> None:
        self._max_pending = value
        for search in self.searches.values():
            search.max_pending = value

    @property
    def finished(self) -> bool:
        return (all(search.finished for search in self.searches.values()) and self._at_reference() is None
                and all(run.done for run in self.runs.values()))

    @property
    def runs(self) -> dict[str, Run]:
        """Every variant's runs by trial id."""
        return {tid: run for search in self.searches.values() for tid, run in search.runs.items()}

    def runs_of(self, variant: str) -> list[Run]:
        return list(self.searches[variant].runs.values())

    def suggest(self, trial_id: str) -> TuneParams | str:
        """The next trial's order (its variant's name and settings added), WAIT or FINISHED."""
        if self.finished:
            return FINISHED
        if sum(not r.done for r in self.runs.values()) >= self._max_pending:
            return WAIT
        for variant in self.settings.variants:
            search = self.searches[variant.name]
            if not self._may_start(variant, search):
                continue
            decided = len(search.decisions)
            answer = search.suggest(trial_id)
            self.decisions += [VariantDecision(f"{variant.name}: {d.stage}", d.why, variant.name)
                               for d in search.decisions[decided:]]
            if isinstance(answer, dict):
                self.owner[trial_id] = variant.name
                return self._order(variant, answer)
        if (extra := self._at_reference()) is not None:
            variant, planned = extra
            self.decisions.append(VariantDecision(f"{variant.name}: {AT_REFERENCE}", planned.why, variant.name))
            self.owner[trial_id] = variant.name
            return self._order(variant, self.searches[variant.name].start_planned(trial_id, planned))
        return FINISHED if self.finished else WAIT

    def _may_start(self, variant: Variant, search: EdgeSearch) -> bool:
        """Whether ``variant``'s search may ask for trials: always, unless it starts from the reference's answer
        (``start: reference``) and has not started yet; then once the reference's search has finished, from its
        best LR and edge bracket (or, where the reference crowned no best LR, as a search of its own)."""
        if self.settings.start != START_REFERENCE or variant.name == self.settings.reference.name or search.decisions:
            return True
        reference = self.searches[self.settings.reference.name]
        if not reference.finished:
            return False
        best = self.reference_best()
        if best is not None:
            edge = bracket([r for r in reference.runs.values() if r.stage != RANGE_STAGE])
            search.start = WarmStart(best.lr, edge.stable_lr, edge.diverged_lr)
        return True

    def reference_best(self) -> LrResult | None:
        """The reference's crowned best LR (None: its search has not finished, or crowned none)."""
        reference = self.searches[self.settings.reference.name]
        if not reference.finished:
            return None
        return conclude([r for r in reference.runs.values() if r.stage != RANGE_STAGE], reference.budget).best

    def _at_reference(self) -> tuple[Variant, Planned] | None:
        """The next run at the reference's best LR a finished variant lacks (one per seed of the reference's best)."""
        best = self.reference_best()
        if best is None:
            return None
        for variant in self.settings.variants[1:]:
            search = self.searches[variant.name]
            if not search.finished:
                continue
            have = {r.seed for r in search.runs.values() if r.stage != RANGE_STAGE and same_lr(r.lr, best.lr)}
            for seed in best.seeds:
                if seed not in have:
                    return variant, Planned(AT_REFERENCE, best.lr, seed,
                                            f"the reference's best LR {best.lr:.3g}, seed {seed}: the variant's loss "
                                            "at the reference's optimum")
        return None

    def _order(self, variant: Variant, answer: TuneParams) -> TuneParams:
        order = TrialOrder.from_tune(answer)
        settings = {**variant.settings, **order.settings}  # (resolved: a batch-size variant's steps are in them)
        return TrialOrder(settings, order.stage, order.continue_from, order.fork_from, order.early_stop,
                          variant=variant.name).to_tune()

    def observe(self, trial_id: str, result: TuneResult) -> None:
        if trial_id in self.owner:
            self.searches[self.owner[trial_id]].observe(trial_id, result)

    def complete(self, trial_id: str, outcome: str, result: TuneResult | None = None) -> Run | None:
        if trial_id not in self.owner:
            return None
        return self.searches[self.owner[trial_id]].complete(trial_id, outcome, result)

    def requeue(self, trial_id: str, why: str) -> None:
        variant = self.owner.pop(trial_id, None)
        if variant is not None:
            self.searches[variant].requeue(trial_id, why)
        self.interrupted[trial_id] = why

    def conclusion(self) -> JsonObject:
        return {name: search.conclusion() for name, search in self.searches.items()}

    def to_json(self) -> JsonObject:
        return {"settings": self.settings.to_json(), "budget": asdict(self.budget), "max_pending": self._max_pending,
                "variants": {name: search.to_json() for name, search in self.searches.items()},
                "owner": self.owner, "decisions": [asdict(d) for d in self.decisions],
                "runs": {tid: run.to_json() for tid, run in self.runs.items()}, "finished": self.finished,
                "interrupted": self.interrupted, "conclusion": self.conclusion()}

    @classmethod
    def from_json(cls, data: JsonObject) -> CompareSearch:
        budget = data["budget"]
        search = cls(CompareSettings.from_json(data["settings"]), Budget(**{**budget, "rungs": tuple(budget["rungs"])}),
                     data.get("max_pending", 1))
        search.searches = {name: EdgeSearch.from_json(state) for name, state in data["variants"].items()}
        search.owner = dict(data["owner"])
        search.decisions = [VariantDecision(**d) for d in data["decisions"]]
        search.interrupted = dict(data.get("interrupted") or {})
        return search
