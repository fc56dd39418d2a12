"""The suite's two tiers and its time limits (tests/conftest.py; docs/contributing.md, "Running the tests"): a test
marked release runs only with --release, every test has a limit, and a process a test runs never outlives it."""

from __future__ import annotations

import sys
import time

import pytest
from conftest import PER_PUSH_LIMIT_S, REPO, run_command, time_left


def test_a_process_a_test_runs_may_use_the_rest_of_the_tests_limit_less_a_margin():
    left = time_left()
    assert left is not None and PER_PUSH_LIMIT_S - 30 < left <= PER_PUSH_LIMIT_S - 10
    assert time_left(5) == 5  # (a shorter timeout asked for is kept)
    assert time_left(10 * PER_PUSH_LIMIT_S) == pytest.approx(time_left(), abs=1)  # (a longer one is cut)


@pytest.mark.timeout(30)  # (its own limit, shorter than the tier's)
def test_a_test_with_a_limit_of_its_own_gives_its_processes_that_limit():
    assert time_left() <= 20


def test_a_process_that_overruns_is_killed_and_fails_its_test_naming_the_command():
    started = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match=r"sleep 30 \.\.\. did not finish within 1 s"):
        run_command(["sleep", "30"], timeout=1)
    assert time.monotonic() - started < 20  # (killed, not waited for)


@pytest.mark.parametrize(("flags", "collected"), [([], False), (["--release"], True)])
def test_a_release_test_is_collected_only_with_release(flags: list[str], collected: bool):
    proc = run_command([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                        "tests/test_install.py", *flags], cwd=REPO)
    assert proc.returncode == (0 if collected else 5), proc.stdout[-2000:]  # (5: pytest collected nothing)
    assert ("test_install.py::" in proc.stdout) is collected
    assert ("deselected" in proc.stdout) is not collected
