"""A new search is one folder plus one line: a minimal deciding search written here (two LRs, then the better one
again with a second seed, then finished) is registered with one line, parsed from a space file, driven by the one
Tune adapter as Tune drives it (suggest, results, completion, save and restore), its state kept where its name
says, and the report takes it with the common report's part."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar

import pytest

from lmtune import searches
from lmtune.analysis.conclusion import conclude
from lmtune.analysis.runs import Budget, Run, effective_runs
from lmtune.report.sections import section_for
from lmtune.report.sections.base import PlainSection
from lmtune.searches.base import DecidingDefaults
from lmtune.searches.deciding import DecidingSearch
from lmtune.searches.state import read_search_state, search_state_path
from lmtune.searches.trial_order import TrialOrder
from lmtune.sweep.searcher import DecidingSearcher, tune_search_alg
from lmtune.sweep.spaces import load_space

# -- the new search: what its folder would hold ----------------------------------------------------------------


@dataclass(frozen=True)
class PairSettings:
    """``pair:`` in a space file: the two LRs it tries."""

    low: float = 1e-3
    high: float = 1e-2

    def problems(self) -> list[tuple[str, str]]:
        return [("high", "must be above low")] if self.high <= self.low else []

    def added_seeds(self) -> int:
        return 1


@dataclass
class PairPlanned:
    stage: str
    lr: float
    seed: int
    why: str = ""

    def config(self):
        return TrialOrder({"lr": self.lr, "seed": self.seed}, stage=self.stage).to_tune()


@dataclass(frozen=True)
class PairDecision:
    stage: str
    lrs: list[float] = field(default_factory=list)
    why: str = ""


class PairSearch(DecidingSearch[PairPlanned, PairDecision]):
    name = "pair"
    settings_class = PairSettings
    planned_class = PairPlanned
    decision_class = PairDecision

    def _start(self, trial_id: str, planned: PairPlanned) -> Run:
        return Run(planned.lr, planned.seed, planned.stage, self.budget.full_tokens, self.budget.full_tokens,
                   trial_id=trial_id)

    def _decide(self) -> None:
        stages = [d.stage for d in self.decisions]
        if "pair" not in stages:
            lrs = [self.settings.low, self.settings.high]
            self.queue = [PairPlanned("pair", lr, self.budget.seed) for lr in lrs]
            self.decisions.append(PairDecision("pair", lrs, "the two LRs of the space"))
        elif "again" not in stages:
            best = min(self.runs.values(), key=lambda r: r.val[max(r.val)])  # (each run's last evaluation)
            self.queue = [PairPlanned("again", best.lr, self.budget.seed + 1)]
            self.decisions.append(PairDecision("again", [best.lr], "the better LR with a second seed"))
        else:
            self.finished = True

    def conclusion(self):
        return conclude(effective_runs(list(self.runs.values())), self.budget).to_json()


@dataclass(frozen=True)
class PairStrategy(DecidingDefaults):
    settings: PairSettings

    name: ClassVar[str] = "pair"
    keys: ClassVar[frozenset[str]] = frozenset({"pair", "params"})
    settings_class: ClassVar[type] = PairSettings
    settings_section: ClassVar[tuple[str, type]] = ("pair", PairSettings)
    search_class: ClassVar[type] = PairSearch
    owns: ClassVar[tuple[str, ...]] = ("lr",)

    def describe(self, fuse: int) -> str:
        return f"pair search: {self.settings.low:g} and {self.settings.high:g}, the better one seeded twice"

    def progress_columns(self, fuse: int) -> list[str]:
        return ["stage", "lr", "seed"]

    def expected_trials(self) -> tuple[int, int]:
        return 3, 0


# -- the one line, and the search run as Tune runs it ------------------------------------------------------------


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(searches.STRATEGIES, "pair", searches.SearchEntry(PairStrategy))  # its one line


@pytest.fixture
def space(registered, tmp_path: Path):
    path = tmp_path / "pair.yaml"
    path.write_text("search: pair\nbudget: quick\nscheduler: {name: none}\npair: {low: 0.001, high: 0.03}\n")
    return load_space(str(path))


BUDGET = Budget(steps=100, warmup_steps=10, tokens_per_step=512, seed=0, rungs=())
LOSS = {0.001: 3.0, 0.03: 2.5}  # the higher LR trains better


def drive(searcher: DecidingSearcher, trials: int) -> list[TrialOrder]:
    """What Tune does: ask for a trial, report its rows, complete it; until the searcher says it has finished."""
    orders = []
    for n in range(trials):
        answer = searcher.suggest(f"t{n}")
        if answer is None or answer == DecidingSearcher.FINISHED:
            break
        order = TrialOrder.from_tune(answer)
        orders.append(order)
        lr = order.settings["lr"]
        for tokens, loss in ((25600, LOSS[lr] + 1), (BUDGET.full_tokens, LOSS[lr])):
            searcher.on_trial_result(f"t{n}", {"tokens": tokens, "val_loss": loss, "val_step": tokens // 512})
        searcher.on_trial_complete(f"t{n}", {"tokens": BUDGET.full_tokens, "val_loss": LOSS[lr], "done": True})
    return orders


def test_a_space_file_names_the_new_search_and_is_parsed_by_it(space):
    assert isinstance(space.strategy, PairStrategy) and space.strategy.settings == PairSettings(0.001, 0.03)


def test_the_new_searchs_section_is_refused_in_one_line_when_wrong(registered, tmp_path):
    from lmtune.errors import LmtuneError

    path = tmp_path / "bad.yaml"
    path.write_text("search: pair\nbudget: quick\nscheduler: {name: none}\npair: {low: 0.1, high: 0.01}\n")
    with pytest.raises(LmtuneError, match=r"pair\.high: must be above low"):
        load_space(str(path))


def test_the_generic_adapter_runs_the_new_search_to_its_end(space, tmp_path):
    searcher, samples = tune_search_alg(space.strategy, BUDGET, tmp_path)
    assert isinstance(searcher, DecidingSearcher) and samples == -1
    orders = drive(searcher, 10)
    assert [(o.stage, o.settings["lr"], o.settings["seed"]) for o in orders] == [
        ("pair", 0.001, 0), ("pair", 0.03, 0), ("again", 0.03, 1)]
    assert searcher.suggest("t9") == DecidingSearcher.FINISHED


def test_its_state_is_kept_where_its_name_says_and_read_back_by_name(space, tmp_path):
    searcher, _ = tune_search_alg(space.strategy, BUDGET, tmp_path)
    drive(searcher, 10)
    searcher.suggest("t9")
    assert search_state_path(tmp_path, "pair") == tmp_path / "decisions" / "pair_search.json"
    state = read_search_state(tmp_path, "pair")
    assert state["finished"] and [d["stage"] for d in state["decisions"]] == ["pair", "again"]
    assert space.strategy.finished(tmp_path)


def test_tunes_snapshot_restores_the_new_search_where_it_was(space, tmp_path):
    searcher, _ = tune_search_alg(space.strategy, BUDGET, tmp_path)
    drive(searcher, 2)
    searcher.save(str(tmp_path / "snapshot.json"))
    restored, _ = tune_search_alg(space.strategy, BUDGET, tmp_path)
    restored.restore(str(tmp_path / "snapshot.json"))
    assert restored.search.to_json() == searcher.search.to_json()
    assert TrialOrder.from_tune(restored.suggest("t2")).stage == "again"


def test_the_report_takes_the_new_search_with_the_common_part(registered):
    assert section_for("pair") == PlainSection("pair")


def test_the_state_it_writes_is_json_of_its_own_dataclasses(space, tmp_path):
    searcher, _ = tune_search_alg(space.strategy, BUDGET, tmp_path)
    drive(searcher, 1)
    data = json.loads(search_state_path(tmp_path, "pair").read_text())
    assert data["settings"] == asdict(PairSettings(0.001, 0.03)) and data["plans"]["t0"]["stage"] == "pair"
