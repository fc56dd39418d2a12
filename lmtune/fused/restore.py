"""Resuming a fused group from its members' own checkpoints.

A member whose summary.json says it ended (completed, diverged, cut) stays ended. The others go back
into the fused tensors from the newest step at which every one of them has a checkpoint that
verifies (they checkpoint in lockstep, so that is normally the newest of each); with none, they start
afresh.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

from lmtune.fused.members import Member
from lmtune.fused.state import FusedState
from lmtune.training.checkpoint import PERIODIC, load_checkpoint, periodic_checkpoints, periodic_path
from lmtune.training.loop import RunEnd, RunResult
from lmtune.training.state import restore_rng_state

log = logging.getLogger(__name__)

ENDED = ("completed", "diverged", "stopped_early")


def ended_result(member: Member) -> RunResult | None:
    """How the member ended, from its summary.json; None while it has not (or was interrupted)."""
    try:
        summary = json.loads((member.out_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(summary, dict) or summary.get("status") not in ENDED:
        return None
    end = RunEnd(summary["status"], summary.get("reason") or "", summary.get("diverged_step"),
                 summary.get("diverged_how"))
    return RunResult(summary["status"], summary, member.out_dir, end=end)


def restore_members(state: FusedState, members: Sequence[Member]) -> float:
    """Load the unfinished members' newest common checkpoint into ``state`` (ended members are left out
    of it); returns the wall time the earlier processes took."""
    for member in members:
        member.result = ended_result(member)
    running = [m for m in members if m.result is None]
    state.keep([m.index for m in running])
    steps = [{int(PERIODIC.match(p.name).group(1)) for p in periodic_checkpoints(m.checkpointer.directory)}
             for m in running]
    common = sorted(set.intersection(*steps), reverse=True) if steps else []
    for step in common:
        try:
            saved = {m.index: load_checkpoint(periodic_path(m.checkpointer.directory, step)) for m in running}
        except (ValueError, OSError) as err:
            log.warning("checkpoints at step %d unusable (%s); trying an earlier one", step, err)
            continue
        for m in running:
            state.load_member(m.index, saved[m.index])
            m.best_val_loss, m.elapsed_s, m.step = saved[m.index]["best_val_loss"], saved[m.index]["elapsed_s"], step
        state.step = step
        restore_rng_state(saved[running[0].index]["rng"], state.device)
        log.info("resuming %d members from step %d", len(running), step)
        return max(m.elapsed_s for m in running)
    if any(steps):
        log.warning("no step at which every unfinished member has a usable checkpoint: they start afresh")
    return 0.0
