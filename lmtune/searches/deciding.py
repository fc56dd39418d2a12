"""What the searches that decide as they go (edge, horizon, width, compare) share, Ray-free: the runs they have
started, the plan each trial got, the queue, their decisions; taking Tune's results in; planning again a trial that
can never report; and the JSON of that state. Each search adds its own stages (``_decide``) and state."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import ClassVar, Generic, TypeVar

from lmtune.analysis.runs import Budget, Run
from lmtune.files import JsonObject
from lmtune.searches.trial_order import TrialOrder, TuneParams, TuneResult, evaluated_val_loss
from lmtune.training.divergence import BY_RULE, WHOLE_RUN

# What a search that decides as it goes answers suggest() with when it has no trial to give.
WAIT, FINISHED = "wait", "finished"

@dataclass(frozen=True)
class Decision:
    """A stage's plan: the LRs it asked for, and why (at which point of its axis, for a search along one)."""

    stage: str
    lrs: list[float]
    why: str
    point: int | None = None
    """The budget in steps (search: horizon) or the width, d_model (search: width); None for the edge search."""


@dataclass
class Planned:
    """A trial a search asks for: its stage, LR (None: the range test, whose LR rises over its run) and seed, why,
    and (for a search along an axis) its point; the run it continues, if any."""

    stage: str
    lr: float | None
    seed: int
    why: str = ""
    point: int | None = None
    """The budget in steps (search: horizon) or the width, d_model (search: width); None for the edge search."""
    continue_from: str | None = None
    """The trial id of an ASHA-cut run this one continues from its newest checkpoint (the edge search)."""
    fork_from: str | None = None
    """Under WSD: the trial id of this LR and seed's run at a smaller budget, whose stable phase this run
    continues from where it ended (the same run as from scratch: lmtune.training.fork)."""

    def config(self, early_stop: bool = True) -> TuneParams:
        """The trial's order as Tune carries it: its stage, LR and seed, the run it continues, and whether the
        stopper's divergence rule may end it; not what its point sets (a search along an axis adds that:
        lmtune.searches.axis.axis.SearchAxis.params)."""
        settings = {"seed": self.seed, **({"lr": self.lr} if self.lr is not None else {})}
        return TrialOrder(settings, stage=self.stage, continue_from=self.continue_from, fork_from=self.fork_from,
                          early_stop=early_stop).to_tune()


PlannedT = TypeVar("PlannedT")
"""A search's own dataclass of a trial it asks for (its stage, LR, seed, why: ``planned_class``)."""
DecisionT = TypeVar("DecisionT")
"""A search's own dataclass of a stage it decided (the stage, its LRs, why: ``decision_class``)."""


