"""A run fails when it diverges, or when, above an LR that trained, it ends no better than the data's unigram
baseline (each validation token predicted by its training-split frequency): not when it merely stays below ln V."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
from conftest import drive_search
from test_edge import BUDGET, SimulatedSweep

from lmtune.analysis.bracket import bracket, edge_confirmation, seed_dependent_lrs
from lmtune.analysis.runs import Run
from lmtune.data.dataset import data_unigram_loss, read_meta, unigram_loss
from lmtune.searches.edge.search import EdgeSearch
from lmtune.searches.edge.settings import EdgeSettings

FULL = BUDGET.full_tokens
BASELINE = 5.0


def finished(lr: float, loss: float, seed: int = 0, outcome: str = "completed", baseline: float | None = BASELINE,
             ) -> Run:
    """A run that trained its whole budget, ending at ``loss``."""
    return Run(lr, seed, "coarse", FULL, FULL, outcome, FULL, {FULL: loss}, baseline=baseline)


def test_the_unigram_loss_is_the_validation_cross_entropy_of_the_training_frequencies():
    train, val = np.array([0, 0, 1], dtype=np.uint16), np.array([0, 1], dtype=np.uint16)
    # add-1/2 smoothing over a vocabulary of 3: p = (2.5, 1.5, 0.5) / 4.5
    expected = -(math.log(2.5 / 4.5) + math.log(1.5 / 4.5)) / 2
    assert unigram_loss(train, val, 3) == pytest.approx(expected)


def test_a_token_unseen_in_training_costs_a_finite_loss():
    assert math.isfinite(unigram_loss(np.array([0, 0], dtype=np.uint16), np.array([1], dtype=np.uint16), 2))


def test_prepared_data_records_its_unigram_loss_in_meta_json(builtin_data):
    recorded = json.loads((builtin_data / "meta.json").read_text())["unigram_loss"]
    train, val = (np.fromfile(builtin_data / f"{split}.bin", dtype=np.uint16) for split in ("train", "val"))
    assert recorded == pytest.approx(unigram_loss(train, val, read_meta(builtin_data).vocab_size))
    assert recorded < math.log(read_meta(builtin_data).vocab_size)


def test_data_prepared_before_the_baseline_was_recorded_has_it_measured(builtin_data, tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    for name in ("train.bin", "val.bin", "tokenizer.json"):
        (old / name).write_bytes((builtin_data / name).read_bytes())
    meta = json.loads((builtin_data / "meta.json").read_text())
    (old / "meta.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "unigram_loss"}))
    assert data_unigram_loss(old) == pytest.approx(meta["unigram_loss"])


def test_a_run_ending_no_better_than_the_baseline_above_a_trained_lr_is_the_failed_end():
    edge = bracket([finished(0.01, 3.0), finished(0.1, 4.5), finished(0.3, 5.2), finished(1.0, 7.0)])
    assert (edge.stable_lr, edge.diverged_lr) == (0.1, 0.3)


def test_a_run_ending_untrained_below_every_trained_lr_is_too_slow_not_the_edge():
    edge = bracket([finished(1e-5, 7.5), finished(0.01, 3.0), finished(0.1, 4.5)])
    assert (edge.stable_lr, edge.diverged_lr) == (0.1, None)


def test_without_a_recorded_baseline_only_divergence_fails_a_run():
    runs = [finished(0.01, 3.0, baseline=None), finished(0.3, 5.2, baseline=None),
            finished(1.0, 9.0, outcome="diverged", baseline=None)]
    assert (bracket(runs).stable_lr, bracket(runs).diverged_lr) == (0.3, 1.0)


def test_an_untrained_end_is_established_by_training_and_says_so():
    runs = [finished(0.01, 3.0), finished(0.1, 4.5), finished(0.3, 5.2)]
    confirmation = edge_confirmation(runs, bracket(runs))
    assert confirmation.confirmed
    (end,) = confirmation.diverged_end
    assert "no better than the data's unigram baseline (5.000" in end.how and end.decided_at_tokens == FULL


def test_seeds_that_disagree_about_training_make_the_lr_seed_dependent():
    runs = [finished(0.01, 3.0), finished(0.3, 4.9, seed=0), finished(0.3, 5.1, seed=1)]
    (dependence,) = seed_dependent_lrs(runs)
    assert (dependence.lr, dependence.seeds_through, dependence.seeds_diverged) == (0.3, (0,), (1,))


def test_the_edge_search_brackets_where_runs_stop_training_not_where_they_diverge():
    sweep, baseline = SimulatedSweep(), 2.4
    search = EdgeSearch(EdgeSettings(), replace(BUDGET, unigram_loss=baseline))
    drive_search(search, sweep, 200)
    assert search.finished
    edge = bracket(search.runs.values())
    assert sweep.loss(edge.stable_lr, FULL, 0) < baseline <= sweep.loss(edge.diverged_lr, FULL, 0)
