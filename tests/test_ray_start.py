"""A local Ray instance that does not come up: Ray's raylet misses its fixed 30 s to register on a busy machine
(ray._private.node raises a bare Exception). The start is tried again, then refused in one line naming the cause
and the fixes. Fault injection: ``ray.init`` is replaced by one raising Ray's own words, as no test can make a
machine busy enough on cue."""

from __future__ import annotations

import pytest
import ray

from lmtune.errors import LmtuneError
from lmtune.run import build_parser, sweep_options
from lmtune.sweep import session
from lmtune.sweep.session import LOCAL_RAY_ATTEMPTS, RAY_STARTUP_TIMEOUT

RAYS_WORDS = (f"The current node {RAY_STARTUP_TIMEOUT}. This could happen because some of the raylet failed to "
              "startup or the GCS has become overloaded.")


@pytest.fixture
def options(builtin_data):
    args = ["--space", "quick", "--data", str(builtin_data), "--no-dashboard", "--num-cpus", "1"]
    return sweep_options(build_parser().parse_args(args), args)


def failing_init(calls: list[dict], succeed_on: int | None = None):
    def init(**kwargs):
        calls.append(kwargs)
        if succeed_on is not None and len(calls) == succeed_on:
            return "context"
        raise Exception(RAYS_WORDS)  # noqa: TRY002 - Ray's own bare Exception
    return init


def test_a_local_ray_that_misses_its_startup_wait_is_refused_in_one_line_after_a_second_try(options, monkeypatch,
                                                                                            tmp_path):
    calls: list[dict] = []
    monkeypatch.setattr(ray, "init", failing_init(calls))
    with pytest.raises(LmtuneError) as err:
        session._init_ray(options, str(tmp_path))
    assert len(calls) == LOCAL_RAY_ATTEMPTS
    message = str(err.value)
    assert "\n" not in message and "30 s" in message and "--address auto" in message and "load average" in message


def test_a_local_ray_that_starts_on_its_second_try_is_used(options, monkeypatch, tmp_path):
    calls: list[dict] = []
    monkeypatch.setattr(ray, "init", failing_init(calls, succeed_on=2))
    assert session._init_ray(options, str(tmp_path)) == "context" and len(calls) == 2


def test_any_other_failure_of_ray_init_is_not_retried(options, monkeypatch, tmp_path):
    def init(**kwargs):
        raise ValueError("some other problem")
    monkeypatch.setattr(ray, "init", init)
    with pytest.raises(ValueError, match="some other problem"):
        session._init_ray(options, str(tmp_path))
