"""Every per-step metric a run logs, defined once: ``REGISTRY``.

A metrics row (what the training loops emit at a log interval) holds registered keys only, and every
place that handles rows reads them from here: metrics.csv's header and which of its columns are counts
(lmtune.training.metrics), TensorBoard and W&B (the row's finite numbers), Ray Tune's report
(lmtune.sweep.reporting), the report's stability probes (lmtune.findings.stability) and its instability
figure (lmtune.report.figures.plot_instability). A key no metric names is refused (``UnregisteredMetric``),
never dropped.

Adding a metric: a ``Metric`` below, and the code that measures it. One a step measures at log steps goes in
``StepMeasure.after`` (lmtune.training.step), which both loops' steps call (a single model's and a fused
group's): a device tensor under its name, shape () or, for a per-layer family, (n_layers,); a fused group's
carry the members first, (K,) or (K, n_layers). The interval meter reads those tensors to the host with the row
(one transfer), nothing else changes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# What a row's value may be: a number, a count, a flag, a text (for Tune), or None (not measured at this row).
RowValue = float | int | bool | str | None
Row = dict[str, RowValue]

FLOAT, COUNT, FLAG, TEXT = "float", "count", "flag", "text"
_NAME = re.compile(r"[a-z][a-z0-9_]*")


class UnregisteredMetric(LookupError):
    """A row key that no registered metric names: a programming error, never silently dropped."""


@dataclass(frozen=True)
class Metric:
    """One per-step metric."""

    name: str
    """The row key and metrics.csv column; for a per-layer family, the stem of its columns."""
    description: str
    """What it measures, in a sentence (its documentation)."""
    kind: str = FLOAT
    """FLOAT; COUNT (a whole number 0..2^53, read back as int); FLAG (a bool); TEXT (a string)."""
    csv: bool = True
    """A column of metrics.csv; False: only the row's other sinks see it (TensorBoard, W&B, Tune)."""
    per_layer: bool = False
    """One value per transformer block: columns <name>_max and <name>_l0 .. <name>_l{n_layers - 1}."""
    label: str = ""
    """Short words for it in the report (default: its name)."""
    instability_panel: bool = False
    """Drawn in the report's instability figure (a per-layer family: its max over layers)."""
    log_scale: bool = True
    """Its panel's y axis is logarithmic (of |value|)."""
    probe: bool = False
    """A stability probe: the report's first_growth compares it with the best trial's at the same step."""

    @property
    def column(self) -> str:
        """The column the report reads it by: its own, or a family's max over layers."""
        return f"{self.name}_max" if self.per_layer else self.name

    @property
    def title(self) -> str:
        return self.label or self.name

    def layer_column(self, layer: int) -> str:
        return f"{self.name}_l{layer}"

    def expand(self, values: list[float]) -> dict[str, float]:
        """A measured value as the row's columns: a family's (n_layers,) values as its max and one per layer."""
        if not self.per_layer:
            (value,) = values
            return {self.name: value}
        top = math.nan if any(math.isnan(v) for v in values) else max(values)
        return {self.column: top, **{self.layer_column(i): v for i, v in enumerate(values)}}


REGISTRY: dict[str, Metric] = {}


def register(metric: Metric) -> Metric:
    """Add ``metric``; refused when its name, or one of its columns, is already taken."""
    if not _NAME.fullmatch(metric.name):
        raise ValueError(f"metric name {metric.name!r}: lower-case letters, digits and _ only")
    if metric.kind not in (FLOAT, COUNT, FLAG, TEXT):
        raise ValueError(f"metric {metric.name}: kind {metric.kind!r} is not one of {FLOAT}, {COUNT}, {FLAG}, {TEXT}")
    if metric.per_layer and metric.kind != FLOAT:
        raise ValueError(f"metric {metric.name}: a per-layer family holds floats")
    taken = metric_of(metric.column) or metric_of(metric.name) or metric_of(metric.layer_column(0))
    if taken is not None:
        raise ValueError(f"metric {metric.name} clashes with the registered metric {taken.name}")
    REGISTRY[metric.name] = metric
    return metric


def unregister(name: str) -> None:
    REGISTRY.pop(name, None)


def metric_of(key: str) -> Metric | None:
    """The metric a row key or metrics.csv column belongs to (a per-layer family's columns included)."""
    if key in REGISTRY:
        return REGISTRY[key]
    stem, _, suffix = key.rpartition("_")
    family = REGISTRY.get(stem)
    if family is not None and family.per_layer and (suffix == "max" or re.fullmatch(r"l\d+", suffix)):
        return family
    return None


