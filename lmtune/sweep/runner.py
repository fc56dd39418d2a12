"""A sweep as one Ray Tune experiment: run it, or resume it. The command is ``python -m lmtune.run``.

Writes the experiment to results/NAME/: Ray's files, one folder per trial with lmtune's own outputs,
sweep.json (the plan and where it ran), and decisions/ (the outcome ledger and ASHA's rungs). What the
sweep concluded is read back from that folder by the report's reader (lmtune.report.writer.summarize_sweep),
the same for ``run`` and ``analyze``.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ray import tune

from lmtune.errors import LmtuneError
from lmtune.sweep.disk import DiskNeed, Keep, check_free_disk, disk_need, format_bytes, free_disk
from lmtune.sweep.experiment import (
    build_trainable,
    build_tuner,
    disk_reserve,
    place_on_cluster,
    plan_sweep,
    ship_data,
    sweep_record,
)
from lmtune.sweep.options import SweepOptions
from lmtune.sweep.placement import Placement
from lmtune.sweep.plan import SweepPlan
from lmtune.sweep.record import SWEEP_FILE, Outcome, SweepRecord, is_sweep_dir, read_outcomes, sole_writer
from lmtune.sweep.retention import prune_sweep
from lmtune.sweep.session import Echo, Interruptions, ray_session
from lmtune.sweep.spaces import load_space

log = logging.getLogger(__name__)

MIN_FREE_BYTES = 200 * 2**20
DISK_FULL = "full disk"


@dataclass
class SweepResult:
    """How a sweep ended: its trials' outcomes (the ledger) and whether a signal stopped it first."""

    sweep_dir: Path
    planned: int
    """Trials the space asks for (a search that decides as it goes: the trials it started)."""
    outcome_counts: dict[str, int]
    stopped_by: str | None = None
    """SIGINT or SIGTERM when a signal ended the sweep before every trial (and the search) finished; DISK_FULL when
    its stopper did, the results disk being unable to take the next checkpoints (``disk_note`` says how)."""
    disk_note: str = ""

    @property
    def unfinished(self) -> int:
        return max(0, self.planned - sum(self.outcome_counts.values()))


def run_sweep(options: SweepOptions, echo: Echo = print) -> SweepResult:
    """A new sweep into results/NAME (refused if it exists), or with ``resume`` that sweep continued."""
    if options.resume:
        return resume_sweep(options, echo)
    sweep_dir = options.sweep_dir
    if sweep_dir.exists():
        raise LmtuneError(f"results/{options.name} already exists; pass --resume to continue it or choose "
                          "another --name")
    plan = plan_sweep(options)
    preflight_write_check(options.results.resolve())
    with sole_writer(sweep_dir, new=True), ray_session(options, echo):
        placement = place_on_cluster(options, plan)
        need = sweep_disk_need(options, plan, placement)
        free = check_free_disk(options.results.resolve(), need, options.force)
        shipped = ship_data(options, Path(plan.base.data_dir))
        sweep_record(options, plan, placement).write(sweep_dir)
        base = plan.base
        echo(f"sweep {options.name}: {plan.space.describe_search()}; budget {base.budget} ({base.total_tokens:,} "
             f"tokens/trial); {placement.cpu:g} CPU + {placement.gpu:g} GPU per trial, up to "
             f"{placement.max_concurrent} at once")
        echo(f"{need.describe(free)}; ended trials keep {KEEP_WORDS[options.keep]} (--keep)")
        tuner = build_tuner(options, plan, placement, shipped)
        Interruptions.tuning = True
        return finish(options, sweep_result(sweep_dir, tuner.fit(), plan), disk_reserve(plan, placement.max_concurrent))


def resume_sweep(options: SweepOptions, echo: Echo = print) -> SweepResult:
    """Continue an interrupted sweep: decided trials stay decided, unfinished ones continue from their
    newest checkpoint, errored ones are retried."""
    sweep_dir = options.sweep_dir
    if not sweep_dir.exists():
        existing = sorted(p.name for p in options.results.resolve().glob("*") if is_sweep_dir(p))
        raise LmtuneError(f"--resume: no sweep at {sweep_dir}; check --name "
                          f"(existing: {', '.join(existing) or 'none'})")
    if not is_sweep_dir(sweep_dir):
        raise LmtuneError(f"--resume: {sweep_dir} is not an lmtune sweep (no {SWEEP_FILE}); "
                          "give the --name of a sweep")
    check_resume_inputs(options, SweepRecord.read(sweep_dir))  # before the lock: a refusal writes nothing
    preflight_write_check(sweep_dir)
    with sole_writer(sweep_dir, new=False):
        return _resume_held_sweep(options, sweep_dir, echo)


