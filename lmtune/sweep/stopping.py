"""Where a trial is stopped, and why each trial ended.

- ``TrialStopper`` ends diverged and too-slow trials (ASHA alone never stops a NaN trial: NaN is not
  below any cutoff). diverged: a non-finite train loss or gradient norm, a divergence the training
  loop reported at its end (its whole loss judged), or the divergence rule firing on the trial's own
  LossWatch (lmtune.training.divergence: the loss stayed above its initial value for the whole recovery
  window: evidence that it will not recover); too_slow: measured tokens/s projecting a finish beyond the
  sweep's deadline, or under a floor. A trial that reports ``no_early_stop`` (an edge search's
  confirmation run) is never ended by the divergence rule.
- ``PersistentASHA`` is Tune's ASHA, with its rung records kept across driver restarts.
- ``OutcomeRecorder`` is the only writer of the ledger (decisions/trial_outcomes.json): the two
  above hand it their decisions the moment they make them, and Tune tells it of completions and errors.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

from ray.tune import Callback, Stopper
from ray.tune.schedulers import AsyncHyperBandScheduler, TrialScheduler

from lmtune.files import atomic_write_json
from lmtune.private_apis import asha_rungs, asha_stopped_count, restore_asha_rungs
from lmtune.sweep.disk import format_bytes, free_disk
from lmtune.sweep.record import Outcome, evaluated_val_loss, rebased
from lmtune.sweep.runs import format_tokens

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# Formatting reasons


def format_hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"


# ---------------------------------------------------------------------------------------------
# The ledger's writer


class OutcomeRecorder(Callback):
    """Writes decisions/trial_outcomes.json, and nothing else does: why each trial ended, with the step
    and tokens at that moment. The first decision about a trial stands, except that a trial retried
    after an error (--resume retries errored trials) gets the ending of its retry.

    A fused trial (lmtune.sweep.fused_trial) reports its members' endings as they happen; a decision
    about the whole group (ASHA, the stopper, an error) is also each still-running member's. The
    group's own entry lists its ``members``, so that counts of trials can leave it out."""

    def __init__(self, ledger: Path, gpus_per_trial: float = 0.0):
        self.ledger = Path(ledger)
        self.gpus_per_trial = gpus_per_trial

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Restored by Tune on --resume: the ledger of the folder this driver resumes in (lmtune.sweep.record.rebased).
        ledger = Path(state["ledger"])
        self.__dict__.update(state, ledger=rebased(ledger, ledger.parent.parent))

    def decided(self, trial_id: str, outcome: Outcome, reason: str, result: dict[str, Any]) -> None:
        """A stop the stopper or ASHA just decided: written at once, so it survives a driver crash."""
        self._record(trial_id, outcome, reason, result)
        self._record_running_members(outcome, reason, result)
        log.info("trial %s: %s", trial_id, reason)

    def on_trial_result(self, iteration: int, trials: list, trial, result: dict, **info: Any) -> None:
        for member, ending in (result.get("member_endings") or {}).items():
            self._record(member, Outcome(ending["outcome"]), ending["reason"], ending)

    def on_trial_complete(self, iteration: int, trials: list, trial, **info: Any) -> None:
        result = trial.last_result or {}
        outcome, reason = outcome_of(result)
        self._record(trial.trial_id, outcome, reason, result)
        self._record_running_members(outcome, reason, result)

    def on_trial_error(self, iteration: int, trials: list, trial, **info: Any) -> None:
        message = _error_text(trial)
        reason = f"error: {message}"
        if "out of memory" in message.lower() and 0 < self.gpus_per_trial < 1:
            reason += (f" (GPU shared by {round(1 / self.gpus_per_trial)} trials: lower trials per GPU with "
                       f"--gpus-per-trial {min(1.0, self.gpus_per_trial * 2):g})")
        self._record(trial.trial_id, Outcome.ERROR, reason, trial.last_result or {})
        self._record_running_members(Outcome.ERROR, reason, trial.last_result or {})

    def _record_running_members(self, outcome: Outcome, reason: str, result: dict[str, Any]) -> None:
        for member in member_list(result.get("members_running")):
            self._record(member, outcome, reason, result)

    def _entries(self) -> dict[str, dict[str, Any]]:
        return json.loads(self.ledger.read_text()) if self.ledger.exists() else {}

    def _record(self, trial_id: str, outcome: Outcome, reason: str, result: dict[str, Any]) -> None:
        entries = self._entries()
        if entries.get(trial_id, {}).get("outcome") not in (None, Outcome.ERROR):
            return
        entries[trial_id] = {"outcome": str(outcome), "reason": reason, "time": time.time(),
                             "step": result.get("step"), "tokens": result.get("tokens")}
        members = member_list(result.get("member_ids"))
        if members and trial_id not in members:
            entries[trial_id]["members"] = members
        atomic_write_json(self.ledger, entries)


