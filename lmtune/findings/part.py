"""The contract a search's part of the report follows (``ReportPart``), what it is given (the sweep as the report read
it from its folder, to summarize, and what the report's figures are drawn from), and the part of a search that adds
nothing of its own (grid, optuna, edge: ``PlainSection``, the common report with the stages' reasons). A search's
folder holds its part (lmtune.searches.NAME.report), below the report that reads the sweep and calls it: all a part
is given is typed here, so it imports nothing of the report's nor of the sweep's."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from lmtune.analysis.runs import Budget
from lmtune.findings.comparison import StageDecision
from lmtune.findings.sharpness import SharpnessRow
from lmtune.findings.stability import TrialRecord
from lmtune.findings.summary import ResultT, SweepFacts, SweepSummary, sweep_summary
from lmtune.training.config import RunConfig
from lmtune.training.lr_range import RangeTestResult


@dataclass(frozen=True)
class SweepInputs:
    """A sweep as the report read it from its folder: what a section summarizes."""

    strategy: Any
    """The search's strategy as sweep.json records it (a part reads its own: its folder's SpaceSection; None: a
    sweep.json from before searches were recorded)."""
    base: RunConfig | None
    """The config every trial starts from (None: sweep.json records none)."""
    unigram_loss: float | None
    """The data's unigram baseline (lmtune.data.dataset.unigram_loss), which judges whether a run trained (None: not
    recorded)."""
    trials: Sequence[TrialRecord]
    """Every trial as the report read it."""
    sweep_dir: Path
    """The sweep's folder."""
    target: float | None
    """The target val loss given to analyze (None: none)."""
    budget: Budget | None
    """The sweep's budget and ASHA's rungs (None: sweep.json lacks a base config)."""
    vocab_size: int | None
    """The model's vocabulary (ℓ₀ = ln vocab; None: not recorded)."""
    range_tokens: int | None
    """Tokens the edge search's LR range test trained (None: none ran)."""
    decisions: Sequence[StageDecision]
    """The search's reasons for its stages, from its state (decisions/NAME_search.json), where it decided as it went
    (none for grid and optuna: one stage)."""


@dataclass(frozen=True)
class FigureInputs:
    """What the report's figures are drawn from."""

    summary: SweepSummary
    """What the report concludes."""
    facts: SweepFacts
    """What the report read of the sweep's records (its model)."""
    trials: Sequence[TrialRecord]
    """Every trial as the report read it (their curves)."""
    range_test: RangeTestResult | None
    """The edge search's LR range test (None: none ran)."""
    sharpness: Sequence[SharpnessRow] | None
    """The sharpness estimates (analyze --sharpness; None: not asked for)."""
    target: float | None
    """The target val loss given to analyze (None: none)."""
    x_axes: tuple[str, ...] = ("tokens", "wall")
    """The learning curves' x axes drawn: tokens, wall (wall-clock time), or both (analyze --x)."""


@dataclass(frozen=True)
class ReportFigure:
    """One figure of the report: its file name (defined here once: the markdown names it from this), when it is
    drawn, and how."""

    file: str
    """Its file name in the report folder."""
    shown: Callable[[FigureInputs], bool]
    """Whether the report has it (something to show)."""
    draw: Callable[[FigureInputs, Path], Path]
    """Draws it into the path given; returns the path."""


class ReportPart(Protocol[ResultT]):
    """What a search's part of the report says, typed by its own results (None: it has none): the third of a
    search's contracts (lmtune.searches.contracts), its folder's ``report.py`` as ``SECTION``, registered in
    lmtune.searches.STRATEGIES behind a function (a sweep imports none of it)."""

    def summarize(self, sweep: SweepInputs) -> SweepSummary[ResultT]:
        """Args: sweep: the sweep as the report read it from its folder. Its summary (SweepSummary.search_result:
        its own typed results, if any)."""
        ...

    def markdown(self, summary: SweepSummary[ResultT]) -> list[str]:
        """Args: summary: what ``summarize`` gave. Its own section of lr_sweep_analysis.md, after the overview
        (empty: none)."""
        ...

    def figures(self) -> tuple[ReportFigure, ...]:
        """Its own figures, listed first in the report."""
        ...

    def headline(self, summary: SweepSummary[ResultT]) -> list[str]:
        """Args: summary: what ``summarize`` gave. Its lines before the CLIs' common ones (empty: none)."""
        ...


@dataclass(frozen=True)
class PlainSection:
    """The common report alone, with the stages' reasons of a search that decided as it went: grid, optuna, edge,
    and any search without a report part of its own."""

    name: str = "grid"
    """The search's name."""

    def summarize(self, sweep: SweepInputs) -> SweepSummary[None]:
        return sweep_summary(sweep.trials, sweep.budget, target=sweep.target, vocab_size=sweep.vocab_size,
                             decisions=list(sweep.decisions), range_tokens=sweep.range_tokens, search=self.name)

    def markdown(self, summary: SweepSummary[None]) -> list[str]:
        return []

    def figures(self) -> tuple[ReportFigure, ...]:
        return ()

    def headline(self, summary: SweepSummary[None]) -> list[str]:
        return []