def _resume_held_sweep(options: SweepOptions, sweep_dir: Path, echo: Echo) -> SweepResult:
    record = SweepRecord.read(sweep_dir)
    try:
        plan = SweepPlan.from_json(asdict(record))
    except LmtuneError as err:
        raise LmtuneError(f"--resume: {sweep_dir / SWEEP_FILE}: {err}") from None
    with ray_session(options, echo):
        if not tune.Tuner.can_restore(str(sweep_dir)):
            raise LmtuneError(f"--resume: {sweep_dir} has no Ray experiment state yet (it stopped before the first "
                              "trial started); delete it and run again without --resume")
        shipped = ship_data(options, Path(plan.base.data_dir))
        record.resumed_at.append(time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        record.write(sweep_dir)  # before the restore: Ray then stages this version of the top-level files
        echo(f"resuming sweep {sweep_dir.name}: finished trials are kept, unfinished ones continue from their "
             "last checkpoint")
        # Decisions in the ledger stand: a trial that ended after Tune's last experiment snapshot is
        # still "running" there and would be resumed. Errored trials are retried (resume_errored).
        ended = frozenset(t for t, e in read_outcomes(sweep_dir).items() if e.get("outcome") != Outcome.ERROR)
        resources = {k: float(v) for k, v in record.resources_per_trial.items()}
        trainable = build_trainable(plan, resources, shipped, ended)
        try:
            tuner = tune.Tuner.restore(str(sweep_dir), trainable=trainable, resume_unfinished=True,
                                       resume_errored=True)
        except (ModuleNotFoundError, AttributeError) as err:  # unpickling names this lmtune does not have
            raise LmtuneError(f"--resume: {sweep_dir.name} was started by an earlier lmtune whose Ray state this "
                              f"version cannot load ({err}); analyze it as it is, or start a new sweep") from None
        Interruptions.tuning = True
        reserve = disk_reserve(plan, record.max_concurrent or 1)
        kept = replace(options, keep=Keep(record.keep) if record.keep in set(Keep) else Keep.BEST)
        return finish(kept, sweep_result(sweep_dir, tuner.fit(), plan), reserve)


# What --keep leaves of an ended trial, in words.
KEEP_WORDS = {Keep.BEST: "best.pt only", Keep.LAST: "best.pt and their newest checkpoint",
              Keep.ALL: "every checkpoint"}


def sweep_disk_need(options: SweepOptions, plan: SweepPlan, placement: Placement) -> DiskNeed:
    """The disk the sweep's checkpoints will take at their peak, from its largest trial's checkpoint size, its
    trial count (a deciding search's: an estimate) and the retention rule (lmtune.sweep.retention)."""
    trials, held = plan.space.strategy.expected_trials()
    return disk_need(plan.largest_trial(), max(trials, 1), placement.max_concurrent, options.keep,
                     held_by_search=held, members=plan.space.fuse)


def finish(options: SweepOptions, result: SweepResult, reserve: int) -> SweepResult:
    """A sweep that ended keeps only what --keep asks for: what the search held until now goes. One that stopped
    early is left as it is for --resume: by a signal, or by its stopper because the results disk could not take
    the next checkpoints (``reserve`` bytes; then ``stopped_by`` says so)."""
    if result.stopped_by is None:
        freed = prune_sweep(options.storage_path, options.name, options.keep)
        log.info("pruned %s of checkpoints nothing can use any more", format_bytes(freed))
    elif (free := free_disk(options.results.resolve())) < reserve:
        result.stopped_by = DISK_FULL
        result.disk_note = (f"only {format_bytes(free)} free on the disk of {options.results.resolve()}, less than "
                            f"the next checkpoints need ({format_bytes(reserve)}); free space, then resume")
    return result


def check_resume_inputs(options: SweepOptions, record: SweepRecord) -> None:
    """--space and --data on a resume must name what the sweep ran on: it continues with those."""
    ran = record.space.get("yaml")
    if options.space is not None and ran is not None and load_space(options.space).source != ran:
        raise LmtuneError(f"--resume: --space {options.space} is not the space {record.name} ran "
                          f"({record.space.get('name')}, as saved in its sweep.json); drop --space")
    ran_on = record.data.get("dir")
    if options.data is not None and ran_on and Path(options.data).resolve() != Path(ran_on):
        raise LmtuneError(f"--resume: --data {options.data} is not the data {record.name} ran on ({ran_on}); "
                          "drop --data")


def sweep_result(sweep_dir: Path, results: tune.ResultGrid, plan: SweepPlan) -> SweepResult:
    """The ledger's counts and whether a signal stopped the sweep first."""
    counts: dict[str, int] = {}
    for entry in read_outcomes(sweep_dir).values():
        if "members" not in entry:  # a fused group: its members are the trials
            counts[entry["outcome"]] = counts.get(entry["outcome"], 0) + 1
    # A search counts the trials it started: the ledger's, which include a probe an interruption made it rerun.
    started = max(plan.space.num_trials or 0, len(results), sum(counts.values()))
    summary = SweepResult(sweep_dir, started, dict(sorted(counts.items())))
    if summary.unfinished or not plan.space.strategy.finished(sweep_dir):
        summary.stopped_by = Interruptions.name()
    return summary


def preflight_write_check(directory: Path, min_free: int = MIN_FREE_BYTES) -> None:
    """Refuse at start, not hours later, a results folder that cannot take writes."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".lmtune-write-test-{os.getpid()}"
        probe.write_bytes(b"x" * 4096)
        probe.unlink()
    except OSError as err:
        raise LmtuneError(f"cannot write to {directory} ({err.strerror or err}); choose a writable --results "
                          f"folder or fix its permissions") from None
    free = shutil.disk_usage(directory).free
    if free < min_free:
        raise LmtuneError(f"only {free / 2**20:.0f} MiB free under {directory}; free at least "
                          f"{min_free / 2**20:.0f} MiB or choose another --results folder")
