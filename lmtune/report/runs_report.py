"""The edge-of-stability report of runs lmtune did not make (``python -m lmtune.analyze --runs PATH``;
docs/analyze-runs.md): the runs read by lmtune.report.external_runs, turned into the report's TrialRecords and
concluded on as a sweep's are (lmtune.findings.summary.sweep_summary: lmtune.analysis.conclusion.conclude on their
Runs), written as lr_sweep_analysis.md, summary.json, summary.csv and the figures the data supports.

What the runs are judged by: the loss is val_loss (train_loss where no run logged val_loss), compared at equal
tokens (equal steps where a run logs no tokens); the budget is the longest run's last evaluated step or token count,
a run whose log ends before it counts as stopped early, and a run with a non-finite loss as diverged. Where the runs'
vocabulary is known (``--vocab-size``, or a vocab_size column), ℓ₀ = ln(vocab) and their train losses are judged by
the divergence rule of a sweep (diverged, unconfirmed: cut while above ℓ₀, spiked); without it only a non-finite loss
counts, and the ℓ₀ the report draws and uses is an estimate, said to be one (the median first train loss). Each
section the data cannot make is named in the report with the column it lacks (``MissingColumn``). The samples and
the sharpness are omitted: there is no checkpoint."""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from lmtune.analysis.runs import Budget
from lmtune.errors import LmtuneError
from lmtune.files import JsonObject, atomic_write_text, check_destination
from lmtune.findings.part import FigureInputs
from lmtune.findings.rows import json_safe
from lmtune.findings.stability import TrialRecord
from lmtune.findings.summary import SweepFacts, SweepSummary, sweep_summary
from lmtune.findings.text import initial_loss_text
from lmtune.report.external_runs import RunsInput, read_runs
from lmtune.report.figures import COMPARISON, COMPARISON_WALL, LR_VS_LOSS
from lmtune.report.markdown.edge import edge
from lmtune.report.markdown.landscape import best_lr, landscape
from lmtune.report.markdown.method import definitions
from lmtune.report.markdown.runs import convergence, equal_tokens, overview, sensitivity, target, trials
from lmtune.report.run_tables import COLUMN_NAMES, LOSSES, LoggedRun
from lmtune.report.writer import (
    MARKDOWN,
    REPORT_DIR,
    REPORT_MARKER,
    X_AXES,
    check_report_dir,
    write_figures,
    write_tables,
    written_whole,
)

SOURCE = "runs"
SAMPLES_NOTE = "omitted: runs not made by lmtune leave no checkpoint lmtune can load"
# The points (fractions of the budget) where LRs are compared besides the whole budget: lr_vs_loss.png's curves.
COMPARISON_FRACTIONS = (1 / 8, 1 / 4, 1 / 2)
TOKEN_WORD = re.compile(r"\b([Tt])oken(s?)\b")
SHAPES = {"log": "a long-format run log", "tune": "a Ray Tune experiment folder (progress.csv + params.json)",
          "wandb": "a W&B panel export"}


@dataclass(frozen=True)
class MissingColumn:
    """A part of the report the runs cannot give as a sweep's report gives it, for want of a column."""

    section: str
    """The section or figure."""
    column: str
    """The column it lacks."""
    instead: str
    """What the report does instead."""
    is_column: bool = True
    """Whether what it lacks is a column of the runs (else something else: a checkpoint, the vocabulary)."""

    def line(self) -> str:
        return f"no {self.column}{' column' if self.is_column else ''}: {self.instead} ({self.section})"


