"""ASHA per variant (``PerVariantASHA``): a compare search's variants each judged by an ASHA of their own.

One ASHA over a compare sweep would cut a no-norm variant's coarse LRs against the reference's losses, and a
batch-size variant's against another batch's: what it keeps would say which variant is better, not which of the
variant's LRs. So each variant gets its own ``PersistentASHA`` (the same rungs in tokens, its own rung records and
state file), made the first time one of its trials is added; a trial without a variant goes to an ASHA of its own
too. Trials run in the order Tune's FIFO scheduler picks them, as under one ASHA.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ray.tune.schedulers import FIFOScheduler

from lmtune.searches.trial_order import TrialOrder
from lmtune.sweep.asha_scheduler import PersistentASHA
from lmtune.sweep.record import rebased
from lmtune.sweep.stopping import OutcomeRecorder

# The key of the trials that name no variant.
NO_VARIANT = ""
# The axis column of a search whose trials are variants (a compare search's ``axis_columns``): its sweep judges each
# variant's trials by an ASHA of their own.
VARIANT_AXIS = "variant"


def variant_state_path(state_path: Path | None, variant: str) -> Path | None:
    """Where a variant's ASHA keeps its rung records: ``asha_state.json`` -> ``asha_state.VARIANT.json``."""
    if state_path is None:
        return None
    return state_path.with_name(f"{state_path.stem}.{variant or 'none'}{state_path.suffix}")


class PerVariantASHA(FIFOScheduler):
    """One ``PersistentASHA`` per compare variant, each seeing only its own variant's trials.

    Args:
        recorder: the sweep's ledger, handed every early stop with its reason (None: a user's Tuner).
        state_path: the sweep's ASHA state file; each variant's sits beside it (variant_state_path).
        metric: the metric ASHA compares (None: the Tuner's TuneConfig sets it).
        mode: "min" (None: the Tuner's TuneConfig sets it).
        asha: PersistentASHA's other keywords (time_attr, max_t, grace_period, reduction_factor, stages).
    """

    def __init__(self, recorder: OutcomeRecorder | None = None, state_path: Path | None = None, *,
                 metric: str | None = None, mode: str | None = None, **asha: Any):
        super().__init__()
        self.recorder, self.state_path = recorder, state_path
        self.search_metric, self.search_mode = metric, mode
        self.asha = asha
        self.by_variant: dict[str, PersistentASHA] = {}
        self.variant_of: dict[str, str] = {}  # trial id -> its variant

    def __setstate__(self, state: dict[str, object]) -> None:
        # Restored by Tune on --resume: the state files of the folder this driver resumes in (each variant's ASHA
        # rebases its own as it is unpickled).
        path = state.get("state_path")
        self.__dict__.update(state, state_path=rebased(path, path.parent.parent if path else None))

    @property
    def supports_buffered_results(self) -> bool:
        return False  # (as Tune's ASHA: each result judged as it comes)

    def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
        """A user's TuneConfig's metric and mode, for every variant's ASHA (those made later too)."""
        probe = PersistentASHA(metric=self.search_metric, mode=self.search_mode, **self.asha)
        if not probe.set_search_properties(metric, mode, **spec):  # (checks the objective: one line if not val_loss)
            return False
        self.search_metric, self.search_mode = probe.metric, mode or self.search_mode
        return all(a.set_search_properties(metric, mode, **spec) for a in self.by_variant.values())

    def scheduler_of(self, trial) -> PersistentASHA:
        """The ASHA of ``trial``'s variant, made on its first trial."""
        variant = self.variant_of.get(trial.trial_id)
        if variant is None:
            variant = TrialOrder.from_tune(getattr(trial, "config", None) or {}).variant or NO_VARIANT
            self.variant_of[trial.trial_id] = variant
        if variant not in self.by_variant:
            self.by_variant[variant] = PersistentASHA(
                self.recorder, variant_state_path(self.state_path, variant), metric=self.search_metric,
                mode=self.search_mode, **self.asha)
        return self.by_variant[variant]

    def on_trial_add(self, tune_controller, trial) -> None:
        self.scheduler_of(trial).on_trial_add(tune_controller, trial)

    def on_trial_error(self, tune_controller, trial) -> None:
        self.scheduler_of(trial).on_trial_error(tune_controller, trial)

    def on_trial_result(self, tune_controller, trial, result: dict) -> str:
        return self.scheduler_of(trial).on_trial_result(tune_controller, trial, result)

    def on_trial_complete(self, tune_controller, trial, result: dict) -> None:
        self.scheduler_of(trial).on_trial_complete(tune_controller, trial, result)

    def on_trial_remove(self, tune_controller, trial) -> None:
        self.scheduler_of(trial).on_trial_remove(tune_controller, trial)

    def debug_string(self) -> str:
        names = ", ".join(v or "(none)" for v in self.by_variant) or "none yet"
        return f"ASHA per variant ({names})"

