"""A trial's sharpness as the report records it: one estimate at a checkpoint (``Sharpness``), its row of
sharpness.csv and of summary.json (``SharpnessRow``), and the thresholds it is read against. What estimates it (power
iteration on Hessian-vector products at a trial's checkpoints, analyze --sharpness) is lmtune.report.sharpness."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from lmtune.files import JsonObject


@dataclass(frozen=True)
class Sharpness:
    """One checkpoint's sharpness, raw and Adam-preconditioned, and the thresholds it is read against."""

    step: int
    """The checkpoint's step."""
    lr_at_step: float | None
    """The LR its last step was taken with (None: neither its optimizer state nor its config tells)."""
    sharpness: float
    """The top Hessian eigenvalue of the training loss on the fixed batch."""
    preconditioned_sharpness: float | None
    """The top eigenvalue of P^-1/2 H P^-1/2 under Adam's preconditioner (None: no optimizer state)."""
    gd_threshold: float | None
    """2/lr: where full-batch GD's sharpness hovers (None: no LR)."""
    adam_threshold: float | None
    """(2 + 2 beta1) / ((1 - beta1) lr): where Adam's preconditioned sharpness hovers (None: no LR or beta1)."""


@dataclass(frozen=True)
class SharpnessRow:
    """A row of sharpness.csv (and of summary.json's ``sharpness``): one trial's sharpness at one checkpoint."""

    trial_id: str | None
    """The trial (None: a lone checkpoint's series)."""
    lr: float | None
    """The trial's LR."""
    estimate: Sharpness
    """Its sharpness at the checkpoint."""

    def to_json(self) -> JsonObject:
        """The row by SHARPNESS_COLUMNS, in their order."""
        return {"trial_id": self.trial_id, "lr": self.lr, **asdict(self.estimate)}


def gd_threshold(lr: float) -> float:
    """Sharpness at which full-batch GD with step ``lr`` stops being stable on a quadratic: 2/lr."""
    return 2.0 / lr


def adam_threshold(lr: float, beta1: float = 0.9) -> float:
    """Preconditioned-sharpness stability threshold of Adam (Cohen et al. 2022): (2 + 2 b1)/((1 - b1) lr)."""
    return (2.0 + 2.0 * beta1) / ((1.0 - beta1) * lr)


SHARPNESS_COLUMNS = ["trial_id", "lr", "step", "lr_at_step", "sharpness", "preconditioned_sharpness",
                     "gd_threshold", "adam_threshold"]
