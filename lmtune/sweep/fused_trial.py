"""A fused trial: one Tune trial trains a group of a grid's LRs as one fused model (lmtune.fused).

Tune sees the group: ASHA ranks it by its best member, the stopper watches it as a whole, one GPU
share runs it. Each member is a trial of its own everywhere else: a folder beside the group's
(``<group id>-<k>_lr=...``, with trial.json, so analyze, diagnose and the report list it), an entry
in the ledger with its own outcome and reason, and within the group the same rules end it that
would end it alone: the stopper's divergence rule at every report, and ASHA's rung rule (keep the
best 1/reduction_factor at each rung) among the group's members.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ray import tune

from lmtune.analysis.rungs import Rungs
from lmtune.analysis.runs import Outcome, format_tokens
from lmtune.files import atomic_write_json, link_or_copy
from lmtune.fused.loop import train_fused
from lmtune.searches.trial_order import TrialOrder, TuneParams, TuneResult
from lmtune.sweep.plan import TrialSetup
from lmtune.sweep.record import TRIAL_FILE, write_trial_file
from lmtune.sweep.reporting import TuneSink
from lmtune.sweep.stopping import Ending
from lmtune.training.config import RunConfig
from lmtune.training.divergence import BY_RULE
from lmtune.training.loop import RunEnd, RunResult
from lmtune.training.metrics import Row
from lmtune.usercode.spec import spec_for

log = logging.getLogger(__name__)


def member_folders(group_dir: Path, group_id: str, lrs: list[float]) -> dict[str, Path]:
    """Member trial id -> its folder, beside the group's in the sweep folder."""
    return {f"{group_id}-{k}": group_dir.parent / f"{group_id}-{k}_lr={lr:.3g}" for k, lr in enumerate(lrs)}


def train_group_trial(order: TrialOrder, params: TuneParams, base: RunConfig, group_id: str, group_dir: Path,
                      rungs: Rungs | None, setup: TrialSetup) -> list[RunResult]:
    """Train a fused order's members (its LRs, sharing its other settings) with each member's files in its own
    folder; Tune hears the group through GroupTuneSink. ``params``: the order as Tune handed it, for the group's
    trial.json. ``rungs``: the sweep's ASHA's (None: no ASHA). ``setup``: what the sweep's trials share."""
    assert order.members is not None
    lrs, others = list(order.members.lrs), dict(order.members.shared)
    folders = member_folders(group_dir, group_id, lrs)
    configs = order.member_configs(base, list(folders), checked=setup.space_checked)
    atomic_write_json(group_dir / TRIAL_FILE, {"trial_id": group_id, "params": params,
                                               "members": {m: f.name for m, f in folders.items()}})
    for (member, folder), lr in zip(folders.items(), lrs, strict=True):
        folder.mkdir(parents=True, exist_ok=True)
        write_trial_file(folder, member, {"lr": lr, **others}, group=group_id)
    restore_group_checkpoint(folders)
    sink = GroupTuneSink(configs[0], list(folders))
    return train_fused(configs, list(folders.values()), resume=True, group_sink=sink,
                       member_rule=member_rule(configs[0], rungs), divergence=setup.divergence,
                       spec=spec_for(configs[0]), figures=setup.trial_figures)


def member_rule(config: RunConfig, rungs: Rungs | None):
    """The group's MemberRule: the stopper's divergence rule at every row (the member's LossWatch fired:
    above its initial loss for the whole recovery window), ASHA's rung rule at evaluations."""
    group = GroupRungs(rungs, run_tokens=config.run_tokens) if rungs else None

    def decide(step: int, rows: dict[int, Row]) -> dict[int, RunEnd]:
        # (At its last row a member ends by itself and its whole loss is judged, as an unfused trial's is.)
        last = step >= config.train.stop_step
        endings = {m: RunEnd("diverged", f"diverged at step {row['diverged_step']}: {row['divergence_reason']}",
                             row["diverged_step"], BY_RULE)
                   for m, row in rows.items() if row.get("divergence_stop") and not last}
        if group is not None:
            vals = {m: r["val_loss"] for m, r in rows.items() if m not in endings and r["val_loss"] is not None}
            tokens = step * config.tokens_per_step
            endings.update({m: RunEnd("stopped_early", why) for m, why in group.cut(tokens, vals).items()})
        return endings

    return decide


