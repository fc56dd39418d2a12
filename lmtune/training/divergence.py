"""When a run has failed, and when it only spiked: judged by what its loss does, not by a threshold crossed once.

ℓ₀ is the loss at initialisation, ln(vocab) for a model that starts out predicting near-uniformly (the
quantity every run of a sweep shares). A run has **diverged** when its loss becomes non-finite, or when
it goes above ℓ₀ and does not come back below ℓ₀ within the recovery window (a fraction of the budget's
steps), or when its budget ends with the loss still above ℓ₀ — in both cases only once it has climbed
(risen more than the spike threshold above its running minimum, ℓ₀ included). A run still near ℓ₀ that never
climbed has not diverged: it **did not learn** within its budget (a 2-step smoke run, a tiny LR). A run whose
loss rose far above its running minimum and came back is **spiked**, not diverged: each spike is recorded
with its step, its height relative to the running minimum before it, and the steps it took to come back.

The default window is the whole budget, because that is what the measured runs demand (benchmarks/
README.md, "When training fails"): under the cosine schedule, runs far above the best LR climb to tens or
hundreds of times ℓ₀ and come back once the decaying LR falls low enough, as late as 156 of 162 steps
above ℓ₀ (the quick model at lr 1.898 on the built-in corpus; 144 for the 4-layer one at lr 1.5), while none
of the runs that ended above ℓ₀ showed anything earlier that told them apart. So by default the stopper
ends a run early only at a non-finite value; a shorter window (``stopper.recovery_window``) suits
schedules that do not decay. The stopper never ends a run on less than the rule: a non-finite value, or
the loss above ℓ₀ x ``stop_factor`` for the whole window.

The judgement works on a run's logged rows (the train loss averaged over each log interval), in the
training loop, in the sweep's stopper, in a fused group's member rule and in the report alike.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import NotRequired, TypedDict

from lmtune.errors import LmtuneError

# How a divergence was established: a non-finite value (no run comes back from one), the stopper's rule
# (above the initial loss for the whole window, then ended early), or the whole budget seen.
NON_FINITE, BY_RULE, WHOLE_RUN = "non-finite", "rule", "whole run"


@dataclass(frozen=True)
class DivergenceRule:
    """How a sweep tells a diverged run from a spiked one (the ``stopper:`` section of a space)."""

    recovery_window: float = 1.0
    """A run that stays above ℓ₀ for this fraction of its budget's steps has diverged (it did not recover);
    1: only a run whose budget ends above ℓ₀ (measured runs came back after up to 89% of theirs)."""
    stop_factor: float = 1.0
    """The stopper ends a run early when its loss stayed above ℓ₀ x this for the whole recovery window
    (>= 1: it never ends a run the judgement would not call diverged)."""
    spike_threshold: float = 0.1
    """A spike: the loss more than this fraction above its running minimum (ℓ₀ included); twice the largest
    rise measured in healthy runs at or below the best LR (4.8%, batch-to-batch noise)."""

    def validate(self, where: str = "stopper") -> None:
        checks = [
            ("recovery_window", 0 < self.recovery_window <= 1,
             "must be a fraction of the budget's steps in (0, 1], e.g. 1 (the whole budget)"),
            ("stop_factor", math.isfinite(self.stop_factor) and self.stop_factor >= 1,
             "must be >= 1 (1: stop once the loss stayed above the initial loss for the whole window)"),
            ("spike_threshold", math.isfinite(self.spike_threshold) and self.spike_threshold > 0,
             "must be > 0, e.g. 0.1 (a 10% rise above the running minimum)"),
        ]
        for key, ok, message in checks:
            if not ok:
                raise LmtuneError(f"{where}.{key}: {message} (got {getattr(self, key)!r})")

    def window_steps(self, budget_steps: int) -> int:
        return max(1, math.ceil(self.recovery_window * budget_steps))


DEFAULT_RULE = DivergenceRule()


@dataclass
class Spike:
    """One excursion of the loss above (1 + spike_threshold) x its running minimum."""

    step: int
    """The first logged step above the threshold."""
    height: float
    """Its highest loss / the running minimum before it (4.0: four times the best loss so far)."""
    peak_step: int
    recovered_after: int | None = None
    """Steps from ``step`` until the loss came back within the threshold (None: it never did)."""

    def describe(self, open_as: str = "never back") -> str:
        """``open_as``: what a spike not yet back says ("never back" of a run that ended; "not back when it was
        cut" of one cut during it)."""
        back = f"back after {self.recovered_after} steps" if self.recovered_after is not None else open_as
        return f"step {self.step}: {self.height:.2g}x its running minimum, {back}"


@dataclass
class Verdict:
    """What a run's loss says of it so far."""

    diverged: bool = False
    step: int | None = None
    """Where divergence was decided (the first non-finite step, or where the window ran out)."""
    reason: str = ""
    stop: bool = False
    """The stopper's rule fired (a non-finite value, or above ℓ₀ x stop_factor for the whole window)."""
    undecided: bool = False
    """The run ended above ℓ₀ before its window ran out without training its whole budget: whether it
    would have recovered is unknown."""
    did_not_learn: bool = False
    """The run trained its whole budget and ended above ℓ₀ without ever climbing (no spike, nothing
    non-finite): it ran out of budget before it learned, which is no divergence."""


class WatchRowFields(TypedDict):
    """What a metrics row carries of a LossWatch (LossWatch.row_fields)."""

    loss_over_min: float | None
    """The loss over its running minimum (a spike shows as a rise above 1; None: a non-finite loss)."""
    above_init_steps: int
    """Steps the loss has been above ℓ₀."""
    spikes: int
    """Spikes so far."""
    spike_text: NotRequired[str]
    """They, in words (once there is one)."""
    diverged_step: NotRequired[int | None]
    """Where it diverged (once it has)."""
    divergence_stop: NotRequired[bool]
    """Whether the stopper's rule fired (once diverged)."""
    divergence_reason: NotRequired[str]
    """Why it diverged (once it has)."""


class SpikeRecord(TypedDict):
    """A Spike as summary.json keeps it (the fields are Spike's)."""

    step: int
    height: float
    peak_step: int
    recovered_after: int | None


class DivergenceRecord(TypedDict):
    """What summary.json (its "divergence") and the ledger keep of a LossWatch."""

    initial_loss: float
    """ℓ₀."""
    recovery_window_steps: int
    """The recovery window, in steps."""
    spikes: list[SpikeRecord]
    """Every spike, the one still open included."""
    max_spike_height: float | None
    """The highest spike's height (None: no spike)."""
    diverged: bool
    """The verdict's."""
    diverged_step: int | None
    """Where it diverged."""
    divergence_reason: str
    """The verdict's reason."""
    undecided: bool
    """Stopped above ℓ₀ before its window ended."""
    did_not_learn: bool
    """Ended above ℓ₀ without ever climbing."""


class LossWatch:
    """Follows one run's logged train losses: its spikes, and whether (and where) it diverged.

    ``see`` takes the rows in order; ``verdict`` says what they show; ``finish`` adds what the end of the
    run shows (its budget ended above ℓ₀)."""

    def __init__(self, ell0: float, budget_steps: int, rule: DivergenceRule = DEFAULT_RULE):
        self.ell0, self.rule = float(ell0), rule
        self.window = rule.window_steps(budget_steps)
        self.budget_steps = budget_steps
        self.running_min = self.ell0
        self.spikes: list[Spike] = []
        self._open: Spike | None = None
        self._reference = self.ell0  # the running minimum when the open spike started
        self.last_below = 0  # the last step whose loss was at or below ℓ₀ (the start: the loss is ℓ₀ there)
        self.last_below_stop = 0  # ... at or below ℓ₀ x stop_factor
        self.last_step = 0
        self.last_loss: float | None = None
        self.verdict = Verdict()

    @property
    def climbed(self) -> bool:
        """The loss has risen more than the spike threshold above its running minimum (ℓ₀ included) at least
        once: what tells a diverging run from one that has not learned yet, both above ℓ₀."""
        return self._open is not None or bool(self.spikes)

    @property
    def above_for(self) -> int:
        """Steps since the loss was last at or below ℓ₀ (0 while it is)."""
        return self.last_step - self.last_below if self.last_loss is not None and self.last_loss > self.ell0 else 0

    def see(self, step: int, loss: float) -> Verdict:
        """One more row; the verdict so far (once diverged, it stays so; ``stop`` may come later when
        stop_factor > 1)."""
        if self.verdict.stop:
            return self.verdict
        self.last_step, self.last_loss = int(step), float(loss)
        if not math.isfinite(loss):
            self._close_spike(None)
            if not self.verdict.diverged:
                self.verdict = Verdict(True, int(step), f"non-finite loss at step {step}")
            self.verdict.stop = True
            return self.verdict
        self._follow_spikes(int(step), float(loss))
        if loss <= self.ell0:
            self.last_below = int(step)
        if loss <= self.ell0 * self.rule.stop_factor:
            self.last_below_stop = int(step)
        if not self.verdict.diverged and step - self.last_below >= self.window and self.climbed:
            self.verdict = Verdict(True, int(step), self._window_reason(step))
        if self.verdict.diverged and step - self.last_below_stop >= self.window:
            self.verdict = Verdict(True, self.verdict.step, self.verdict.reason, stop=True)
        return self.verdict

    def row_fields(self) -> WatchRowFields:
        """What a metrics row carries of it: the loss over its running minimum (a spike shows as a rise
        above 1), the steps it has been above ℓ₀, and once diverged, where and whether the stopper's rule fired."""
        spikes = self.all_spikes()
        fields: WatchRowFields = {
            "loss_over_min": self.last_loss / self.running_min if self.last_loss is not None and
            math.isfinite(self.last_loss) else None,
            "above_init_steps": self.above_for, "spikes": len(spikes)}
        if spikes:  # (a string: the ledger's reason for a run that spiked takes it from its last report)
            fields["spike_text"] = describe_spikes(spikes)
        if self.verdict.diverged:
            fields.update(diverged_step=self.verdict.step, divergence_stop=self.verdict.stop,
                          divergence_reason=self.verdict.reason)
        return fields

    def _window_reason(self, step: int) -> str:
        return (f"loss above ℓ₀ = {self.ell0:.3g} from step {self.last_below} on: not back within the recovery "
                f"window of {self.window} steps (step {step}, loss {self.last_loss:.3g})")

    def _follow_spikes(self, step: int, loss: float) -> None:
        threshold = 1 + self.rule.spike_threshold
        if self._open is None:
            if loss > self.running_min * threshold:
                self._open = Spike(step, loss / self.running_min, step)
                self._reference = self.running_min
        elif loss <= self._reference * threshold:
            self._close_spike(step)
        elif loss / self._reference > self._open.height:
            self._open.height, self._open.peak_step = loss / self._reference, step
        self.running_min = min(self.running_min, loss)

    def _close_spike(self, step: int | None) -> None:
        if self._open is not None:
            if step is not None:
                self._open.recovered_after = step - self._open.step
            self.spikes.append(self._open)
            self._open = None

    def finish(self, steps_trained: int) -> Verdict:
        """The run ended after ``steps_trained`` steps: a budget that ended above ℓ₀ has diverged, or did not
        learn when its loss never climbed; a run stopped early above ℓ₀ is undecided."""
        climbed, all_spikes = self.climbed, self.all_spikes()
        if self.verdict.diverged or self.last_loss is None or self.last_loss <= self.ell0:
            self.spikes = all_spikes
            self._open = None
            return self.verdict
        self.spikes, self._open = all_spikes, None
        if steps_trained >= self.budget_steps and not climbed:
            self.verdict = Verdict(did_not_learn=True, reason=f"did not learn within its budget: the loss "
                                   f"{self.last_loss:.4g} is still above ℓ₀ = {self.ell0:.4g} after {steps_trained} "
                                   "steps, but it never climbed (no spike, nothing non-finite), so it did not "
                                   "diverge; train longer or at a higher LR")
        elif steps_trained >= self.budget_steps:
            self.verdict = Verdict(True, int(self.last_step), f"its budget ended with the loss {self.last_loss:.3g} "
                                   f"still above ℓ₀ = {self.ell0:.3g} (above it since step {self.last_below})")
        else:
            self.verdict = Verdict(undecided=True, reason=f"stopped at step {self.last_step} with the loss above "
                                   f"ℓ₀ since step {self.last_below}, before its recovery window ended")
        return self.verdict

    def all_spikes(self) -> list[Spike]:
        """Every spike so far, the one still open included (not yet recovered)."""
        return [*self.spikes, *([self._open] if self._open is not None else [])]

    def record(self) -> DivergenceRecord:
        """What summary.json and the ledger keep of it."""
        spikes = self.all_spikes()
        return {"initial_loss": self.ell0, "recovery_window_steps": self.window, "spikes": [asdict(s) for s in spikes],
                "max_spike_height": max((s.height for s in spikes), default=None),
                "diverged": self.verdict.diverged, "diverged_step": self.verdict.step,
                "divergence_reason": self.verdict.reason, "undecided": self.verdict.undecided,
                "did_not_learn": self.verdict.did_not_learn}


def judge(rows: Iterable[tuple[int, float]], ell0: float, budget_steps: int, steps_trained: int,
          rule: DivergenceRule = DEFAULT_RULE, ended: bool = True) -> LossWatch:
    """A run's (step, train loss) rows judged as a whole; ``ended``: the run is over (else still running)."""
    watch = LossWatch(ell0, budget_steps, rule)
    for step, loss in rows:
        if watch.see(step, loss).diverged:
            break
    if ended:
        watch.finish(steps_trained)
    return watch


def describe_spikes(spikes: list[Spike], open_as: str = "never back") -> str:
    """"spiked twice (step 6: 4.1x its running minimum, back after 72 steps; ...)" or "" (``open_as``: as in
    Spike.describe)."""
    if not spikes:
        return ""
    times = {1: "once", 2: "twice"}.get(len(spikes), f"{len(spikes)} times")
    return f"spiked {times} ({'; '.join(s.describe(open_as) for s in spikes)})"
