"""``python -m lmtune.train``: train one model (the loop itself is lmtune.training.loop)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import time
from dataclasses import asdict
from pathlib import Path

from lmtune.cli import command_parser, parse_set_args, set_names
from lmtune.data.prepare import ensure_builtin_corpus
from lmtune.errors import LmtuneError, cli_entry, setup_cli_logging, shown
from lmtune.files import LOCK_FILE, check_destination
from lmtune.tools.terminal_progress import ProgressSink, logs_above_the_bar
from lmtune.training.checkpoint import BEST_NAME, checkpoint_step, disk_full_in_run, periodic_checkpoints
from lmtune.training.config import BUDGETS, RunConfig, apply_overrides, budget_config
from lmtune.training.fork import same_data
from lmtune.training.handout import handout_name
from lmtune.training.loop import resolve_config, run_being_written, train
from lmtune.training.metrics import METRICS_FILE
from lmtune.training.schedule import first_lr_difference
from lmtune.usercode.checks import check_code
from lmtune.usercode.config import FLAGS, add_code_arguments, code_from_arguments
from lmtune.usercode.consent import RUN_RECORD, TRUST_FLAG, check_recorded_files, read_run_record, write_run_record
from lmtune.usercode.spec import spec_for

# What a resumed run may change: where and how it runs, its bookkeeping, and its LR schedule (checked to give
# every step it already trained the same LR). The model, batch, seed, optimizer and evaluation stay the run's.
RESUME_MAY_CHANGE = {"log_interval", "eval_interval", "checkpoint_interval", "keep_checkpoints", "device", "compile",
                     "compile_backend", "compile_mode", "precision", "grad_accum_steps",
                     "lr", "min_lr_ratio", "schedule", "warmup_steps", "steps", "run_steps", "cooldown_fraction",
                     "cooldown_shape"}
# What a run that trained leaves in its folder, which a start from step 0 would replace.
RUN_RECORDS = (METRICS_FILE, "summary.json", f"checkpoints/{BEST_NAME}")


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("train", description="Train one language model.")
    parser.add_argument("--data", type=Path, help="prepared data dir (default: the built-in corpus)")
    parser.add_argument("--budget", choices=list(BUDGETS), help="named budget (default: quick; a resumed run's own)")
    parser.add_argument("--lr", type=float, help="peak learning rate")
    parser.add_argument("--out", type=Path, help="output dir (default: results/train-BUDGET-TIMESTAMP)")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", default=[],
                        help="override any model/training field, e.g. --set batch_size=64 (repeatable)")
    add_code_arguments(parser)
    parser.add_argument(TRUST_FLAG, action="store_true",
                        help="with --resume: import the code the run's config.json names even where it is not the "
                             "file, unchanged, that the run started with (only for a results folder you trust)")
    parser.add_argument("--wandb", metavar="PROJECT",
                        help="also log to Weights & Biases project PROJECT (needs pip install -e '.[wandb]')")
    parser.add_argument("--quiet", action="store_true", help="only warnings and the final summary")
    return parser


def output_folder(args: argparse.Namespace) -> Path:
    """--out, or results/train-BUDGET-TIMESTAMP; one line where it cannot be a run's folder."""
    budget = args.budget or "quick"
    out = args.out or Path("results") / f"train-{budget}-{time.strftime('%Y%m%d-%H%M%S')}"
    check_destination(out, "--out")
    return out


def run_config(args: argparse.Namespace, out: Path) -> RunConfig:
    """The config of the run in ``out``, every refusal checked before anything is written (or built)."""
    overrides = parse_set_args(args.set)
    if args.lr is not None:
        if "lr" in overrides:
            raise LmtuneError(f"--lr and --set {handout_name('lr', set_names(args.set))} both give the peak LR; give "
                              "it once")
        overrides["lr"] = args.lr
    budget = args.budget or "quick"
    if args.resume:
        return resumed_config(args, out, overrides)
    if args.trust_code:
        raise LmtuneError(f"{TRUST_FLAG} applies to --resume (the code a run's folder names); a new run imports only "
                          f"the code its flags name: drop {TRUST_FLAG}")
    if out.exists() and any(p.name != LOCK_FILE for p in out.iterdir()):
        raise LmtuneError(f"{out} already holds files; pass --resume to continue it or choose another --out")
    config = budget_config(budget, overrides, code=code_from_arguments(args))
    config.data_dir = str(args.data if args.data is not None else ensure_builtin_corpus())  # the last step: slow
    return config


