"""ASHA that survives a driver restart and judges trials in the sweep's order (``PersistentASHA``)."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from ray.tune.schedulers import AsyncHyperBandScheduler, TrialScheduler

from lmtune.analysis.rungs import Rungs
from lmtune.analysis.runs import Outcome, format_tokens
from lmtune.files import atomic_write_json
from lmtune.private_apis import asha_rungs, asha_stopped_count, restore_asha_rungs
from lmtune.searches.trial_order import TrialOrder, TuneResult, check_objective, evaluated_val_loss
from lmtune.sweep.record import rebased
from lmtune.sweep.stopping import Ending, Members, OutcomeRecorder, format_value

log = logging.getLogger(__name__)


class PersistentASHA(AsyncHyperBandScheduler):
    """Tune's ASHA on ``metric`` against ``time_attr``, with its rung records saved after every decision
    and reloaded after ``Tuner.restore`` (which does not restore scheduler state, ray#30838), each early
    stop handed to the recorder with its reason, and its decisions independent of the order results arrive.

    Order: Tune's ASHA judges a trial at a rung against the trials that reached the rung before it, so
    which trial is cut depends on timing: two trials a few milliseconds apart, or a resumed sweep whose
    restored trials restart in a different order (an edge search interrupted as its coarse trials began
    let an LR complete that the uninterrupted run cut). Here each trial's result at a rung is held until
    every trial added before it has reached that rung or ended, then given to Tune's ASHA: a trial is
    judged against exactly the trials before it in the sweep's own order, whatever the timing. A held
    trial keeps training meanwhile; one that finishes while held finishes (its rung values still count
    for the trials after it).

    ``stages``: in an edge search, the stages whose trials ASHA may cut (the coarse grid); the others
    (range test, stability probes, refinement, seeds) run to their end. None: every trial. Without a
    ``recorder`` (a user's own Tuner) no ledger is written, and without a ``state_path`` nothing is saved;
    ``metric`` and ``mode`` then come from the Tuner's TuneConfig."""

    def __init__(self, recorder: OutcomeRecorder | None = None, state_path: Path | None = None, *,
                 time_attr: str = "tokens", metric: str | None = None, mode: str | None = None,
                 max_t: float = 100, grace_period: float = 1, reduction_factor: float = 4,
                 stages: frozenset[str] | None = None, **kwargs: Any):
        # A trial reaching max_t finishes by itself (writing its summary); it must not be killed there.
        super().__init__(time_attr=time_attr, metric=metric, mode=mode, max_t=max_t, grace_period=grace_period,
                         reduction_factor=reduction_factor, stop_last_trials=False, **kwargs)
        self.rungs = Rungs.of(grace_period, reduction_factor, max_t)  # (Tune's, placed by the one rung rule)
        self.recorder = recorder
        self.state_path = Path(state_path) if state_path is not None else None
        self.time_attr = time_attr  # (the metric is Tune's own public ``metric`` property)
        self.stages = stages
        self.loaded = False
        self.order: list[str] = []  # judged trials in the order they were added
        self.ended: set[str] = set()
        self.held: dict[str, list[TuneResult]] = {}  # trial -> its rung results not yet judged (for Tune's ASHA)

    def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
        """A user's ``TuneConfig(metric=..., mode=...)`` (Tune hands it to the scheduler whatever the param space:
        lmtune's deciding searchers, whose param space is empty, never hear it): val_loss, lowest first, or an error
        before anything trains."""
        check_objective("lmtune's ASHA", metric, mode)
        return super().set_search_properties(metric, mode, **spec)

    def __setstate__(self, state: dict[str, object]) -> None:
        # Restored by Tune on --resume: the state file of the folder this driver resumes in.
        path = state.get("state_path")
        self.__dict__.update(state, state_path=rebased(path, path.parent.parent if path else None))

    def _ensure_loaded(self) -> None:
        if self.loaded:
            return
        self.loaded = True
        if self.state_path is not None and self.state_path.exists():
            state = json.loads(self.state_path.read_text())
            restore_asha_rungs(self, state)
            self.order = list(state.get("order", []))
            self.ended = set(state.get("ended", []))
            self.held = {t: list(r) for t, r in state.get("held", {}).items()}
            log.info("ASHA state restored from %s (%d trials stopped before)", self.state_path,
                     asha_stopped_count(self))

    def _save(self) -> None:
        if self.state_path is None:
            return
        atomic_write_json(self.state_path, {**asha_rungs(self), "order": self.order, "ended": sorted(self.ended),
                                            "held": self.held})

    def on_trial_add(self, tune_controller, trial) -> None:
        self._ensure_loaded()
        super().on_trial_add(tune_controller, trial)
        if not self._exempt(trial) and trial.trial_id not in self.order:
            self.order.append(trial.trial_id)
            self._save()  # at once: a resume re-adds the restored trials in an order of Tune's own

    def _exempt(self, trial) -> bool:
        order = TrialOrder.from_tune(getattr(trial, "config", None) or {})
        return self.stages is not None and order.stage not in self.stages

    def on_trial_complete(self, tune_controller, trial, result: dict) -> None:
        self._ensure_loaded()
        if self._exempt(trial):  # its losses must not enter the rungs the coarse trials are cut against
            super().on_trial_remove(tune_controller, trial)
            return
        self._release_held(tune_controller, trial)
        self.ended.add(trial.trial_id)
        super().on_trial_complete(tune_controller, trial, result)
        self._save()

    def on_trial_remove(self, tune_controller, trial) -> None:
        self._ensure_loaded()
        self.ended.add(trial.trial_id)
        super().on_trial_remove(tune_controller, trial)
        self._save()

    def on_trial_error(self, tune_controller, trial) -> None:
        self._ensure_loaded()
        self.ended.add(trial.trial_id)
        super().on_trial_error(tune_controller, trial)
        self._save()

    def on_trial_result(self, tune_controller, trial, result: dict) -> str:
        self._ensure_loaded()
        if self._exempt(trial):
            return TrialScheduler.CONTINUE
        tokens = result.get(self.time_attr, 0)
        if tokens >= result.get("run_tokens", result.get("total_tokens", math.inf)):
            # The trial's last report: it finishes by itself and writes its summary; stopping it
            # here would only kill it mid-write.
            return TrialScheduler.CONTINUE
        self._hold(trial.trial_id, result)
        action, judged = TrialScheduler.CONTINUE, False
        for held in self._ready(trial.trial_id):
            judged = True
            action = super().on_trial_result(tune_controller, trial, held)
            if action == TrialScheduler.STOP:
                reason = (f"stopped by ASHA at {format_tokens(held[self.time_attr])} tokens (val loss "
                          f"{format_value(held.get(self.metric))} worse than its rung's cutoff)")
                if self.recorder is not None:  # (a fused group's members stopped: those running now, not at the rung)
                    ending = Ending.at(Outcome.STOPPED_EARLY, reason, held)
                    self.recorder.decided(trial.trial_id, ending, Members.of(result))
                self.held.pop(trial.trial_id, None)
                self.ended.add(trial.trial_id)
                break
        if judged or self._measured(result):  # else nothing was held or judged: the saved state stands
            self._save()
        return action

    def _recorded(self, milestone: float) -> dict[str, float]:
        """Tune's ASHA's records at a rung: trial id -> its value there."""
        return next(r["recorded"] for r in asha_rungs(self)["brackets"][0] if math.isclose(r["milestone"], milestone))

    def _hold(self, trial_id: str, result: TuneResult) -> None:
        """Keep the result at the highest rung it reached (as Tune's ASHA would record it) that the trial has
        neither reached before nor been judged at."""
        if not self._measured(result):
            return
        held = self.held.setdefault(trial_id, [])
        passed = self.rungs.passed(result[self.time_attr])
        done = {self._rung_of(r) for r in held} | {m for m in passed if trial_id in self._recorded(m)}
        if passed and passed[-1] not in done and (not done or passed[-1] > max(done)):
            keys = (self.time_attr, self.metric, "step", "run_tokens", "total_tokens")
            held.append({k: result[k] for k in keys if k in result})

    def _measured(self, result: TuneResult) -> bool:
        """Whether ``result`` measured the metric at its own step: one repeating an earlier evaluation (lmtune's
        val_loss with val_step before its step) is judged where it was measured, not again."""
        if self.metric == "val_loss":
            return evaluated_val_loss(result) is not None
        return self.metric in result

    def _rung_of(self, result: TuneResult) -> float:
        return self.rungs.rung_of(result[self.time_attr])

    def _ready(self, trial_id: str):
        """The trial's held results, oldest first, while every trial before it has reached that rung or ended."""
        held = self.held.get(trial_id, [])
        before = self.order[:self.order.index(trial_id)] if trial_id in self.order else []
        while held:
            recorded = self._recorded(self._rung_of(held[0]))
            if any(other not in recorded and other not in self.ended for other in before):
                return
            yield held.pop(0)

    def _release_held(self, tune_controller, trial) -> None:
        """A trial that ended while held: its rung values enter the rungs (up to where ASHA would have cut
        it), so the trials after it are judged as if it had been judged in order."""
        for held in self.held.pop(trial.trial_id, []):
            if super().on_trial_result(tune_controller, trial, held) == TrialScheduler.STOP:
                break
