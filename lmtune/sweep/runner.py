"""A sweep as one Ray Tune experiment: build the Tuner from a search space, run it, or resume it.

The command is ``python -m lmtune.run`` (lmtune/run.py parses its options into ``SweepOptions``).
Writes the experiment to results/NAME/: Ray's files, one folder per trial with lmtune's own outputs,
sweep.json, and decisions/ (the outcome ledger and ASHA's rungs).
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna
import ray
import torch
from ray import tune

from lmtune import __version__
from lmtune.data.dataset import load_data, read_meta
from lmtune.data.prepare import ensure_builtin_corpus
from lmtune.errors import LmtuneError
from lmtune.private_apis import keep_local_ray_on_loopback, wandb_logger_callback
from lmtune.sweep import plan
from lmtune.sweep.edge import ASHA_STAGES, EdgeSearch, EdgeSettings
from lmtune.sweep.record import (
    SWEEP_FILE,
    Outcome,
    SweepRecord,
    asha_state_path,
    is_sweep_dir,
    ledger_path,
    read_edge_state,
    read_outcomes,
    sole_writer,
)
from lmtune.sweep.runs import Budget
from lmtune.sweep.spaces import SearchSpace, load_space, make_searcher, tune_param_space
from lmtune.sweep.stopping import OutcomeRecorder, PersistentASHA, TrialStopper
from lmtune.sweep.trainable import DATA_FILES, ShippedData, train_trial
from lmtune.training.config import RunConfig, budget_config
from lmtune.training.divergence import DEFAULT_RULE, DivergenceRule
from lmtune.training.loop import resolve_config
from lmtune.training.lr_range import RangeTestConfig

log = logging.getLogger(__name__)

METRIC, MODE = "val_loss", "min"
MIN_FREE_BYTES = 200 * 2**20
Echo = Callable[[str], None]


@dataclass(frozen=True)
class SweepOptions:
    """What ``python -m lmtune.run`` was asked to do, checked once by the CLI."""

    space: str
    """A space name in search_spaces/ or a YAML path."""
    name: str
    """The sweep's folder under ``results``."""
    results: Path = Path("results")
    data: Path | None = None
    """A prepared data dir; None: the built-in corpus."""
    budget: str | None = None
    """Overrides the space's budget."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """--set key=value pairs (checked against the config's fields)."""
    resume: bool = False
    storage: str | None = None
    """Ray storage: a shared path or an s3:// / gs:// URI; None: ``results``."""
    time_budget_s: float | None = None
    gpus_per_trial: float | None = None
    """None: one trial per GPU share the packing rule picks (lmtune.sweep.plan)."""
    fuse: int | None = None
    """LRs per fused trial; None: the space's ``fuse``."""
    cpus_per_trial: float = 1.0
    max_concurrent: int | None = None
    max_failures: int = 2
    address: str | None = None
    """A Ray cluster to join (auto or HOST:PORT); None: a local Ray instance of this process."""
    num_cpus: int | None = None
    num_gpus: float | None = None
    ship_data_mb: int = 2048
    dashboard: bool = True
    dashboard_host: str = "127.0.0.1"
    quiet: bool = False
    wandb_project: str | None = None
    command: tuple[str, ...] = ()

    @property
    def sweep_dir(self) -> Path:
        return self.results.resolve() / self.name

    @property
    def storage_path(self) -> str:
        return self.storage or str(self.results.resolve())


@dataclass
class SweepResult:
    """How a sweep ended: its trials' outcomes (the ledger) and whether a signal stopped it first."""

    sweep_dir: Path
    planned: int
    """Trials the space asks for (an edge search: the trials it started)."""
    outcome_counts: dict[str, int]
    stopped_by: str | None = None
    """SIGINT or SIGTERM when a signal ended the sweep before every trial (and the search) finished."""

    @property
    def unfinished(self) -> int:
        return max(0, self.planned - sum(self.outcome_counts.values()))


class Interruptions:
    """SIGTERM (a job scheduler, ``timeout``) stops a sweep the way Ctrl-C does: it is turned into
    SIGINT, which Tune answers by saving the experiment and stopping the trials (its checkpoints
    kept for --resume), instead of Ray's core killing the driver with a stack dump."""

    sigterm = False

    @classmethod
    @contextlib.contextmanager
    def caught(cls) -> Iterator[None]:
        """SIGTERM handled so while the block runs (the previous handler back afterwards)."""
        cls.sigterm = False
        previous = signal.signal(signal.SIGTERM, cls._on_sigterm)
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, previous)

    @classmethod
    def install(cls) -> None:
        signal.signal(signal.SIGTERM, cls._on_sigterm)

    @classmethod
    def _on_sigterm(cls, signum: int, frame: Any) -> None:
        cls.sigterm = True
        signal.raise_signal(signal.SIGINT)


