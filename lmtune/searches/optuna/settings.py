"""``search: optuna``'s part of a space file: each setting of ``params`` as the distribution Optuna's sampler draws
from, checked (the strategy that reads it: lmtune.searches.optuna)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmtune.searches.base import Fail, Setting
from lmtune.training.config import check_setting, field_type

SAMPLERS = ("tpe", "random", "cmaes")
DISTRIBUTIONS = ("loguniform", "uniform", "randint", "choice")


@dataclass(frozen=True)
class Distribution:
    kind: str
    """loguniform | uniform | randint | choice"""
    args: tuple[Setting, ...]
    """(low, high), both included for randint; or the choices."""

    def ends(self) -> list[Setting]:
        return [self.args[0]] if self.kind == "choice" else list(self.args)

    def largest(self) -> Setting:
        return max(self.args)

    def tune_domain(self):
        from ray import tune

        if self.kind == "loguniform":
            return tune.loguniform(*self.args)
        if self.kind == "uniform":
            return tune.uniform(*self.args)
        if self.kind == "randint":
            return tune.randint(self.args[0], self.args[1] + 1)  # inclusive upper bound, as written
        return tune.choice(list(self.args))


def distribution(name: str, spec: Any, key: str, fail: Fail) -> Distribution:
    def refuse(why: str) -> Exception:
        return fail(key, why)

    if isinstance(spec, list):
        if not spec:
            raise fail(key, "empty choice list; list at least one value")
        return Distribution("choice", tuple(check_setting(name, v, refuse) for v in spec))
    if not isinstance(spec, dict) or len(spec) != 1:
        raise fail(key, f"expected one distribution, e.g. {{loguniform: [1.0e-4, 1.0e-2]}}; use one of "
                        f"{', '.join(DISTRIBUTIONS)}")
    (kind, args), = spec.items()
    if kind not in DISTRIBUTIONS:
        raise fail(key, f"unknown distribution '{kind}'; use one of {', '.join(DISTRIBUTIONS)}")
    if kind == "choice":
        if not isinstance(args, list) or not args:
            raise fail(key, "choice needs a non-empty list of values")
        return Distribution(kind, tuple(check_setting(name, v, refuse) for v in args))
    if not isinstance(args, list) or len(args) != 2:
        raise fail(key, f"{kind} needs [low, high]")
    low, high = (check_setting(name, v, refuse) for v in args)
    if not low < high:
        raise fail(key, f"bounds in the wrong order ({low} >= {high}); write [low, high] with low < high")
    if kind == "loguniform" and low <= 0:
        raise fail(key, "loguniform bounds must be > 0")
    if kind == "randint" and field_type(name) is not int:
        raise fail(key, "randint is for integer settings; use uniform or loguniform")
    return Distribution(kind, (low, high))
