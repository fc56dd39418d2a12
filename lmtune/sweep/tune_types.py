"""What Ray Tune hands lmtune and takes back: plain dicts, as Tune types them. Named here so that the code reading
them says it stands at Ray's boundary, and reads what it needs there (a typed value from then on)."""

from __future__ import annotations

from typing import Any

TuneResult = dict[str, Any]
"""A result: what a trial reports (``tune.report``), and what Tune hands its callbacks, stoppers and schedulers."""

TuneParams = dict[str, Any]
"""A trial's config: its values from the sweep's param space (lr, stage, members, ...), as Tune hands them to the
trainable."""

# The one objective lmtune's searchers and ASHA rank trials by.
METRIC, MODE = "val_loss", "min"


def check_objective(who: str, metric: str | None, mode: str | None) -> None:
    """A user's ``TuneConfig(metric=..., mode=...)`` handed to lmtune's searcher or ASHA: val_loss, lowest first (or
    left unset); anything else refused, naming the fix (mode="max" would keep the worst LRs and cut the best)."""
    if metric not in (None, METRIC) or mode not in (None, MODE):
        raise ValueError(f"{who} ranks runs by {METRIC}, lowest first; set TuneConfig(metric={METRIC!r}, "
                         f"mode={MODE!r}) (got metric={metric!r}, mode={mode!r})")
