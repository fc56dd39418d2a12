"""``python -m lmtune.run``: a learning-rate sweep as one Ray Tune experiment (lmtune.sweep.runner).

Prints Ray's live trial table and, at the end, the trials' outcomes and the best trial.
"""

from __future__ import annotations

import argparse
import collections
import logging
import os
import re
import shlex
import sys
import time
from pathlib import Path

from lmtune.cli import command_parser, parse_set_args, set_names
from lmtune.errors import LmtuneError, cli_entry, setup_cli_logging, shown
from lmtune.sweep.disk import Keep
from lmtune.sweep.hooks import load_step_hook
from lmtune.sweep.options import SweepOptions
from lmtune.sweep.placement import ClusterCapacity
from lmtune.sweep.preflight import (
    check_address_answers,
    check_dashboard_host,
    check_local_resources,
    check_outside_sweeps,
    check_storage_answers,
    checked_address,
    checked_storage,
    read_cluster_config,
)
from lmtune.sweep.runner import DISK_FULL, INCURABLE, SweepResult, run_sweep
from lmtune.sweep.session import Interruptions, signal_exit_code
from lmtune.sweep.spaces import available_spaces, load_space
from lmtune.sweep.storage import SweepStorage
from lmtune.training.config import BUDGETS
from lmtune.training.handout import HANDOUT_NAMES
from lmtune.usercode.config import add_code_arguments, code_from_arguments

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
DEFAULT_RESULTS = "results"


def build_parser() -> argparse.ArgumentParser:
    p = command_parser("run", description="Run a hyperparameter sweep on Ray Tune.")
    p.add_argument("--space", help="search space: a shipped one (--list-spaces) or a YAML path (default: lr_grid)")
    p.add_argument("--list-spaces", action="store_true", help="list the shipped search spaces and exit")
    p.add_argument("--data", type=Path, help="prepared data dir (default: the built-in corpus)")
    p.add_argument("--budget", choices=list(BUDGETS), help="override the space's budget")
    p.add_argument("--name", help="experiment name: results/NAME (default: SPACE-TIMESTAMP)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a training field")
    p.add_argument("--resume", action="store_true", help="continue the interrupted sweep --name")
    p.add_argument("--results", default=DEFAULT_RESULTS, help="results root folder (default: results)")
    p.add_argument("--storage", help="Ray storage: a shared path or s3:// / gs:// URI (default: --results)")
    p.add_argument("--time-budget", help="sweep wall-clock budget (e.g. 4h): trials projected past it stop as too_slow")
    p.add_argument("--gpus-per-trial", type=float, help="GPU share per trial; 0.25 packs four trials per GPU")
    p.add_argument("--fuse", type=int, metavar="K", help="train up to K LRs of a grid as one fused model per trial "
                   "(default: the space's fuse, else 1)")
    p.add_argument("--cpus-per-trial", type=float, default=1.0, help="CPUs per trial (default 1)")
    p.add_argument("--max-concurrent", type=int, help="trials at once (default: what the resources allow)")
    p.add_argument("--max-failures", type=int, default=2, help="retries of a crashed trial from its checkpoint")
    p.add_argument("--address", help="join a Ray cluster: auto or HOST:PORT (default: start a local one)")
    p.add_argument("--cluster-config", type=Path, metavar="YAML",
                   help="with --address: the autoscaler's cluster config, whose node types say what the cluster can "
                        "scale to (default: ~/ray_bootstrap_config.yaml on a `ray up` head, when present)")
    p.add_argument("--num-cpus", type=int, help="CPUs of the local Ray instance (default: all)")
    p.add_argument("--num-gpus", type=float, help="GPUs of the local Ray instance (logical GPUs for testing)")
    p.add_argument("--ship-data-mb", type=int, default=2048, help="largest data put in Ray's object store")
    p.add_argument("--no-dashboard", action="store_true", help="do not start the Ray dashboard")
    p.add_argument("--trial-figures", action="store_true",
                   help="each trial draws its own loss_curves.png and lr_schedule.png into its folder (default: the "
                        "report's figures, which show every trial, are the only ones)")
    p.add_argument("--dashboard-host", default="127.0.0.1", help="dashboard bind address (default 127.0.0.1 only)")
    p.add_argument("--wandb", metavar="PROJECT", help="also log every trial to Weights & Biases project PROJECT "
                   "(Ray Tune's WandbLoggerCallback; needs pip install -e '.[wandb]')")
    p.add_argument("--quiet", action="store_true", help="no live trial table")
    p.add_argument("--keep", choices=[k.value for k in Keep], default=Keep.BEST.value,
                   help="what an ended trial keeps: best = its best.pt (default); last = also its newest checkpoint "
                        "(to resume or continue it); all = every checkpoint (analyze --sharpness reads them)")
    p.add_argument("--force", action="store_true",
                   help="start even if the results disk has less free space than the sweep is estimated to need")
    p.add_argument("--yes", action="store_true",
                   help="start a bare run (no --space: lr_grid, 7 trials of the 17M model) though its trials would "
                        "train on this machine's CPU, for the time it prints (measured from a training step here)")
    add_code_arguments(p)
    p.add_argument("--trust-code", action="store_true",
                   help="with --resume: import the code sweep.json names even where it is not the file, unchanged, "
                        "that the sweep started with (only for a results folder you trust)")
    p.add_argument("--step-hook", metavar="MODULE:FUNCTION",
                   help="code of your own each trial runs: FUNCTION(config, trial_dir) before training, and what it "
                        "returns before every step, with (step, model); MODULE must be on PYTHONPATH")
    return p


