"""The type check (``python -m mypy lmtune``, pyproject.toml's [tool.mypy]; scripts/test.sh runs it after ruff, so
every CI run does) holds a search to its three contracts: a strategy registered in lmtune.searches.STRATEGIES that
misses a member of SearchStrategy, decisions (a deciding strategy's ``search_class``) that miss one of TrialSource,
or a report part that misses one of ReportPart fail it, before any user's sweep saves its state. Shown on the worked
example of docs/contributing.md (tests/pair_search/), registered as its registry line would register it, once whole
and once with a member taken out. (Whether ``python -m mypy lmtune`` itself passes is scripts/test.sh's to say: it
runs it before the tests.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import time_left

REPO = Path(__file__).resolve().parents[1]
PAIR = REPO / "tests" / "pair_search"

# The registry line of docs/contributing.md ("Adding a search") for the module ``{module}``, and the places a
# strategy, its decisions and its report part are used as what their contracts say they are.
REGISTERED = '''\
from __future__ import annotations

from lmtune.searches import SearchEntry
from lmtune.searches.base import SearchStrategy
from pair_search.search import PairSettings
from {module} import PairStrategy, report_part

ENTRY = SearchEntry(PairStrategy, report=report_part)
STRATEGY: SearchStrategy = PairStrategy(PairSettings())
'''

# Decisions and a report part, each without one member of its contract (TrialSource.requeue, ReportPart.headline).
PARTIAL_PARTS = '''\
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from lmtune.analysis.runs import Budget, Run
from lmtune.files import JsonObject
from lmtune.findings.part import PlainSection, ReportFigure, ReportPart, SweepInputs
from lmtune.findings.summary import SweepSummary
from lmtune.searches.contracts import TrialSource, TrialSourceClass
from lmtune.searches.trial_order import TuneParams, TuneResult
from pair_search import PairStrategy


class NoRequeue:
    name: ClassVar[str] = "pair"

    def __init__(self, settings: Any, budget: Budget) -> None:
        self.decisions: list[Any] = []
        self.max_pending = 1

    @property
    def runs(self) -> dict[str, Run]:
        return {}

    def suggest(self, trial_id: str) -> TuneParams | str:
        return "FINISHED"

    def observe(self, trial_id: str, result: TuneResult) -> None:
        return None

    def complete(self, trial_id: str, outcome: str, result: TuneResult | None = None) -> Any:
        return None

    def to_json(self) -> JsonObject:
        return {}

    @classmethod
    def from_json(cls, data: JsonObject) -> NoRequeue:
        raise NotImplementedError


@dataclass(frozen=True)
class NoRequeueStrategy(PairStrategy):
    search_class: ClassVar[TrialSourceClass] = NoRequeue


def decisions(budget: Budget) -> TrialSource:
    return NoRequeue(None, budget)


class NoHeadline:
    def summarize(self, sweep: SweepInputs) -> SweepSummary[None]:
        return PlainSection("pair").summarize(sweep)

    def markdown(self, summary: SweepSummary[None]) -> list[str]:
        return []

    def figures(self) -> tuple[ReportFigure, ...]:
        return ()


def report_part() -> ReportPart[Any]:
    return NoHeadline()
'''


def mypy(files: list[Path]) -> tuple[int, dict[str, list[str]]]:
    """``python -m mypy`` with the project's configuration (and its cache: scripts/test.sh's run has filled it) on
    ``files``, which import lmtune and tests/pair_search: its exit status, and its lines by the file they name."""
    env = {**os.environ, "MYPYPATH": str(REPO / "tests")}  # (pair_search; lmtune: the working directory)
    done = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"),
                           "--show-error-codes", "--no-color-output", *map(str, files)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=time_left())
    lines: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        lines.setdefault(Path(line.split(":", 1)[0]).name, []).append(line)
    assert done.returncode in (0, 1), done.stdout + done.stderr  # (2: mypy itself failed)
    return done.returncode, lines


def without_method(source: str, method: str) -> str:
    """``source`` with the method ``method`` of its class taken out (its def, up to the next blank line)."""
    cut = re.sub(rf"\n    def {method}\(.*?\n\n", "\n", source, count=1, flags=re.S)
    assert cut != source and f"def {method}(" not in cut, f"no method {method} in the source"
    return cut


@pytest.mark.slow  # two mypy runs over what the files import of lmtune (about 10 s each with the cache warm)
def test_the_type_check_fails_a_search_missing_a_member_of_its_contracts_and_passes_it_whole(tmp_path: Path):
    whole = tmp_path / "whole_registration.py"
    whole.write_text(REGISTERED.format(module="pair_search"))
    # The worked example's strategy with one member of SearchStrategy left out: describe, the run's first line.
    (tmp_path / "lopsided_search.py").write_text(without_method((PAIR / "__init__.py").read_text(), "describe"))
    lopsided = tmp_path / "lopsided_registration.py"
    lopsided.write_text(REGISTERED.format(module="lopsided_search"))
    partial = tmp_path / "partial_parts.py"
    partial.write_text(PARTIAL_PARTS)

    status, lines = mypy([whole])
    assert status == 0 and not [line for line in lines.get(whole.name, []) if ": error:" in line], lines

    status, lines = mypy([lopsided, partial])
    assert status == 1, lines
    shown = "\n".join(lines.get(lopsided.name, []))
    # Its registry line fails (so does CI), and a strategy used as one is told the member it lacks.
    assert re.search(r':8: error: Argument 1 to "SearchEntry" has incompatible type "type\[PairStrategy\]"; '
                     r'expected "type\[SearchStrategy\]"', shown), shown
    assert re.search(r':9: error: Incompatible types in assignment.*\n.*"PairStrategy" is missing following '
                     r'"SearchStrategy" protocol member:\n.*note:\s+describe\n', shown + "\n"), shown
    parts = "\n".join(lines.get(partial.name, []))
    # Decisions missing TrialSource.requeue, where a deciding strategy names them; a part missing
    # ReportPart.headline, where its report_part() gives it.
    assert re.search(r'error: Incompatible types in assignment \(expression has type "type\[NoRequeue\]", variable '
                     r'has type "TrialSourceClass"\)', parts), parts
    assert re.search(r'error: Incompatible return value type \(got "NoRequeue", expected "TrialSource"\)'
                     r'.*\n.*"NoRequeue" is missing following "TrialSource" protocol member:\n.*note:\s+requeue',
                     parts), parts
    assert re.search(r'error: Incompatible return value type \(got "NoHeadline", expected "ReportPart\[Any\]"\)'
                     r'.*\n.*"NoHeadline" is missing following "ReportPart" protocol member:\n.*note:\s+headline',
                     parts), parts
