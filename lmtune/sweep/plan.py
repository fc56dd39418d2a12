"""The plan of a sweep: everything a sweep's trials and its resume need to know, typed, frozen, and
written whole to sweep.json (``to_json``) and read back whole (``from_json``: lmtune.sweep.sweep_file, the one
reader of sweep.json, for --resume and the report alike).

    SweepPlan
      space   the search space as validated: its strategy and that strategy's settings, the fixed settings,
              the scheduler, the stopper (and its divergence rule), the LRs fused per trial
      base    the RunConfig every trial starts from (budget + fixed settings + --set)
      asha    ASHA's rungs in tokens (None without ASHA)
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field

from lmtune.analysis.runs import AshaBudget, Budget
from lmtune.errors import LmtuneError
from lmtune.files import JsonObject
from lmtune.sweep.spaces import SchedulerSpec, SearchSpace
from lmtune.training.config import RunConfig, run_config_of
from lmtune.training.divergence import DEFAULT_RULE, DivergenceRule
from lmtune.training.lr_range import RangeTestConfig
from lmtune.usercode.config import MODEL_SETTING


def asha_budget(spec: SchedulerSpec, largest_trial_tokens: int) -> AshaBudget:
    """A space's ASHA settings in tokens: max_t and grace_period <= 1 are fractions (of the largest
    trial's token budget, and of max_t); larger values are tokens."""
    # Rounded, not cut: a grace period of 1/9 written as 0.1111111 must land on the step it names.
    max_t = round(spec.max_t * largest_trial_tokens) if spec.max_t <= 1 else int(spec.max_t)
    grace = round(spec.grace_period * max_t) if spec.grace_period <= 1 else int(spec.grace_period)
    return AshaBudget(max_t, max(1, min(grace, max_t)), spec.reduction_factor)


@dataclass(frozen=True)
class TrialSetup:
    """What every trial of a sweep shares, whole: what ``train_trial`` needs besides the trial's own values."""

    base: RunConfig
    """The config every trial starts from; a trial applies its own values (lr, seed, ...) to a copy."""
    divergence: DivergenceRule = DEFAULT_RULE
    """How a run's loss is judged (spikes; diverged: failed to recover), reported to the stopper."""
    range_test: RangeTestConfig | None = None
    """The LR range test a trial of stage "range" runs (an edge search's); None: no such trials."""
    asha: AshaBudget | None = None
    """ASHA's rungs in tokens, which a fused group applies to its members itself (None: no ASHA)."""
    code_path: tuple[str, ...] = ()
    """The folders the driver imported the user's code from, which a trial's process adds to its sys.path."""
    code_objects: dict[str, object] = field(default_factory=dict)
    """The user's code handed over in Python (lmtune.Sweep(model=MyModel)), by spec: sent to the trials as objects."""
    space_checked: bool = False
    """Every trial's settings come from the space file lmtune parsed and checked (``python -m lmtune.run``): the
    trials put them in place unchecked. False: a Tuner of the user's may hand any param_space; each trial checks."""
    trial_figures: bool = False
    """Each trial draws its own loss_curves.png and lr_schedule.png as it ends (``run --trial-figures``). False: the
    report's figures, which show every trial's curves, are the only ones; a trial's process then spends no time
    on figures, nor on importing matplotlib."""

    def import_user_code(self) -> None:
        """Make the user's code importable in this (a trial's) process, as it was in the driver's."""
        from lmtune.usercode.imports import add_to_sys_path, adopt

        add_to_sys_path(self.code_path)
        adopt(self.code_objects)