def resumed_config(args: argparse.Namespace, out: Path, overrides: dict[str, object]) -> RunConfig:
    """The config a --resume continues with: the run's own, with only the overrides that leave what it has
    trained so far the same run (refused in one line otherwise)."""
    path = out / "config.json"
    if not path.exists():
        raise LmtuneError(f"--resume: {out} holds no training run (no config.json); drop --resume to start one")
    refuse_running_sweep(out)
    refuse_running_train(out)
    check_something_to_resume(out)
    saved = read_run_config(path)
    if args.budget is not None and args.budget != saved.budget:
        raise LmtuneError(f"--resume: the run in {out} has budget {saved.budget}, not {args.budget}; drop --budget "
                          "to continue it, or choose another --out for a new run")
    if args.data is not None and not same_data(str(args.data), saved.data_dir):
        raise LmtuneError(f"--resume: the run in {out} trained on {saved.data_dir}, not --data {args.data}; drop "
                          "--data to continue it, or choose another --out for a new run")
    config = apply_overrides(saved, overrides)
    config.code = code_from_arguments(args).on_top_of(saved.code)
    if config.code != saved.code:
        raise LmtuneError(f"--resume: the run in {out} trains {saved.code.describe()}, not {config.code.describe()} "
                          "(or another optimizer or schedule); drop --model/--optimizer/--schedule to continue it, "
                          "or choose another --out for a new run")
    check_resumed_code(args, saved, out)  # before check_resumable, which calls the run's schedule
    check_resumable(saved, config, newest_checkpoint_step(out / "checkpoints"), out)
    return config


def enclosing_sweep(out: Path) -> Path | None:
    """The sweep whose trial ``out`` is (its folder holds sweep.json), or None for a run of its own."""
    from lmtune.sweep.record import is_sweep_dir  # (a sweep's records only: lmtune train runs without Ray)

    folder = out.resolve().parent
    return folder if is_sweep_dir(folder) else None


def refuse_running_sweep(out: Path) -> None:
    """A trial of a sweep whose driver runs (or resumes) now is that driver's to write: one line, nothing written."""
    from lmtune.sweep.record import running_writer

    sweep = enclosing_sweep(out)
    if sweep is not None and (pid := running_writer(sweep)) is not None:
        raise LmtuneError(f"--resume: {out} is a trial of {sweep}, and {sweep} is being written by a running lmtune "
                          f"sweep (pid {pid}); wait for it to end, or stop it, before you resume one of its trials")


def refuse_running_train(out: Path) -> None:
    """A run another ``lmtune train`` writes now (it holds the folder's lock) is refused as the loop's own lock would
    refuse it, before anything else is judged of the folder (its first checkpoint may not be written yet)."""
    from lmtune.sweep.record import running_writer

    if (pid := running_writer(out)) is not None:
        raise LmtuneError(run_being_written(out, pid))


def held_sweep(out: Path) -> contextlib.AbstractContextManager[object]:
    """While a --resume trains a sweep's trial, the sweep's lock (no ``run --resume`` of the sweep meanwhile)."""
    from lmtune.sweep.record import sole_writer

    sweep = enclosing_sweep(out)
    return sole_writer(sweep, new=False) if sweep is not None else contextlib.nullcontext()


def check_something_to_resume(out: Path) -> None:
    """A --resume continues from a step checkpoint in out/checkpoints. Where there is none but the run left records
    (metrics.csv, summary.json, best.pt: the default ``run --keep best`` leaves a sweep's trial best.pt only), it
    would start again from step 0 over them: refused in one line naming the ways to train it again. A folder that
    holds config.json alone (a run set up, never trained) starts from step 0, as a --resume there always has."""
    if periodic_checkpoints(out / "checkpoints"):
        return
    records = [name for name in RUN_RECORDS if (out / name).exists()]
    if not records:
        return
    kept = "best.pt only" if (out / "checkpoints" / BEST_NAME).exists() else "no checkpoint"
    raise LmtuneError(f"--resume: nothing to resume in {out}: the run kept {kept} (no step checkpoint in "
                      f"{out / 'checkpoints'}), and a start from step 0 would replace its {', '.join(records)}; "
                      "to train it again, copy its config.json alone into a new folder and resume that (train "
                      "--resume --out NEW), or start a new run with another --out")


