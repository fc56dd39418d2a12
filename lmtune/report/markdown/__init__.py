"""lr_sweep_analysis.md, written from the typed summary and facts (lmtune.findings.summary): one section per
heading in HEADINGS, the search's own section after the overview (lmtune.report.sections), the range test's
before the definitions."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from lmtune.files import atomic_write_text
from lmtune.findings.stability import TrialRecord
from lmtune.findings.summary import SweepFacts, SweepSummary
from lmtune.report.headline import unfinished_mark
from lmtune.report.markdown.edge import HOW_RUNS_BROKE, edge, how_runs_broke
from lmtune.report.markdown.landscape import HEADING as LANDSCAPE_HEADING
from lmtune.report.markdown.landscape import best_lr, landscape
from lmtune.report.markdown.method import definitions, range_test, search_and_compute
from lmtune.report.markdown.model import model_overview, samples
from lmtune.report.markdown.runs import convergence, equal_tokens, overview, sensitivity, target, trials
from lmtune.report.sections import section_for

log = logging.getLogger(__name__)

HEADINGS = (
    "## Trials",
    "## Best learning rate",
    "## Samples from the best LR's model",
    LANDSCAPE_HEADING,
    "## Edge of stability",
    "## Loss against LR at equal token counts",
    "## Convergence speed",
    "## LR sensitivity",
    "## Target",
    HOW_RUNS_BROKE,
    "## Search strategy and compute",
    "## Definitions",
)


def write_markdown(summary: SweepSummary, facts: SweepFacts, records: Sequence[TrialRecord], path: Path,
                   figures: Sequence[str] = ()) -> Path:
    """lr_sweep_analysis.md: the report's text, one section per heading in HEADINGS (and the search's own, and the
    range test's). ``figures``: the report's figure files, as the overview lists them."""
    sections = [
        overview(summary, facts, figures), model_overview(facts), section_for(summary.search).markdown(summary),
        trials(summary), best_lr(summary), samples(facts), landscape(summary), edge(summary), equal_tokens(summary),
        convergence(summary), sensitivity(summary), target(summary), how_runs_broke(summary, records),
        search_and_compute(summary, facts), range_test(facts), definitions(summary),
    ]
    text = "\n".join(mark_unfinished([line for section in sections for line in section], summary))
    atomic_write_text(Path(path), text)
    log.info("wrote %s", path)
    return Path(path)


def mark_unfinished(lines: list[str], summary: SweepSummary) -> list[str]:
    """``lines`` of a sweep read while trials ran: its title and every heading marked "unfinished (N trials
    running)", and a warning under the title that every verdict may change (a later report replaces this one)."""
    mark = unfinished_mark(summary)
    if not mark:
        return lines
    warning = (f"**{mark[0].upper()}{mark[1:]}:** this report was written while the sweep ran. Every verdict below "
               "may change before it ends; run `lmtune analyze` again then, and its report replaces this one.")
    marked, fenced = [], False
    for line in lines:
        fenced ^= line.startswith("```")  # (a sample's text, in a fence, is no heading)
        marked.append(f"{line} ({mark})" if line.startswith(("# ", "## ")) and not fenced else line)
    return [marked[0], "", warning, *marked[1:]]