class DecidingSearch(Generic[PlannedT, DecisionT]):
    """The state every deciding search keeps, and how it answers Tune (``suggest``): a TrialSource
    (lmtune.searches.contracts). A subclass sets ``name``, ``settings_class``, ``planned_class`` and
    ``decision_class``; decides its stages (``_decide``: plans trials into ``queue``, or sets ``finished``); says what
    run a planned trial starts (``_start``); and adds its own keys to ``to_json`` / ``_restore``."""

    name: ClassVar[str]
    """Its ``search:`` value (it names the search's state file, decisions/NAME_search.json)."""
    settings_class: ClassVar[type]
    planned_class: ClassVar[type]
    decision_class: ClassVar[type]
    renamed: ClassVar[dict[str, str]] = {}
    """Keys of its plans and decisions an earlier version's state file named otherwise: old name -> new."""
    whole_budget_only: ClassVar[bool] = False
    """Whether it compares LRs only at a run's whole budget (its space then refuses a scheduler that cuts runs)."""
    axis_columns: ClassVar[tuple[str, ...]] = ()
    """What its trials step along besides the LR, shown in the progress table (steps, d_model)."""

    def __init__(self, settings, budget: Budget, max_pending: int = 1):
        self.settings, self.budget, self.max_pending = settings, budget, max_pending
        self.runs: dict[str, Run] = {}
        self.plans: dict[str, PlannedT] = {}  # trial id -> the plan it got
        self.queue: list[PlannedT] = []
        self.decisions: list[DecisionT] = []  # in the order decided
        self.finished = False
        self.interrupted: dict[str, str] = {}  # trial id -> why its plan was run again in another trial

    def suggest(self, trial_id: str) -> TuneParams | str:
        """The next trial's order (as Tune carries it), WAIT (nothing to start now) or FINISHED."""
        if self.finished:
            return FINISHED
        if sum(not r.done for r in self.runs.values()) >= self.max_pending:
            return WAIT
        self._replan()
        if not self.queue:
            return FINISHED if self.finished else WAIT
        planned = self._next_planned()
        self.queue.remove(planned)
        return self.start_planned(trial_id, planned)

    def start_planned(self, trial_id: str, planned: PlannedT) -> TuneParams:
        """Start ``planned`` in trial ``trial_id`` (its own queue's next, or a trial planned on its behalf by the
        search it is part of: a compare search's run of a variant at the reference's best LR); its order, as Tune
        carries it."""
        self.runs[trial_id] = self._start(trial_id, planned)
        self.plans[trial_id] = planned
        return self._order(planned)

    # -- what a search decides (each search's own) -------------------------------------------------------

    def _replan(self) -> None:
        """Plan the next stage's trials into ``queue`` (or set ``finished``) if the runs so far say to."""
        if not self.queue:
            self._decide()

    def _decide(self) -> None:
        raise NotImplementedError

    def _next_planned(self) -> PlannedT:
        """Which queued trial to start next (the first, unless a search says otherwise)."""
        return self.queue[0]

    def _start(self, trial_id: str, planned: PlannedT) -> Run:
        """The run a planned trial starts, as the search tracks it."""
        raise NotImplementedError

    def _order(self, planned: PlannedT) -> TuneParams:
        """The planned trial's order, as Tune carries it."""
        return planned.config()

    # -- what Tune tells it ------------------------------------------------------------------------------

    def observe(self, trial_id: str, result: TuneResult) -> None:
        """A result the trial reported: its tokens and, at an evaluation, its val loss."""
        run = self.runs.get(trial_id)
        tokens = result.get("tokens")
        if run is None or not isinstance(tokens, (int, float)) or not math.isfinite(tokens):
            return
        run.tokens = max(run.tokens, int(tokens))
        loss = evaluated_val_loss(result)
        if loss is not None and math.isfinite(loss):
            run.val[int(tokens)] = float(loss)

    def complete(self, trial_id: str, outcome: str, result: TuneResult | None = None) -> Run | None:
        """The trial ended with ``outcome`` (the ledger's word for it); ``result`` may say how a divergence was
        established (``divergence``, ``diverged_tokens``, ``diverged_step``). Returns its run (None: not ours)."""
        run = self.runs.get(trial_id)
        if run is None:
            return None
        result = result or {}
        self.observe(trial_id, result)
        run.outcome = outcome
        if run.diverged:
            run.divergence = result.get("divergence") or (WHOLE_RUN if run.full else BY_RULE)
            step = result.get("diverged_step")
            run.diverged_tokens = result.get("diverged_tokens") or (
                int(step) * self.budget.tokens_per_step if isinstance(step, (int, float)) else run.tokens)
        return run

    def requeue(self, trial_id: str, why: str) -> None:
        """A trial that can never report (its driver died before Tune's snapshot knew of it): forget its run
        and plan it again, first."""
        self.runs.pop(trial_id, None)
        plan = self.plans.pop(trial_id, None)
        if plan is not None:
            self.queue.insert(0, plan)
        self.interrupted[trial_id] = why

    def conclusion(self) -> JsonObject:
        raise NotImplementedError

    def to_json(self) -> JsonObject:
        return {
            "settings": asdict(self.settings), "budget": asdict(self.budget), "max_pending": self.max_pending,
            "runs": {tid: run.to_json() for tid, run in self.runs.items()},
            "plans": {tid: asdict(p) for tid, p in self.plans.items()}, "queue": [asdict(p) for p in self.queue],
            "decisions": [asdict(d) for d in self.decisions], "finished": self.finished,
            "interrupted": self.interrupted, "conclusion": self.conclusion(),
        }

    @classmethod
    def from_json(cls, data: JsonObject):
        budget = data["budget"]
        known = cls.settings_class.__dataclass_fields__
        search = cls(cls.settings_class(**{k: v for k, v in data["settings"].items() if k in known}),
                     Budget(**{**budget, "rungs": tuple(budget["rungs"])}), data.get("max_pending", 1))
        search.runs = {tid: Run.from_json(run) for tid, run in data["runs"].items()}
        search.plans = {tid: _plan(cls.planned_class, cls._renamed(p)) for tid, p in data["plans"].items()}
        search.queue = [_plan(cls.planned_class, cls._renamed(p)) for p in data["queue"]]
        search.decisions = [cls.decision_class(**cls._renamed(d)) for d in data["decisions"]]
        search.finished = data["finished"]
        search.interrupted = dict(data.get("interrupted") or {})
        search._restore(data)
        return search

    @classmethod
    def _renamed(cls, data: JsonObject) -> JsonObject:
        return {cls.renamed.get(k, k): v for k, v in data.items()}

    def _restore(self, data: JsonObject) -> None:
        """The subclass's own keys of ``to_json``."""


def _plan(planned_class: type, data: JsonObject):
    return planned_class(**{k: v for k, v in data.items() if k in planned_class.__dataclass_fields__})
