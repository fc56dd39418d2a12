"""The width search's 90% intervals hold what they claim: simulated searches (the real width search at quick_width's
settings, runs trained instantly on known loss curves with the run-to-run noise measured at each width;
benchmarks/width_coverage.py) cover the true best LR at the target width in 85-95% of searches, whether LR* falls
as 1/width (SP's fall on the built-in corpus) or stays put (μP's promise). 200 searches put the binomial sd of the
coverage at about 2%."""

from __future__ import annotations

import importlib
import math
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def coverage():
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    return importlib.import_module("width_coverage")


# A benchmark of the search against its ground truth (simulated searches): the release tier.
@pytest.mark.release
@pytest.mark.slow
def test_the_90_percent_interval_holds_the_true_lr_at_the_target_width_in_85_to_95_percent_of_searches(coverage):
    outcomes = [coverage.simulate(gamma, 1000 + k) for gamma in (1.0, 0.0) for k in range(100)]
    assert all(o is not None for o in outcomes), "every simulated search must fit"
    held = sum(o.covered for o in outcomes) / len(outcomes)
    assert 0.85 <= held <= 0.95, f"the nominal 90% interval held the true LR* in {held:.1%} of 200 searches"


# A benchmark of the search against its ground truth (simulated searches): the release tier.
@pytest.mark.release
@pytest.mark.slow
def test_a_fall_like_sps_is_resolved_and_a_flat_optimum_mostly_is_not(coverage):
    falling = [coverage.simulate(1.0, 3000 + k) for k in range(50)]
    flat = [coverage.simulate(0.0, 4000 + k) for k in range(50)]
    assert sum(o.resolved for o in falling) / len(falling) >= 0.9
    assert sum(o.resolved for o in flat) / len(flat) <= 0.25  # 10% expected of a calibrated 90% interval


def test_a_held_out_bent_width_law_turns_from_the_narrowest_proxys_gamma_to_the_targets(coverage):
    bent = coverage.HELD_OUT["bent_sp"]
    slope = {w: -math.log(bent.best(w * 1.01, 0.006) / bent.best(w, 0.006)) / math.log(1.01) for w in (32, 256)}
    assert bent.best(256, 0.006) == pytest.approx(0.006)
    assert slope[32] == pytest.approx(0.5, abs=0.01) and slope[256] == pytest.approx(1.0, abs=0.01)
    assert bent.true_gamma is None


def test_the_shipped_cases_are_the_scenario_of_their_gamma_with_nothing_held_out(coverage):
    """simulate(gamma, seed) is the plain power law on the measured noise: the same search as its Scenario."""
    assert coverage.simulate(1.0, 7) == coverage.simulate(1.0, 7, scenario=coverage.Scenario("plain", 1.0))