@dataclass(frozen=True)
class RunsReport:
    """What the report of external runs concludes, before anything is written."""

    runs: RunsInput
    """The runs as read."""
    records: list[TrialRecord]
    """Each run as the report's trial record."""
    summary: SweepSummary
    """What they conclude."""
    facts: SweepFacts
    """The input in the report's words."""
    judged_on: str
    """The loss the LRs are compared on: val_loss, or train_loss where no run logged val_loss."""
    x: str
    """What the runs are compared at: tokens, or step where a run logs no tokens."""
    missing: tuple[MissingColumn, ...]
    """The parts the runs' columns cannot give."""
    vocab_size: int | None = None
    """The runs' vocabulary (--vocab-size, or their vocab_size column): ℓ₀ = ln of it (None: not known)."""
    vocab_from: str = ""
    """Where it was read: "--vocab-size" or the column ("": not known)."""

    def to_json(self) -> JsonObject:
        """summary.json: a sweep's report's keys, and ``source: "runs"`` with the input and what it lacked."""
        return {**self.summary.to_json(), **json_safe(self.facts.to_json()), "source": SOURCE,
                "input": str(self.runs.path.resolve()), "input_shape": self.runs.shape, "judged_on": self.judged_on,
                "compared_at": self.x, "missing_columns": [asdict(m) for m in self.missing]}


# ---------------------------------------------------------------------------------------------
# Runs -> trial records


def judged_loss(found: RunsInput) -> str:
    return "val_loss" if found.has("val_loss") else "train_loss"


def comparison_axis(found: RunsInput) -> str:
    """tokens where every run logs them, else step where every run logs steps."""
    for x in ("tokens", "step"):
        if all(x in run.points and run.points[x].notna().any() for run in found.runs):
            return x
    raise LmtuneError(f"--runs {found.path}: some runs log only step and others only tokens, so they cannot be "
                      "compared; log the same column in every run")


def run_curve(run: LoggedRun, judged: str, x: str) -> pd.DataFrame:
    """A run's points as metrics.csv's columns: tokens (the comparison axis: steps where only steps are known),
    step, val_loss (the judged loss; a non-finite one as inf: NaN there means 'not evaluated'), train_loss (where
    val_loss is judged; filled in between its logged points, so that a row logging val_loss alone is not a NaN
    train loss) and elapsed_s."""
    points = run.points[run.points[x].notna()].sort_values(x, kind="stable")
    curve = pd.DataFrame({"tokens": points[x].to_numpy()})
    if "step" in points:
        curve["step"] = points["step"].to_numpy()
    loss = points[judged].to_numpy() if judged in points else np.full(len(points), np.nan)
    curve["val_loss"] = np.where(np.isnan(loss) | np.isfinite(loss), loss, np.inf)
    if judged == "train_loss":  # (the train loss is what the divergence rule judges)
        curve["train_loss"] = curve["val_loss"].to_numpy()
    elif "train_loss" in points and points["train_loss"].notna().any():
        train = points["train_loss"]
        known = train.notna().to_numpy()
        curve["train_loss"] = np.interp(points[x].to_numpy(), points[x].to_numpy()[known], train.to_numpy()[known])
        curve.loc[known, "train_loss"] = train.to_numpy()[known]
    if "wall_time" in points and points["wall_time"].notna().any():
        curve["elapsed_s"] = points["wall_time"].to_numpy()
    return curve


def first_nonfinite(run: LoggedRun, x: str) -> float | None:
    """The first step (or token count) at which a logged loss is non-finite (None: none is)."""
    bad = np.zeros(len(run.points), dtype=bool)
    for loss in LOSSES:
        if loss in run.points:
            values = run.points[loss]
            bad |= (values.notna() & ~np.isfinite(values.fillna(0.0))).to_numpy()
    if not bad.any():
        return None
    steps = run.points[x].to_numpy()
    where = steps[bad][np.isfinite(steps[bad])]  # (a row may log the other count alone: then its run's last)
    return float(where.min()) if where.size else float(np.nanmax(steps))


def last_evaluated(curve: pd.DataFrame) -> float | None:
    finite = curve[np.isfinite(curve["val_loss"])]
    return float(finite["tokens"].max()) if len(finite) else None


def runs_budget(curves: Sequence[pd.DataFrame], diverged: Sequence[bool]) -> Budget:
    """One budget for all the runs: the longest run's last evaluated point (of runs that did not diverge, unless
    all did), compared there and at COMPARISON_FRACTIONS of it."""
    ends = [e for c, d in zip(curves, diverged, strict=True) if not d and (e := last_evaluated(c)) is not None]
    ends = ends or [float(c["tokens"].max()) for c in curves if len(c)]
    full = max(1, int(math.ceil(max(ends)))) if ends else 1
    rungs = sorted({int(full * f) for f in COMPARISON_FRACTIONS if int(full * f) > 0} | {full})
    return Budget(steps=full, warmup_steps=0, tokens_per_step=1, seed=0, rungs=tuple(rungs))


