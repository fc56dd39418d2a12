"""The pair search's part of the report (a ReportPart): the common report, and one section of its own."""

from __future__ import annotations

from dataclasses import dataclass

from lmtune.findings.part import PlainSection
from lmtune.findings.summary import SweepSummary


@dataclass(frozen=True)
class PairSection(PlainSection):
    name: str = "pair"

    def markdown(self, summary: SweepSummary[None]) -> list[str]:
        return ["## The pair search", "", "Two LRs, the better one trained again with a second seed."]


SECTION = PairSection()