class _WithoutRaysRestoreHint(logging.Filter):
    """lmtune names its own resume command; Tune's "Resume experiment with: Tuner.restore(...)" would mislead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Tuner.restore(" not in record.getMessage()


# ---------------------------------------------------------------------------------------------
# Running and resuming


def run_sweep(options: SweepOptions, echo: Echo = print) -> SweepResult:
    """A new sweep into results/NAME (refused if it exists), or with ``resume`` that sweep continued."""
    if options.resume:
        return resume_sweep(options, echo)
    sweep_dir = options.sweep_dir
    if sweep_dir.exists():
        raise LmtuneError(f"results/{options.name} already exists; pass --resume to continue it or choose "
                          "another --name")
    space = load_space(options.space)
    if options.fuse is not None:
        space = space.fused(options.fuse, fail=lambda message: LmtuneError(f"--fuse {options.fuse}: {message}"))
    if space.fuse > 1 and options.storage and "://" in options.storage:
        raise LmtuneError(f"--storage {options.storage}: fused members write beside their trial's folder, which needs "
                          "filesystem storage (a local or shared path); use fuse: 1 with URI storage")
    data_dir = (options.data or ensure_builtin_corpus()).resolve()  # trials run in their own working dirs
    base = sweep_base_config(space, options.budget or space.budget, options.overrides, data_dir)
    preflight_write_check(options.results.resolve())
    with sole_writer(sweep_dir, new=True), ray_session(options, echo):
        cluster = ray.cluster_resources()
        gpu_bytes = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None
        resources = plan.trial_resources(plan.largest_trial(space, base), options.cpus_per_trial,
                                         options.gpus_per_trial, cluster.get("GPU", 0), gpu_bytes, members=space.fuse)
        max_concurrent = plan.max_concurrent_trials(options.max_concurrent, cluster.get("CPU", 1), resources["cpu"])
        asha = plan.asha_budget(space.scheduler, plan.max_trial_tokens(space, base)) \
            if space.scheduler.name == "asha" else None
        shipped = ship_data(options, data_dir)
        sweep_record(options, space, base, resources, max_concurrent, asha).write(sweep_dir)
        echo(f"sweep {options.name}: {space.describe_search()}; budget {base.budget} ({base.total_tokens:,} "
             f"tokens/trial); {resources['cpu']:g} CPU + {resources['gpu']:g} GPU per trial, up to "
             f"{max_concurrent} at once")
        tuner = build_tuner(options, space, base, resources, max_concurrent, asha, shipped)
        return sweep_result(sweep_dir, tuner.fit(), SweepRecord.read(sweep_dir))


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
    preflight_write_check(sweep_dir)
    with sole_writer(sweep_dir, new=False):
        return _resume_held_sweep(options, sweep_dir, echo)


def _resume_held_sweep(options: SweepOptions, sweep_dir: Path, echo: Echo) -> SweepResult:
    record = SweepRecord.read(sweep_dir)
    try:
        base = RunConfig.from_dict(record.base_config)
    except (KeyError, TypeError) as err:
        raise LmtuneError(f"--resume: {sweep_dir / SWEEP_FILE} has no usable base_config ({err!r}); it was not "
                          "written by python -m lmtune.run, or was edited: restore it") from None
    with ray_session(options, echo):
        if not tune.Tuner.can_restore(str(sweep_dir)):
            raise LmtuneError(f"--resume: {sweep_dir} has no Ray experiment state yet (it stopped before the first "
                              "trial started); delete it and run again without --resume")
        shipped = ship_data(options, Path(base.data_dir))
        record.resumed_at.append(time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        record.write(sweep_dir)  # before the restore: Ray then stages this version of the top-level files
        echo(f"resuming sweep {sweep_dir.name}: finished trials are kept, unfinished ones continue from their "
             "last checkpoint")
        # Decisions in the ledger stand: a trial that ended after Tune's last experiment snapshot is
        # still "running" there and would be resumed. Errored trials are retried (resume_errored).
        ended = frozenset(t for t, e in read_outcomes(sweep_dir).items() if e.get("outcome") != Outcome.ERROR)
        resources = {k: float(v) for k, v in record.resources_per_trial.items()}
        trainable = build_trainable(base, resources, shipped, EdgeSettings.of_space(record.space), ended,
                                    {"asha": record.asha}, record.divergence_rule)
        try:
            tuner = tune.Tuner.restore(str(sweep_dir), trainable=trainable, resume_unfinished=True,
                                       resume_errored=True)
        except (ModuleNotFoundError, AttributeError) as err:  # unpickling names this lmtune does not have
            raise LmtuneError(f"--resume: {sweep_dir.name} was started by an earlier lmtune whose Ray state this "
                              f"version cannot load ({err}); analyze it as it is, or start a new sweep") from None
        return sweep_result(sweep_dir, tuner.fit(), record)


@contextlib.contextmanager
def ray_session(options: SweepOptions, echo: Echo) -> Iterator[None]:
    """Ray for the length of a sweep: a local instance of this process, or the cluster at --address."""
    kwargs: dict[str, Any] = {"logging_level": logging.WARNING, "configure_logging": True}
    if options.address:
        kwargs["address"] = options.address
    else:
        # "local": a new instance even when a `ray start` cluster runs on this machine (ray.init()
        # without an address would join that one, and refuse num_cpus/num_gpus). It serves nothing
        # beyond this machine: every listener on loopback (SECURITY.md).
        keep_local_ray_on_loopback()
        kwargs.update(address="local", num_cpus=options.num_cpus, num_gpus=options.num_gpus,
                      include_dashboard=options.dashboard)
        if options.dashboard:
            kwargs["dashboard_host"] = options.dashboard_host
    url = getattr(ray.init(**kwargs), "dashboard_url", None)
    Interruptions.install()  # again: Ray's core installed its own SIGTERM handler in ray.init
    hint_filter = _WithoutRaysRestoreHint()
    logging.getLogger("ray.tune.tune").addFilter(hint_filter)
    try:
        if url:
            echo(f"Ray dashboard: {url}" if "://" in url else f"Ray dashboard: http://{url}")
        # The classic progress table (the new output engine ignores metric_columns), and no error for
        # results without val_loss (it comes every eval_interval; ASHA and Optuna skip results without it).
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
        os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
        # Short trials checkpoint often, and CheckpointConfig(num_to_keep) forces an experiment snapshot
        # each time (wanted: resume loses nothing); Tune's warning about that is noise here.
        os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
        yield
    finally:
        logging.getLogger("ray.tune.tune").removeFilter(hint_filter)
        ray.shutdown()


# ---------------------------------------------------------------------------------------------
# Building the experiment


def sweep_base_config(space: SearchSpace, budget: str, overrides: dict[str, Any], data_dir: Path) -> RunConfig:
    """The config every trial starts from: budget, the space's fixed settings, then --set."""
    swept = sorted(set(overrides) & set(space.swept))
    if swept:  # each trial's own value would replace it, while sweep.json recorded it
        where = "the edge search sets it per trial" if space.search == "edge" else "change the space's values instead"
        raise LmtuneError(f"--set {', '.join(swept)}: the space sweeps {', '.join(swept)}; {where}")
    config = resolve_config(budget_config(budget, {**space.fixed, **overrides}, data_dir=str(data_dir)), data_dir)
    contexts = space.params.get("context_length")
    longest = config.model.context_length
    if contexts is not None:
        values = contexts if space.search == "grid" else contexts[1]
        longest = max([longest, *[int(v) for v in values]])
    load_data(data_dir, longest, config.model.vocab_size)  # every bad-data case fails here, before Ray starts
    return config


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


