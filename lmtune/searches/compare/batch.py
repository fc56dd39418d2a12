"""A compare search's batch-size variants read together: how the best LR moves with the batch at equal tokens, the
loss each batch reaches at its own best LR, and each batch's throughput. Ray-free and file-free.

Only the variants that change nothing but the batch (and the step counts that keep the tokens) enter, the reference
among them: an ablation's best LR says nothing about the batch. Each batch's LR* is located between its grid LRs
(lmtune.analysis.locate, as the horizon and width searches do) and the line ln LR* = a + k ln B is fitted through
them weighted by their errors (lmtune.analysis.fit.fit_power_law). The square-root rule says k = 1/2 (Adam-style
optimizers, Malladi et al. 2022), the linear rule k = 1 (SGD, Goyal et al. 2017); k's interval says which the
measured LR*s allow. How often that interval holds the true k is measured by benchmarks/batch_coverage.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from lmtune.analysis.fit import PowerLaw, fit_power_law
from lmtune.analysis.locate import LocatedLr
from lmtune.errors import LmtuneError
from lmtune.files import JsonObject

# The rules a measured exponent is held against: LR* ∝ B^k.
RULES = {"square-root": 0.5, "linear": 1.0}
# The settings a batch-size variant may give besides its batch (a user may pin the steps that keep the tokens).
BATCH_ONLY = frozenset({"batch_size", "steps", "warmup_steps", "eval_interval", "log_interval", "checkpoint_interval"})


@dataclass(frozen=True)
class BatchPoint:
    """One batch size: its variant, where its best LR lies, the loss there and how fast it trained."""

    variant: str
    batch_size: int
    located: LocatedLr | None
    """Its LR*, located between its grid LRs (None: no LR trained its whole budget)."""
    best_lr: float | None
    """The grid LR crowned best."""
    loss: float | None
    """The mean loss at the best LR at the budget's tokens (every batch trains the same tokens)."""
    loss_sd: float | None
    seeds: int
    tokens_per_s: float | None
    """The median throughput of its runs (while the sweep ran its trials side by side)."""

    def to_json(self) -> JsonObject:
        return {"variant": self.variant, "batch_size": self.batch_size, "best_lr": self.best_lr,
                "located": self.located.to_json() if self.located else None, "loss": self.loss,
                "loss_sd": self.loss_sd, "seeds": self.seeds, "tokens_per_s": self.tokens_per_s}


@dataclass(frozen=True)
class BatchScaling:
    """The batch sizes, smallest first, and the power law through their LR*s (None: ``why_no_law``)."""

    points: tuple[BatchPoint, ...]
    law: PowerLaw | None
    why_no_law: str | None = None

    @property
    def exponent(self) -> float | None:
        """k of LR* ∝ B^k (the fit's exponent is that of LR* ∝ x^-exponent)."""
        return -self.law.exponent if self.law else None

    @property
    def exponent_interval(self) -> tuple[float, float] | None:
        """k's interval (the fit's nominal 90%; what it holds is measured by benchmarks/batch_coverage.py)."""
        if self.law is None:
            return None
        low, high = self.law.exponent_interval
        return -high, -low

    def rules_allowed(self) -> dict[str, bool]:
        """Each rule's k inside the exponent's interval (empty: no fit)."""
        interval = self.exponent_interval
        if interval is None:
            return {}
        return {name: interval[0] <= k <= interval[1] for name, k in RULES.items()}

    def to_json(self) -> JsonObject:
        interval = self.exponent_interval
        return {"points": [p.to_json() for p in self.points], "exponent": self.exponent,
                "exponent_interval": list(interval) if interval else None,
                "rules_allowed": cast(JsonObject, self.rules_allowed()),
                "law": self.law.to_json() if self.law else None, "why_no_law": self.why_no_law}


def fit_batches(points: Sequence[BatchPoint]) -> BatchScaling:
    """The power law through the ``points``' located LR*s (each batch size once), weighted by their errors."""
    points = tuple(sorted(points, key=lambda p: p.batch_size))
    usable = [p for p in points if p.located is not None and p.located.usable]
    if len({p.batch_size for p in usable}) < 2:
        return BatchScaling(points, None, "a fit needs LR* at two or more batch sizes (each batch's best LR not at the "
                                          "end of its LRs, and trained through)")
    try:
        law = fit_power_law([float(p.batch_size) for p in usable], [cast(LocatedLr, p.located) for p in usable],
                            float(max(p.batch_size for p in usable)))
    except (LmtuneError, ValueError, ArithmeticError) as err:
        return BatchScaling(points, None, str(err))
    return BatchScaling(points, law)
