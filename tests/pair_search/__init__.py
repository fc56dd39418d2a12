"""``search: pair``, the worked example of docs/contributing.md ("Adding a search"): a folder of three files, one per
contract of lmtune.searches.contracts, and one line in lmtune.searches.STRATEGIES (tests/test_new_search.py adds it).
This file is its space section: its settings (the ``pair:`` section) and its strategy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from lmtune.searches.base import DecidingDefaults
from lmtune.searches.contracts import TrialSourceClass
from pair_search.search import PairSearch, PairSettings

if TYPE_CHECKING:
    from lmtune.findings.part import ReportPart


@dataclass(frozen=True)
class PairStrategy(DecidingDefaults):
    settings: PairSettings

    name: ClassVar[str] = "pair"
    keys: ClassVar[frozenset[str]] = frozenset({"pair", "params"})  # its section, and params: to say it takes none
    settings_class: ClassVar[type] = PairSettings
    search_class: ClassVar[TrialSourceClass] = PairSearch  # where its next trial comes from (a TrialSource)
    owns: ClassVar[tuple[str, ...]] = ("lr",)

    def describe(self, fuse: int) -> str:
        return f"pair search: {self.settings.low:g} and {self.settings.high:g}, the better one seeded twice"

    def expected_trials(self) -> tuple[int, int]:
        return 3, 0


def report_part() -> ReportPart[Any]:
    """Its part of the report, imported only when the report asks (a sweep loads no figure code)."""
    from pair_search.report import SECTION

    return SECTION
