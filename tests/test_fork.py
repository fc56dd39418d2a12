"""A WSD budget forked from another budget's run trains exactly as the same budget from scratch: a shorter one
from a longer run's checkpoint, a longer one from a shorter run's stable.pt."""

from __future__ import annotations

import pytest

from lmtune.errors import LmtuneError
from lmtune.training.checkpoint import STABLE_NAME, periodic_path
from lmtune.training.fork import fork_run
from lmtune.training.loop import train
from lmtune.training.metrics import read_metrics

WSD = {"schedule": "wsd", "cooldown_fraction": 0.2, "warmup_steps": 5, "checkpoint_interval": 10,
       "keep_checkpoints": 10, "eval_interval": 10, "log_interval": 5}


def learning(run_dir):
    """What training did, row by row (not how fast it did it)."""
    keys = ("step", "tokens", "train_loss", "val_loss", "lr", "grad_norm")
    return [{k: row.get(k) for k in keys} for row in read_metrics(run_dir / "metrics.csv")]


@pytest.fixture(scope="module")
def long_run(make_tiny_config, tmp_path_factory):
    """A 60-step WSD run (its stable phase ends at step 47) with a checkpoint every 10 steps."""
    out = tmp_path_factory.mktemp("long")
    train(make_tiny_config(**WSD, steps=60), out)
    return out


@pytest.mark.slow
def test_a_forked_cooldown_ends_bit_for_bit_as_the_shorter_run_from_scratch(long_run, make_tiny_config, tmp_path):
    short = make_tiny_config(**WSD, steps=40)  # cooldown: steps 32..40
    scratch = train(short, tmp_path / "scratch")
    forked = fork_run(periodic_path(long_run / "checkpoints", 30), short, tmp_path / "forked")
    assert forked.status == scratch.status == "completed"
    assert learning(tmp_path / "forked") == learning(tmp_path / "scratch")
    assert forked.summary["final_val_loss"] == scratch.summary["final_val_loss"]


@pytest.mark.slow
def test_a_longer_run_continued_from_a_shorter_runs_stable_end_is_the_longer_run_from_scratch(
        long_run, make_tiny_config, tmp_path):
    short = train(make_tiny_config(**WSD, steps=40), tmp_path / "short")
    stable = tmp_path / "short" / "checkpoints" / STABLE_NAME
    assert short.status == "completed" and stable.is_file()  # at step 32, where its cooldown begins
    longer = fork_run(stable, make_tiny_config(**WSD, steps=60), tmp_path / "longer")
    forked, scratch = learning(tmp_path / "longer"), learning(long_run)
    # Every evaluation is the same; so is every row from step 40 on (the row at 35 averages the train loss over
    # steps 33-35 in the continued run, whose copied history has a row at 32, and over 31-35 from scratch).
    assert [r for r in forked if r["val_loss"] is not None] == [r for r in scratch if r["val_loss"] is not None]
    assert [r for r in forked if r["step"] >= 40] == [r for r in scratch if r["step"] >= 40]
    assert longer.summary["final_val_loss"] == scratch[-1]["val_loss"]


def test_a_fork_from_inside_the_shorter_runs_cooldown_is_refused(long_run, make_tiny_config, tmp_path):
    with pytest.raises(LmtuneError, match="after step 32, where the shorter run's cooldown begins"):
        fork_run(periodic_path(long_run / "checkpoints", 40), make_tiny_config(**WSD, steps=40), tmp_path / "f")
    assert not (tmp_path / "f").exists()


def test_a_fork_of_another_lr_is_refused(long_run, make_tiny_config, tmp_path):
    with pytest.raises(LmtuneError, match="differ in lr"):
        fork_run(periodic_path(long_run / "checkpoints", 20), make_tiny_config(**WSD, steps=40, lr=0.5),
                      tmp_path / "f")