def outcome_of(result: dict[str, Any]) -> tuple[Outcome, str]:
    """How a trial ended and why, from its last result alone: what the ledger records of a trial that ended by
    itself, and what a searcher without a ledger (in a user's own Tuner) learns of any trial. A trial whose last
    result is short of its budget, with no divergence in it, was cut (by ASHA or another scheduler)."""
    if result.get("range_test"):
        return Outcome.RANGE_TEST, result.get("range_summary") or "LR range test ended"
    diverged = TrialStopper.divergence(result)
    if diverged is not None:
        reason = diverged
    elif result.get("tokens", 0) < result.get("run_tokens", result.get("total_tokens", 0)):
        return Outcome.STOPPED_EARLY, f"stopped at {format_tokens(result.get('tokens', 0))} tokens, before its budget"
    elif result.get("run_tokens", math.inf) < result.get("total_tokens", 0):
        outcome = Outcome.PROBED
        reason = f"trained the {format_tokens(result['run_tokens'])} tokens it was asked to without diverging"
    else:
        outcome, reason = Outcome.COMPLETED, "completed its budget"
    if diverged is not None:
        outcome = Outcome.DIVERGED
    if result.get("spike_text"):
        reason += f"; {result['spike_text']}"
    return outcome, reason


def member_list(ids: str | None) -> list[str]:
    """A fused trial's comma-separated member ids as a list."""
    return [i for i in (ids or "").split(",") if i]


def _error_text(trial) -> str:
    """The last line of the trial's error, whole: Tune's message, else its error file."""
    text = getattr(trial, "error_msg", None) or ""
    path = getattr(trial, "error_file", None) or ""
    if not text and path and Path(path).exists():
        text = Path(path).read_text()
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    return lines[-1] if lines else "unknown error"


# ---------------------------------------------------------------------------------------------
# The stopper


class DiskGuard:
    """Whether the results disk still holds the next round of checkpoints: a sweep that filled it anyway (another
    program wrote there, or the estimate was low) is stopped whole, its trials' newest checkpoints kept for
    --resume, instead of its trials failing one write after another. Asked at most every ``interval_s``."""

    def __init__(self, directory: Path, reserve: int, interval_s: float = 5.0):
        self.directory, self.reserve, self.interval_s = Path(directory), reserve, interval_s
        self.checked = -math.inf
        self.full: str | None = None
        """Why the sweep was stopped (one line), once it was."""

    def __setstate__(self, state: dict[str, Any]) -> None:
        # A resumed sweep (Tune restores its stopper pickled) asks the disk afresh.
        self.__dict__.update(state, checked=-math.inf, full=None)

    def exhausted(self) -> bool:
        now = time.monotonic()
        if self.full is None and now - self.checked >= self.interval_s:
            self.checked = now
            free = free_disk(self.directory)
            if free < self.reserve:
                self.full = (f"only {format_bytes(free)} free on the disk of {self.directory}, less than the next "
                             f"checkpoints need ({format_bytes(self.reserve)})")
                log.warning("stopping the sweep: %s", self.full)
        return self.full is not None


class TrialStopper(Stopper):
    """Stops diverged and too-slow trials (each decision, with its reason, goes to the recorder), and with a
    ``disk_guard`` every trial once the results disk cannot take the next checkpoints."""

    def __init__(self, recorder: OutcomeRecorder | None, time_budget_s: float | None = None,
                 min_tokens_per_s: float = 0.0, slow_grace_reports: int = 2, disk_guard: DiskGuard | None = None):
        self.recorder = recorder
        self.disk_guard = disk_guard
        self.time_budget_s = time_budget_s
        self.min_tokens_per_s = min_tokens_per_s
        self.slow_grace_reports = slow_grace_reports
        self.started = time.time()
        self._reports: dict[str, int] = {}

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        if result.get("done") or result.get("range_test"):
            # (An LR range test's loss blows up by design; it stops itself there.)
            # Tune repeating the last result of a trainable that returned: the trial ends by itself.
            # After a driver restart that result can be older than a decision already in the ledger
            # (a trial that ended after Tune's last experiment snapshot), so it must not decide again.
            return False
        decision = self.decide(trial_id, result)
        if decision is None:
            return False
        outcome, reason = decision
        if self.recorder is not None:
            self.recorder.decided(trial_id, outcome, reason, result)
        return True

    def decide(self, trial_id: str, result: dict[str, Any]) -> tuple[Outcome, str] | None:
        """(outcome, reason) when the trial must stop, else None. Pure but for per-trial memory."""
        diverged = self.divergence(result)
        if diverged is not None:
            return Outcome.DIVERGED, diverged
        return self._too_slow(trial_id, result)

    @staticmethod
    def divergence(result: dict[str, Any]) -> str | None:
        """Why ``result`` shows its trial diverged (None: it does not)."""
        step = result.get("step")
        loss = result.get("train_loss")
        if result.get("diverged"):
            # The training loop's own finding at its end: what went non-finite, or its whole loss judged.
            because = result.get("diverged_because") or f"loss {_fmt(loss)}"
            return f"diverged at step {result.get('diverged_step') or step}, {because}"
        for name, value in (("loss", loss), ("gradient norm", result.get("grad_norm"))):
            if value is not None and not math.isfinite(value):
                return f"diverged at step {step}, {name} {_fmt(value)}"
        last = result.get("tokens", 0) >= result.get("run_tokens", result.get("total_tokens", math.inf))
        if result.get("divergence_stop") and not result.get("no_early_stop") and not last:
            # The trial's LossWatch: above its initial loss for the whole recovery window. (At its last
            # report a trial ends by itself and reports its own judgement.)
            return f"diverged at step {result.get('diverged_step')}: {result.get('divergence_reason')}"
        return None

    def _too_slow(self, trial_id: str, result: dict[str, Any]) -> tuple[Outcome, str] | None:
        self._reports[trial_id] = self._reports.get(trial_id, 0) + 1
        rate = result.get("tokens_per_s")
        if self._reports[trial_id] <= self.slow_grace_reports or not rate or rate <= 0:
            return None
        if self.min_tokens_per_s and rate < self.min_tokens_per_s:
            return Outcome.TOO_SLOW, f"too slow: {rate:,.0f} tok/s < floor {self.min_tokens_per_s:,.0f} tok/s"
        remaining = max(result.get("run_tokens", result.get("total_tokens", 0)) - result.get("tokens", 0), 0)
        if self.time_budget_s and remaining:
            projected = (time.time() - self.started) + remaining / rate
            if projected > self.time_budget_s:
                return Outcome.TOO_SLOW, (f"too slow: {rate:,.0f} tok/s, projected {format_hours(projected)} > "
                                    f"{format_hours(self.time_budget_s)} budget")
        return None

    def stop_all(self) -> bool:
        return self.disk_guard is not None and self.disk_guard.exhausted()


