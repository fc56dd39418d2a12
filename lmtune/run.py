"""``python -m lmtune.run``: a learning-rate sweep as one Ray Tune experiment.

Writes the experiment to results/NAME/ (Ray's files, one folder per trial with lmtune's own
outputs, sweep.json, trial_outcomes.json, asha_state.json); prints Ray's live trial table and, at
the end, the best trial.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import re
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

# Ray reads these at import: the classic progress table (the new output engine ignores
# metric_columns), and no error for results without val_loss (evaluation is every eval_interval;
# ASHA skips results without it).
os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

from lmtune import __version__  # noqa: E402
from lmtune.checkpoint import atomic_write_text  # noqa: E402
from lmtune.config import RunConfig, budget_config, parse_set_args  # noqa: E402
from lmtune.errors import LmtuneError, cli_entry, setup_cli_logging  # noqa: E402
from lmtune.spaces import SearchSpace, available_spaces, load_space, make_searcher, tune_param_space  # noqa: E402
from lmtune.sweep_files import SWEEP_FILE, is_sweep_dir  # noqa: E402

log = logging.getLogger(__name__)

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
MIN_FREE_BYTES = 200 * 2**20
METRIC, MODE = "val_loss", "min"


# ---------------------------------------------------------------------------------------------
# Checks at the edge


def check_name(name: str) -> str:
    if not NAME_PATTERN.match(name) or ".." in name:
        raise LmtuneError(f"--name {name!r} is not a plain folder name; use letters, digits, '.', '_' or '-' "
                          f"(it must stay inside the results folder)")
    return name


def parse_duration(text: str | None) -> float | None:
    """'90s', '30m', '4h', '1.5h' or plain seconds."""
    if text is None:
        return None
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([smh]?)\s*", text)
    if not match or float(match.group(1)) <= 0:
        raise LmtuneError(f"--time-budget {text!r}: give a positive duration such as 90s, 30m or 4h")
    return float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]


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


# ---------------------------------------------------------------------------------------------
# Building the experiment


def sweep_base_config(space: SearchSpace, budget: str, overrides: dict[str, Any], data_dir: Path) -> RunConfig:
    """The config every trial starts from: budget, the space's fixed settings, then --set."""
    from lmtune.data import load_data
    from lmtune.train import resolve_config

    config = resolve_config(budget_config(budget, {**space.fixed, **overrides}, data_dir=str(data_dir)), data_dir)
    contexts = space.params.get("context_length")
    longest = config.model.context_length
    if contexts is not None:
        values = contexts if space.search == "grid" else contexts[1]
        longest = max([longest, *[int(v) for v in values]])
    load_data(data_dir, longest, config.model.vocab_size)  # every bad-data case fails here, before Ray starts
    return config


def default_resources(args: argparse.Namespace, base: RunConfig, cluster_gpus: float) -> dict[str, float]:
    cpus = args.cpus_per_trial
    gpus = args.gpus_per_trial
    if gpus is None:
        gpus = 0.0
        if cluster_gpus > 0:
            gpus = 1.0 / default_trials_per_gpu(base)
    return {"cpu": cpus, "gpu": gpus}


def default_trials_per_gpu(base: RunConfig) -> int:
    """Trials packed per GPU: from lmtune.bench's memory estimate and concurrency rule when it is
    available (see benchmarks/README.md), else one trial per GPU."""
    try:
        import torch

        from lmtune.bench import estimate_trial_memory_bytes, recommend_trials_per_gpu

        total = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else 80 * 2**30
        need = estimate_trial_memory_bytes(base.model, base.train.batch_size, amp=True)
        return max(1, recommend_trials_per_gpu(need, total, None))
    except Exception as err:  # noqa: BLE001 - packing is an optimisation; one trial per GPU is always safe
        log.info("trial packing estimate unavailable (%s); one trial per GPU", err)
        return 1


def asha_scheduler(space: SearchSpace, sweep_dir: Path, max_tokens: int):
    from lmtune.stopper import PersistentASHA

    spec = space.scheduler
    if spec.name == "none":
        return None
    max_t = int(spec.max_t * max_tokens) if spec.max_t <= 1 else int(spec.max_t)
    grace = int(spec.grace_period * max_t) if spec.grace_period <= 1 else int(spec.grace_period)
    grace = max(1, min(grace, max_t))
    return PersistentASHA(sweep_dir, time_attr="tokens", metric=METRIC, mode=MODE, max_t=max_t,
                          grace_period=grace, reduction_factor=spec.reduction_factor)


