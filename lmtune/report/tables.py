"""The report's tables: summary.json (the whole summary, written from its types) and summary.csv (one row per
trial, params flattened)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from lmtune.files import atomic_write_text
from lmtune.report.rows import varied_params
from lmtune.report.summary import SweepSummary

CSV_COLUMNS = ["trial_id", "lr", "status", "final_val_loss", "best_val_loss", "tokens", "wall_time_s",
               "tokens_per_s", "max_spike_height", "stop_step", "reason"]


def write_tables(summary: SweepSummary, out_dir: Path) -> tuple[Path, Path]:
    """summary.json (SweepSummary.to_json) and summary.csv (one row per trial, params flattened)."""
    out_dir = Path(out_dir)
    json_path, csv_path = out_dir / "summary.json", out_dir / "summary.csv"
    atomic_write_text(json_path, json.dumps(summary.to_json(), indent=2, allow_nan=False) + "\n")
    extra = varied_params(summary.trials)
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(CSV_COLUMNS[:2] + extra + CSV_COLUMNS[2:])
    for row in summary.trials:
        values = [getattr(row, c) for c in CSV_COLUMNS]
        values = values[:2] + [row.params.get(k) for k in extra] + values[2:]
        writer.writerow(["" if v is None else v for v in values])
    atomic_write_text(csv_path, buffer.getvalue())
    return json_path, csv_path