def _fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    return "nan" if isinstance(value, float) and math.isnan(value) else f"{value:.4g}"


# ---------------------------------------------------------------------------------------------
# ASHA that survives a driver restart


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
                 stages: frozenset[str] | None = None, **kwargs: Any):
        # A trial reaching max_t finishes by itself (writing its summary); it must not be killed there.
        super().__init__(time_attr=time_attr, metric=metric, mode=mode, stop_last_trials=False, **kwargs)
        self.recorder = recorder
        self.state_path = Path(state_path) if state_path is not None else None
        self.time_attr = time_attr  # (the metric is Tune's own public ``metric`` property)
        self.stages = stages
        self.loaded = False
        self.order: list[str] = []  # judged trials in the order they were added
        self.ended: set[str] = set()
        self.held: dict[str, list[dict[str, Any]]] = {}  # trial -> its rung results not yet judged

    def __setstate__(self, state: dict[str, Any]) -> None:
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
        config = getattr(trial, "config", None) or {}
        return self.stages is not None and config.get("stage") not in self.stages

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
                          f"{_fmt(held.get(self.metric))} worse than its rung's cutoff)")
                # (the members a fused group stops are those running now, not at the rung)
                members = {k: result[k] for k in ("member_ids", "members_running") if k in result}
                if self.recorder is not None:
                    self.recorder.decided(trial.trial_id, Outcome.STOPPED_EARLY, reason, {**held, **members})
                self.held.pop(trial.trial_id, None)
                self.ended.add(trial.trial_id)
                break
        if judged or self._measured(result):  # else nothing was held or judged: the saved state stands
            self._save()
        return action

    def _milestones(self) -> list[float]:
        return sorted(rung["milestone"] for rung in asha_rungs(self)["brackets"][0])

    def _recorded(self, milestone: float) -> dict[str, float]:
        return next(r["recorded"] for r in asha_rungs(self)["brackets"][0] if r["milestone"] == milestone)

    def _hold(self, trial_id: str, result: dict[str, Any]) -> None:
        """Keep the result at the highest rung it reached (as Tune's ASHA would record it) that the trial has
        neither reached before nor been judged at."""
        if not self._measured(result):
            return
        held = self.held.setdefault(trial_id, [])
        passed = [m for m in self._milestones() if result[self.time_attr] >= m]
        done = {self._rung_of(r) for r in held} | {m for m in passed if trial_id in self._recorded(m)}
        if passed and passed[-1] not in done and (not done or passed[-1] > max(done)):
            keys = (self.time_attr, self.metric, "step", "run_tokens", "total_tokens")
            held.append({k: result[k] for k in keys if k in result})

    def _measured(self, result: dict[str, Any]) -> bool:
        """Whether ``result`` measured the metric at its own step: one repeating an earlier evaluation (lmtune's
        val_loss with val_step before its step) is judged where it was measured, not again."""
        if self.metric == "val_loss":
            return evaluated_val_loss(result) is not None
        return self.metric in result

    def _rung_of(self, result: dict[str, Any]) -> float:
        return max(m for m in self._milestones() if result[self.time_attr] >= m)

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