def steps_budget(curve: pd.DataFrame, budget: Budget, x: str) -> int | None:
    """A run's budget in its own steps, which its train losses are judged against by the divergence rule: the
    budget itself where runs are compared at steps; at tokens, the budget's tokens at the run's own tokens per step
    (its last logged step over its tokens there); None where it logs no step."""
    if x == "step":
        return budget.steps
    if "step" not in curve:
        return None
    both = curve[np.isfinite(curve["step"]) & np.isfinite(curve["tokens"]) & (curve["tokens"] > 0)]
    if both.empty:
        return None
    last = both.iloc[-1]
    return max(1, int(round(budget.full_tokens * float(last["step"]) / float(last["tokens"]))))


def trial_records(found: RunsInput, judged: str, x: str,
                  vocab_size: int | None = None) -> tuple[list[TrialRecord], Budget]:
    """Each run as a TrialRecord (outcome: diverged at a non-finite loss, stopped_early where its log ends before
    the budget, else completed) and the runs' budget. Without a seed column, the runs at one LR count as seeds 0,
    1, ... in the order read. With ``vocab_size`` each carries ℓ₀ = ln(vocab) and its budget in steps (steps_budget),
    so that the divergence rule judges it (lmtune.findings.stability.classify)."""
    curves = [run_curve(run, judged, x) for run in found.runs]
    broke = [first_nonfinite(run, x) for run in found.runs]
    budget = replace(runs_budget(curves, [b is not None for b in broke]), asha_rungs=False)
    ell0 = math.log(vocab_size) if vocab_size else None
    seeds: dict[float, int] = {}
    records = []
    for run, curve, at in zip(found.runs, curves, broke, strict=True):
        seed = run.seed
        if seed is None:
            seed = seeds[run.lr] = seeds.get(run.lr, -1) + 1
        end = last_evaluated(curve)
        if at is not None:
            outcome, reason = "diverged", f"its loss went non-finite at {x} {at:g}"
        elif end is None or end < budget.full_tokens:
            outcome, reason = "stopped_early", f"its log ends at {x} {end or 0:g}, before the budget's {budget.steps}"
        else:
            outcome, reason = "completed", ""
        records.append(TrialRecord(trial_id=run.name, lr=run.lr, params={"lr": run.lr}, outcome=outcome,
                                   reason=reason, curve=curve, wall_time_s=_wall(curve), seed=seed, ell0=ell0,
                                   judged_steps=steps_budget(curve, budget, x) if ell0 is not None else None))
    return records, budget


def _wall(curve: pd.DataFrame) -> float | None:
    if "elapsed_s" not in curve or not curve["elapsed_s"].notna().any():
        return None
    return float(curve["elapsed_s"].max())


# ---------------------------------------------------------------------------------------------
# What the runs' columns cannot give