def sweep_options(args: argparse.Namespace, argv: list[str]) -> SweepOptions:
    """The parsed flags as SweepOptions; every flag that no sweep could use is refused here, in one line."""
    if args.gpus_per_trial is not None and not 0 < args.gpus_per_trial:
        raise LmtuneError("--gpus-per-trial must be > 0 (e.g. 0.5 for two trials per GPU)")
    if args.cpus_per_trial <= 0:
        raise LmtuneError("--cpus-per-trial must be > 0")
    if args.max_concurrent is not None and args.max_concurrent < 1:
        raise LmtuneError("--max-concurrent must be >= 1")
    if args.fuse is not None and args.fuse < 1:
        raise LmtuneError("--fuse must be >= 1 (the LRs trained together in one process; 1: one per trial)")
    if args.resume:
        refuse_resume_changes(args)
    elif args.trust_code:
        raise LmtuneError("--trust-code applies to --resume (the code a sweep's folder names); a new sweep imports "
                          "only the code its flags and space name: drop --trust-code")
    if args.max_failures < 0:
        raise LmtuneError("--max-failures must be >= 0")
    if args.name is None and args.resume:
        raise LmtuneError("--resume needs --name NAME of the sweep to continue")
    if args.ship_data_mb < 0:
        raise LmtuneError("--ship-data-mb must be >= 0 (the largest data put in Ray's object store; 0: none)")
    if args.wandb is not None:
        if not args.wandb.strip():
            raise LmtuneError("--wandb: give the name of the Weights & Biases project to log to, e.g. --wandb lr")
        from lmtune.training.wandb_sink import import_wandb

        import_wandb()
    if args.step_hook:
        load_step_hook(args.step_hook)  # (a name that imports nothing is refused before Ray starts)
    refuse_swept_handout_names(args)
    address, results, storage = where_it_runs(args)
    results_flag = "--storage" if args.storage is not None and storage is None else "--results"
    space = args.space or (None if args.resume else "lr_grid")  # a resume reads its space from sweep.json
    return SweepOptions(
        space=space, name=check_name(args.name or f"{Path(space or '').stem}-{time.strftime('%Y%m%d-%H%M%S')}"),
        results=results, results_flag=results_flag, data=args.data, budget=args.budget,
        overrides=parse_set_args(args.set),
        resume=args.resume, storage=storage, time_budget_s=parse_duration(args.time_budget),
        gpus_per_trial=args.gpus_per_trial, fuse=args.fuse, cpus_per_trial=args.cpus_per_trial,
        max_concurrent=args.max_concurrent,
        max_failures=args.max_failures, address=address, num_cpus=args.num_cpus, num_gpus=args.num_gpus,
        ship_data_mb=args.ship_data_mb, dashboard=not args.no_dashboard, dashboard_host=args.dashboard_host,
        trial_figures=args.trial_figures,
        quiet=args.quiet, wandb_project=args.wandb.strip() if args.wandb else None,
        command=("python -m lmtune.run", *argv),
        keep=Keep(args.keep), force=args.force, cluster_config=args.cluster_config, step_hook=args.step_hook,
        code=code_from_arguments(args), trust_code=args.trust_code,
    )


