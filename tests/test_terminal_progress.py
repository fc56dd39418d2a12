"""Progress with an ETA for train, lr_find and analyze --sharpness (issue 56 item 5): a bar on a terminal, nothing
where stderr is a file, a pipe or a Ray worker's."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from conftest import TINY, run_lmtune

from lmtune.tools.terminal_progress import ProgressSink, each


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_training_bar_reaches_the_last_logged_step_with_the_loss():
    screen = Terminal()
    sink = ProgressSink(30, "train", file=screen)
    for step in (5, 10, 30):
        sink.write({"step": step, "train_loss": 4.25}, None)
    sink.close(None)
    assert "30/30" in screen.getvalue() and "loss=4.2500" in screen.getvalue()


def test_where_stderr_is_no_terminal_nothing_is_drawn():
    log = io.StringIO()
    sink = ProgressSink(30, "train", file=log)
    sink.write({"step": 30, "train_loss": 4.0}, None)
    sink.close(None)
    assert log.getvalue() == ""


def test_each_yields_every_item_in_order_and_counts_them_on_a_terminal():
    screen = Terminal()
    assert list(each(["a", "b", "c"], 3, "sharpness", "checkpoint", file=screen)) == ["a", "b", "c"]
    assert "3/3" in screen.getvalue()


@pytest.mark.slow
def test_train_run_from_a_pipe_writes_no_bar_into_its_log(builtin_data: Path, tmp_path: Path):
    settings = [f"--set={k}={v}" for k, v in {**TINY, "steps": 10, "eval_interval": 5}.items()]
    proc = run_lmtune("train", "--data", str(builtin_data), "--out", str(tmp_path / "run"), *settings, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "step/s" not in proc.stderr and "s/step" not in proc.stderr and "%|" not in proc.stderr
