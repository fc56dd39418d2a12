"""Building a sweep's Ray Tune experiment from its plan: the plan itself (space, base config, ASHA's budget),
where its trials run, the trainable, the Tuner with its scheduler, stopper, searcher and callbacks, and the
sweep's record (sweep.json)."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import logging
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import ray
import torch
from ray import tune
from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

from lmtune.data.dataset import data_unigram_loss, load_data, read_meta
from lmtune.data.prepare import ensure_builtin_corpus
from lmtune.errors import LmtuneError
from lmtune.private_apis import wandb_logger_callback
from lmtune.searches.base import Setting
from lmtune.searches.trial_order import METRIC, MODE, TrialOrder
from lmtune.sweep.asha_scheduler import PersistentASHA
from lmtune.sweep.disk import CheckpointBytes, Keep
from lmtune.sweep.options import SweepOptions
from lmtune.sweep.placement import ClusterCapacity, Placement, place_trials
from lmtune.sweep.plan import SweepPlan
from lmtune.sweep.preflight import read_cluster_config
from lmtune.sweep.ray_state import RayStateBackup
from lmtune.sweep.record import asha_state_path, ledger_path
from lmtune.sweep.retention import CheckpointPruner, TuneResultsKept
from lmtune.sweep.searcher import tune_search_alg
from lmtune.sweep.spaces import SearchSpace, load_space
from lmtune.sweep.stopping import DiskGuard, OutcomeRecorder, TrialStopper
from lmtune.sweep.storage import is_uri
from lmtune.sweep.sweep_file import DataRecord, SweepRecord
from lmtune.sweep.trainable import DATA_FILES, ShippedData, train_trial
from lmtune.sweep.variant_asha import VARIANT_AXIS, PerVariantASHA
from lmtune.training.config import RunConfig, budget_config
from lmtune.training.device import resolve_device
from lmtune.training.loop import resolve_config
from lmtune.training.memory import check_fits
from lmtune.usercode.checks import builds_share_state, check_code
from lmtune.usercode.config import MODEL_ARG_PREFIX, MODEL_SETTING, UserCode
from lmtune.usercode.consent import check_recorded_files, recorded_files
from lmtune.usercode.spec import spec_for

log = logging.getLogger(__name__)



def plan_sweep(options: SweepOptions) -> SweepPlan:
    """The sweep's plan from its options: the space (with --fuse), and the base config on the data (the
    built-in corpus, prepared on first use, unless --data), every problem refused before Ray starts."""
    space = load_space(options.space)
    if options.fuse is not None:
        space = space.fused(options.fuse, fail=lambda message: LmtuneError(f"--fuse {options.fuse}: {message}"))
    if space.fuse > 1 and options.storage and is_uri(options.storage):
        raise LmtuneError(f"--storage {options.storage}: fused members write beside their trial's folder, which needs "
                          "filesystem storage (a local or shared path); use fuse: 1 with URI storage")
    # (with --address the trials run elsewhere: their device is known here only where this machine has a GPU)
    local = not options.address or torch.cuda.is_available()
    return make_plan(space, options.data, options.budget, options.overrides, options.code, local_device=local)


def make_plan(space: SearchSpace, data: Path | None, budget: str | None, overrides: dict[str, Setting],
              code: UserCode | None = None, local_device: bool = True) -> SweepPlan:
    """The plan of ``space`` on ``data`` (None: the built-in corpus, prepared on first use) with ``budget`` (None: the
    space's), ``overrides`` and the user's ``code`` (over the space's own) on top; every problem with the data, the
    settings or the user's code refused here, before Ray starts. ``local_device``: the trials run on this machine's
    device (its CUDA GPU, MPS or CPU: what a space's ``batch_size: largest`` is fitted to)."""
    data_dir = (data or ensure_builtin_corpus()).resolve()  # trials run in their own working dirs
    base = base_config(space, budget or space.budget, overrides, data_dir, (code or UserCode()).on_top_of(space.code))
    device = (lambda: resolve_device(base.train.device)) if local_device else None  # (asked only where needed)
    space = dataclasses.replace(space, strategy=space.strategy.fitted_to_device(base, device))
    plan = SweepPlan.create(space, base)
    longest = plan.largest_value("context_length", plan.base.model.context_length)
    load_data(data_dir, longest, plan.base.model.vocab_size)  # every bad-data case fails here, before Ray starts
    plan = dataclasses.replace(plan, unigram_loss=data_unigram_loss(data_dir))
    check_code(plan.base, space.fuse)
    return plan


def base_config(space: SearchSpace, budget: str, overrides: dict[str, Setting], data_dir: Path,
                code: UserCode) -> RunConfig:
    """The config every trial starts from: budget, the space's fixed settings, then --set; training ``code``."""
    swept = sorted(set(overrides) & set(space.swept))
    if swept:  # each trial's own value would replace it, while sweep.json recorded it
        raise LmtuneError(f"--set {', '.join(swept)}: the space sweeps {', '.join(swept)} "
                          f"({space.strategy.owns_why()})")
    config = budget_config(budget, {**space.fixed, **overrides}, data_dir=str(data_dir), code=code)
    return resolve_config(config, data_dir)


# Where `ray up` leaves the autoscaler's cluster config on the head (where `ray job submit` runs the driver).
BOOTSTRAP_CONFIG = Path("~/ray_bootstrap_config.yaml")


def place_on_cluster(options: SweepOptions, plan: SweepPlan) -> Placement:
    """Resources per trial and trials at once (inside a Ray session): on the nodes Ray reports up now, or, on an
    autoscaling cluster (--address with its cluster config), on what the cluster holds at full scale, so trials
    ask for GPU shares while no GPU worker is up yet and the autoscaler starts GPU workers for them."""
    cluster = ray.cluster_resources()
    cpus, gpus, why = cluster.get("CPU", 1), cluster.get("GPU", 0), ""
    capacity = cluster_capacity(options)
    if capacity is not None and (capacity.cpus > cpus or capacity.gpus > gpus):
        cpus, gpus = max(cpus, capacity.cpus), max(gpus, capacity.gpus)
        why = (f" (the cluster scales to {capacity.workers} worker{'s' * (capacity.workers != 1)}: {cpus:g} CPUs, "
               f"{gpus:g} GPUs)")
    gpu_bytes = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None
    if not gpus and not options.address:  # trials on this machine's CPU: the largest one must fit its memory
        largest = plan.largest_trial()
        check_fits(largest, torch.device("cpu"), members=plan.space.fuse,
                   where=f"the sweep's largest trial (batch_size {largest.train.batch_size})", spec=spec_for(largest))
    return place_trials(plan.largest_trial(), plan.space.fuse, options.cpus_per_trial, options.gpus_per_trial,
                        options.max_concurrent, cpus, gpus, gpu_bytes, why)


def cluster_capacity(options: SweepOptions) -> ClusterCapacity | None:
    """The autoscaler's capacity at full scale, from --cluster-config or (with --address) `ray up`'s bootstrap
    config on this head; None on one machine or where neither is at hand."""
    path = options.cluster_config or (BOOTSTRAP_CONFIG.expanduser() if options.address else None)
    if path is None or (options.cluster_config is None and not path.is_file()):
        return None
    return ClusterCapacity.from_config(read_cluster_config(path), str(path))


def build_tuner(options: SweepOptions, plan: SweepPlan, placement: Placement,
                shipped: ShippedData | None) -> tune.Tuner:
    sweep_dir, space = options.sweep_dir, plan.space
    recorder = OutcomeRecorder(ledger_path(sweep_dir), gpus_per_trial=placement.gpu)
    scheduler = plan_scheduler(plan, recorder, asha_state_path(sweep_dir), metric=METRIC, mode=MODE)
    stopper = TrialStopper(recorder, time_budget_s=options.time_budget_s,
                           min_tokens_per_s=space.stopper.min_tokens_per_s,
                           slow_grace_reports=space.stopper.slow_grace_reports,
                           # (with object storage the results disk holds only the driver's records)
                           disk_guard=None if is_uri(options.storage_path) else DiskGuard(
                               options.results.resolve(), disk_reserve(plan, placement.max_concurrent)))
    # The recorder first: the pruner reads the outcome it records.
    callbacks: list[tune.Callback] = [
        recorder, CheckpointPruner(options.storage_path, options.keep, space.strategy.held_checkpoints, sweep_dir),
        *result_loggers(options.storage_path)]
    if not is_uri(options.storage_path):  # an object store takes Ray's snapshot whole or not at all
        callbacks.append(RayStateBackup(sweep_dir))
    if options.wandb_project:
        callbacks.append(wandb_logger_callback(project=options.wandb_project, group=options.name, dir=str(sweep_dir)))
    search_alg, num_samples = tune_search_alg(space.strategy, plan.budget(), sweep_dir)
    return tune.Tuner(
        build_trainable(plan, placement.resources, shipped, step_hook=options.step_hook,
                        trial_figures=options.trial_figures),
        param_space=space.strategy.param_space(space.fuse),
        tune_config=tune.TuneConfig(
            search_alg=search_alg, scheduler=scheduler, num_samples=num_samples,
            max_concurrent_trials=placement.max_concurrent, trial_dirname_creator=trial_dirname,
            reuse_actors=reuses_workers(plan),
        ),
        run_config=tune.RunConfig(
            name=options.name, storage_path=options.storage_path, stop=stopper,
            failure_config=tune.FailureConfig(max_failures=options.max_failures),
            # One checkpoint per trial while it runs (resume needs its newest); --keep all keeps keep_checkpoints.
            checkpoint_config=tune.CheckpointConfig(
                num_to_keep=plan.base.train.keep_checkpoints if options.keep == Keep.ALL else 1),
            # Trials write straight into a filesystem storage path; URI storage needs Ray's sync.
            sync_config=tune.SyncConfig(sync_artifacts=is_uri(options.storage_path)),
            callbacks=callbacks, progress_reporter=progress_reporter(space), verbose=0 if options.quiet else 1,
        ),
    )


def result_loggers(storage_path: str) -> list[tune.Callback]:
    """Tune's CSV and JSON results of each trial, continuing those in storage, and no TensorBoard stream of Tune's
    (TUNE_DISABLE_AUTO_CALLBACK_LOGGERS, set in ray_session): each trial has lmtune's own."""
    return [TuneResultsKept(storage_path), CSVLoggerCallback(), JsonLoggerCallback()]


def reuses_workers(plan: SweepPlan) -> bool:
    """TuneConfig's reuse_actors for the plan: a finished trial's worker process runs the next trial, with no process
    start and imports per trial (seconds each, more than a short trial's training on a CPU). Not for a user's model
    whose builds share state (a module-level cache): the next trial would start from what the last one left there."""
    return not builds_share_state(plan.base)


def plan_scheduler(plan: SweepPlan, recorder: OutcomeRecorder | None = None, state_path: Path | None = None,
                   metric: str | None = None, mode: str | None = None) -> PersistentASHA | PerVariantASHA | None:
    """The plan's ASHA on tokens (None without one): cutting only the stages its strategy lets it cut, each trial
    judged in the sweep's order — and, where the trials are variants (a compare search), only against its own
    variant's; with a ``recorder`` and a ``state_path``, its decisions in the ledger and its rungs kept across
    restarts. ``metric``/``mode`` None: the Tuner's TuneConfig sets them."""
    asha = plan.asha
    if asha is None:
        return None
    strategy = plan.space.strategy
    per_variant = VARIANT_AXIS in getattr(strategy, "axis_columns", ())
    return (PerVariantASHA if per_variant else PersistentASHA)(
        recorder, state_path, time_attr="tokens", metric=metric, mode=mode, max_t=asha.max_t,
        grace_period=asha.grace_period, reduction_factor=asha.reduction_factor, stages=strategy.asha_stages())


def disk_reserve(plan: SweepPlan, max_concurrent: int) -> int:
    """The free bytes the next round of checkpoints needs: one more for each trial running at once (each member
    of a fused trial)."""
    return max_concurrent * plan.space.fuse * CheckpointBytes.of(plan.largest_trial()).full


def build_trainable(plan: SweepPlan, resources: dict[str, float], shipped: ShippedData | None,
                    ended: frozenset[str] = frozenset(), step_hook: str | None = None, trial_figures: bool = False):
    """The function trainable with the whole plan (and, on --resume, the trials the ledger says ended)."""
    setup = plan.trial_setup(space_checked=True, trial_figures=trial_figures)
    trainable = tune.with_parameters(train_trial, setup=setup, shipped=shipped,
                                     ended=ended, step_hook=step_hook)
    return tune.with_resources(trainable, resources)


def check_resumed_code(record: SweepRecord, trust_code: bool = False) -> None:
    """A resumed sweep's user code, checked before Ray starts: each file the very one the sweep recorded, unchanged
    (else refused unless ``trust_code``: lmtune.usercode.consent), it imports, passes lmtune's checks, and builds a
    model of the parameters the sweep began with (the trials' checkpoints hold those)."""
    plan = record.plan
    check_recorded_files(plan.code_specs, record.code_files, trust_code)
    check_code(plan.base, plan.space.fuse)
    base = plan.base
    if record.model_fingerprint and spec_for(base).model.fingerprint(base) != record.model_fingerprint:
        raise LmtuneError(f"--resume: --model {base.code.model} now builds a model of other parameters (names or "
                          "shapes) than when the sweep started, so its trials' checkpoints cannot continue; restore "
                          "the model's code as it was, or start a new sweep")


def ship_data(options: SweepOptions, data_dir: Path) -> ShippedData | None:
    """On a cluster, put the prepared data in Ray's object store once (up to --ship-data-mb) so a
    node without it still runs its trials; on one machine the files are read in place."""
    if not options.address:
        return None
    size = sum((data_dir / name).stat().st_size for name in DATA_FILES if (data_dir / name).exists())
    if size > options.ship_data_mb * 2**20:
        log.warning("data is %.0f MiB > --ship-data-mb %d: every node must have it at %s", size / 2**20,
                    options.ship_data_mb, data_dir)
        return None
    return ShippedData.from_dir(data_dir)


def trial_dirname(trial) -> str:
    config = dict(trial.config)
    members = TrialOrder.from_tune(config).members
    if members is not None:  # a fused group: its LRs and the other settings its members share
        config = {**members.shared, **{k: v for k, v in config.items() if k != "members"},
                  "lr": ",".join(_short(v) for v in members.lrs)}
    # (a compare variant's own model is named by its variant; an argument of the model's by its own name)
    params = "_".join(f"{k.removeprefix(MODEL_ARG_PREFIX)}={_short(v)}" for k, v in sorted(config.items())
                      if k != MODEL_SETTING)
    return f"{trial.trial_id}_{params}"[:120]


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def progress_reporter(space: SearchSpace) -> tune.CLIReporter:
    return tune.CLIReporter(
        parameter_columns=space.strategy.progress_columns(space.fuse),
        metric_columns={"tokens": "tokens", "train_loss": "train", "val_loss": "val", "tokens_per_s": "tok/s"},
        max_report_frequency=15, sort_by_metric=False,
    )


def sweep_record(options: SweepOptions, plan: SweepPlan, placement: Placement) -> SweepRecord:
    return plan_record(plan, options.name, resources_per_trial=placement.resources,
                       max_concurrent=placement.max_concurrent, time_budget_s=options.time_budget_s,
                       address=options.address, command=tuple(options.command or sys.argv), keep=options.keep)


def installed_version(package: str) -> str | None:
    """``package``'s installed version, without importing it (None: not installed; optuna is needed only by
    search: optuna; lmtune itself run from a checkout it was never installed from)."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def plan_record(plan: SweepPlan, name: str, **where: Any) -> SweepRecord:
    """sweep.json of a sweep of ``plan`` named ``name``: the plan, its data, the versions and the machine, a user's
    model's fingerprint, and ``where`` it ran (SweepRecord's other fields)."""
    data_dir = Path(plan.base.data_dir)
    base = plan.base
    return SweepRecord(
        model_fingerprint=spec_for(base).model.fingerprint(base),
        code_files=recorded_files(plan.code_specs),
        name=name, plan=plan, data=DataRecord(str(data_dir.resolve()), read_meta(data_dir)),
        versions={"lmtune": installed_version("lmtune"), "torch": torch.__version__, "ray": ray.__version__,
                  "optuna": installed_version("optuna"), "python": platform.python_version()},
        hardware={"platform": platform.platform(), "cpu_count": os.cpu_count(),
                  "cuda_devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]},
        start_time=time.strftime("%Y-%m-%dT%H:%M:%S%z"), **where,
    )