def build_tuner(options: SweepOptions, space: SearchSpace, base: RunConfig, resources: dict[str, float],
                max_concurrent: int, asha: plan.AshaBudget | None, shipped: ShippedData | None) -> tune.Tuner:
    sweep_dir = options.sweep_dir
    recorder = OutcomeRecorder(ledger_path(sweep_dir), gpus_per_trial=resources["gpu"])
    edge = space.search == "edge"
    scheduler = None if asha is None else PersistentASHA(
        recorder, asha_state_path(sweep_dir), time_attr="tokens", metric=METRIC, mode=MODE, max_t=asha.max_t,
        grace_period=asha.grace_period, reduction_factor=asha.reduction_factor, stages=ASHA_STAGES if edge else None)
    stopper = TrialStopper(recorder, time_budget_s=options.time_budget_s,
                           min_tokens_per_s=space.stopper.min_tokens_per_s,
                           slow_grace_reports=space.stopper.slow_grace_reports)
    callbacks: list[tune.Callback] = [recorder]
    if options.wandb_project:
        callbacks.append(wandb_logger_callback(project=options.wandb_project, group=options.name, dir=str(sweep_dir)))
    if edge:
        search_alg, num_samples = edge_searcher(space.edge, base, asha, sweep_dir), -1  # until it says finished
    else:
        # OptunaSearch reads its metric from every result; val_loss comes every eval_interval only, so it
        # sees "objective": the latest val loss (ln(vocab) for a diverged trial).
        search_alg = make_searcher(space, metric="objective", seed=base.train.seed)
        num_samples = space.num_samples if space.search == "optuna" else 1
    rules = {"asha": asdict(asha) if asha else None}
    return tune.Tuner(
        build_trainable(base, resources, shipped, space.edge if edge else None, fused_rules=rules,
                        divergence=space.stopper.rule),
        param_space=tune_param_space(space),
        tune_config=tune.TuneConfig(
            search_alg=search_alg, scheduler=scheduler, num_samples=num_samples,
            max_concurrent_trials=max_concurrent, trial_dirname_creator=trial_dirname,
            # A finished trial's worker process runs the next trial: no process start and imports per
            # trial (seconds each, more than a short trial's training on a CPU).
            reuse_actors=True,
        ),
        run_config=tune.RunConfig(
            name=options.name, storage_path=options.storage_path, stop=stopper,
            failure_config=tune.FailureConfig(max_failures=options.max_failures),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
            # Trials write straight into a filesystem storage path; URI storage needs Ray's sync.
            sync_config=tune.SyncConfig(sync_artifacts="://" in options.storage_path),
            callbacks=callbacks, progress_reporter=progress_reporter(space), verbose=0 if options.quiet else 1,
        ),
    )


