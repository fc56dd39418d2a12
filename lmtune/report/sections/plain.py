"""The report's part for a search that adds nothing of its own (grid, optuna): the common report alone."""

from __future__ import annotations

from dataclasses import dataclass

from lmtune.report.comparison import StageDecision
from lmtune.report.sections.base import ReportFigure, SweepInputs
from lmtune.report.summary import SweepSummary, sweep_summary


@dataclass(frozen=True)
class PlainSection:
    """A grid or Optuna sweep: the common report alone."""

    name: str = "grid"
    """The search's name."""

    def summarize(self, sweep: SweepInputs) -> SweepSummary:
        return sweep_summary(sweep.trials, sweep.budget, target=sweep.target, vocab_size=sweep.vocab_size,
                             decisions=self.decisions(sweep), range_tokens=sweep.range_tokens, search=self.name)

    def decisions(self, sweep: SweepInputs) -> list[StageDecision]:
        """The search's reasons for its stages (none: one stage)."""
        return []

    def markdown(self, summary: SweepSummary) -> list[str]:
        return []

    def figures(self) -> tuple[ReportFigure, ...]:
        return ()

    def headline(self, summary: SweepSummary) -> list[str]:
        return []
