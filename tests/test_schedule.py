import math

import pytest

from lmtune.training.schedule import cosine_lr

MAX, MIN, TW, TC = 1e-3, 1e-4, 100, 1000


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        (0, 0.0),
        (50, 0.5e-3),
        (TW, MAX),
        ((TW + TC) // 2, MIN + 0.5 * (MAX - MIN)),
        (TW + (TC - TW) // 4, MIN + 0.5 * (1 + math.cos(math.pi / 4)) * (MAX - MIN)),
        (TC, MIN),
        (TC + 500, MIN),
    ],
    ids=["t0", "mid-warmup", "end-of-warmup", "mid-cosine", "quarter-cosine", "end-of-cosine", "after"],
)
def test_cosine_schedule_with_warmup(step, expected):
    assert cosine_lr(step, MAX, MIN, TW, TC) == pytest.approx(expected, abs=1e-15)


def test_run_schedule_reaches_min_lr_exactly_at_the_last_step():
    from lmtune.training.schedule import lr_at

    assert lr_at(999, 1e-3, 0.1, 100, 1000) == pytest.approx(1e-4, abs=1e-18)
    assert lr_at(998, 1e-3, 0.1, 100, 1000) > 1e-4