def max_trial_tokens(space: SearchSpace, base: RunConfig) -> int:
    """The largest token budget any trial of the space can have (batch/context/steps may vary)."""
    def largest(name: str, current: int) -> int:
        spec = space.params.get(name)
        if spec is None:
            return current
        values = spec if space.search == "grid" else (spec[1] if spec[0] == "choice" else [spec[1][1]])
        return max(int(v) for v in values)

    return (largest("batch_size", base.train.batch_size) * largest("context_length", base.model.context_length)
            * largest("steps", base.train.steps))


def build_trainable(base: RunConfig, resources: dict[str, float], shipped, ended: frozenset[str] = frozenset()):
    from ray import tune

    from lmtune.trainable import train_trial

    return tune.with_resources(tune.with_parameters(train_trial, base=base.to_dict(), shipped=shipped, ended=ended),
                               resources)


def keep_sweep_files(sweep_dir: Path):
    """The callback that keeps Ray's restore from reverting lmtune's own files (see KeepSweepFiles)."""
    from lmtune.stopper import ASHA_STATE_NAME, LEDGER_NAME, KeepSweepFiles

    return KeepSweepFiles(sweep_dir, (SWEEP_FILE, LEDGER_NAME, ASHA_STATE_NAME))


def outcome_callback(sweep_dir: Path, gpus_per_trial: float):
    from ray import tune

    from lmtune.stopper import LEDGER_NAME, read_outcomes, record_outcome

    ledger = sweep_dir / LEDGER_NAME

    class OutcomeRecorder(tune.Callback):
        """Completed and errored trials into the ledger (stops are recorded where they are decided)."""

        def on_trial_complete(self, iteration, trials, trial, **info):
            result = trial.last_result or {}
            # A trial that errored before and completed on a retry (--resume) is completed now.
            retried = read_outcomes(sweep_dir).get(trial.trial_id, {}).get("outcome") == "error"
            record_outcome(ledger, trial.trial_id, "completed", "completed its budget", overwrite=retried,
                           step=result.get("step"), tokens=result.get("tokens"))

        def on_trial_error(self, iteration, trials, trial, **info):
            message = _error_text(trial)
            reason = f"error: {message}"
            if "out of memory" in message.lower() and 0 < gpus_per_trial < 1:
                reason += f" (GPU shared by {round(1 / gpus_per_trial)} trials: lower trials per GPU with " \
                          f"--gpus-per-trial {min(1.0, gpus_per_trial * 2):g})"
            result = trial.last_result or {}
            record_outcome(ledger, trial.trial_id, "error", reason, step=result.get("step"),
                           tokens=result.get("tokens"))

    return OutcomeRecorder()


def _error_text(trial) -> str:
    """The last line of the trial's error: Tune's message, else its error file."""
    text = getattr(trial, "error_msg", None) or ""
    path = getattr(trial, "error_file", None) or ""
    if not text and path and Path(path).exists():
        text = Path(path).read_text()
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "unknown error"


def progress_reporter(space: SearchSpace):
    from ray.tune import CLIReporter

    return CLIReporter(
        parameter_columns=list(space.params),
        metric_columns={"tokens": "tokens", "train_loss": "train", "val_loss": "val", "tokens_per_s": "tok/s"},
        max_report_frequency=15, sort_by_metric=False,
    )


def sweep_record(args: argparse.Namespace, space: SearchSpace, base: RunConfig, data_dir: Path,
                 resources: dict[str, float]) -> dict[str, Any]:
    import ray
    import torch

    from lmtune.data import read_meta

    try:
        import optuna

        optuna_version = optuna.__version__
    except ImportError:  # pragma: no cover - a declared dependency
        optuna_version = None
    return {
        "name": args.name,
        "space": {"name": space.name, "path": str(space.path), "description": space.description,
                  "search": space.search, "sampler": space.sampler, "num_samples": space.num_samples,
                  "num_trials": space.num_trials, "params": space.params, "fixed": space.fixed,
                  "scheduler": asdict(space.scheduler), "stopper": asdict(space.stopper),
                  "description_of_search": space.describe_search(), "yaml": space.path.read_text()},
        "budget": base.budget,
        "base_config": base.to_dict(),
        "data": {"dir": str(data_dir.resolve()), "meta": asdict(read_meta(data_dir))},
        "versions": {"lmtune": __version__, "torch": torch.__version__, "ray": ray.__version__,
                     "optuna": optuna_version, "python": platform.python_version()},
        "hardware": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                     "cuda_devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]},
        "resources_per_trial": resources,
        "max_concurrent": args.max_concurrent,
        "time_budget_s": parse_duration(args.time_budget),
        "address": args.address,
        "start_time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": sys.argv,
    }


