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


# ---------------------------------------------------------------------------------------------
# Warmup-stable-decay


def _wsd(**settings):
    from lmtune.training.config import TrainConfig

    return TrainConfig(**{"lr": 1e-3, "min_lr_ratio": 0.1, "warmup_steps": 10, "steps": 100, "schedule": "wsd",
                          "cooldown_fraction": 0.2, **settings})


def test_wsd_warms_up_holds_the_peak_then_cools_down_to_the_floor_at_the_last_step():
    from lmtune.training.schedule import scheduled_lr, stable_until

    t = _wsd()
    assert scheduled_lr(5, t) == pytest.approx(0.5e-3)
    assert stable_until(t) == 79 and scheduled_lr(10, t) == scheduled_lr(79, t) == 1e-3
    assert scheduled_lr(99, t) == pytest.approx(1e-4, abs=1e-18)
    lrs = [scheduled_lr(s, t) for s in range(79, 100)]
    assert all(a > b for a, b in zip(lrs, lrs[1:], strict=False))


@pytest.mark.parametrize(("shape", "halfway"), [("1-sqrt", 1 - math.sqrt(0.5)), ("linear", 0.5), ("cosine", 0.5)])
def test_each_cooldown_shape_is_at_its_formula_halfway(shape, halfway):
    from lmtune.training.schedule import scheduled_lr

    t = _wsd(cooldown_shape=shape)
    assert scheduled_lr(89, t) == pytest.approx(1e-4 + (1e-3 - 1e-4) * halfway)


def test_a_shorter_wsd_run_is_the_longer_one_until_its_own_cooldown():
    from lmtune.training.schedule import scheduled_lr, stable_until

    short, long = _wsd(steps=100), _wsd(steps=400)
    assert [scheduled_lr(s, short) for s in range(stable_until(short) + 1)] == \
           [scheduled_lr(s, long) for s in range(stable_until(short) + 1)]


def test_a_wsd_schedule_whose_warm_up_and_cooldown_do_not_fit_is_refused():
    from lmtune.errors import LmtuneError
    from lmtune.training.config import RunConfig, apply_overrides

    with pytest.raises(LmtuneError, match="do not fit in 100 steps"):
        apply_overrides(RunConfig(), {"schedule": "wsd", "steps": 100, "warmup_steps": 90, "cooldown_fraction": 0.2})
