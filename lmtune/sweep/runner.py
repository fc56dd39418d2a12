"""A sweep as one Ray Tune experiment: run it, or resume it. The command is ``python -m lmtune.run``.

Writes the experiment to results/NAME/: Ray's files, one folder per trial with lmtune's own outputs,
sweep.json (the plan and where it ran), and decisions/ (the outcome ledger and ASHA's rungs). What the
sweep concluded is read back from that folder by the report's reader (lmtune.report.writer.summarize_sweep),
the same for ``run`` and ``analyze``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sized
from dataclasses import dataclass, replace
from pathlib import Path

import ray
from ray import tune

from lmtune.analysis.runs import Outcome
from lmtune.errors import LmtuneError
from lmtune.files import DiskFullError, existing_ancestor, full_disk, mirrored
from lmtune.sweep.disk import DiskNeed, Keep, check_free_disk, disk_need, format_bytes, free_disk
from lmtune.sweep.experiment import (
    build_trainable,
    build_tuner,
    check_resumed_code,
    disk_reserve,
    place_on_cluster,
    plan_sweep,
    ship_data,
    sweep_record,
)
from lmtune.sweep.options import SweepOptions
from lmtune.sweep.placement import Placement
from lmtune.sweep.plan import SweepPlan
from lmtune.sweep.ray_state import repair_ray_state
from lmtune.sweep.record import SWEEP_FILE, is_sweep_dir, read_outcomes, resuming_in, sole_writer
from lmtune.sweep.retention import drop_staged_duplicates, prune_sweep
from lmtune.sweep.session import Echo, Interruptions, ray_session
from lmtune.sweep.spaces import load_space
from lmtune.sweep.stopping import incurable
from lmtune.sweep.storage import SweepStorage
from lmtune.sweep.sweep_file import SweepRecord

log = logging.getLogger(__name__)

MIN_FREE_BYTES = 200 * 2**20
DISK_FULL = "full disk"
INCURABLE = "an error no retry cures"


@dataclass
class SweepResult:
    """How a sweep ended: its trials' outcomes (the ledger) and whether a signal stopped it first."""

    sweep_dir: Path
    planned: int
    """Trials the space asks for (a search that decides as it goes: the trials it started)."""
    outcome_counts: dict[str, int]
    stopped_by: str | None = None
    """SIGINT or SIGTERM when a signal ended the sweep before every trial (and the search) finished; DISK_FULL when
    its stopper did, the results disk being unable to take the next checkpoints, INCURABLE when a trial failed in a
    way no retry cures (``note`` says how)."""
    note: str = ""

    @property
    def unfinished(self) -> int:
        return max(0, self.planned - sum(self.outcome_counts.values()))


def run_sweep(options: SweepOptions, echo: Echo = print) -> SweepResult:
    """A new sweep into results/NAME (refused if it exists), or with ``resume`` that sweep continued."""
    if options.resume:
        return resume_sweep(options, echo)
    sweep_dir = options.sweep_dir
    if sweep_dir.exists():
        raise LmtuneError(f"{sweep_dir} already exists; pass --resume to continue it or choose another --name")
    # The results folder checked first: a refused one must not leave the built-in corpus that planning prepares.
    preflight_write_check(options.results.resolve(), flag=options.results_flag)
    plan = plan_sweep(options)
    storage = SweepStorage(options.storage_path, options.name)
    with sole_writer(sweep_dir, new=True) as started, ray_session(options, echo), \
            mirrored_records(storage, sweep_dir):
        placement = place_on_cluster(options, plan)
        check_storage_reach(options, storage)
        need = sweep_disk_need(options, plan, placement)
        free = free_disk(options.results.resolve()) if storage.remote else \
            check_free_disk(options.results.resolve(), need, options.force, options.results_flag)
        shipped = ship_data(options, Path(plan.base.data_dir))
        sweep_record(options, plan, placement).write(sweep_dir)
        base = plan.base
        echo(f"sweep {options.name}: {plan.space.describe_search()}; budget {base.budget} ({base.total_tokens:,} "
             f"tokens/trial); {placement.cpu:g} CPU + {placement.gpu:g} GPU per trial, up to "
             f"{placement.max_concurrent} at once{placement.why}")
        if advice := plan.space.strategy.advice(base):
            echo(f"note: {advice}")
        where = f" in {storage.uri}" if storage.remote else ""
        echo(f"{need.describe(free)}{where}; ended trials keep {KEEP_WORDS[options.keep]} (--keep)")
        tuner = build_tuner(options, plan, placement, shipped)
        Interruptions.tuning = True
        started.set()
        return fit_sweep(tuner.fit, options, storage, plan, disk_reserve(plan, placement.max_concurrent))


