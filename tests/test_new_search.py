"""A new search is a folder of three files and one registry line, as docs/contributing.md ("Adding a search") walks
it: tests/pair_search/ is that folder (its space section, where its next trial comes from, its report part), and the
fixture adds its line. It is parsed from a space file, driven by the one Tune adapter as Tune drives it (suggest,
results, completion, save and restore) with its state kept where its name says, and the report takes its part."""

from __future__ import annotations

import pytest
from pair_search import PairStrategy, report_part
from pair_search.report import PairSection
from pair_search.search import PairSettings

from lmtune import searches
from lmtune.analysis.runs import Budget
from lmtune.errors import LmtuneError
from lmtune.report.sections import section_for
from lmtune.searches.state import read_search_state, search_state_path
from lmtune.searches.trial_order import TrialOrder
from lmtune.sweep.searcher import DecidingSearcher, tune_search_alg
from lmtune.sweep.spaces import load_space

BUDGET = Budget(steps=100, warmup_steps=10, tokens_per_step=512, seed=0, rungs=())
LOSS = {0.001: 3.0, 0.03: 2.5}  # the higher LR trains better


@pytest.fixture(autouse=True)
def registered(monkeypatch):
    # The one line a new search adds to lmtune.searches.STRATEGIES:
    monkeypatch.setitem(searches.STRATEGIES, "pair", searches.SearchEntry(PairStrategy, report=report_part))


def space_file(tmp_path, section: str):
    path = tmp_path / "pair.yaml"
    path.write_text(f"search: pair\nbudget: quick\nscheduler: {{name: none}}\npair: {section}\n")
    return load_space(str(path))


def drive(searcher: DecidingSearcher, trials: int) -> list[TrialOrder]:
    """What Tune does: ask for a trial, report its rows, complete it; until the searcher says it has finished."""
    orders = []
    for n in range(trials):
        answer = searcher.suggest(f"t{n}")
        if answer is None or answer == DecidingSearcher.FINISHED:
            break
        orders.append(order := TrialOrder.from_tune(answer))
        loss = LOSS[order.settings["lr"]]
        searcher.on_trial_result(f"t{n}", {"tokens": 25600, "val_loss": loss + 1, "val_step": 50})
        searcher.on_trial_complete(f"t{n}", {"tokens": BUDGET.full_tokens, "val_loss": loss, "done": True})
    return orders


def test_a_space_file_names_the_new_search_and_its_section_is_checked_in_one_line(tmp_path):
    assert space_file(tmp_path, "{low: 0.001, high: 0.03}").strategy == PairStrategy(PairSettings(0.001, 0.03))
    with pytest.raises(LmtuneError, match=r"pair\.high: must be above low"):
        space_file(tmp_path, "{low: 0.1, high: 0.01}")
    with pytest.raises(LmtuneError, match=r"pair\.middle: unknown key"):
        space_file(tmp_path, "{middle: 0.01}")


def test_the_one_adapter_runs_it_to_its_end_and_keeps_its_state_by_its_name(tmp_path):
    strategy = space_file(tmp_path, "{low: 0.001, high: 0.03}").strategy
    searcher, samples = tune_search_alg(strategy, BUDGET, tmp_path)
    assert isinstance(searcher, DecidingSearcher) and samples == -1
    assert [(o.stage, o.settings["lr"], o.settings["seed"]) for o in drive(searcher, 10)] == [
        ("pair", 0.001, 0), ("pair", 0.03, 0), ("again", 0.03, 1)]
    assert searcher.suggest("t9") == DecidingSearcher.FINISHED
    assert search_state_path(tmp_path, "pair") == tmp_path / "decisions" / "pair_search.json"
    state = read_search_state(tmp_path, "pair")
    assert state["finished"] and [d["stage"] for d in state["decisions"]] == ["pair", "again"]
    assert state["settings"] == {"low": 0.001, "high": 0.03} and strategy.finished(tmp_path)


def test_tunes_snapshot_restores_it_where_it_was(tmp_path):
    strategy = space_file(tmp_path, "{low: 0.001, high: 0.03}").strategy
    searcher, _ = tune_search_alg(strategy, BUDGET, tmp_path)
    drive(searcher, 2)
    searcher.save(str(tmp_path / "snapshot.json"))
    restored, _ = tune_search_alg(strategy, BUDGET, tmp_path)
    restored.restore(str(tmp_path / "snapshot.json"))
    assert restored.search.to_json() == searcher.search.to_json()
    assert TrialOrder.from_tune(restored.suggest("t2")).stage == "again"


def test_the_report_takes_its_registered_part():
    assert section_for("pair") == PairSection() and section_for("pair").markdown(None)[0] == "## The pair search"
