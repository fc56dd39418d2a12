"""The contract a search's part of the report follows (``ReportPart``), what it is given (the sweep as read from its
folder, to summarize, and what the report's figures are drawn from), and the part of a search that adds nothing of
its own (grid, optuna: ``PlainSection``, the common report alone), which the others extend."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from lmtune.analysis.runs import Budget
from lmtune.report.comparison import StageDecision
from lmtune.report.sharpness import SharpnessRow
from lmtune.report.stability import TrialRecord
from lmtune.report.summary import ResultT, SweepFacts, SweepSummary, sweep_summary
from lmtune.searches.state import read_search_state
from lmtune.sweep.sweep_file import SweepRecord
from lmtune.training.lr_range import RangeTestResult


@dataclass(frozen=True)
class SweepInputs:
    """A sweep as the report read it from its folder: what a section summarizes."""

    record: SweepRecord
    """sweep.json."""
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
                             decisions=self.decisions(sweep), range_tokens=sweep.range_tokens, search=self.name)

    def decisions(self, sweep: SweepInputs) -> list[StageDecision]:
        """The search's reasons for its stages, from its state (decisions/NAME_search.json) where it decided as it
        went (edge, a new search); none for grid and optuna (one stage)."""
        state = read_search_state(sweep.sweep_dir, self.name) or {}
        return [StageDecision(d["stage"], d["why"]) for d in state.get("decisions", [])]

    def markdown(self, summary: SweepSummary[None]) -> list[str]:
        return []

    def figures(self) -> tuple[ReportFigure, ...]:
        return ()

    def headline(self, summary: SweepSummary[None]) -> list[str]:
        return []
