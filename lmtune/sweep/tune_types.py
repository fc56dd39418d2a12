"""What Ray Tune hands lmtune and takes back: plain dicts, as Tune types them. Named here so that the code reading
them says it stands at Ray's boundary, and reads what it needs there (a typed value from then on)."""

from __future__ import annotations

from typing import Any

TuneResult = dict[str, Any]
"""A result: what a trial reports (``tune.report``), and what Tune hands its callbacks, stoppers and schedulers."""

TuneParams = dict[str, Any]
"""A trial's config: its values from the sweep's param space (lr, stage, members, ...), as Tune hands them to the
trainable."""