def resume_sweep(options: SweepOptions, echo: Echo = print) -> SweepResult:
    """Continue an interrupted sweep: decided trials stay decided, unfinished ones continue from their
    newest checkpoint, errored ones are retried."""
    sweep_dir = options.sweep_dir
    storage = SweepStorage(options.storage_path, options.name)
    if not sweep_dir.exists() and storage.remote and storage.exists(SWEEP_FILE):
        # A new driver (a new head, the laptop): the sweep's records come from its storage.
        storage.download(sweep_dir, records_only=True)
    if not sweep_dir.exists():
        existing = sorted(p.name for p in options.results.resolve().glob("*") if is_sweep_dir(p))
        raise LmtuneError(f"--resume: no sweep at {sweep_dir}; check --name "
                          f"(existing: {', '.join(existing) or 'none'})")
    if not is_sweep_dir(sweep_dir):
        raise LmtuneError(f"--resume: {sweep_dir} is not an lmtune sweep (no {SWEEP_FILE}); "
                          "give the --name of a sweep")
    record = SweepRecord.read(sweep_dir)
    check_resume_inputs(options, record)  # before the lock: a refusal writes nothing
    if record.plan is not None:
        # the user's code: the very file recorded (or --trust-code), it imports, passes its checks, builds the model
        check_resumed_code(record, options.trust_code)
    preflight_write_check(sweep_dir, flag=options.results_flag)
    with sole_writer(sweep_dir, new=False):
        return _resume_held_sweep(options, sweep_dir, echo)