def init_ray(args: argparse.Namespace):
    import ray

    kwargs: dict[str, Any] = {"logging_level": logging.WARNING, "configure_logging": True}
    if args.address:
        kwargs["address"] = args.address
    else:
        # "local": a new instance even when a `ray start` cluster runs on this machine (ray.init()
        # without an address would join that one, and refuse --num-cpus/--num-gpus).
        kwargs["address"] = "local"
        if args.num_cpus is not None:
            kwargs["num_cpus"] = args.num_cpus
        if args.num_gpus is not None:
            kwargs["num_gpus"] = args.num_gpus
        kwargs["include_dashboard"] = not args.no_dashboard
        if not args.no_dashboard:
            kwargs["dashboard_host"] = args.dashboard_host
    context = ray.init(**kwargs)
    url = getattr(context, "dashboard_url", None)
    if url:
        print(f"Ray dashboard: http://{url}" if "://" not in url else f"Ray dashboard: {url}")
    return context


# ---------------------------------------------------------------------------------------------
# Running


def run_sweep(args: argparse.Namespace) -> int:
    results_root = Path(args.results).resolve()
    check_name(args.name)
    sweep_dir = results_root / args.name
    storage = args.storage or str(results_root)
    if args.resume:
        if not sweep_dir.exists():
            existing = sorted(p.name for p in results_root.glob("*") if is_sweep_dir(p))
            raise LmtuneError(f"--resume: no sweep at {sweep_dir}; check --name (existing: "
                              f"{', '.join(existing) or 'none'})")
        if not is_sweep_dir(sweep_dir):
            raise LmtuneError(f"--resume: {sweep_dir} is not an lmtune sweep (no {SWEEP_FILE}); "
                              f"give the --name of a sweep")
        return resume_sweep(args, sweep_dir, storage)
    if sweep_dir.exists():
        raise LmtuneError(f"results/{args.name} already exists; pass --resume to continue it or choose another --name")

    space = load_space(args.space)
    overrides = parse_set_args(args.set)
    budget = args.budget or space.budget
    if args.data is None:
        from lmtune.prepare import ensure_builtin_corpus

        data_dir = ensure_builtin_corpus()
    else:
        data_dir = Path(args.data)
    data_dir = data_dir.resolve()  # trials run in their own working directories
    base = sweep_base_config(space, budget, overrides, data_dir)
    time_budget = parse_duration(args.time_budget)
    preflight_write_check(results_root)

    import ray
    from ray import tune

    from lmtune.stopper import LEDGER_NAME, TrialStopper

    init_ray(args)
    try:
        cluster_gpus = ray.cluster_resources().get("GPU", 0)
        resources = default_resources(args, base, cluster_gpus)
        max_concurrent = args.max_concurrent or max(1, int(ray.cluster_resources().get("CPU", 1) // resources["cpu"]))
        args.max_concurrent = max_concurrent
        shipped = ship_data(args, data_dir)
        sweep_dir.mkdir(parents=True)
        record = sweep_record(args, space, base, data_dir, resources)
        atomic_write_text(sweep_dir / SWEEP_FILE, json.dumps(record, indent=2, default=str))
        print(f"sweep {args.name}: {space.describe_search()}; budget {budget} ({base.total_tokens:,} tokens/trial); "
              f"{resources['cpu']:g} CPU + {resources['gpu']:g} GPU per trial, up to {max_concurrent} at once")

        stopper = TrialStopper(sweep_dir / LEDGER_NAME, explode_factor=space.stopper.explode_factor,
                               time_budget_s=time_budget, min_tokens_per_s=space.stopper.min_tokens_per_s,
                               slow_grace_reports=space.stopper.slow_grace_reports)
        tuner = tune.Tuner(
            build_trainable(base, resources, shipped),
            param_space=tune_param_space(space),
            tune_config=tune.TuneConfig(
                # OptunaSearch reads its metric from every result; val_loss comes every eval_interval only,
                # so it sees "objective": the latest val loss (ln(vocab) for a diverged trial).
                search_alg=make_searcher(space, metric="objective", seed=base.train.seed),
                scheduler=asha_scheduler(space, sweep_dir, max_trial_tokens(space, base)),
                num_samples=space.num_samples if space.search == "optuna" else 1,
                max_concurrent_trials=max_concurrent,
                trial_dirname_creator=trial_dirname,
            ),
            run_config=tune.RunConfig(
                name=args.name, storage_path=storage, stop=stopper,
                failure_config=tune.FailureConfig(max_failures=args.max_failures),
                checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
                # Trials write straight into a filesystem storage path; URI storage needs Ray's sync.
                sync_config=tune.SyncConfig(sync_artifacts="://" in storage),
                callbacks=[outcome_callback(sweep_dir, resources["gpu"]), keep_sweep_files(sweep_dir)],
                progress_reporter=progress_reporter(space), verbose=1 if not args.quiet else 0,
            ),
        )
        results = tuner.fit()
        return print_outcome(sweep_dir, results)
    finally:
        ray.shutdown()


def resume_sweep(args: argparse.Namespace, sweep_dir: Path, storage: str) -> int:
    import ray
    from ray import tune

    from lmtune.stopper import KeepSweepFiles, read_outcomes

    record = json.loads((sweep_dir / SWEEP_FILE).read_text())
    base = RunConfig.from_dict(record["base_config"])
    preflight_write_check(sweep_dir)
    init_ray(args)
    try:
        if not tune.Tuner.can_restore(str(sweep_dir)):
            raise LmtuneError(f"--resume: {sweep_dir} has no Ray experiment state yet (it stopped before the first "
                              f"trial started); delete it and run again without --resume")
        resources = {k: float(v) for k, v in record["resources_per_trial"].items()}
        shipped = ship_data(args, Path(base.data_dir))
        record.setdefault("resumed_at", []).append(time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        atomic_write_text(sweep_dir / SWEEP_FILE, json.dumps(record, indent=2, default=str))
        print(f"resuming sweep {sweep_dir.name}: finished trials are kept, unfinished ones continue from their "
              f"last checkpoint")
        # Decisions in the ledger stand: a trial that ended after Tune's last experiment snapshot is
        # still "running" there and would be resumed. Errored trials are retried (resume_errored).
        ended = frozenset(t for t, e in read_outcomes(sweep_dir).items() if e.get("outcome") != "error")
        tuner = tune.Tuner.restore(str(sweep_dir), trainable=build_trainable(base, resources, shipped, ended),
                                   resume_unfinished=True, resume_errored=True)
        # Sweeps started before KeepSweepFiles existed do not have it in their tuner.pkl.
        run_config = tuner._local_tuner.get_run_config() if getattr(tuner, "_local_tuner", None) else None
        if run_config is not None and not any(isinstance(c, KeepSweepFiles) for c in run_config.callbacks or []):
            run_config.callbacks = [*(run_config.callbacks or []), keep_sweep_files(sweep_dir)]
        results = tuner.fit()
        return print_outcome(sweep_dir, results)
    finally:
        ray.shutdown()


def ship_data(args: argparse.Namespace, data_dir: Path):
    """On a cluster, put the prepared data in Ray's object store once (up to --ship-data-mb) so a
    node without it still runs its trials; on one machine the files are read in place."""
    from lmtune.trainable import DATA_FILES, ShippedData

    if not args.address:
        return None
    size = sum((data_dir / name).stat().st_size for name in DATA_FILES if (data_dir / name).exists())
    if size > args.ship_data_mb * 2**20:
        log.warning("data is %.0f MiB > --ship-data-mb %d: every node must have it at %s", size / 2**20,
                    args.ship_data_mb, data_dir)
        return None
    return ShippedData.from_dir(data_dir)


def trial_dirname(trial) -> str:
    params = "_".join(f"{k}={_short(v)}" for k, v in sorted(trial.config.items()))
    return f"{trial.trial_id}_{params}"[:120]


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def print_outcome(sweep_dir: Path, results) -> int:
    from lmtune.stopper import read_outcomes

    outcomes = read_outcomes(sweep_dir)
    counts: dict[str, int] = {}
    for entry in outcomes.values():
        counts[entry["outcome"]] = counts.get(entry["outcome"], 0) + 1
    print(f"\n{len(results)} trials: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    best = None
    for result in results:
        frame = result.metrics_dataframe
        if frame is None or METRIC not in frame or result.metrics is None:
            continue
        values = frame[METRIC].dropna()
        values = values[values.map(math.isfinite)]
        if values.empty:
            continue
        if best is None or values.min() < best[0]:
            best = (float(values.min()), result)
    if best is None:
        print("no trial reported a finite validation loss")
        return 1
    value, result = best
    trial_dir = Path(result.path)
    print(f"best trial: {trial_dir.name}")
    print(f"  config: {json.dumps(result.config)}")
    print(f"  best val loss: {value:.4f}")
    print(f"  checkpoint: {trial_dir / 'checkpoints' / 'best.pt'}")
    print(f"report: python -m lmtune.analyze {sweep_dir}")
    return 0


# ---------------------------------------------------------------------------------------------
# CLI


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lmtune.run", description="Run a hyperparameter sweep on Ray Tune.")
    p.add_argument("--space", default="lr_grid", help="search space: a name in search_spaces/ or a YAML path")
    p.add_argument("--list-spaces", action="store_true", help="list the shipped search spaces and exit")
    p.add_argument("--data", type=Path, help="prepared data dir (default: the built-in corpus)")
    p.add_argument("--budget", choices=["quick", "low-resource", "full"], help="override the space's budget")
    p.add_argument("--name", help="experiment name: results/NAME (default: SPACE-TIMESTAMP)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a training field")
    p.add_argument("--resume", action="store_true", help="continue the interrupted sweep --name")
    p.add_argument("--results", default="results", help="results root folder (default: results)")
    p.add_argument("--storage", help="Ray storage: a shared path or s3:// / gs:// URI (default: --results)")
    p.add_argument("--time-budget", help="sweep wall-clock budget (e.g. 4h): trials projected past it stop as too_slow")
    p.add_argument("--gpus-per-trial", type=float, help="GPU share per trial; 0.25 packs four trials per GPU")
    p.add_argument("--cpus-per-trial", type=float, default=1.0, help="CPUs per trial (default 1)")
    p.add_argument("--max-concurrent", type=int, help="trials at once (default: what the resources allow)")
    p.add_argument("--max-failures", type=int, default=2, help="retries of a crashed trial from its checkpoint")
    p.add_argument("--address", help="join a Ray cluster: auto or HOST:PORT (default: start a local one)")
    p.add_argument("--num-cpus", type=int, help="CPUs of the local Ray instance (default: all)")
    p.add_argument("--num-gpus", type=float, help="GPUs of the local Ray instance (logical GPUs for testing)")
    p.add_argument("--ship-data-mb", type=int, default=2048, help="largest data put in Ray's object store")
    p.add_argument("--no-dashboard", action="store_true", help="do not start the Ray dashboard")
    p.add_argument("--dashboard-host", default="127.0.0.1", help="dashboard bind address (default 127.0.0.1 only)")
    p.add_argument("--quiet", action="store_true", help="no live trial table")
    return p


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_cli_logging(logging.WARNING)
    if args.list_spaces:
        for name in available_spaces():
            print(f"{name:12s} {load_space(name).description}")
        return 0
    if args.gpus_per_trial is not None and not 0 < args.gpus_per_trial:
        raise LmtuneError("--gpus-per-trial must be > 0 (e.g. 0.5 for two trials per GPU)")
    if args.cpus_per_trial <= 0:
        raise LmtuneError("--cpus-per-trial must be > 0")
    if args.max_concurrent is not None and args.max_concurrent < 1:
        raise LmtuneError("--max-concurrent must be >= 1")
    if args.max_failures < 0:
        raise LmtuneError("--max-failures must be >= 0")
    if args.name is None:
        if args.resume:
            raise LmtuneError("--resume needs --name NAME of the sweep to continue")
        args.name = f"{Path(args.space).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    parse_duration(args.time_budget)
    return run_sweep(args)


if __name__ == "__main__":
    raise SystemExit(main())
