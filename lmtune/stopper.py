"""Ending trials early: the divergence / throughput Stopper, the persistent ASHA scheduler, and the
ledger of why each trial ended (``results/NAME/trial_outcomes.json``).

ASHA alone never stops a NaN trial (NaN is not below any cutoff), so TrialStopper does:
- diverged: a non-finite train loss or gradient norm, or (after warm-up) a train loss above
  ``explode_factor`` x the loss at initialisation (ln vocab, or the first report if lower);
- too_slow: measured tokens/s projecting a finish beyond the sweep's deadline, or under a floor.
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

from lmtune.checkpoint import atomic_write_text
from lmtune.sweep_files import LEDGER_NAME, read_outcomes, record_outcome  # noqa: F401 - re-exported

log = logging.getLogger(__name__)

ASHA_STATE_NAME = "asha_state.json"


# ---------------------------------------------------------------------------------------------
# Formatting reasons


def format_tokens(tokens: float) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if tokens >= scale:
            return f"{tokens / scale:.1f}{unit}"
    return f"{tokens:.0f}"


def format_hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"


# ---------------------------------------------------------------------------------------------
# The stopper


class TrialStopper(Stopper):
    """Stops diverged and too-slow trials; the reason and step go to the ledger."""

    def __init__(self, ledger: Path, explode_factor: float = 1.5, time_budget_s: float | None = None,
                 min_tokens_per_s: float = 0.0, slow_grace_reports: int = 2):
        self.ledger = Path(ledger)
        self.explode_factor = explode_factor
        self.time_budget_s = time_budget_s
        self.min_tokens_per_s = min_tokens_per_s
        self.slow_grace_reports = slow_grace_reports
        self.started = time.time()
        self._initial_loss: dict[str, float] = {}
        self._reports: dict[str, int] = {}

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        if result.get("done"):
            # Tune repeating the last result of a trainable that returned: the trial ends by itself.
            # After a driver restart that result can be older than a decision already in the ledger
            # (a trial that ended after Tune's last experiment snapshot), so it must not decide again.
            return False
        decision = self.decide(trial_id, result)
        if decision is None:
            return False
        outcome, reason = decision
        record_outcome(self.ledger, trial_id, outcome, reason, step=result.get("step"), tokens=result.get("tokens"))
        log.info("trial %s: %s", trial_id, reason)
        return True

    def decide(self, trial_id: str, result: dict[str, Any]) -> tuple[str, str] | None:
        """(outcome, reason) when the trial must stop, else None. Pure but for per-trial memory."""
        step = result.get("step")
        loss = result.get("train_loss")
        grad_norm = result.get("grad_norm")
        if result.get("diverged"):
            return "diverged", f"diverged at step {step}, loss {_fmt(loss)}"
        for name, value in (("loss", loss), ("gradient norm", grad_norm)):
            if value is not None and not math.isfinite(value):
                return "diverged", f"diverged at step {step}, {name} {_fmt(value)}"
        if loss is not None:
            # The reference is the loss at initialisation: ln(vocab) for a well-initialised LM, or the
            # first report if lower (a high LR can already have blown up within the first interval).
            first = min(loss, result.get("uniform_loss", loss))
            initial = self._initial_loss.setdefault(trial_id, first)
            if not result.get("in_warmup", False) and loss > self.explode_factor * initial:
                return "diverged", (f"diverged at step {step}, loss {loss:.3g} exploded above "
                                    f"{self.explode_factor:g} x initial {initial:.3g}")
        return self._too_slow(trial_id, result)

    def _too_slow(self, trial_id: str, result: dict[str, Any]) -> tuple[str, str] | None:
        self._reports[trial_id] = self._reports.get(trial_id, 0) + 1
        rate = result.get("tokens_per_s")
        if self._reports[trial_id] <= self.slow_grace_reports or not rate or rate <= 0:
            return None
        if self.min_tokens_per_s and rate < self.min_tokens_per_s:
            return "too_slow", f"too slow: {rate:,.0f} tok/s < floor {self.min_tokens_per_s:,.0f} tok/s"
        remaining = max(result.get("total_tokens", 0) - result.get("tokens", 0), 0)
        if self.time_budget_s and remaining:
            projected = (time.time() - self.started) + remaining / rate
            if projected > self.time_budget_s:
                return "too_slow", (f"too slow: {rate:,.0f} tok/s, projected {format_hours(projected)} > "
                                    f"{format_hours(self.time_budget_s)} budget")
        return None

    def stop_all(self) -> bool:
        return False


def _fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    return "nan" if isinstance(value, float) and math.isnan(value) else f"{value:.4g}"


# ---------------------------------------------------------------------------------------------
# ASHA that survives a driver restart


class PersistentASHA(AsyncHyperBandScheduler):
    """Tune's ASHA, with its rung records saved after every decision and reloaded after
    ``Tuner.restore`` (Ray keeps no scheduler state across a driver restart by itself), and each
    early stop written to the ledger with its reason."""

    def __init__(self, state_dir: Path, **kwargs: Any):
        # A trial reaching max_t finishes by itself (writing its summary); it must not be killed there.
        super().__init__(stop_last_trials=False, **kwargs)
        self.state_dir = Path(state_dir)
        self._loaded = False

    @property
    def state_path(self) -> Path:
        return self.state_dir / ASHA_STATE_NAME

    def _ensure_loaded(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        if not self.state_path.exists():
            return
        state = json.loads(self.state_path.read_text())
        for bracket, rungs in zip(self._brackets, state["brackets"], strict=False):
            for (milestone, recorded), saved in zip(bracket._rungs, rungs, strict=False):
                if math.isclose(milestone, saved["milestone"]):
                    recorded.update(saved["recorded"])
        self._num_stopped = state.get("num_stopped", 0)
        log.info("ASHA state restored from %s (%d trials stopped before)", self.state_path, self._num_stopped)

    def _save(self) -> None:
        state = {
            "num_stopped": self._num_stopped,
            "brackets": [[{"milestone": m, "recorded": dict(r)} for m, r in b._rungs] for b in self._brackets],
        }
        atomic_write_text(self.state_path, json.dumps(state, indent=1, default=float))

    def on_trial_add(self, tune_controller, trial) -> None:
        self._ensure_loaded()
        super().on_trial_add(tune_controller, trial)

    def on_trial_result(self, tune_controller, trial, result: dict) -> str:
        self._ensure_loaded()
        if result.get(self._time_attr, 0) >= result.get("total_tokens", math.inf):
            # The trial's last report: it finishes by itself and writes its summary; stopping it
            # here would only kill it mid-write.
            return TrialScheduler.CONTINUE
        action = super().on_trial_result(tune_controller, trial, result)
        tokens = result.get(self._time_attr, 0)
        if action == TrialScheduler.STOP:
            metric = result.get(self._metric)
            record_outcome(self.state_dir / LEDGER_NAME, trial.trial_id, "stopped_early",
                           f"stopped by ASHA at {format_tokens(tokens)} tokens (val loss {_fmt(metric)} "
                           f"worse than its rung's cutoff)", overwrite=False, step=result.get("step"), tokens=tokens)
        if self._metric in result:
            self._save()
        return action


# ---------------------------------------------------------------------------------------------
# Keeping lmtune's files out of Ray's experiment-state sync


class KeepSweepFiles(Callback):
    """Stops Ray from reverting lmtune's sweep-level files after ``Tuner.restore``.

    On restore Ray copies *every* ``*.json`` / ``*.pkl`` at the experiment root (ours included:
    the ledger, ASHA's state, sweep.json) into its driver staging folder
    (``/tmp/ray/session_*/artifacts/.../driver_artifacts``), and at every experiment snapshot it
    uploads that whole folder over the experiment folder. Those stale copies would overwrite each
    decision written since the restore (the resumed trials would end with no ledger entry and ASHA's
    new rung records would vanish). This deletes the copies before Ray's first snapshot: the first
    ``on_step_begin`` comes after the restore and before the first upload.
    """

    def __init__(self, sweep_dir: Path, names: tuple[str, ...]):
        self.sweep_dir = Path(sweep_dir)
        self.names = tuple(names)
        self._checked = False

    def __getstate__(self) -> dict[str, Any]:  # pickled in tuner.pkl: a restored copy must check again
        return {**self.__dict__, "_checked": False}

    def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
        if self._checked or not trials:
            return
        self._checked = True
        try:
            staging = Path(trials[0].storage.experiment_driver_staging_path)
        except Exception as err:  # noqa: BLE001 - private Ray layout; say so rather than fail the sweep
            log.warning("cannot locate Ray's driver staging folder (%s); after a resume, Ray may revert %s",
                        err, ", ".join(self.names))
            return
        if not staging.is_dir() or staging.resolve() == self.sweep_dir.resolve():
            return
        for name in self.names:
            copy = staging / name
            if copy.is_file():
                copy.unlink()
                log.debug("removed Ray's stale copy %s (the live file is %s)", copy, self.sweep_dir / name)
