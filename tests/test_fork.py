"""A shorter WSD budget forked from a longer run's checkpoint trains exactly as the shorter run from scratch."""

from __future__ import annotations

import pytest

from lmtune.errors import LmtuneError
from lmtune.training.checkpoint import periodic_path
from lmtune.training.fork import fork_cooldown
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


def test_a_forked_cooldown_ends_bit_for_bit_as_the_shorter_run_from_scratch(long_run, make_tiny_config, tmp_path):
    short = make_tiny_config(**WSD, steps=40)  # cooldown: steps 32..40
    scratch = train(short, tmp_path / "scratch")
    forked = fork_cooldown(periodic_path(long_run / "checkpoints", 30), short, tmp_path / "forked")
    assert forked.status == scratch.status == "completed"
    assert learning(tmp_path / "forked") == learning(tmp_path / "scratch")
    assert forked.summary["final_val_loss"] == scratch.summary["final_val_loss"]


def test_a_fork_from_inside_the_shorter_runs_cooldown_is_refused(long_run, make_tiny_config, tmp_path):
    with pytest.raises(LmtuneError, match="after step 32, where the shorter run's cooldown"):
        fork_cooldown(periodic_path(long_run / "checkpoints", 40), make_tiny_config(**WSD, steps=40), tmp_path / "f")
    assert not (tmp_path / "f").exists()


def test_a_fork_of_another_lr_is_refused(long_run, make_tiny_config, tmp_path):
    with pytest.raises(LmtuneError, match="differ in lr"):
        fork_cooldown(periodic_path(long_run / "checkpoints", 20), make_tiny_config(**WSD, steps=40, lr=0.5),
                      tmp_path / "f")
