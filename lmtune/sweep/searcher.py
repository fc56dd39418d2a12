"""Any search that decides as it goes (edge, horizon, width, a new one) as a Ray Tune Searcher: Tune asks it for
trials and tells it their results; the decisions are the Ray-free search's (a DecidingSearch: suggest, observe,
complete, requeue, to_json/from_json), one adapter for all of them.

Concurrency is the searcher's own (it returns True from ``set_max_concurrency``): it knows which
trials run. Its state goes into Tune's experiment snapshot (``save``/``restore``, taken together with
the trials' states, so a resumed sweep continues the same search) and, after every decision, into
decisions/ (NAME_search.json: edge_search.json, ...), which the run summary and the report read. How a trial
ended comes from the sweep's ledger, whose writer has recorded every stop before Tune tells the searcher.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from ray.tune.search import Searcher

from lmtune.analysis.runs import INTERRUPTED, Budget
from lmtune.files import atomic_write_json
from lmtune.searches.base import SearchStrategy
from lmtune.searches.deciding import FINISHED, WAIT
from lmtune.searches.state import read_state_file, search_state_path
from lmtune.searches.trial_order import TuneParams, TuneResult, check_objective
from lmtune.sweep.record import read_outcomes, rebased, trial_folders
from lmtune.sweep.stopping import outcome_of
from lmtune.training.lr_range import read_range_test
from lmtune.training.metrics import METRICS_FILE, read_metrics

log = logging.getLogger(__name__)


class DecidingSearcher(Searcher):
    """Tune's side of any deciding search: ``search`` is its Ray-free decisions (a DecidingSearch), whose name (its
    ``search:`` value) names its state file in decisions/ and its lines in the log."""

    def __init__(self, search, sweep_dir: Path | None = None, metric: str = "val_loss", mode: str = "min"):
        super().__init__(metric=metric, mode=mode)
        self.search = search
        self.name = search.name
        self.label = f"{self.name} search"
        self.sweep_dir = Path(sweep_dir) if sweep_dir is not None else None
        """lmtune's own sweep folder (its ledger and decisions/); None in a user's own Tuner: the search then
        learns every trial's ending from Tune's results alone and keeps its state only through save/restore."""

    def __setstate__(self, state: dict[str, object]) -> None:
        # Restored by Tune on --resume (its experiment snapshot pickles the searcher): the sweep folder this driver
        # resumes in (lmtune.sweep.record.rebased).
        self.__dict__.update(state, sweep_dir=rebased(state.get("sweep_dir"), state.get("sweep_dir")))

    def state_path(self) -> Path | None:
        return search_state_path(self.sweep_dir, self.name) if self.sweep_dir is not None else None

    def set_search_properties(self, metric: str | None, mode: str | None, config: TuneParams, **spec: Any) -> bool:
        """A user's ``TuneConfig(metric=..., mode=...)``: the search ranks runs by their validation loss, lowest
        first, and takes nothing else. ``config`` (the Tuner's param_space) may hold fixed values only: Tune
        adds them to every trial the search suggests."""
        check_objective(f"the {self.label}", metric, mode)
        return True

    def set_max_concurrency(self, max_concurrent: int) -> bool:
        self.search.max_pending = max_concurrent
        return True

    def suggest(self, trial_id: str) -> TuneParams | str | None:
        decided = len(self.search.decisions)
        answer = self.search.suggest(trial_id)
        for decision in self.search.decisions[decided:]:
            log.info("%s, %s: %s", self.label, decision.stage, decision.why)
        if answer == WAIT:
            if len(self.search.decisions) != decided:
                self._mirror()
            return None
        self._mirror()
        return Searcher.FINISHED if answer == FINISHED else answer

    def on_trial_result(self, trial_id: str, result: TuneResult) -> None:
        self.search.observe(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: TuneResult | None = None, error: bool = False) -> None:
        result = dict(result or {})
        self._backfill(trial_id, result)
        self.search.complete(trial_id, self._outcome(trial_id, result, error), result)
        self._mirror()

    def _outcome(self, trial_id: str, result: TuneResult, error: bool) -> str:
        """The ledger's word for how the trial ended (the stopper and ASHA record theirs before Tune tells the
        searcher); without a ledger, or before it has one, what the trial's last result shows."""
        recorded = read_outcomes(self.sweep_dir).get(trial_id, {}).get("outcome") if self.sweep_dir else None
        if recorded:
            return str(recorded)
        return "error" if error else str(outcome_of(result)[0])

    def _backfill(self, trial_id: str, result: TuneResult) -> None:
        """What the trial's own files hold that Tune's results may lack (a trial that ended after the
        experiment snapshot a resume started from): its evaluations, and a range test's finding."""
        if self.sweep_dir is None:
            return
        folder = next((f for f in trial_folders(self.sweep_dir) if f.trial_id == trial_id), None)
        if folder is None:
            return
        if "steepest_lr" not in result and (found := read_range_test(folder.path)) is not None:
            result.update(steepest_lr=found.steepest_lr, min_loss_lr=found.min_loss_lr, blowup_lr=found.blowup_lr)
        summary = folder.read_json("summary.json")
        if summary.get("status") == "diverged":  # where and how, when Tune's last result lacks it
            result.setdefault("diverged_step", summary.get("diverged_step"))
            result.setdefault("divergence", summary.get("diverged_how"))
        metrics = folder.path / METRICS_FILE
        if metrics.exists():
            for row in read_metrics(metrics):
                self.search.observe(trial_id, {"tokens": row["tokens"], "val_loss": row.get("val_loss")})

    def _mirror(self) -> None:
        if self.sweep_dir is not None:
            atomic_write_json(self.state_path(), self.search.to_json())

    def save(self, checkpoint_path: str) -> None:
        atomic_write_json(Path(checkpoint_path), self.search.to_json())

    def restore(self, checkpoint_path: str) -> None:
        """Continue from the newest state: its file in decisions/, written at every decision, is
        newer than Tune's snapshot (``checkpoint_path``) whenever trials started after that snapshot.
        Tune's restored trial list lacks those, so they would be planned again; instead each one that
        ended is taken with its ledger outcome, and each one that was still running is planned anew."""
        search_class = type(self.search)
        snapshot = search_class.from_json(json.loads(Path(checkpoint_path).read_text()))
        latest = read_state_file(self.state_path()) if self.sweep_dir is not None else None
        if latest is None or not set(snapshot.runs) <= set(latest.get("runs", {})):
            self.search = snapshot  # no mirror, or not this search's: Tune's own state
            return
        try:
            self.search = search_class.from_json(latest)
        except (KeyError, TypeError, ValueError, AttributeError) as err:  # an edited or damaged mirror
            log.warning("%s: ignoring %s (%s: %s); resuming from Tune's own snapshot", self.label,
                        self.state_path(), type(err).__name__, err)
            self.search = snapshot
            return
        ledger = read_outcomes(self.sweep_dir)
        for trial_id, run in list(self.search.runs.items()):
            if run.done or trial_id in snapshot.runs:
                continue  # Tune knows it: it resumes it or has its result
            outcome = ledger.get(trial_id, {}).get("outcome")
            if outcome:
                result: TuneResult = {}  # as Tune's last result would have held it
                self._backfill(trial_id, result)
                self.search.complete(trial_id, str(outcome), result)
                log.info("%s: trial %s ended (%s) after Tune's last snapshot; its result is kept",
                         self.label, trial_id, outcome)
            else:
                self.search.requeue(trial_id, INTERRUPTED)
                log.info("%s: trial %s was running when the driver stopped; planned again", self.label, trial_id)
        self._mirror()


def tune_search_alg(strategy: SearchStrategy, budget: Budget, sweep_dir: Path | None) -> tuple[Searcher | None, int]:
    """Tune's search_alg and num_samples for a sweep's search: a deciding search's decisions through the one adapter
    (num_samples -1: until it has finished), else the strategy's own (grid: Tune's generation; optuna: its
    OptunaSearch)."""
    decisions = strategy.decisions(budget)
    if decisions is not None:
        return DecidingSearcher(decisions, sweep_dir), -1
    return strategy.searcher(budget, sweep_dir)
