"""The LR range test: reading its curve (pure), and the real test on the quick model, run the way a user
runs it (``python -m lmtune.lr_find``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from lmtune import lr_find
from lmtune.training.lr_range import (
    RANGE_CSV,
    RANGE_FIGURE,
    RANGE_JSON,
    RangeTestConfig,
    blew_up,
    read_curve,
    read_range_test,
    smooth_losses,
)


def test_smoothing_is_bias_corrected_so_a_constant_loss_stays_constant():
    assert smooth_losses([4.0] * 5, 0.9) == pytest.approx([4.0] * 5)


def test_a_non_finite_loss_makes_every_later_smoothed_value_non_finite():
    smoothed = smooth_losses([4.0, 3.0, float("nan"), 2.0], 0.5)
    assert all(math.isfinite(v) for v in smoothed[:2]) and all(math.isnan(v) for v in smoothed[2:])


def test_blow_up_is_a_rise_above_the_factor_times_the_lowest_earlier_loss():
    assert not blew_up([5.0, 3.0, 4.4], 1.5)
    assert blew_up([5.0, 3.0, 4.6], 1.5)
    assert blew_up([5.0, float("nan")], 1.5)


def test_the_steepest_descent_is_where_the_loss_falls_fastest_before_its_minimum_not_in_the_rise_after():
    lrs = [10 ** (-4 + k / 10) for k in range(40)]
    # gentle fall, a steep fall around index 15, the minimum at index 25, then a rise steeper than any fall
    losses = [10 - 0.1 * k for k in range(12)] + [8.9 - 1.0 * k for k in range(1, 7)] + \
             [2.9 - 0.1 * k for k in range(1, 8)] + [2.2 + 2.0 * k for k in range(1, 16)]
    steepest, lowest = read_curve(lrs, losses)
    assert lowest == pytest.approx(lrs[24])
    assert lrs[12] <= steepest <= lrs[17]


def test_settings_that_cannot_ramp_are_refused_naming_the_key():
    with pytest.raises(Exception, match="max_lr must be a number above min_lr"):
        RangeTestConfig(min_lr=1.0, max_lr=0.1).validate()


@pytest.fixture(scope="module")
def range_run(builtin_data: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """``lr_find`` on the quick model (batch 16 x 64 tokens, 60 steps from 1e-5 to 10), once."""
    out = tmp_path_factory.mktemp("lr_find") / "range"
    argv = ["--data", str(builtin_data), "--budget", "quick", "--set", "batch_size=16", "--set", "context_length=64",
            "--set", "device=cpu", "--set", "compile=off", "--steps", "60", "--out", str(out), "--quiet"]
    from contextlib import redirect_stdout
    from io import StringIO

    printed = StringIO()
    with redirect_stdout(printed):
        assert lr_find.main(argv) == 0
    return out, printed.getvalue()


@pytest.mark.slow
def test_the_range_test_on_the_quick_model_finds_the_blow_up_below_the_largest_lr(range_run):
    out, _ = range_run
    result = read_range_test(out)
    assert result is not None and result.blowup_lr is not None and result.blowup_lr < 10
    assert len(result.lrs) < 60  # it stopped at the blow-up instead of running on


@pytest.mark.slow
def test_the_steepest_descent_never_lies_above_the_blow_up(range_run):
    result = read_range_test(range_run[0])
    assert result.steepest_lr is not None and result.steepest_lr < result.min_loss_lr <= result.blowup_lr


@pytest.mark.slow
def test_lr_find_writes_its_curve_figure_and_settings_and_prints_the_coarse_grid(range_run):
    out, printed = range_run
    assert {RANGE_CSV, RANGE_JSON, RANGE_FIGURE} <= {p.name for p in out.iterdir()}
    assert json.loads((out / RANGE_JSON).read_text())["settings"]["steps"] == 60
    assert "steepest descent at lr" in printed and "coarse grid at lr" in printed


@pytest.mark.slow
def test_lr_find_refuses_an_out_folder_that_already_holds_files(range_run, capsys):
    from conftest import assert_refused

    before = sorted(p.name for p in range_run[0].iterdir())
    assert_refused(lr_find.main, ["--out", str(range_run[0])], capsys, "already exists", "another --out")
    assert sorted(p.name for p in range_run[0].iterdir()) == before
