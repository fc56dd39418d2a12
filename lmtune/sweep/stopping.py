"""Where a trial is stopped, and why each trial ended.

- ``TrialStopper`` ends diverged and too-slow trials (ASHA alone never stops a NaN trial: NaN is not
  below any cutoff). diverged: a non-finite train loss or gradient norm, a divergence the training
  loop reported at its end (its whole loss judged), or the divergence rule firing on the trial's own
  LossWatch (lmtune.training.divergence: the loss stayed above its initial value for the whole recovery
  window: evidence that it will not recover); too_slow: measured tokens/s projecting a finish beyond the
  sweep's deadline, or under a floor. A trial that reports ``no_early_stop`` (an edge search's
  confirmation run) is never ended by the divergence rule.
- ``OutcomeRecorder`` is the only writer of the ledger (decisions/trial_outcomes.json): the stopper and ASHA
  (lmtune.sweep.asha_scheduler.PersistentASHA) hand it their decisions the moment they make them, and Tune
  tells it of completions and errors. An error no retry cures (``incurable``: the user's code failing, a module
  the trial's process cannot import) is recorded at its first attempt, and the stopper then ends the sweep.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ray.tune import Callback, Stopper

from lmtune.analysis.runs import Outcome, format_tokens
from lmtune.files import atomic_write_json
from lmtune.searches.trial_order import TuneResult
from lmtune.sweep.disk import format_bytes, free_disk
from lmtune.sweep.record import rebased

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# Formatting reasons


def format_hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"


# ---------------------------------------------------------------------------------------------
# The ledger's writer


@dataclass(frozen=True)
class Ending:
    """How and why a trial ended, and where it was then: one entry of the ledger."""

    outcome: Outcome
    """How it ended."""
    reason: str
    """Why, in one line."""
    step: int | None = None
    """Its step at that moment (None: it reported none)."""
    tokens: int | None = None
    """Its tokens at that moment."""

    @classmethod
    def at(cls, outcome: Outcome, reason: str, result: TuneResult) -> Ending:
        """The ending decided at ``result``, a result of the trial's."""
        return cls(outcome, reason, result.get("step"), result.get("tokens"))

    @classmethod
    def from_json(cls, entry: dict[str, str | int | None]) -> Ending:
        """A fused member's ending as its group's result carries it (``to_json``)."""
        return cls(Outcome(entry["outcome"]), entry["reason"], entry.get("step"), entry.get("tokens"))

    def to_json(self) -> dict[str, str | int | None]:
        return {"outcome": str(self.outcome), "reason": self.reason, "step": self.step, "tokens": self.tokens}


@dataclass(frozen=True)
class Members:
    """A fused trial's members as its results name them (comma-joined ids); none for any other trial."""

    all: tuple[str, ...] = ()
    """Every member's trial id."""
    running: tuple[str, ...] = ()
    """The members still training at the result: a decision about the group is each of theirs."""

    @classmethod
    def of(cls, result: TuneResult) -> Members:
        return cls(tuple(member_list(result.get("member_ids"))), tuple(member_list(result.get("members_running"))))


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
        self.incurable: str | None = None
        """The first error of this driver's that no retry cures ("trial ID: error"), which ends the sweep."""

    def __setstate__(self, state: dict[str, object]) -> None:
        # Restored by Tune on --resume: the ledger of the folder this driver resumes in (lmtune.sweep.record.rebased);
        # the errors that stopped the last driver are retried (the user fixed what they were told to).
        ledger = Path(str(state["ledger"]))
        self.__dict__.update(state, ledger=rebased(ledger, ledger.parent.parent), incurable=None)

    def decided(self, trial_id: str, ending: Ending, members: Members = Members()) -> None:
        """A stop the stopper or ASHA just decided: written at once, so it survives a driver crash."""
        self._settle(trial_id, ending, members)
        log.info("trial %s: %s", trial_id, ending.reason)

    def on_trial_result(self, iteration: int, trials: list, trial, result: TuneResult, **info: Any) -> None:
        for member, ending in (result.get("member_endings") or {}).items():
            self._record(member, Ending.from_json(ending))

    def on_trial_complete(self, iteration: int, trials: list, trial, **info: Any) -> None:
        result = trial.last_result or {}
        self._settle(trial.trial_id, Ending.at(*outcome_of(result), result), Members.of(result))

    def on_trial_recover(self, iteration: int, trials: list, trial, **info: Any) -> None:
        """Tune is about to retry an errored trial: one whose error no retry cures ends as an error now, and the
        sweep with it (TrialStopper.stop_all)."""
        if incurable(_error_text(trial)):
            self.on_trial_error(iteration, trials, trial, **info)

    def on_trial_error(self, iteration: int, trials: list, trial, **info: Any) -> None:
        message = _error_text(trial)
        reason = f"error: {message}"
        if incurable(message) and self.incurable is None:
            self.incurable = f"trial {trial.trial_id}: {message}"
        if "out of memory" in message.lower() and 0 < self.gpus_per_trial < 1:
            reason += (f" (GPU shared by {round(1 / self.gpus_per_trial)} trials: lower trials per GPU with "
                       f"--gpus-per-trial {min(1.0, self.gpus_per_trial * 2):g})")
        result = trial.last_result or {}
        self._settle(trial.trial_id, Ending.at(Outcome.ERROR, reason, result), Members.of(result))

    def _settle(self, trial_id: str, ending: Ending, members: Members) -> None:
        """The trial's ending, and each of its running members' (a fused group's)."""
        self._record(trial_id, ending, members.all)
        for member in members.running:
            self._record(member, ending)

    def _record(self, trial_id: str, ending: Ending, members: tuple[str, ...] = ()) -> None:
        entries = json.loads(self.ledger.read_text()) if self.ledger.exists() else {}  # (the ledger: JSON)
        if entries.get(trial_id, {}).get("outcome") not in (None, Outcome.ERROR):
            return
        entries[trial_id] = {"outcome": str(ending.outcome), "reason": ending.reason, "time": time.time(),
                             "step": ending.step, "tokens": ending.tokens}
        if members and trial_id not in members:
            entries[trial_id]["members"] = list(members)
        atomic_write_json(self.ledger, entries)