def missing_columns(found: RunsInput, judged: str, x: str, vocab_size: int | None = None,
                    ell0: tuple[float | None, str | None] = (None, None)) -> tuple[MissingColumn, ...]:
    """Each part of the report the runs' columns cannot give, with the column it lacks and what is done instead
    (``ell0``: the summary's ℓ₀ and how it was found, said where the vocabulary is not known)."""
    missing = []
    if judged != "val_loss":
        missing.append(MissingColumn("Best learning rate", "val_loss",
                                     "the best LR is judged on train_loss (drawn as the bold curves)"))
    elif not found.has("train_loss"):
        missing.append(MissingColumn("lr_sweep_comparison.png", "train_loss", "the learning curves show val_loss "
                                     "alone"))
    if x != "tokens":
        missing.append(MissingColumn("Loss against LR at equal step counts", "tokens",
                                     "LRs are compared at equal steps (the figures' 'tokens' axes count steps)"))
    if not found.has("wall_time"):
        missing.append(MissingColumn(COMPARISON_WALL.file, "wall_time", "no learning curves against wall-clock "
                                     "time, and no wall time per trial"))
    if not found.has("seed"):
        missing.append(MissingColumn("Best learning rate", "seed", "the runs at one LR count as seeds 0, 1, ... in "
                                     "the order read"))
    if vocab_size is None:
        missing.append(MissingColumn(
            "Edge of stability", "vocabulary size", "a run counts as diverged only where its loss went non-finite "
            "(no run is judged by the rule of the Definitions), and ℓ₀ is not ln(vocab) but an estimate: "
            f"{initial_loss_text(*ell0, digits=3)}; give --vocab-size, or a vocab_size column, for ℓ₀ = ln(vocab)",
            is_column=False))
    elif not found.has("step"):
        missing.append(MissingColumn("Edge of stability", "step", "a run counts as diverged only where its loss went "
                                     "non-finite: the rule of the Definitions judges a run's steps"))
    missing += [
        MissingColumn("instability.png", "grad_norm / attn_logit_max / output_logit_max", "not drawn"),
        MissingColumn("Samples from the best LR's model", "checkpoint", SAMPLES_NOTE, is_column=False),
    ]
    return tuple(missing)


# ---------------------------------------------------------------------------------------------
# The report


def runs_vocab_size(found: RunsInput, given: int | None) -> tuple[int | None, str]:
    """The runs' vocabulary and where it was read: --vocab-size, else their vocab_size column (or Tune's
    params.json); one that contradicts the other is refused."""
    named = found.vocab_size()
    if given is not None and named is not None and given != named:
        raise LmtuneError(f"--vocab-size {given}, but the runs' vocab_size says {named}; drop --vocab-size or give "
                          f"--vocab-size {named}")
    if given is not None:
        return given, "--vocab-size"
    return named, ("the runs' vocab_size" if named is not None else "")


def summarize_runs_input(path: Path, target: float | None = None, lr_of: dict[str, float] | None = None,
                         vocab_size: int | None = None) -> RunsReport:
    """Read ``--runs PATH`` and compute its report, writing nothing (``vocab_size``: --vocab-size)."""
    found = read_runs(path, lr_of)
    if not found.runs:
        raise LmtuneError(f"--runs {path} holds no run")
    judged, x = judged_loss(found), comparison_axis(found)
    vocab, vocab_from = runs_vocab_size(found, vocab_size)
    records, budget = trial_records(found, judged, x, vocab)
    summary = sweep_summary(records, budget, target=target, vocab_size=vocab)
    best = next((r for r in records if r.trial_id == summary.best_trial), None)
    facts = SweepFacts(
        sweep=found.path.name, sweep_dir=str(found.path.resolve()),
        best_config={"lr": best.lr, "seed": best.seed} if best else None,
        search_strategy=f"{len(found.runs)} runs read from {SHAPES[found.shape]}: {found.path}",
        data="", generated=time.strftime("%Y-%m-%dT%H:%M:%S%z"), samples_note=SAMPLES_NOTE)
    missing = missing_columns(found, judged, x, vocab, (summary.initial_loss, summary.initial_loss_from))
    return RunsReport(found, records, summary, facts, judged, x, missing, vocab, vocab_from)


def default_out(path: Path) -> Path:
    """PATH_report/ beside a file; PATH/report/ for a folder."""
    path = Path(path)
    return path / REPORT_DIR if path.is_dir() else path.with_name(f"{path.name}_report")


def check_runs_out(out: Path, path: Path, given: bool) -> None:
    """The report folder is empty, new, or holds an earlier report of this same input (lmtune.report.writer's
    check_report_dir rule); a folder's own report/ holding files analyze did not write is refused too."""
    if out.is_dir() and any(out.iterdir()) and not (out / REPORT_MARKER).is_file():
        raise LmtuneError(f"{out} already holds files analyze did not write, which the report would overwrite; "
                          "give --out with an empty or new folder")
    check_report_dir(out, Path(path))
    check_destination(out, "--out" if given else "the report folder",
                      fix=None if given else "give --out FOLDER to write the report elsewhere")


