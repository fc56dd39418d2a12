"""The sweep's disk estimate (lmtune.sweep.disk): its checkpoint sizes against real files, the peak a sweep
reaches under each --keep, and the refusal when the results folder lacks the space."""

from __future__ import annotations

import shutil
from collections import namedtuple
from pathlib import Path

import pytest
import torch

from lmtune.errors import LmtuneError
from lmtune.sweep.disk import (
    CheckpointBytes,
    DiskNeed,
    Keep,
    check_free_disk,
    disk_need,
    format_bytes,
    free_disk,
    history_rows,
    tensor_count,
)
from lmtune.training.checkpoint import BEST_NAME, Checkpointer, load_checkpoint, periodic_checkpoints
from lmtune.training.config import budget_config
from lmtune.training.loop import train
from lmtune.training.model import TransformerLM
from lmtune.training.state import TrainState

BUILTIN_VOCAB = 3801  # the built-in corpus's vocabulary: what a quick sweep's model has
Usage = namedtuple("Usage", "total used free")


def stepped_state(config) -> TrainState:
    """A fresh TrainState after one optimizer step on a tiny batch, so AdamW's state exists as in a real checkpoint."""
    state = TrainState.create(config, torch.device("cpu"))
    tokens = torch.randint(0, config.model.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    state.model(tokens, tokens).backward()
    state.optimizer.step()
    state.optimizer.zero_grad(set_to_none=True)
    state.step = config.train.stop_step
    return state


class ByteCounter:
    """A file torch.save writes to that keeps only the count (a 17M model's 270 MB need not be held twice)."""

    def __init__(self):
        self.size = 0

    def write(self, data) -> int:
        self.size += len(data)
        return len(data)

    def flush(self) -> None:
        pass


@pytest.fixture(scope="module")
def real_history(make_tiny_config, tmp_path_factory) -> list[dict]:
    """The rows of a real tiny run's last checkpoint (the loop's own columns and types)."""
    out = tmp_path_factory.mktemp("disk_run")
    train(make_tiny_config(), out)
    return load_checkpoint(periodic_checkpoints(out / "checkpoints")[-1])["history"]


def run_end_history(template: list[dict], rows: int) -> list[dict]:
    """``rows`` rows in the shape of a real run's, as a checkpoint at a run's end holds them."""
    return [{**template[i % len(template)], "step": i + 1} for i in range(rows)]


def test_a_real_runs_history_has_the_rows_the_estimate_counts(real_history, make_tiny_config):
    assert len(real_history) == history_rows(make_tiny_config().train)


def test_history_rows_counts_every_step_the_loop_logs_at_with_unaligned_intervals_and_a_wsd_fork():
    config = budget_config("quick", {"steps": 997, "log_interval": 7, "eval_interval": 30, "checkpoint_interval": 45,
                                     "schedule": "wsd", "cooldown_fraction": 0.31})
    t = config.train
    assert history_rows(t) == sum(t.logs_at(step) for step in range(1, t.stop_step + 1))


def test_tensor_count_matches_the_models_state_dict_with_and_without_qk_norm(make_tiny_config):
    for qk_norm in (False, True):
        config = make_tiny_config(n_layers=3, qk_norm=qk_norm)
        assert tensor_count(config) == len(TransformerLM(config.model).state_dict())


def test_the_quick_models_full_checkpoint_and_best_pt_are_within_3_percent_of_the_estimate(real_history, tmp_path):
    config = budget_config("quick", {"vocab_size": BUILTIN_VOCAB, "device": "cpu"})
    state = stepped_state(config)
    checkpointer = Checkpointer(tmp_path, keep=config.train.keep_checkpoints)
    full = checkpointer.save(state, config, run_end_history(real_history, history_rows(config.train)))
    best = checkpointer.save_best(state, config, val_loss=2.5)
    assert best.name == BEST_NAME
    estimate = CheckpointBytes.of(config)
    assert estimate.full == pytest.approx(full.stat().st_size, rel=0.03)
    assert estimate.best == pytest.approx(best.stat().st_size, rel=0.03)


def test_the_17m_models_full_checkpoint_is_within_3_percent_of_the_estimate(real_history):
    config = budget_config("low-resource", {"vocab_size": 10_000, "device": "cpu"})
    state = stepped_state(config)
    saved = {**state.state_dict(), "sampler": {"seed": 0, "next_step": state.step},
             "history": run_end_history(real_history, history_rows(config.train)), "config": config.to_dict()}
    counter = ByteCounter()
    torch.save(saved, counter)
    assert CheckpointBytes.of(config).full == pytest.approx(counter.size, rel=0.03)


def test_the_estimate_of_a_17m_model_builds_nothing(monkeypatch):
    """Instant because nothing is built (no wall-clock assert: a loaded CI machine would make it flaky)."""
    monkeypatch.setattr(TransformerLM, "__init__", lambda *a: pytest.fail("the estimate built a model"))
    monkeypatch.setattr(torch.nn.Module, "__init__", lambda *a: pytest.fail("the estimate built a module"))
    size = CheckpointBytes.of(budget_config("low-resource", {"vocab_size": 10_000}))
    assert size.full > 3 * size.best > 0


@pytest.fixture
def sizes():
    """A 17M config and its checkpoint sizes: the arithmetic below is checked in units of these."""
    config = budget_config("low-resource", {"vocab_size": 10_000})
    return config, CheckpointBytes.of(config)


def test_keep_best_leaves_best_pt_alone_to_each_ended_trial(sizes):
    config, size = sizes
    need = disk_need(config, trials=10, max_concurrent=2, keep=Keep.BEST)
    assert need.per_running_trial == 2 * size.full + size.best
    assert need.per_ended_trial == size.best
    assert need.total == 2 * need.per_running_trial + 8 * size.best


def test_keep_last_adds_the_newest_full_checkpoint_to_each_ended_trial(sizes):
    config, size = sizes
    need = disk_need(config, trials=10, max_concurrent=2, keep=Keep.LAST)
    assert need.per_ended_trial == size.best + size.full
    assert need.total == 2 * (2 * size.full + size.best) + 8 * (size.best + size.full)


def test_keep_all_counts_keep_checkpoints_full_checkpoints_and_ended_trials_that_outweigh_running_ones(sizes):
    config, size = sizes
    need = disk_need(config, trials=10, max_concurrent=2, keep=Keep.ALL)
    assert need.per_ended_trial == size.best + config.train.keep_checkpoints * size.full
    assert need.per_ended_trial > need.per_running_trial
    assert need.total == 10 * need.per_ended_trial


def test_a_wsd_run_also_holds_stable_pt_running_and_under_keep_all():
    config = budget_config("low-resource", {"vocab_size": 10_000, "schedule": "wsd"})
    size = CheckpointBytes.of(config)
    need = disk_need(config, trials=4, max_concurrent=1, keep=Keep.ALL)
    assert need.per_running_trial == 3 * size.full + size.best
    assert need.per_ended_trial == (config.train.keep_checkpoints + 1) * size.full + size.best
    assert disk_need(config, trials=4, max_concurrent=1, keep=Keep.BEST).per_ended_trial == size.best


def test_checkpoints_held_by_the_search_add_one_full_checkpoint_each(sizes):
    config, size = sizes
    plain = disk_need(config, trials=24, max_concurrent=1, keep=Keep.BEST)
    held = disk_need(config, trials=24, max_concurrent=1, keep=Keep.BEST, held_by_search=12)
    assert held.held_by_search == 12 * size.full
    assert held.total == plain.total + 12 * size.full


def test_a_fused_trial_holds_members_times_a_runs_bytes_but_held_checkpoints_stay_per_run(sizes):
    config, size = sizes
    one = disk_need(config, trials=6, max_concurrent=2, keep=Keep.LAST, held_by_search=1)
    fused = disk_need(config, trials=6, max_concurrent=2, keep=Keep.LAST, held_by_search=1, members=4)
    assert (fused.per_running_trial, fused.per_ended_trial) == (4 * one.per_running_trial, 4 * one.per_ended_trial)
    assert fused.total - fused.held_by_search == 4 * (one.total - one.held_by_search)
    assert fused.held_by_search == size.full


def test_fewer_trials_than_slots_are_all_counted_running(sizes):
    config, _ = sizes
    need = disk_need(config, trials=3, max_concurrent=8, keep=Keep.BEST)
    assert need.total == 3 * need.per_running_trial


def test_format_bytes_gives_two_or_three_significant_figures_in_decimal_units():
    cases = {512: "512 B", 4_500_000: "4.5 MB", 27_400_000: "27 MB", 150_000_000: "150 MB", 80e9: "80 GB",
             999_600: "1.0 MB", 272_430_149: "272 MB"}
    assert {n: format_bytes(n) for n in cases} == cases


def test_describe_is_one_line_naming_the_per_trial_and_total_bytes():
    line = DiskNeed(per_running_trial=27_000_000, per_ended_trial=4_500_000, held_by_search=0, total=150_000_000,
                    trials=24).describe(free=80_000_000_000)
    assert line == "disk: about 27 MB per running trial, 4.5 MB kept per ended trial, about 150 MB in all for 24 " \
                   "trials (80 GB free)"


def test_free_disk_asks_the_nearest_existing_ancestor_of_a_folder_not_yet_made(tmp_path, monkeypatch):
    asked = []
    monkeypatch.setattr(shutil, "disk_usage", lambda path: asked.append(Path(path)) or Usage(10, 5, 5))
    assert free_disk(tmp_path / "results" / "sweep") == 5
    assert asked == [tmp_path]


NEED = DiskNeed(per_running_trial=636_000_000, per_ended_trial=91_000_000, held_by_search=0, total=6_000_000_000,
                trials=24)


def test_check_free_disk_refuses_in_one_line_naming_the_shortfall_and_the_fixes(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**10, 10**10 - 2 * 10**9, 2 * 10**9))
    with pytest.raises(LmtuneError) as refused:
        check_free_disk(tmp_path, NEED, force=False)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"only 2.0 GB free under {tmp_path}, and this sweep needs about 6.0 GB (636 MB per "
                              "running trial, 91 MB kept per ended trial)")
    for fix in ("free space", "--results", "lower --keep", "--force"):
        assert fix in message


def test_check_free_disk_starts_anyway_with_force(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**10, 10**10 - 2 * 10**9, 2 * 10**9))
    assert check_free_disk(tmp_path, NEED, force=True) == 2 * 10**9


def test_check_free_disk_passes_when_the_space_is_there(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**11, 0, 10**11))
    assert check_free_disk(tmp_path, NEED, force=False) == 10**11