def refuse_swept_handout_names(args: argparse.Namespace) -> None:
    """--set naming a setting the space searches by the CS336 handout's name for it (max_learning_rate where the
    space searches the LR): refused in one line that says which of lmtune's settings it is (the plan's own check,
    which refuses every searched setting, names lmtune's only)."""
    handout = {HANDOUT_NAMES[name]: name for name in set_names(args.set) if name in HANDOUT_NAMES}
    if not handout or args.resume:  # (--resume refuses --set itself)
        return
    space = args.space or "lr_grid"
    for own in sorted(set(handout) & set(load_space(space).swept)):
        name = handout[own]
        raise LmtuneError(f"--set {name} (the handout's name for {own}): the space {space} searches {own}, each trial "
                          f"at a value of its own; drop --set {name} (lmtune train --set {name}=VALUE trains one run "
                          "at one)")


def where_it_runs(args: argparse.Namespace) -> tuple[str | None, Path, str | None]:
    """(--address, the results folder, --storage) as the sweep uses them, their forms checked: the address's, the
    cluster config (with --address only); a storage folder is where the sweep lives, records and trials together
    (the results folder), and a new sweep's lies inside no other sweep. Nothing here asks the network:
    ``check_it_can_run`` does."""
    address = checked_address(args.address) if args.address is not None else None
    if args.cluster_config is not None:
        if address is None:
            raise LmtuneError("--cluster-config describes the cluster at --address, which was not given; give "
                              "--address too, or drop --cluster-config for a run on this machine")
        ClusterCapacity.from_config(read_cluster_config(args.cluster_config), str(args.cluster_config))
    results, storage = Path(args.results), None
    if args.storage is not None:
        storage = checked_storage(args.storage)
        if "://" not in storage:  # a folder (local or shared by all nodes): the sweep's one home
            if args.results != DEFAULT_RESULTS and Path(args.results).resolve() != Path(storage):
                raise LmtuneError(f"--storage {args.storage} and --results {args.results} name two folders for one "
                                  "sweep; give one of them")
            results, storage = Path(storage), None
    if not args.resume:  # (a resume continues its sweep where it was made)
        flag, given = ("--storage", args.storage) if args.storage is not None and storage is None else \
            ("--results", args.results)
        check_outside_sweeps(results.resolve(), flag, given)
    return address, results, storage


def check_it_can_run(options: SweepOptions) -> None:
    """Before Ray starts and anything is written, each within seconds: the cluster at --address answers, object
    storage answers and has its bucket; a run on this machine asks no more CPUs or GPUs than it has (Ray would
    wait for them forever)."""
    if options.address is None:
        import torch

        check_local_resources(options.cpus_per_trial, options.gpus_per_trial, options.num_cpus, options.num_gpus,
                              torch.cuda.device_count())
        if options.dashboard:  # (a cluster's dashboard is its head's: --dashboard-host is for one started here)
            check_dashboard_host(options.dashboard_host)
    else:
        check_address_answers(options.address)
    if options.storage is not None:
        check_storage_answers(options.storage)


# What a resumed sweep keeps from its start (sweep.json and Ray's experiment state): flags that would change it.
# (--space and --data may be given if they name the sweep's own: lmtune.sweep.runner checks them.)
RESUME_FIXED = {"budget": "--budget", "set": "--set", "keep": "--keep",
                "time_budget": "--time-budget", "gpus_per_trial": "--gpus-per-trial", "fuse": "--fuse",
                "cpus_per_trial": "--cpus-per-trial", "max_concurrent": "--max-concurrent",
                "max_failures": "--max-failures", "wandb": "--wandb", "cluster_config": "--cluster-config",
                "model": "--model", "model_set": "--model-set", "optimizer": "--optimizer", "schedule": "--schedule"}