def write_runs_report(path: Path, out_dir: Path | None = None, target: float | None = None,
                      lr_of: dict[str, float] | None = None, x: str = "both",
                      vocab_size: int | None = None) -> tuple[RunsReport, Path]:
    """Write the report of ``--runs PATH`` into ``out_dir`` (default: default_out) and return it with the folder;
    nothing is written when the input or the folder is refused."""
    if x not in X_AXES:
        raise LmtuneError(f"--x {x!r}: choose tokens, wall or both")
    path = Path(path)
    out = Path(out_dir) if out_dir is not None else default_out(path)
    # (first: a bad input writes nothing, not even a folder)
    report = summarize_runs_input(path, target, lr_of, vocab_size)
    check_runs_out(out, path, given=out_dir is not None)
    axes = tuple(a for a in X_AXES[x] if a != "wall" or report.runs.has("wall_time"))
    figures = (COMPARISON, COMPARISON_WALL, LR_VS_LOSS)
    with written_whole(out) as staged:  # (whole, or the report before it left as it was)
        atomic_write_text(staged / REPORT_MARKER, json.dumps({"sweep": str(path.resolve())}) + "\n")
        drawn = write_figures(staged, FigureInputs(report.summary, report.facts, report.records, None, None, target,
                                                   axes), figures)
        atomic_write_text(staged / MARKDOWN, "\n".join(runs_markdown(report, [f.file for f in drawn])))
        write_tables(report.to_json(), report.summary.trials, staged)
    return report, out


def runs_markdown(report: RunsReport, figures: Sequence[str]) -> list[str]:
    """lr_sweep_analysis.md of external runs: a sweep report's sections the runs support, after a section on the
    input and what it lacks."""
    summary = report.summary
    sections = [trials(summary), best_lr(summary), landscape(summary), edge(summary), equal_tokens(summary),
                convergence(summary), sensitivity(summary), target(summary), definitions(summary)]
    lines = [line for section in sections for line in section]
    return [*overview(summary, report.facts, figures), *source_section(report),
            *(lines if report.x == "tokens" else steps_for_tokens(lines))]


def steps_for_tokens(lines: list[str]) -> list[str]:
    """A report's lines where its token counts are steps (runs that log no tokens): each 'token(s)' says 'step(s)'
    (the figures' axes still read tokens: the report's 'Runs read' says so)."""
    return [TOKEN_WORD.sub(lambda m: ("S" if m.group(1) == "T" else "s") + "tep" + m.group(2), line) for line in lines]


def source_section(report: RunsReport) -> list[str]:
    found = report.runs
    names = ", ".join(f"{c} ({' / '.join(COLUMN_NAMES[c])})" for c in ("lr", "step", "tokens", "train_loss",
                                                                         "val_loss", "wall_time", "seed",
                                                                         "vocab_size"))
    unit = report.x.removesuffix("s") + "s"
    summary = report.summary
    ell0 = initial_loss_text(summary.initial_loss, summary.initial_loss_from)
    judged = (f"with {ell0} ({report.vocab_from}: {report.vocab_size:,}), a run is judged by the divergence rule of "
              "the Definitions (diverged, unconfirmed when its log ends while its loss stands above ℓ₀, spiked)"
              if report.vocab_size is not None else
              "only a run with a non-finite loss counts as diverged: the vocabulary, so ln(vocab), is not known")
    return ["## Runs read", "",
            f"{len(found.runs)} runs lmtune did not make, read from {SHAPES[found.shape]}: `{found.path}`. The LRs "
            f"are compared on **{report.judged_on}** at equal **{unit}**; the budget is the longest run's last "
            f"evaluated {report.x} ({summary.compared_at_tokens}), and a run whose log ends earlier counts as "
            f"stopped early; {judged}. Columns read (and the names each goes by): " + names + ".", "",
            "What these runs' columns cannot give:", "", *[f"- {m.line()}" for m in report.missing], ""]
