"""A search as three small contracts, one per file of its folder: what its section of a space file holds
(``SpaceSection``: the strategy, its folder's ``__init__.py``), where its next trial comes from (``TrialSource``: its
decisions, ``search.py``), and what its part of the report says (lmtune.findings.part.ReportPart:
``report.py``). lmtune.searches.STRATEGIES registers each search's three by its ``search:`` value.

Grid and optuna have no trial source of their own to write: Tune generates a grid's trials, and Ray's OptunaSearch
suggests optuna's (their strategy's ``searcher``); their report part is the common report's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Protocol

from lmtune.analysis.runs import Budget, Run
from lmtune.errors import LmtuneError
from lmtune.files import JsonObject
from lmtune.searches.trial_order import TuneParams, TuneResult

Fail = Callable[[str, str], LmtuneError]
"""fail(key, message): the one-line error naming the space file and the key."""


class SpaceSection(Protocol):
    """What a search's part of a space file holds: its keys, parsed and validated, and their JSON in sweep.json. The
    strategy (lmtune.searches.base.SearchStrategy) is one, frozen; it also says what the sweep runs."""

    name: ClassVar[str]
    """Its ``search:`` value."""
    keys: ClassVar[frozenset[str]]
    """The top-level keys of a space file it reads (besides those every space has)."""

    @classmethod
    def parse(cls, raw: JsonObject, fail: Fail) -> SpaceSection:
        """Args: raw: the space file's top-level mapping; fail: makes the error for a key (raise it). Its settings,
        each problem one ``fail`` naming the key (``edge.tolerance``) and what to write instead."""

    @classmethod
    def from_json(cls, data: JsonObject) -> SpaceSection:
        """Args: data: the space's entry of sweep.json (``to_json``'s keys among the others). Itself, as written."""

    def to_json(self) -> JsonObject:
        """Its keys of the space's JSON: the same keys as its YAML, so that ``from_json`` reads them back."""


class TrialSource(Protocol):
    """Where a search's next trial comes from, Ray-free: the one Tune adapter (lmtune.sweep.searcher.
    DecidingSearcher) answers Tune's ``suggest`` with ``suggest``, ``on_trial_result`` with ``observe`` and
    ``on_trial_complete`` with ``complete``, and keeps its state in Tune's snapshot (``save``/``restore``) and in
    decisions/NAME_search.json as ``to_json``/``from_json``. A DecidingSearch (lmtune.searches.deciding) is one."""

    name: ClassVar[str]
    """Its ``search:`` value; it names the state file, decisions/NAME_search.json."""
    decisions: list[Any]
    """The stages it decided, in order, each with a ``stage`` and a ``why`` (the log and the report print them)."""
    max_pending: int
    """The most of its trials that may run at once (Tune's ``set_max_concurrency`` sets it)."""

    @property
    def runs(self) -> dict[str, Run]:
        """Its trials' runs by trial id, as it has tracked them (a resume asks which had ended)."""

    def suggest(self, trial_id: str) -> TuneParams | str:
        """Args: trial_id: the trial Tune will start. Its order (lmtune.searches.trial_order.TrialOrder, as Tune
        carries it), or WAIT (nothing to start until a trial reports) or FINISHED (lmtune.searches.deciding)."""

    def observe(self, trial_id: str, result: TuneResult) -> None:
        """Args: trial_id: one of its trials; result: a row it reported (tokens, and val_loss at an evaluation)."""

    def complete(self, trial_id: str, outcome: str, result: TuneResult | None = None) -> Any:
        """Args: trial_id: one of its trials, ended; outcome: the ledger's word for how (completed, diverged,
        stopped_early, error); result: its last row (None: none), which may say where it diverged."""

    def requeue(self, trial_id: str, why: str) -> None:
        """Args: trial_id: a trial that can never report (its driver died); why: the word its state keeps for it.
        Plan its trial again, first."""

    def to_json(self) -> JsonObject:
        """Its whole state, as JSON (Tune's snapshot and decisions/NAME_search.json hold it)."""

    @classmethod
    def from_json(cls, data: JsonObject) -> TrialSource:
        """Args: data: what ``to_json`` wrote. The search where it was."""


class TrialSourceClass(Protocol):
    """A deciding strategy's ``search_class`` (lmtune.searches.base.DecidingDefaults): its ``TrialSource`` as a class,
    made from the strategy's settings and the sweep's budget. mypy checks each strategy's against it, so a search whose
    decisions miss a member of ``TrialSource`` fails the type check (scripts/test.sh), not a user's sweep."""

    def __call__(self, settings: Any, budget: Budget) -> TrialSource:
        """Args: settings: the strategy's settings; budget: the sweep's trials' budget. Its decisions, at the
        start."""
        ...