def edge_searcher(settings: EdgeSettings, base: RunConfig, asha: plan.AshaBudget | None, sweep_dir: Path):
    from lmtune.sweep.edge_searcher import EdgeSearcher

    budget = Budget.of_config(base.to_dict(), asdict(asha) if asha else None)
    return EdgeSearcher(EdgeSearch(settings, budget), sweep_dir)


def build_trainable(base: RunConfig, resources: dict[str, float], shipped: ShippedData | None,
                    edge: EdgeSettings | None = None, ended: frozenset[str] = frozenset(),
                    fused_rules: dict[str, Any] | None = None, divergence: DivergenceRule = DEFAULT_RULE):
    range_test = None if edge is None else asdict(RangeTestConfig(
        min_lr=edge.range_min_lr, max_lr=edge.range_max_lr, steps=edge.range_steps,
        blowup_factor=edge.range_blowup_factor))
    trainable = tune.with_parameters(train_trial, base=base.to_dict(), shipped=shipped, ended=ended,
                                     range_test=range_test, fused_rules=fused_rules, divergence=asdict(divergence))
    return tune.with_resources(trainable, resources)


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
    if "members" in config:  # a fused group: its LRs and the other settings its members share
        config = {**config.pop("members"), **config}
        config["lr"] = ",".join(_short(v) for v in config["lr"])
    params = "_".join(f"{k}={_short(v)}" for k, v in sorted(config.items()))
    return f"{trial.trial_id}_{params}"[:120]


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def progress_reporter(space: SearchSpace) -> tune.CLIReporter:
    return tune.CLIReporter(
        parameter_columns=["stage", "lr", "seed"] if space.search == "edge" else
        ["members"] if space.fuse > 1 else list(space.params),
        metric_columns={"tokens": "tokens", "train_loss": "train", "val_loss": "val", "tokens_per_s": "tok/s"},
        max_report_frequency=15, sort_by_metric=False,
    )