def _resume_held_sweep(options: SweepOptions, sweep_dir: Path, echo: Echo) -> SweepResult:
    record = SweepRecord.read(sweep_dir)
    plan = record.plan
    if plan is None:
        raise LmtuneError(f"--resume: {sweep_dir / SWEEP_FILE}: no usable sweep plan (it records no space or no base "
                          "config); it was not written by python -m lmtune.run, or was edited: restore it")
    storage = SweepStorage(options.storage_path, options.name)
    experiment = storage.uri if storage.remote else str(sweep_dir)
    if not storage.remote:
        repair_ray_state(sweep_dir)  # a kill -9 while Ray copied its snapshot leaves it cut short
    with ray_session(options, echo), mirrored_records(storage, sweep_dir):
        if not tune.Tuner.can_restore(experiment):
            raise LmtuneError(f"--resume: {sweep_dir} has no Ray experiment state yet (it stopped before the first "
                              "trial started); delete it and run again without --resume")
        shipped = ship_data(options, Path(plan.base.data_dir))
        record = record.resumed(time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        record.write(sweep_dir)  # before the restore: Ray then stages this version of the top-level files
        echo(f"resuming sweep {sweep_dir.name}: finished trials are kept, unfinished ones continue from their "
             "last checkpoint")
        # Decisions in the ledger stand: a trial that ended after Tune's last experiment snapshot is
        # still "running" there and would be resumed. Errored trials are retried (resume_errored).
        ended = frozenset(t for t, e in read_outcomes(sweep_dir).items() if e.get("outcome") != Outcome.ERROR)
        trainable = build_trainable(plan, record.resources_per_trial, shipped, ended, options.step_hook,
                                    options.trial_figures)
        try:
            with resuming_in(sweep_dir):  # its callbacks, ASHA and searcher come back pointing here
                tuner = tune.Tuner.restore(experiment, trainable=trainable, resume_unfinished=True,
                                           resume_errored=True)
        except (ModuleNotFoundError, AttributeError) as err:  # unpickling names this lmtune does not have
            raise LmtuneError(f"--resume: {sweep_dir.name} was started by an earlier lmtune whose Ray state this "
                              f"version cannot load ({err}); analyze it as it is, or start a new sweep") from None
        Interruptions.tuning = True
        reserve = disk_reserve(plan, record.max_concurrent or 1)
        return fit_sweep(tuner.fit, replace(options, keep=record.keep), storage, plan, reserve)


# What --keep leaves of an ended trial, in words.
KEEP_WORDS = {Keep.BEST: "best.pt only", Keep.LAST: "best.pt and their newest checkpoint",
              Keep.ALL: "every checkpoint"}


def sweep_disk_need(options: SweepOptions, plan: SweepPlan, placement: Placement) -> DiskNeed:
    """The disk the sweep's checkpoints will take at their peak, from its largest trial's checkpoint size, its
    trial count (a deciding search's: an estimate) and the retention rule (lmtune.sweep.retention)."""
    trials, held = plan.space.strategy.expected_trials()
    return disk_need(plan.largest_trial(), max(trials, 1), placement.max_concurrent, options.keep,
                     held_by_search=held, members=plan.space.fuse)


def fit_sweep(fit: Callable[[], Sized], options: SweepOptions, storage: SweepStorage, plan: SweepPlan,
              reserve: int) -> SweepResult:
    """Tune's loop (``fit``: the tuner's), then ``finish``. A full disk under the driver (its records, Ray's
    experiment state, a callback's files) ends the loop with an error: the sweep stopped by it, with what it was
    writing and the room there is as its note, and left for --resume like one its stopper stopped."""
    try:
        result = sweep_result(options.sweep_dir, fit(), plan)
    except Exception as err:
        if (full := full_disk(err, options.sweep_dir)) is None:
            raise
        result = sweep_result(options.sweep_dir, (), plan)
        result.stopped_by, result.note = DISK_FULL, f"{full.fact}; free space, then resume"
    return finish(options, storage, result, reserve)


def finish(options: SweepOptions, storage: SweepStorage, result: SweepResult, reserve: int) -> SweepResult:
    """A sweep that ended keeps only what --keep asks for: what the search held until now goes. One that stopped
    early is left as it is for --resume: by a signal, or by its stopper because the results disk could not take
    the next checkpoints (``reserve`` bytes; then ``stopped_by`` says so). How it ended goes into sweep.json
    (``ended``). A sweep in object storage is then copied back (records and trial files, no checkpoints) into
    results/NAME, where the report reads it."""
    if result.stopped_by is None:
        freed = prune_sweep(options.storage_path, options.name, options.keep)
        log.info("pruned %s of checkpoints nothing can use any more", format_bytes(freed))
    else:
        drop_staged_duplicates(result.sweep_dir)
        if result.stopped_by != DISK_FULL and not storage.remote and \
                (free := free_disk(options.results.resolve())) < reserve:
            result.stopped_by = DISK_FULL
            result.note = (f"only {format_bytes(free)} free on the disk of {options.results.resolve()}, less "
                                f"than the next checkpoints need ({format_bytes(reserve)}); free space, then resume")
    record = SweepRecord.read(result.sweep_dir)
    record = replace(record, ended={"outcomes": result.outcome_counts, "unfinished": result.unfinished,
                                    **({"stopped_by": result.stopped_by, "note": result.note} if result.stopped_by
                                       else {})})
    try:
        record.write(result.sweep_dir)
    except DiskFullError:
        if result.stopped_by != DISK_FULL:
            raise
        # (still full: sweep.json keeps its version before, which a resume reads as well)
        log.warning("sweep.json could not record how the sweep ended: its disk is still full")
    if storage.remote:
        storage.download(result.sweep_dir)
    return result


@contextlib.contextmanager
def mirrored_records(storage: SweepStorage, sweep_dir: Path) -> Iterator[None]:
    """While a sweep in object storage runs, each record its driver writes in results/NAME (sweep.json, the
    ledger, ASHA's and the search's state) is uploaded beside its trials as it is written."""
    if not storage.remote:
        yield
        return
    with mirrored(sweep_dir, storage.upload):
        yield


def check_storage_reach(options: SweepOptions, storage: SweepStorage) -> None:
    """A sweep on a cluster whose nodes are not all this machine needs storage every node reaches: object
    storage, or a path on a network filesystem. Refused in one line before any trial starts."""
    if storage.remote or not options.address or on_network_filesystem(Path(options.storage_path)):
        return
    others = [] if options.cluster_config else other_hosts()
    if others or options.cluster_config:
        where = f"nodes at {', '.join(others)}" if others else "the workers the autoscaler starts"
        raise LmtuneError(f"--storage {options.storage_path}: a path on this machine's own disk, which {where} "
                          "cannot reach; give --storage s3://BUCKET/PREFIX (or gs://..., or a shared NFS path)")


def other_hosts() -> list[str]:
    """The addresses of the cluster's live nodes other than this one."""
    here = ray.util.get_node_ip_address()
    return sorted({n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")} - {here})


def on_network_filesystem(path: Path) -> bool:
    """Whether ``path`` lies on a filesystem other machines mount too (NFS, SMB, Lustre, a FUSE mount of a
    bucket...), by the type of the mount that holds it (/proc/mounts)."""
    try:
        mounts = [line.split()[1:3] for line in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return False
    resolved = str(path.resolve())
    holding = max((m for m in mounts if resolved == m[0] or resolved.startswith(m[0].rstrip("/") + "/")),
                  key=lambda m: len(m[0]), default=None)
    return holding is not None and holding[1].split(".")[0] in NETWORK_FILESYSTEMS


NETWORK_FILESYSTEMS = frozenset({"nfs", "nfs4", "cifs", "smb3", "lustre", "gpfs", "beegfs", "glusterfs", "ceph",
                                 "fuse", "9p", "efs"})


def check_resume_inputs(options: SweepOptions, record: SweepRecord) -> None:
    """--space and --data on a resume must name what the sweep ran on: it continues with those."""
    space = record.plan.space if record.plan else None
    if options.space is not None and space is not None and space.source \
            and load_space(options.space).source != space.source:
        raise LmtuneError(f"--resume: --space {options.space} is not the space {record.name} ran "
                          f"({space.name}, as saved in its sweep.json); drop --space")
    ran_on = record.data.dir
    if options.data is not None and ran_on and Path(options.data).resolve() != Path(ran_on):
        raise LmtuneError(f"--resume: --data {options.data} is not the data {record.name} ran on ({ran_on}); "
                          "drop --data")


def sweep_result(sweep_dir: Path, results: Sized, plan: SweepPlan) -> SweepResult:
    """The ledger's counts and whether a signal stopped the sweep first (``results``: Tune's ResultGrid, none where
    its loop ended with an error)."""
    counts: dict[str, int] = {}
    outcomes = read_outcomes(sweep_dir)
    for entry in outcomes.values():
        if "members" not in entry:  # a fused group: its members are the trials
            counts[entry["outcome"]] = counts.get(entry["outcome"], 0) + 1
    # A search counts the trials it started: the ledger's, which include a probe an interruption made it rerun.
    started = max(plan.space.num_trials or 0, len(results), sum(counts.values()))
    summary = SweepResult(sweep_dir, started, dict(sorted(counts.items())))
    errors = {trial: str(e.get("reason", "")).removeprefix("error: ") for trial, e in outcomes.items()
              if e.get("outcome") == Outcome.ERROR}
    cause = next((f"trial {trial}: {error.partition(': ')[2]}" for trial, error in errors.items() if incurable(error)),
                 None)
    if cause is not None:
        summary.stopped_by, summary.note = INCURABLE, cause
    elif summary.unfinished or not plan.space.strategy.finished(sweep_dir):
        summary.stopped_by = Interruptions.name()
    return summary


def preflight_write_check(directory: Path, min_free: int = MIN_FREE_BYTES, flag: str = "--results") -> None:
    """Refuse at start, not hours later, a results folder that cannot take writes (one not made yet: the folder
    it would be made in; it is made with the sweep's own folder, so that a refused start leaves nothing). ``flag``:
    the option that named the folder (--results, or --storage for a storage folder), named in the fix."""
    if not (ancestor := existing_ancestor(directory)).is_dir():
        where = "" if ancestor == Path(directory).absolute() else f"cannot write to {directory}: "
        raise LmtuneError(f"{where}{ancestor} is a file, not a folder; choose another {flag} folder")
    try:
        probe = ancestor / f".lmtune-write-test-{os.getpid()}"
        probe.write_bytes(b"x" * 4096)
        probe.unlink()
    except OSError as err:
        raise LmtuneError(f"cannot write to {directory} ({err.strerror or err}); choose a writable {flag} "
                          f"folder or fix its permissions") from None
    free = shutil.disk_usage(existing_ancestor(directory)).free
    if free < min_free:
        raise LmtuneError(f"only {free / 2**20:.0f} MiB free under {directory}; free at least "
                          f"{min_free / 2**20:.0f} MiB or choose another {flag} folder (a floor --force does not "
                          "lower: below it a checkpoint's own temporary file may not fit)")
