"""Which of the user's own code a run names: ``UserCode``, a section of every RunConfig (lmtune's own model, AdamW
and schedules where a field is empty), and the settings that name it. A record of names only: nothing here imports
or calls the code (lmtune.usercode does, above training), and how a run trains with it is its training spec's
(lmtune.training.spec; the user's: lmtune.usercode.spec).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import cast

from lmtune.errors import LmtuneError, shown

# The flag (and space-file key) of each code field, for messages.
FLAGS = {"model": "--model", "optimizer": "--optimizer", "schedule": "--schedule"}
# What each names, for messages: how lmtune calls it.
CALLED_AS = {
    "model": "MODULE:CALLABLE, called as CALLABLE(vocab_size=, context_length=, d_model=, num_layers=, num_heads=, "
             "d_ff=, rope_theta=) and returning an nn.Module whose forward(token_ids) gives logits",
    "optimizer": "MODULE:CLASS, a torch.optim.Optimizer called as CLASS(param_groups, lr=, betas=, eps=, "
                 "weight_decay=)",
    "schedule": "MODULE:FUNCTION, called as FUNCTION(it, max_learning_rate, min_learning_rate, warmup_iters, "
                "cosine_cycle_iters)",
}
# A factory argument's value: what --model-set key=value and a space's model_set: give (YAML scalars).
ModelArg = int | float | bool | str
# A trial's (or a compare search's variant's) settings may name the user's model too, as flat settings beside the
# config's fields: ``model`` (its spec) and ``model_set.NAME`` (an argument of its callable).
MODEL_SETTING = "model"
MODEL_ARG_PREFIX = "model_set."


@dataclass
class UserCode:
    """The user's model, optimizer and schedule (each '' : lmtune's own), and the model's further arguments."""

    model: str = ""
    """MODULE:CALLABLE (or PATH.py:CALLABLE) building the model; '' : lmtune's TransformerLM."""
    model_args: dict[str, ModelArg] = field(default_factory=dict)
    """Keyword arguments of the user's own the model's callable also gets (--model-set key=value)."""
    optimizer: str = ""
    """MODULE:CLASS, a torch.optim.Optimizer; '' : lmtune's AdamW."""
    schedule: str = ""
    """MODULE:FUNCTION giving the LR of a step; '' : lmtune's schedule (TrainConfig.schedule)."""

    @property
    def user_model(self) -> bool:
        return bool(self.model)

    @property
    def specs(self) -> dict[str, str]:
        """The code fields that are set, by field name."""
        return {name: spec for name in FLAGS if (spec := getattr(self, name))}

    def on_top_of(self, base: UserCode) -> UserCode:
        """This code over ``base`` (a space's, a resumed run's): each field set here replaces base's, the model's
        arguments are base's updated by these."""
        return UserCode(self.model or base.model, {**base.model_args, **self.model_args},
                        self.optimizer or base.optimizer, self.schedule or base.schedule)

    def with_settings(self, settings: Mapping[str, object]) -> UserCode:
        """This code with the code settings among ``settings`` in place (``is_code_setting``): a ``model`` of their own
        takes only their arguments, the same model this code's arguments updated by theirs."""
        model = str(settings.get(MODEL_SETTING) or "")
        args = {name.removeprefix(MODEL_ARG_PREFIX): cast(ModelArg, value) for name, value in settings.items()
                if name.startswith(MODEL_ARG_PREFIX)}
        if not model and not args:
            return dataclasses.replace(self, model_args=dict(self.model_args))
        own = bool(model) and model != self.model
        return dataclasses.replace(self, model=model or self.model,
                                   model_args={**({} if own else self.model_args), **args})

    def describe(self) -> str:
        """The model in words: its spec and arguments, or lmtune's own."""
        if not self.model:
            return "lmtune's TransformerLM"
        args = ", ".join(f"{k}={v!r}" for k, v in sorted(self.model_args.items()))
        return f"{self.model}" + (f" ({args})" if args else "")

    def title(self) -> str:
        """The model as the report names it to whoever ran the sweep: the user's as "your `SPEC (ARGS)`",
        lmtune's by its name."""
        return f"your `{self.describe()}`" if self.user_model else self.describe()

    def to_dict(self) -> dict:
        return {"model": self.model, "model_args": dict(self.model_args), "optimizer": self.optimizer,
                "schedule": self.schedule}

    @classmethod
    def from_dict(cls, data: object) -> UserCode:
        """From ``to_dict``'s form (a config.json or sweep.json of a version without it: lmtune's own code)."""
        if not isinstance(data, Mapping):
            return cls()
        args = data.get("model_args") or {}
        return cls(**{name: str(data.get(name) or "") for name in FLAGS},
                   model_args={str(k): v for k, v in args.items()} if isinstance(args, Mapping) else {})


def is_code_setting(name: str) -> bool:
    """Whether a flat setting's name names the user's model or one of its arguments, not a config field."""
    return name == MODEL_SETTING or (name.startswith(MODEL_ARG_PREFIX) and name[len(MODEL_ARG_PREFIX):].isidentifier())


def code_setting(name: str, value: object, where: str) -> ModelArg:
    """A code setting's value as a trial carries it: the model's spec as text, an argument a YAML scalar."""
    if name == MODEL_SETTING:
        if not isinstance(value, str) or not value:
            raise LmtuneError(f"{where}: model {shown(value)}: give MODULE:NAME or path/to/file.py:NAME")
        return value
    arg = name.removeprefix(MODEL_ARG_PREFIX)
    return checked_model_args({arg: value}, where.removesuffix(f".{arg}"))[arg]


def checked_model_args(args: object, where: str) -> dict[str, ModelArg]:
    """A space's ``model_set:`` (or the Python API's ``model_set=``): a mapping of argument names to scalars."""
    if args is None:
        return {}
    if not isinstance(args, Mapping):
        raise LmtuneError(f"{where}: must be a mapping of your model's argument names to values, e.g. "
                          "{use_rope: false}")
    result = {}
    for key, value in args.items():
        if not isinstance(key, str) or not key.isidentifier():
            raise LmtuneError(f"{where}: {shown(key)} is not an argument name")
        if not isinstance(value, int | float | bool | str) or (isinstance(value, float) and not math.isfinite(value)):
            raise LmtuneError(f"{where}.{key}: {shown(value)} is not a number, true/false or text")
        result[key] = value
    return result


def check_user_code(code: UserCode, changed_switches: Mapping[str, object], schedule: str,
                    need: Callable[[bool, str], None]) -> None:
    """Settings that only lmtune's model and schedules read, refused where the user's own code stands in for them.
    ``changed_switches``: lmtune's model's own switches set away from their defaults, with their values."""
    need(code.user_model or not code.model_args, f"--model-set {', '.join(code.model_args)}: arguments of your "
         "model's callable, but no --model names it; give --model too")
    if code.user_model:
        for name, value in changed_switches.items():  # (the first one is refused)
            why = (" (μP needs lmtune's model: its multipliers are written for it)"
                   if name == "parametrization" or name.startswith("mup") else "")
            need(False, f"{name}={shown(value)} is a switch of lmtune's model, which --model {code.model} "
                 f"replaces{why}; pass your model's own flags with --model-set key=value")
    if code.schedule:
        need(schedule == "cosine", f"schedule={schedule} picks one of lmtune's schedules, which --schedule "
             f"{code.schedule} replaces; drop one of them")