def sweep_record(options: SweepOptions, space: SearchSpace, base: RunConfig, resources: dict[str, float],
                 max_concurrent: int, asha: plan.AshaBudget | None) -> SweepRecord:
    data_dir = Path(base.data_dir)
    return SweepRecord(
        name=options.name,
        space={"name": space.name, "path": str(space.path), "description": space.description,
               "search": space.search, "sampler": space.sampler, "num_samples": space.num_samples,
               "num_trials": space.num_trials, "params": space.params, "fixed": space.fixed, "fuse": space.fuse,
               "scheduler": asdict(space.scheduler), "stopper": asdict(space.stopper),
               **({"edge": asdict(space.edge)} if space.search == "edge" else {}),
               "description_of_search": space.describe_search(), "yaml": space.path.read_text()},
        budget=base.budget, base_config=base.to_dict(), asha=asdict(asha) if asha else None,
        data={"dir": str(data_dir.resolve()), "meta": asdict(read_meta(data_dir))},
        versions={"lmtune": __version__, "torch": torch.__version__, "ray": ray.__version__,
                  "optuna": optuna.__version__, "python": platform.python_version()},
        hardware={"platform": platform.platform(), "cpu_count": os.cpu_count(),
                  "cuda_devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]},
        resources_per_trial=resources, max_concurrent=max_concurrent, time_budget_s=options.time_budget_s,
        address=options.address, start_time=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        command=list(options.command) or sys.argv,
    )


def sweep_result(sweep_dir: Path, results: tune.ResultGrid, record: SweepRecord) -> SweepResult:
    """The ledger's counts and whether a signal stopped the sweep first. What the sweep concluded is read
    from its folder by the report's own reader (lmtune.report.writer.summarize_sweep), so that ``run``
    and ``analyze`` can never name different best trials."""
    outcomes = read_outcomes(sweep_dir)
    counts: dict[str, int] = {}
    for entry in outcomes.values():
        if "members" not in entry:  # a fused group: its members are the trials
            counts[entry["outcome"]] = counts.get(entry["outcome"], 0) + 1
    summary = SweepResult(sweep_dir, max(record.num_trials or 0, len(results)), dict(sorted(counts.items())))
    edge = EdgeSettings.of_space(record.space)
    search_running = edge is not None and not (read_edge_state(sweep_dir) or {}).get("finished")
    if summary.unfinished or search_running:
        summary.stopped_by = "SIGTERM" if Interruptions.sigterm else "SIGINT"
    return summary