def refuse_resume_changes(args: argparse.Namespace) -> None:
    """A resumed sweep runs as it started; refuse, naming them, the flags it could not honour."""
    defaults = build_parser()
    given = [flag for dest, flag in RESUME_FIXED.items() if getattr(args, dest) != defaults.get_default(dest)]
    if given:
        raise LmtuneError(f"--resume continues the sweep as it started (its budget, settings and resources are in "
                          f"sweep.json); {', '.join(given)} cannot change it: drop "
                          f"{'it' if len(given) == 1 else 'them'}, or start a new sweep with another --name")


def check_cpu_time(args: argparse.Namespace, options: SweepOptions) -> None:
    """A bare ``lmtune run`` (no --space: lr_grid's 7 trials of 40.96M tokens of the 17M model) whose trials would
    train on this machine's CPU: days of work. Before Ray starts, its expected time from a few training steps measured
    here; printed with --yes, else refused in one line naming --yes and the quick edge search."""
    if args.space is not None or options.resume or options.address is not None or options.sweep_dir.exists():
        return  # (an existing --name is refused by run_sweep)
    from lmtune.sweep.experiment import plan_sweep
    from lmtune.sweep.runner import preflight_write_check
    from lmtune.tools.cpu_time import cpu_time
    from lmtune.training.device import resolve_device

    preflight_write_check(options.results.resolve(), flag=options.results_flag)  # (before the corpus is prepared)
    plan = plan_sweep(options)
    if resolve_device(plan.base.train.device).type != "cpu":
        return
    trials = plan.space.strategy.expected_trials()[0]
    estimate = cpu_time(plan.base, trials, options.cpus_per_trial, options.num_cpus or os.cpu_count() or 1,
                        options.max_concurrent).describe()
    if not args.yes:
        raise LmtuneError(f"a bare lmtune run trains lr_grid, and on this CPU its expected time is {estimate}; pass "
                          "--yes to start it, or give --space quick_edge (the edge search on the quick budget's tiny "
                          "model: minutes on a CPU)")
    print(f"expected time on this CPU: {estimate}")


def check_name(name: str) -> str:
    if not NAME_PATTERN.match(name) or ".." in name:
        raise LmtuneError(f"--name {shown(name)} is not a plain folder name; use letters, digits, '.', '_' or '-' "
                          f"(it must stay inside the results folder)")
    return name


def parse_duration(text: str | None) -> float | None:
    """'90s', '30m', '4h', '1.5h' or plain seconds."""
    if text is None:
        return None
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([smh]?)\s*", text)
    if not match or float(match.group(1)) <= 0:
        raise LmtuneError(f"--time-budget {shown(text)}: give a positive duration such as 90s, 30m or 4h")
    return float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]


def resume_command(options: SweepOptions) -> str:
    """The command that continues this sweep, quoted so it can be pasted into a shell."""
    words = ["python", "-m", "lmtune.run", "--name", options.name, "--resume"]
    if options.results != Path("results"):
        words += ["--results", str(options.results)]
    for flag, value in (("--storage", options.storage), ("--address", options.address)):
        if value:
            words += [flag, value]
    return shlex.join(words)


