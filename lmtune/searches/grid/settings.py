"""``search: grid``'s part of a space file: ``params``, each setting's values listed, checked and bounded (the
strategy that reads it: lmtune.searches.grid)."""

from __future__ import annotations

import functools
import math
from collections import Counter

from lmtune.files import JsonObject
from lmtune.searches.base import Fail, Setting, params_section
from lmtune.training.config import check_setting

# The most trials a grid may ask for: far beyond what a sweep can run (a quick trial takes ~10 s on 2 cores),
# and small enough that parsing and Tune's bookkeeping stay instant.
MAX_GRID_TRIALS = 10_000


def combinations(values: dict[str, list[Setting]]) -> list[dict[str, Setting]]:
    """Every combination of the given values per setting."""
    samples: list[dict[str, Setting]] = [{}]
    for name, options in values.items():
        samples = [{**s, name: v} for s in samples for v in options]
    return samples


def parse_grid(raw: JsonObject, fail: Fail) -> dict[str, list[Setting]]:
    """The space's ``params``: setting -> its values in the order listed, each checked, none twice, the grid no
    larger than MAX_GRID_TRIALS."""
    params = {}
    for name, spec in params_section(raw, fail).items():
        key = f"params.{name}"
        if isinstance(spec, dict):
            raise fail(key, "search: grid takes a list of values; distributions are for search: optuna")
        values = spec if isinstance(spec, list) else [spec]
        if not values:
            raise fail(key, "empty grid; list at least one value")
        if len(values) > MAX_GRID_TRIALS:
            raise fail(key, f"{len(values):,} values; a grid runs at most {MAX_GRID_TRIALS:,} trials: "
                            "use search: optuna or edge to cover a range that finely")
        coerced = [check_setting(name, v, functools.partial(fail, key)) for v in values]
        repeated = sorted((v for v, count in Counter(coerced).items() if count > 1), key=str)
        if repeated:  # [1e-3, 0.001] would run the same trial twice
            raise fail(key, f"{', '.join(map(str, repeated))} listed more than once; list each value once")
        params[name] = coerced
    trials = math.prod(len(values) for values in params.values())
    if trials > MAX_GRID_TRIALS:
        raise fail("params", f"the grid has {trials:,} combinations; a grid runs at most {MAX_GRID_TRIALS:,} "
                             "trials: list fewer values")
    return params
