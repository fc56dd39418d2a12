"""The edge-of-stability report of one sweep: reads it, computes the numbers, writes results/NAME/report/.

The figures (lmtune.report.figures.FIGURES and the search's own: lr_sweep_comparison.png, lr_vs_loss.png at equal
token counts, lr_range_test.png for an edge search, horizon.png for a horizon search, instability.png when a run
diverged or spiked, sharpness.png), lr_sweep_analysis.md, summary.json, summary.csv, and with ``sharpness``
sharpness.csv. Nothing else in the sweep folder is written. The command is ``python -m lmtune.analyze``.

What differs by search is the search's report section's (lmtune.report.sections), looked up once by its name.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import logging
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from lmtune.errors import LmtuneError
from lmtune.files import (
    STAGING_PREFIX,
    DiskFullError,
    JsonObject,
    atomic_write_text,
    check_destination,
    full_disk,
    staged_folder,
)
from lmtune.findings.part import FigureInputs, ReportFigure, SweepInputs
from lmtune.findings.rows import TrialRow, json_safe, varied_params
from lmtune.findings.sharpness import SharpnessRow
from lmtune.findings.stability import TrialRecord
from lmtune.findings.summary import SweepFacts, SweepSummary
from lmtune.report.figures import FIGURES
from lmtune.report.headline import running_trials, unfinished_figure_mark
from lmtune.report.markdown import write_markdown
from lmtune.report.reader import kept_checkpoint, load_range_test, load_sweep, missing_trials
from lmtune.report.samples import best_samples
from lmtune.report.sections import search_decisions, search_of, section_for
from lmtune.report.sharpness import sweep_sharpness, write_sharpness_csv
from lmtune.report.sweep_facts import (
    compute_accounting,
    data_description,
    model_facts,
    range_summary,
    search_description,
    sweep_budget,
    vocab_size,
    with_unigram_baseline,
)
from lmtune.sweep.record import is_sweep_dir
from lmtune.sweep.sweep_file import SweepRecord
from lmtune.training.figures import figures_marked
from lmtune.training.lr_range import RangeTestResult
from lmtune.usercode.consent import NO_CONSENT, CodeConsent, only_consented_code

log = logging.getLogger(__name__)

REPORT_DIR = "report"
MARKDOWN = "lr_sweep_analysis.md"


@dataclass(frozen=True)
class SweepReport:
    """A sweep read from its folder and summarized: what ``analyze`` writes and ``run`` prints."""

    record: SweepRecord
    """sweep.json."""
    trials: list[TrialRecord]
    """Every trial as the report read it."""
    summary: SweepSummary
    """What its runs conclude."""
    facts: SweepFacts
    """What the report read of its records beside them (and the best LR's samples)."""
    sharpness: tuple[SharpnessRow, ...] | None
    """The sharpness estimates (analyze --sharpness; None: not asked for), as sharpness.csv's columns."""
    range_test: RangeTestResult | None
    """The edge search's LR range test (None: none ran)."""

    def to_json(self) -> JsonObject:
        """summary.json: its keys and their meaning are the report's public interface (README)."""
        sharpness = {} if self.sharpness is None else {"sharpness": [row.to_json() for row in self.sharpness]}
        # A sweep read while trials ran: its verdicts are provisional (the key is absent once every trial ended).
        running = running_trials(self.summary)
        unfinished = {"unfinished": {"running": running}} if running else {}
        # (the summary's part is JSON-safe already: SweepSummary.to_json)
        return {**unfinished, **self.summary.to_json(), **json_safe({**self.facts.to_json(), **sharpness})}


def summarize_sweep(sweep_dir: Path, target: float | None = None, samples: int = 0,
                    sharpness: bool = False, consent: CodeConsent = NO_CONSENT) -> SweepReport:
    """Read a sweep folder (finished or running) and compute its report, writing nothing: with ``samples`` texts
    from the best LR's model (a user's model: as ``consent`` allows, lmtune.usercode.consent) and, with
    ``sharpness``, the sharpness of the trials' checkpoints."""
    sweep_dir = Path(sweep_dir)
    if target is not None and not (isinstance(target, (int, float)) and math.isfinite(target) and target > 0):
        raise LmtuneError(f"--target must be a positive loss in nats/token (got {target!r})")
    record, trials = load_sweep(sweep_dir)
    record = with_unigram_baseline(record)
    if not trials:
        raise LmtuneError(f"{sweep_dir} has no trials yet (no trial folders); wait until the sweep has started "
                          "trials, then run the report again")
    plan, search = record.plan, search_of(record)
    strategy = plan.space.strategy if plan else None
    range_variant = strategy.range_test_variant() if strategy else None
    range_test = load_range_test(sweep_dir, range_variant)
    range_tokens = range_test.tokens if range_test is not None else None
    inputs = SweepInputs(strategy=strategy, base=plan.base if plan else None,
                         unigram_loss=plan.unigram_loss if plan else None, trials=trials, sweep_dir=sweep_dir,
                         target=target, budget=sweep_budget(record, trials), vocab_size=vocab_size(record),
                         range_tokens=range_tokens, decisions=search_decisions(sweep_dir, search))
    summary = section_for(search).summarize(inputs)
    best = next((t for t in trials if t.trial_id == summary.best_trial), None)
    best_trial_dir = str(best.checkpoint_dir.parent) if best and best.checkpoint_dir else None
    kept = kept_checkpoint(best.checkpoint_dir, best.periodic_checkpoints) if best and best.checkpoint_dir else None
    texts, note = best_samples(best_trial_dir, samples, consent)
    facts = SweepFacts(
        sweep=record.name or sweep_dir.name, sweep_dir=str(sweep_dir.resolve()),
        missing_trials=tuple(missing_trials(sweep_dir, trials)), best_trial_dir=best_trial_dir,
        best_checkpoint=str(kept) if kept else None,
        best_config=best.params if best else None, search_strategy=search_description(record, trials),
        compute=compute_accounting(record, trials, range_tokens), data=data_description(record),
        range_test=range_summary(range_test, range_variant), generated=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        model=model_facts(record, trials), samples=texts, samples_note=note)
    with only_consented_code(consent):  # (a checkpoint it cannot build without consent is skipped, with a warning)
        sharp_rows = tuple(sweep_sharpness(record, trials, summary.best_trial)) if sharpness else None
    return SweepReport(record, trials, summary, facts, sharp_rows, range_test)


@dataclass(frozen=True)
class WrittenReport:
    """A report written: what it concludes, and where."""

    report: SweepReport
    """What the report concludes (summary.json is its to_json)."""
    out: Path
    """The report folder."""

    @property
    def markdown(self) -> Path:
        return self.out / MARKDOWN


# The x axes of the learning curves: tokens (lr_sweep_comparison.png) and wall-clock time (..._wall.png).
X_AXES = {"tokens": ("tokens",), "wall": ("wall",), "both": ("tokens", "wall")}


def analyze(sweep_dir: Path, out_dir: Path | None = None, target: float | None = None,
            sharpness: bool = False, samples: int = 2, x: str = "both",
            consent: CodeConsent = NO_CONSENT) -> JsonObject:
    """Write the report of one sweep; returns the summary (summary.json's content) with ``report_dir``."""
    written = write_report(sweep_dir, out_dir, target, sharpness, samples, x, consent)
    return {**written.report.to_json(), "report_dir": str(written.out)}


def write_report(sweep_dir: Path, out_dir: Path | None = None, target: float | None = None,
                 sharpness: bool = False, samples: int = 2, x: str = "both",
                 consent: CodeConsent = NO_CONSENT) -> WrittenReport:
    """Write the report of one sweep into ``out_dir`` (default: the sweep's report/): with ``samples`` texts from
    the best LR's model, learning curves against ``x`` (tokens, wall or both)."""
    if x not in X_AXES:
        raise LmtuneError(f"--x {x!r}: choose tokens, wall or both")
    sweep_dir = Path(sweep_dir)
    out = Path(out_dir) if out_dir is not None else sweep_dir / REPORT_DIR
    check_report_dir(out, sweep_dir)  # first: the next check's probe file would touch another sweep's report
    if out_dir is None:  # (a read-only sweep: its report can go elsewhere)
        check_destination(out, "the sweep's report folder", fix="give --out FOLDER to write the report elsewhere")
    else:
        check_destination(out, "--out")
    report = summarize_sweep(sweep_dir, target, samples, sharpness, consent)
    with written_whole(out) as staged:
        write_report_files(report, staged, target, x)
    return WrittenReport(report, out)


def write_report_files(report: SweepReport, out: Path, target: float | None, x: str) -> None:
    """The report's files, written into ``out``."""
    atomic_write_text(out / REPORT_MARKER, json.dumps({"sweep": str(report.facts.sweep_dir)}) + "\n")
    summary, facts, trials = report.summary, report.facts, report.trials
    if report.sharpness is not None:
        write_sharpness_csv(report.sharpness, out / "sharpness.csv")
        if not report.sharpness:
            log.warning("no checkpoint gave a sharpness estimate; sharpness.png not written")
    drawn = write_figures(out, FigureInputs(summary, facts, trials, report.range_test, report.sharpness, target,
                                            X_AXES[x]), (*section_for(summary.search).figures(), *FIGURES))
    write_markdown(summary, facts, trials, out / MARKDOWN, [figure.file for figure in drawn])
    write_tables(report.to_json(), summary.trials, out)


@contextlib.contextmanager
def written_whole(out: Path) -> Iterator[Path]:
    """A report's files, written into the folder the block gets, appear in ``out`` together once all are written
    (lmtune.files.staged_folder), or none does: the report before them, if any, stays as it was. A full disk on the
    way is one line without "resume" (analyze has nothing to resume), naming the file in ``out`` it was writing."""
    had_report = (out / MARKDOWN).exists()
    try:
        with staged_folder(out) as staged:
            yield staged
    except OSError as err:
        if (full := full_disk(err, out)) is None:
            raise
        where = out / full.path.name if full.path.parent.name.startswith(STAGING_PREFIX) else full.path
        kept = f"the previous report in {out} is as it was" if had_report else f"nothing was written to {out}"
        raise DiskFullError(where, full.size, fix=f"free space, then run analyze again ({kept})") from None


def write_figures(out: Path, inputs: FigureInputs, figures: tuple[ReportFigure, ...]) -> list[ReportFigure]:
    """Draw each figure that has something to show; returns those drawn, in the report's order. Each one of a sweep
    read while trials ran is marked so (a PNG shared alone must not pass for the finished sweep's)."""
    drawn = [figure for figure in figures if figure.shown(inputs)]
    with figures_marked(unfinished_figure_mark(inputs.summary)):
        for figure in drawn:
            figure.draw(inputs, out / figure.file)
    return drawn


# Written into every report folder: a later analyze replaces only a folder that holds this sweep's report.
REPORT_MARKER = ".lmtune-report"


def check_report_dir(out: Path, sweep_dir: Path) -> None:
    """Refuse a report folder whose files analyze would overwrite: anything but a missing or empty folder,
    the sweep's own report/ folder (while it is the sweep's own: check_own_report_dir), or one holding an earlier
    report of this same sweep."""
    own = sweep_dir / REPORT_DIR
    if out == own or out.resolve() == own.resolve():
        check_own_report_dir(own, sweep_dir)
        return
    if not out.is_dir() or not any(out.iterdir()):
        return
    owner = _report_owner(out)
    if owner != str(sweep_dir.resolve()):
        whose = f"the report of another sweep ({owner})" if owner else "files analyze did not write"
        raise LmtuneError(f"--out {out} already holds {whose}, which the report would overwrite; "
                          "give an empty or new folder")


def check_own_report_dir(own: Path, sweep_dir: Path) -> None:
    """The sweep's report/ is written only while it is the sweep's own: a link leading out of it (to another
    sweep's report, to anyone's files) is refused, and so is a folder holding the report of another sweep that
    exists (a copy of it: its marker names the original)."""
    home = sweep_dir.resolve()
    if own.exists() and own.resolve() != home / REPORT_DIR:
        raise LmtuneError(f"{own} is a link to {own.resolve()}, not a folder of the sweep's own, whose files the "
                          "report would overwrite; remove the link, or give --out FOLDER")
    owner = _report_owner(own)
    if owner and owner != str(home) and is_sweep_dir(Path(owner)):
        raise LmtuneError(f"{own} holds the report of another sweep ({owner}), which the report would overwrite; "
                          f"delete {own} if it is a copy, or give --out FOLDER")


def _report_owner(folder: Path) -> str | None:
    """The sweep whose report a folder holds, by its marker (None: no marker, or not one analyze wrote)."""
    try:
        owner = json.loads((folder / REPORT_MARKER).read_text()).get("sweep")
    except (OSError, ValueError, AttributeError):
        return None
    return owner if isinstance(owner, str) else None


CSV_COLUMNS = ["trial_id", "lr", "status", "final_val_loss", "best_val_loss", "tokens", "wall_time_s",
               "tokens_per_s", "max_spike_height", "stop_step", "reason"]


def write_tables(summary: JsonObject, rows: Sequence[TrialRow], out_dir: Path) -> tuple[Path, Path]:
    """summary.json (``summary``: SweepReport.to_json) and summary.csv (one row per trial, params flattened)."""
    out_dir = Path(out_dir)
    json_path, csv_path = out_dir / "summary.json", out_dir / "summary.csv"
    atomic_write_text(json_path, json.dumps(summary, indent=2, allow_nan=False) + "\n")
    extra = varied_params(rows)
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(CSV_COLUMNS[:2] + extra + CSV_COLUMNS[2:])
    for row in rows:
        values = [getattr(row, c) for c in CSV_COLUMNS]
        values = values[:2] + [row.params.get(k) for k in extra] + values[2:]
        writer.writerow(["" if v is None else v for v in values])
    atomic_write_text(csv_path, buffer.getvalue())
    return json_path, csv_path