def outcome_of(result: TuneResult) -> tuple[Outcome, str]:
    """How a trial ended and why, from its last result alone: what the ledger records of a trial that ended by
    itself, and what a searcher without a ledger (in a user's own Tuner) learns of any trial. A trial whose last
    result is short of its budget, with no divergence in it, was cut (by ASHA or another scheduler)."""
    if result.get("error"):  # (a trial that refused to train: TuneSink.refuse)
        return Outcome.ERROR, f"error: {result['error']}"
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


# The last line of a trial's error that no retry cures: the user's code failed (lmtune.errors.UserCodeError), or a
# module could not be imported in the trial's process (its environment lacks it, or a folder shadows it).
_INCURABLE = ("lmtune.errors.UserCodeError:", "UserCodeError:", "ModuleNotFoundError:", "ImportError:")


def incurable(error: str) -> bool:
    """Whether a trial's error (its last line: ``_error_text``) fails the same way on every attempt."""
    return error.startswith(_INCURABLE)


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

    def __setstate__(self, state: dict[str, object]) -> None:
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
    """Stops diverged and too-slow trials (each decision, with its reason, goes to the recorder), and every trial
    once a trial failed in a way no retry cures (the recorder's ``incurable``) or, with a ``disk_guard``, once the
    results disk cannot take the next checkpoints."""

    def __init__(self, recorder: OutcomeRecorder | None, time_budget_s: float | None = None,
                 min_tokens_per_s: float = 0.0, slow_grace_reports: int = 2, disk_guard: DiskGuard | None = None):
        self.recorder = recorder
        self.disk_guard = disk_guard
        self.time_budget_s = time_budget_s
        self.min_tokens_per_s = min_tokens_per_s
        self.slow_grace_reports = slow_grace_reports
        self.started = time.time()
        self._reports: dict[str, int] = {}

    def __call__(self, trial_id: str, result: TuneResult) -> bool:
        if result.get("done") or result.get("range_test"):
            # (An LR range test's loss blows up by design; it stops itself there.)
            # Tune repeating the last result of a trainable that returned: the trial ends by itself.
            # After a driver restart that result can be older than a decision already in the ledger
            # (a trial that ended after Tune's last experiment snapshot), so it must not decide again.
            return False
        decision = self.decide(trial_id, result)
        if decision is None:
            return False
        if self.recorder is not None:
            self.recorder.decided(trial_id, Ending.at(*decision, result), Members.of(result))
        return True

    def decide(self, trial_id: str, result: TuneResult) -> tuple[Outcome, str] | None:
        """(outcome, reason) when the trial must stop, else None. Pure but for per-trial memory."""
        diverged = self.divergence(result)
        if diverged is not None:
            return Outcome.DIVERGED, diverged
        return self._too_slow(trial_id, result)

    @staticmethod
    def divergence(result: TuneResult) -> str | None:
        """Why ``result`` shows its trial diverged (None: it does not)."""
        step = result.get("step")
        loss = result.get("train_loss")
        if result.get("diverged"):
            # The training loop's own finding at its end: what went non-finite, or its whole loss judged.
            because = result.get("diverged_because") or f"loss {format_value(loss)}"
            return f"diverged at step {result.get('diverged_step') or step}, {because}"
        for name, value in (("loss", loss), ("gradient norm", result.get("grad_norm"))):
            if value is not None and not math.isfinite(value):
                return f"diverged at step {step}, {name} {format_value(value)}"
        last = result.get("tokens", 0) >= result.get("run_tokens", result.get("total_tokens", math.inf))
        if result.get("divergence_stop") and not result.get("no_early_stop") and not last:
            # The trial's LossWatch: above its initial loss for the whole recovery window. (At its last
            # report a trial ends by itself and reports its own judgement.)
            return f"diverged at step {result.get('diverged_step')}: {result.get('divergence_reason')}"
        return None

    def _too_slow(self, trial_id: str, result: TuneResult) -> tuple[Outcome, str] | None:
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
        if self.recorder is not None and self.recorder.incurable is not None:
            return True
        return self.disk_guard is not None and self.disk_guard.exhausted()


def format_value(value: float | None) -> str:
    """A loss or a norm in a reason: 4 significant digits, nan, or n/a."""
    if value is None:
        return "n/a"
    return "nan" if isinstance(value, float) and math.isnan(value) else f"{value:.4g}"