def print_result(result: SweepResult, options: SweepOptions) -> int:
    """The trials and their outcomes, then what the sweep concluded, read from its folder by the report's own
    reader (the lines ``analyze`` prints too, so the two never count differently)."""
    from lmtune.report.headline import best_trial_lines, marked_unfinished, no_best_lines, summary_lines
    from lmtune.report.writer import summarize_sweep  # (the report's imports: only once there is one)

    try:
        report = summarize_sweep(result.sweep_dir)
    except LmtuneError:  # stopped before any trial wrote anything the report can read
        report = None
    summary = report.summary if report else None
    rows = summary.trials if summary else ()
    status_counts = dict(summary.status_counts) if summary else {}
    # A trial that errored before writing its folder's records is the ledger's alone: counted from there.
    unread = max(0, result.outcome_counts.get("error", 0) - status_counts.get("error", 0))
    if unread:
        status_counts["error"] = status_counts.get("error", 0) + unread
    counts = ", ".join(f"{n} {s}" for s, n in status_counts.items()) or "none ended"
    waiting = not_started(result, rows)
    print(f"\n{len(rows) + unread + waiting} trials: {counts}" + (f"; {waiting} not started" if waiting else ""))
    if result.stopped_by == INCURABLE:
        print(f"sweep stopped: {result.note}")
        print(f"no retry cures it; fix it, then resume with: {resume_command(options)}")
        return 1
    if result.stopped_by == DISK_FULL:
        print(f"sweep stopped: {result.note}; unfinished trials keep their newest checkpoint")
        print(f"resume it with: {resume_command(options)}")
        return 1
    if result.stopped_by:
        print(f"sweep interrupted ({result.stopped_by}): unfinished trials keep their newest checkpoint")
        print(f"resume it with: {resume_command(options)}")
        return signal_exit_code(result.stopped_by)
    if summary is not None and summary.nothing_trained is not None:  # (a finding, not a failure: the sweep ran)
        print("\n".join(no_best_lines(summary)))
        print(report_line(result))
        return 0
    if summary is None or summary.best_trial is None:
        print("\n".join(no_best_lines(summary)))
        for line in error_lines(rows):
            print(line)
        return 1
    stored = None
    if options.storage and "://" in options.storage:  # its checkpoints are in the storage only
        stored = f"{SweepStorage(options.storage, options.name).uri.partition('?')[0]}/" \
                 f"{Path(report.facts.best_trial_dir).name}/checkpoints/best.pt"
    print("\n".join([*summary_lines(summary), *marked_unfinished(summary, best_trial_lines(report.facts, stored))]))
    print(report_line(result))
    return 0


def report_line(result: SweepResult) -> str:
    """The command that writes the sweep's report, as a sweep that ended (with or without a best trial) prints it."""
    return f"report: {shlex.join(['python', '-m', 'lmtune.analyze', str(result.sweep_dir)])}"


def not_started(result: SweepResult, rows) -> int:
    """The sweep's trials that have neither ended (the ledger's) nor a folder of their own among ``rows`` (the
    report's: those running are there, and so not counted twice)."""
    from lmtune.sweep.record import read_outcomes

    ended = read_outcomes(result.sweep_dir)
    return max(0, result.unfinished - sum(row.trial_id not in ended for row in rows))


def error_lines(rows) -> list[str]:
    """Why the trials that errored did, each different reason once (the three most frequent), with its count."""
    reasons = collections.Counter(row.reason for row in rows if row.status == "error" and row.reason)
    return [f"  {n} trial{'s' if n > 1 else ''}: {reason}" for reason, n in reasons.most_common(3)]


@cli_entry
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    setup_cli_logging(logging.WARNING)
    if args.list_spaces:
        names = available_spaces()
        width = max(map(len, names), default=0)
        for name in names:
            print(f"{name:{width}s}  {load_space(name).description}")
        return 0
    options = sweep_options(args, argv)
    check_it_can_run(options)
    check_cpu_time(args, options)
    try:
        with Interruptions.caught():
            result = run_sweep(options)
    except KeyboardInterrupt:
        Interruptions.ignore_further()
        if Interruptions.tuning:  # a second Ctrl-C skipped Tune's last snapshot: trials' checkpoints remain
            print(f"\nsweep interrupted ({Interruptions.name()}, then again before Tune finished stopping): "
                  "unfinished trials keep their newest checkpoint")
            print(f"resume it with: {resume_command(options)}")
        else:  # during set-up: nothing of the sweep has trained yet
            print(f"interrupted before the sweep started ({Interruptions.name()})", file=sys.stderr)
        return Interruptions.exit_code()
    Interruptions.ignore_further()
    return print_result(result, options)


if __name__ == "__main__":
    raise SystemExit(main())
