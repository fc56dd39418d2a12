"""One row per trial (summary.json's ``trials``, summary.csv, the report's trial table) and how many trials
have each status; the runs that spiked and those cut while above ℓ₀, as the summary lists them; and the JSON-safety
every value of summary.json passes (no NaN, no numpy scalars)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, cast

import numpy as np

from lmtune.analysis.runs import Run
from lmtune.files import JsonObject
from lmtune.findings.stability import (
    STATUSES,
    TrialRecord,
    best_val_loss,
    classify,
    column,
    final_val_loss,
    initial_loss_of,
    spikes_of,
    tokens_trained,
    trial_statuses,
)
from lmtune.training.divergence import Spike

Param = bool | int | float | str | None
"""A varied hyperparameter's value as Tune gave it (JSON-safe)."""


@dataclass(frozen=True)
class TrialRow:
    """One trial as the report lists it."""

    trial_id: str
    """The trial's id (its folder's first part)."""
    lr: float
    """Its peak LR."""
    stage: str
    """The search stage that planned it ("grid" for a grid or Optuna sweep)."""
    seed: int | None
    """Its seed, when the search set one."""
    params: Mapping[str, Param]
    """Every varied hyperparameter, lr included (Tune's param_space values)."""
    status: str
    """lmtune.findings.stability.trial_statuses: diverged > unconfirmed (cut while above ℓ₀) > spiked > the sweep's
    outcome."""
    final_val_loss: float | None
    """The val loss at the end of its whole budget (None: it stopped earlier, or diverged)."""
    best_val_loss: float | None
    """Its lowest val loss at any token count."""
    tokens: int | None
    """Tokens trained (its newest metrics row)."""
    budget_tokens: int | None
    """Tokens of its whole schedule (None: no config)."""
    wall_time_s: float | None
    """Seconds it ran."""
    tokens_per_s: float | None
    """Mean throughput over its rows (else tokens / wall time)."""
    reason: str
    """Why it ended (the ledger's reason)."""
    stop_step: int | None
    """The step it stopped at (None: it trained its budget, or is running)."""
    spikes: tuple[Spike, ...]
    """Each excursion of its train loss above its running minimum."""
    max_spike_height: float | None
    """The highest of them, over the running minimum (None: no spike)."""

    def to_json(self) -> JsonObject:
        row = asdict(self)
        return {**row, "params": dict(self.params), "spikes": [asdict(s) for s in self.spikes]}


def trial_row(record: TrialRecord, status: str | None = None) -> TrialRow:
    """The trial's row; ``status``: its status among the sweep's trials (trial_statuses; default: its own)."""
    status = status or classify(record)
    spikes = spikes_of(record)
    tokens = tokens_trained(record)
    speed = column(record, "tokens_per_s")
    if speed is not None and np.isfinite(speed).any():
        tokens_per_s = float(np.nanmean(np.where(np.isfinite(speed), speed, np.nan)))
    elif tokens and record.wall_time_s:
        tokens_per_s = tokens / record.wall_time_s
    else:
        tokens_per_s = None
    budget = record.budget_tokens
    full = status != "diverged" and tokens is not None and (budget is None or tokens >= budget)
    return TrialRow(
        trial_id=record.trial_id, lr=record.lr, stage=record.stage, seed=record.seed,
        params={k: clean(v) for k, v in record.params.items()}, status=status,
        final_val_loss=final_val_loss(record) if full else None,  # only at the end of the whole budget
        best_val_loss=best_val_loss(record), tokens=tokens, budget_tokens=budget,
        wall_time_s=clean(record.wall_time_s), tokens_per_s=clean(tokens_per_s), reason=record.reason,
        stop_step=record.stop_step, spikes=tuple(spikes),
        max_spike_height=clean(max((spike.height for spike in spikes), default=None)))


def trial_table(records: Sequence[TrialRecord]) -> tuple[tuple[TrialRow, ...], dict[str, int]]:
    """One row per trial (by LR, seed, id) and how many trials have each status."""
    statuses = trial_statuses(records)
    rows = tuple(trial_row(r, statuses[r.trial_id])
                 for r in sorted(records, key=lambda rec: (rec.lr, rec.seed or 0, rec.trial_id)))
    counts = {s: sum(row.status == s for row in rows) for s in STATUSES if any(row.status == s for row in rows)}
    return rows, counts


@dataclass(frozen=True)
class SpikedRun:
    """A run whose loss spiked (rose far above its running minimum and came back) without diverging."""

    trial_id: str
    """The trial."""
    lr: float
    """Its LR."""
    seed: int
    """Its seed."""
    spikes: tuple[Spike, ...]
    """Each excursion of its loss (lmtune.training.divergence.Spike)."""


@dataclass(frozen=True)
class UnconfirmedRun:
    """A run cut early (by ASHA or the stopper) while its loss stood above ℓ₀, having climbed there
    (lmtune.findings.stability.cut_above_initial): it may have come back, or diverged; not known."""

    trial_id: str
    """The trial."""
    lr: float
    """Its LR."""
    seed: int
    """Its seed."""
    loss: float
    """The train loss it stood at when it was cut."""
    over_initial: float
    """That loss over its ℓ₀ (25: twenty-five times the loss it started at)."""
    tokens: int
    """Tokens it trained before it was cut."""
    reason: str
    """Why it was cut (the ledger's reason)."""


def unconfirmed_run(run: Run, record: TrialRecord) -> UnconfirmedRun:
    """A run cut while above ℓ₀ (run.cut_loss set) as the report names it."""
    ell0, cut_loss = initial_loss_of(record), cast(float, run.cut_loss)
    return UnconfirmedRun(record.trial_id, run.lr, run.seed, float(cut_loss),
                          float(cut_loss / ell0) if ell0 else math.nan, run.tokens, record.reason)


def clean(value: Any) -> Any:
    """JSON-safe: NaN/inf -> None, numpy scalars -> Python."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def json_safe(value: Any) -> Any:
    """NaN/inf -> None and numpy scalars -> Python, through dicts and lists (for JSON with allow_nan=False)."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return clean(value)


def varied_params(rows: Sequence[TrialRow]) -> list[str]:
    """The varied hyperparameters besides the LR, in the order the rows first name them."""
    names: list[str] = []
    for row in rows:
        for key in row.params:
            if key != "lr" and key not in names:
                names.append(key)
    return names