@dataclass(frozen=True)
class SweepPlan:
    """What a sweep runs: its space, the config its trials start from, and ASHA's rungs."""

    space: SearchSpace
    """The search space as validated: how trials are chosen and what every trial shares."""
    base: RunConfig
    """The config every trial starts from; each trial applies its own swept settings to a copy."""
    asha: AshaBudget | None = None
    """ASHA's rungs in tokens (None: the sweep runs no ASHA)."""
    unigram_loss: float | None = None
    """The data's unigram baseline (lmtune.data.dataset.unigram_loss), which judges whether a run trained (None: a
    sweep.json written before lmtune recorded it)."""

    @classmethod
    def create(cls, space: SearchSpace, base: RunConfig, unigram_loss: float | None = None) -> SweepPlan:
        """The plan, with ASHA's budget computed from the largest trial the space can have."""
        space.strategy.check_base(base)
        space = dataclasses.replace(space, strategy=space.strategy.resolved(base))
        plan = cls(space, base, unigram_loss=unigram_loss)
        if space.scheduler.name != "asha" or space.strategy.asha_stages() == frozenset():
            return plan
        return dataclasses.replace(plan, asha=asha_budget(space.scheduler, plan.max_trial_tokens()))

    def trial_setup(self, space_checked: bool = False, trial_figures: bool = False) -> TrialSetup:
        """What the sweep's trials share (lmtune.sweep.trainable.train_trial), the user's code included: the folders
        it was imported from here (the driver has imported it: lmtune.sweep.experiment.make_plan), and any model a
        compare search's variant trains instead.
        ``space_checked``: the trials get only this plan's space's settings (TrialSetup.space_checked);
        ``trial_figures``: TrialSetup.trial_figures."""
        from lmtune.usercode.imports import code_path, objects

        specs = self.code_specs
        return TrialSetup(self.base, self.divergence_rule, self.space.strategy.range_test(), self.asha,
                          tuple(code_path(specs)), objects(specs), space_checked, trial_figures)

    @property
    def code_specs(self) -> list[str]:
        """Every spec of the user's code the sweep's trials import: the base config's, and any model a compare
        search's variant trains instead."""
        return [*self.base.code.specs.values(), *map(str, self.space.strategy.values_of(MODEL_SETTING))]

    def budget(self) -> Budget:
        """Every trial's budget as the searchers and the report see it: steps, tokens per step, seed, ASHA's rungs."""
        return Budget.of_run(self.base, self.asha, self.unigram_loss)

    @property
    def divergence_rule(self) -> DivergenceRule:
        return self.space.stopper.rule

    def largest_value(self, name: str, current: int) -> int:
        """The largest value trials give setting ``name`` (``current``: the base config's, when none sets it)."""
        return max([int(v) for v in self.space.strategy.values_of(name)], default=current)

    def max_trial_tokens(self) -> int:
        """The largest token budget any trial can have (batch/context/steps may vary)."""
        base = self.base
        return (self.largest_value("batch_size", base.train.batch_size)
                * self.largest_value("context_length", base.model.context_length)
                * self.largest_value("steps", base.train.steps))

    def largest_trial(self) -> RunConfig:
        """The base config with the largest batch and context any trial can have: the one that needs the
        most memory."""
        base = self.base
        largest = dataclasses.replace(base, model=dataclasses.replace(base.model),
                                      train=dataclasses.replace(base.train))
        largest.train.batch_size = self.largest_value("batch_size", base.train.batch_size)
        largest.model.context_length = self.largest_value("context_length", base.model.context_length)
        return largest

    def to_json(self) -> JsonObject:
        """sweep.json's keys for the plan: ``space``, ``budget``, ``base_config``, ``asha`` and ``unigram_loss`` (when
        known)."""
        return {"space": self.space.to_json(), "budget": self.base.budget, "base_config": self.base.to_dict(),
                "asha": asdict(self.asha) if self.asha else None,
                **({"unigram_loss": self.unigram_loss} if self.unigram_loss is not None else {})}

    @classmethod
    def from_json(cls, data: JsonObject) -> SweepPlan:
        """The plan of a sweep.json (its ``space``, ``base_config`` and ``asha``, as lmtune.sweep.sweep_file has
        checked them): keys this version does not know left out, missing ones at their defaults. LmtuneError when
        it holds none this version can use."""
        try:
            base = run_config_of(data["base_config"])
            if base is None:
                raise ValueError("base_config is not a run config (model and train, each value of its field's type)")
            asha, unigram = data.get("asha"), data.get("unigram_loss")
            return cls(SearchSpace.from_json(data["space"]), base,
                       AshaBudget(int(asha["max_t"]), int(asha["grace_period"]), float(asha["reduction_factor"]))
                       if asha else None, None if unigram is None else float(unigram))
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise LmtuneError(f"no usable sweep plan ({type(err).__name__}: {err}); it was not written by "
                              "python -m lmtune.run, or was edited: restore it") from None