def check_row(row: Mapping[str, object]) -> None:
    """Refuse a row holding a key no metric names (a sink must never drop one silently)."""
    unknown = [key for key in row if metric_of(key) is None]
    if unknown:
        raise UnregisteredMetric(
            f"metrics row key(s) {', '.join(map(repr, unknown))} are not registered metrics: register each "
            f"with lmtune.training.metric_registry.register(Metric(...)) (the built-in ones are defined there)")


def is_count_column(column: str) -> bool:
    metric = metric_of(column)
    return metric is not None and metric.kind == COUNT


def csv_columns(rows: Iterable[Mapping[str, object]] = ()) -> list[str]:
    """metrics.csv's header for these rows: every registered CSV metric in registry order, a per-layer
    family's max and then the layers the rows hold; last, columns of rows read back from a file that no
    metric names now (kept, not dropped)."""
    present: set[str] = set()
    for row in rows:
        present.update(row)
    columns = []
    for metric in REGISTRY.values():
        if not metric.csv:
            continue
        if not metric.per_layer:
            columns.append(metric.name)
            continue
        layers = sorted(int(c.rpartition("_l")[2]) for c in present
                        if metric_of(c) is metric and c != metric.column)
        columns += [metric.column, *(metric.layer_column(i) for i in layers)]
    return columns + sorted(c for c in present if metric_of(c) is None)


def numbers(row: Mapping[str, object]) -> dict[str, float]:
    """The row's finite numbers but its step (TensorBoard's and W&B's values; counts too, flags and texts not),
    after ``check_row``."""
    check_row(row)
    return {key: float(value) for key, value in row.items()
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value)}


def instability_panels() -> list[Metric]:
    """The metrics the report's instability figure draws, in registry order."""
    return [m for m in REGISTRY.values() if m.instability_panel]


def probe_labels() -> dict[str, str]:
    """Column -> label of the stability probes the report compares against the best trial, in registry order."""
    return {m.column: m.title for m in REGISTRY.values() if m.probe}


# ---------------------------------------------------------------------------------------------
# The built-in metrics, in metrics.csv's column order.

for _metric in (
    Metric("step", "Optimizer steps taken: the row's x axis.", COUNT),
    Metric("tokens", "Tokens trained: step x tokens per step.", COUNT),
    Metric("train_loss", "Mean training loss over the log interval's steps."),
    Metric("val_loss", "Mean loss on the fixed held-out batches; empty where the row did not evaluate."),
    Metric("lr", "The learning rate of the row's step."),
    Metric("grad_norm", "Global gradient norm before clipping, at the row's step.", label="gradient norm",
           instability_panel=True, probe=True),
    Metric("tokens_per_s", "Training throughput over the interval (a fused member: its own tokens, not the group's)."),
    Metric("mfu", "Model FLOPs utilisation over the interval (empty where the device's peak is unknown)."),
    Metric("data_wait_s", "Mean seconds per step spent waiting for a batch."),
    Metric("compute_s", "Mean seconds per step spent computing."),
    Metric("peak_memory_bytes", "Peak device memory since the run started (0 on CPU).", COUNT),
    Metric("attn_logit_max", "Largest causal attention logit q.k/sqrt(d) over the layers, on two windows.",
           label="attention-logit max", instability_panel=True, probe=True),
    Metric("output_logit_max", "Largest |output logit|, on two windows.", label="output-logit max",
           instability_panel=True, probe=True),
    Metric("output_logz_mean", "Mean log-partition of the output logits (what z-loss pulls toward 0)."),
    Metric("elapsed_s", "Wall time of the run, earlier processes of a resumed run included."),
    Metric("loss_over_min", "Train loss over its running minimum (a spike shows as a rise above 1)."),
    Metric("above_init_steps", "Steps the train loss has been above ℓ₀ = ln vocab.", COUNT),
    Metric("update_ratio", "Relative update size ||ΔW|| / ||W|| of the row's step per transformer block (its "
           "parameters as one vector, W before the step): a leading indicator of instability.", per_layer=True,
           label="relative update size (max over layers)", instability_panel=True),
    # Carried by the row to TensorBoard, W&B and Tune (the stopper, the ledger), not to metrics.csv.
    Metric("spikes", "Loss spikes so far (lmtune.training.divergence).", COUNT, csv=False),
    Metric("spike_text", "The spikes in words (the ledger's reason for a run that spiked).", TEXT, csv=False),
    Metric("diverged_step", "Where the divergence rule found the run diverged.", COUNT, csv=False),
    Metric("divergence_stop", "Whether the stopper's divergence rule fired.", FLAG, csv=False),
    Metric("divergence_reason", "Why the run is judged diverged, in words.", TEXT, csv=False),
):
    register(_metric)
