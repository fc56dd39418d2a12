"""Where the pair search's next trial comes from (a TrialSource, Ray-free): its two LRs, then the better one again
with a second seed, then finished; and its settings, the ``pair:`` section, which the strategy reads."""

from __future__ import annotations

from dataclasses import dataclass

from lmtune.analysis.conclusion import conclude
from lmtune.analysis.runs import Run, effective_runs
from lmtune.searches.deciding import DecidingSearch, Decision, Planned


@dataclass(frozen=True)
class PairSettings:
    """``pair:`` in a space file: the two LRs it tries."""

    low: float = 1e-3
    high: float = 1e-2

    def problems(self) -> list[tuple[str, str]]:
        return [("high", "must be above low")] if self.high <= self.low else []

    def added_seeds(self) -> int:
        return 1


class PairSearch(DecidingSearch[Planned, Decision]):
    name = "pair"
    settings_class = PairSettings
    planned_class = Planned
    decision_class = Decision

    def _decide(self) -> None:
        stages = [d.stage for d in self.decisions]
        if "pair" not in stages:
            lrs = [self.settings.low, self.settings.high]
            self.queue = [Planned("pair", lr, self.budget.seed) for lr in lrs]
            self.decisions.append(Decision("pair", lrs, "the two LRs of the space"))
        elif "again" not in stages:
            best = min(self.runs.values(), key=lambda r: r.val[max(r.val)])  # (each run's last evaluation)
            self.queue = [Planned("again", best.lr, self.budget.seed + 1)]
            self.decisions.append(Decision("again", [best.lr], "the better LR with a second seed"))
        else:
            self.finished = True

    def _start(self, trial_id: str, planned: Planned) -> Run:
        assert planned.lr is not None  # (it plans each trial at an LR of its own)
        return Run(planned.lr, planned.seed, planned.stage, self.budget.full_tokens, self.budget.full_tokens,
                   trial_id=trial_id)

    def conclusion(self):
        return conclude(effective_runs(list(self.runs.values())), self.budget).to_json()