def check_resumed_code(args: argparse.Namespace, saved: RunConfig, out: Path) -> None:
    """A run folder is data, never code: the code its config.json names is imported only where this command names
    it again, where it is the very file the run recorded as it started (RUN_RECORD: the user's own run, resumed on
    the machine that trained it), unchanged, or with --trust-code; one line otherwise, before any import."""
    named = set(code_from_arguments(args).specs.values())
    record = read_run_record(out)
    for field_name, spec in saved.code.specs.items():
        if spec not in named:
            check_recorded_files([spec], record, args.trust_code, whose="run", record=f"{out / RUN_RECORD}",
                                 folder=out, fix=f"give {FLAGS[field_name]} {spec} again if it is your own code")


def read_run_config(path: Path) -> RunConfig:
    """A run's config.json, validated; one line naming the file when it is torn or edited past use."""
    fix = "restore it (each checkpoint carries the run's config), or start a new run with another --out"
    try:
        saved = RunConfig.from_dict(json.loads(path.read_text()))
        return apply_overrides(saved, {}, where=str(path))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as err:
        raise LmtuneError(f"--resume: {path} is not a readable run config ({type(err).__name__}: "
                          f"{shown(str(err))}); {fix}") from None
    except LmtuneError as err:  # it parses, but holds a value no run could have trained with
        raise LmtuneError(f"--resume: {err}; {fix}") from None


def newest_checkpoint_step(folder: Path) -> int:
    """The step of the newest periodic checkpoint a resume may start from (0: none, a fresh start); the newest
    by name, so what is checked against it holds for whichever one verifies."""
    found = periodic_checkpoints(folder)
    return checkpoint_step(found[-1]) if found else 0


def check_resumable(saved: RunConfig, config: RunConfig, step: int, out: Path) -> None:
    """One line when ``config`` continued from ``saved``'s checkpoint at ``step`` would not be the run it
    trained so far: a changed model, batch, seed, optimizer or measure, or an LR schedule that differs at a
    step already trained."""
    old, new = flat_fields(saved), flat_fields(config)
    changed = [f"{k} {shown(old[k])} -> {shown(new[k])}" for k in sorted(old)
               if old[k] != new[k] and k not in RESUME_MAY_CHANGE]
    if changed:
        raise LmtuneError(f"--resume: --set {', '.join(changed)} would make the run in {out} another run; "
                          "continue it unchanged, or start a new run with another --out")
    old_lr, new_lr = (spec_for(c).schedule.lr_function(c) for c in (saved, config))
    if (first := first_lr_difference(old_lr, new_lr, step)) is not None:
        at, before, after = first
        raise LmtuneError(f"--resume: the run in {out} is at step {step} and trained step {at} at lr {before:.3g}, "
                          f"where these settings give {after:.3g}; fork it from a checkpoint before that step "
                          "(lmtune.training.fork.fork_run; a WSD run's checkpoints/stable.pt), or start a new run "
                          "with another --out")


def flat_fields(config: RunConfig) -> dict[str, object]:
    """Every model and training field by name (the two sections share no name)."""
    return {**asdict(config.model), **asdict(config.train)}


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_cli_logging(logging.WARNING if args.quiet else logging.INFO)
    out = output_folder(args)
    config = run_config(args, out)
    with held_sweep(out) if args.resume else contextlib.nullcontext():
        return train_run(args, config, out)


def train_run(args: argparse.Namespace, config: RunConfig, out: Path) -> int:
    """Train the run (its config checked), then print how it ended: 0 where it completed or was stopped."""
    check_code(resolve_config(config, Path(config.data_dir)))  # the user's code, before anything is written
    sinks: list = [ProgressSink(config.train.stop_step, f"train {out.name}")]  # a bar with an ETA on a terminal
    if args.wandb:
        from lmtune.training.wandb_sink import WandbSink

        sinks.append(WandbSink(args.wandb, config, out))
    try:
        with logs_above_the_bar():
            result = train(config, out, resume=args.resume, sinks=sinks, spec=spec_for(config),
                           on_start=lambda folder: write_run_record(folder, config.code))
    except OSError as err:  # a full disk: one line, with the run's way on
        if (full := disk_full_in_run(err, out)) is None:
            raise
        raise full from err
    s = result.summary
    best = f"{s['best_val_loss']:.4f}" if s["best_val_loss"] is not None else "n/a"
    status = "completed, did not learn" if s.get("divergence", {}).get("did_not_learn") else result.status
    print(f"{status}: {s['steps']} steps, {s['tokens']:,} tokens, best val loss {best}, "
          f"{s['tokens_per_s'] or 0:,.0f} tokens/s, {s['wall_time_s']:.1f} s -> {out}")
    return 0 if result.status in ("completed", "stopped") else 1


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