class GroupRungs:
    """ASHA's rung rule (lmtune.analysis.rungs) among a group's members: the first evaluation at or past each rung
    cuts the members worse than the best 1/reduction_factor of them, as Tune's ASHA cuts a trial worse than
    that cutoff of its rung's; none is cut at the trial's last report."""

    def __init__(self, rungs: Rungs, run_tokens: int):
        self.rungs, self.run_tokens = rungs, run_tokens
        self.done: set[float] = set()

    def cut(self, tokens: int, vals: dict[int, float]) -> dict[int, str]:
        if not vals or tokens >= self.run_tokens:
            return {}
        due = [m for m in self.rungs.passed(tokens) if m not in self.done]
        if not due:
            return {}
        self.done.add(due[0])
        cutoff = self.rungs.cutoff(vals.values())
        return {m: (f"stopped by ASHA's rung rule within its fused group at {format_tokens(tokens)} tokens (val loss "
                    f"{v:.4g} worse than the group's cutoff {cutoff:.4g})") for m, v in vals.items() if v > cutoff}


def member_ending(result: RunResult) -> Ending:
    """A member's ending as the ledger records it."""
    summary = result.summary
    reason = result.end.reason or "completed its budget"
    return Ending(Outcome(result.status), reason, summary.get("steps"), summary.get("tokens"))


class GroupTuneSink:
    """The group as one Tune trial: each report is its best running member's (ASHA ranks the group by it),
    with ``member_ids`` and ``members_running`` (comma-separated trial ids) and the ``member_endings``
    decided since the last report,
    which the driver's OutcomeRecorder writes to the ledger; each checkpoint holds every member's."""

    def __init__(self, config: RunConfig, member_ids: list[str]):
        self.tune_sink = TuneSink(config)
        self.member_ids = member_ids
        self.running = list(range(len(member_ids)))
        self.last: Row = {"step": 0, "tokens": 0}

    def write(self, rows: dict[int, Row], checkpoints: dict[int, Path], endings: dict[int, RunResult]) -> None:
        self.running = [m for m in self.running if m not in endings]
        values = self._group_row(rows) if rows else {k: self.last[k] for k in ("step", "tokens")}
        values.update(self._membership(endings))
        files = {}
        for path in checkpoints.values():
            for file in (path, path.with_name(path.name + ".sha256")):
                files[f"{path.parent.parent.name}/{file.name}"] = file
        self.tune_sink.report(values, files)

    def close(self, results: list[RunResult]) -> None:
        """The group's last report: every member's ending; ``diverged`` (for the stopper) if all diverged."""
        self.running = [m for m, r in enumerate(results) if r is None or r.status == "stopped"]
        values = {k: self.last[k] for k in ("step", "tokens")}
        values.update(self._membership({m: r for m, r in enumerate(results) if r is not None}))
        if all(r is not None and r.status == "diverged" for r in results):
            values.update(diverged=True, diverged_because="every member of the fused group diverged")
            self.tune_sink.latest_val = self.tune_sink.uniform_loss
        self.tune_sink.report(values, {})

    def _group_row(self, rows: dict[int, Row]) -> Row:
        best = min(rows.values(), key=lambda r: (r["val_loss"] is None, r["val_loss"] or 0.0, r["train_loss"]))
        vals = [r["val_loss"] for r in rows.values() if r["val_loss"] is not None]
        self.last = best
        return {**best, "train_loss": min(r["train_loss"] for r in rows.values()),
                "val_loss": min(vals) if vals else None, "members_reporting": len(rows),
                "aggregate_tokens_per_s": best["tokens_per_s"] * len(rows)}

    def _membership(self, endings: dict[int, RunResult]) -> TuneResult:
        # Comma-joined: Tune's loggers take strings as they are (a list would be logged as a histogram).
        return {"member_ids": ",".join(self.member_ids),
                "members_running": ",".join(self.member_ids[m] for m in self.running),
                "member_endings": {self.member_ids[m]: member_ending(r).to_json() for m, r in endings.items()
                                   if r.status != "stopped"}}


def restore_group_checkpoint(folders: dict[str, Path]) -> None:
    """Put the members' checkpoints of the Tune checkpoint this trial restores from (a retry, or --resume
    on another node) into their folders, where the fused loop's resume looks."""
    restored = tune.get_checkpoint()
    if restored is None:
        return
    by_name = {f.name: f for f in folders.values()}
    with restored.as_directory() as directory:
        for path in Path(directory).glob("*/step_*.pt*"):
            folder = by_name.get(path.parent.name)
            target = folder / "checkpoints" / path.name if folder else None
            if target is not None and not target.exists():
                link_or_copy(path, target)
