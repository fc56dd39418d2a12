"""ASHA's rung rule (lmtune.analysis.rungs), written once: the rungs and the cut Tune's ASHA applies to a sweep's
trials (lmtune.sweep.asha_scheduler.PersistentASHA) and a fused group to its members (GroupRungs)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
from ray.tune.schedulers import TrialScheduler

from lmtune.analysis.rungs import Rungs
from lmtune.private_apis import asha_rungs
from lmtune.sweep.asha_scheduler import PersistentASHA
from lmtune.sweep.fused_trial import GroupRungs

GRACE, MAX_T, RF = 100, 900, 3  # rungs at 100, 300 and 900 tokens


@dataclass
class FakeTrial:
    """What ASHA reads of a trial: its id."""

    trial_id: str


def tunes_asha(grace: float = GRACE, factor: float = RF, max_t: float = MAX_T) -> PersistentASHA:
    """Tune's ASHA as a sweep runs it, on val_loss against tokens (no ledger, no saved state)."""
    return PersistentASHA(metric="val_loss", mode="min", max_t=max_t, grace_period=grace, reduction_factor=factor)


@pytest.mark.parametrize("grace, factor, max_t", [(GRACE, RF, MAX_T), (1000, 2, 8000), (20, 2, 300), (7, 3, 189),
                                                  (1, 4, 100), (5, 2.5, 80)])
def test_the_rung_rule_places_its_rungs_where_tunes_asha_does(grace: int, factor: float, max_t: int):
    asha = tunes_asha(grace, factor, max_t)
    assert list(asha.rungs.milestones) == sorted(r["milestone"] for r in asha_rungs(asha)["brackets"][0])


def test_tunes_asha_stops_a_trial_exactly_where_the_rung_rule_cuts_its_loss():
    """40 trials reach the first rung one after another: each is stopped iff the rule cuts its loss among the
    losses of the trials before it."""
    asha, rng, before = tunes_asha(), random.Random(3), []
    for index in range(40):
        loss, trial = round(rng.uniform(2.0, 6.0), 2), FakeTrial(f"t{index:02d}")
        asha.on_trial_add(None, trial)
        result = {"tokens": GRACE + 20, "val_loss": loss, "total_tokens": MAX_T, "step": 12}
        stopped = asha.on_trial_result(None, trial, result) == TrialScheduler.STOP
        assert stopped == asha.rungs.cuts(loss, before), (index, loss, before)
        before.append(loss)


def test_a_fused_group_cuts_its_members_by_the_rung_rule_once_per_rung():
    rungs = Rungs.of(GRACE, RF, MAX_T)
    group = GroupRungs(rungs, run_tokens=MAX_T)
    losses = {0: 3.0, 1: 3.1, 2: 3.2, 3: 5.0, 4: 4.0, 5: 2.9}
    assert group.cut(GRACE - 1, losses) == {}  # before the first rung
    cut = group.cut(GRACE + 20, losses)  # the first evaluation past it
    assert set(cut) == {m for m, loss in losses.items() if rungs.cuts(loss, losses.values())} == {1, 2, 3, 4}
    assert "worse than the group's cutoff 3.067" in cut[3]  # (their 1/3 quantile)
    assert group.cut(GRACE + 40, {0: 3.0, 5: 2.9}) == {}  # that rung was judged
    assert set(group.cut(3 * GRACE, {0: 3.0, 5: 2.9})) == {0}  # the next one
    assert group.cut(MAX_T, {0: 9.0, 5: 2.9}) == {}  # the last report: it ends by itself
