"""``python -m lmtune.bench``: time lmtune's training step against a naive baseline (lmtune.tools.throughput),
or with ``--concurrency 1,2,4`` several training processes at once and the trials-per-GPU they suggest; or,
with ``--coord-check``, no timing: μP's coordinate check across widths (lmtune.training.coord_check)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import sys
from dataclasses import replace
from pathlib import Path

import torch

from lmtune.cli import command_parser, parse_set_args
from lmtune.data.prepare import ensure_builtin_corpus
from lmtune.errors import LmtuneError, cli_entry, setup_cli_logging, shown
from lmtune.files import check_destination
from lmtune.sweep.placement import recommend_trials_per_gpu
from lmtune.tools.projection import DEVICES, project, projection_table
from lmtune.tools.throughput.benchmark import COMPILE_MODES, CONFIGS, bench_config, fused_tokens_per_s, run_bench
from lmtune.tools.throughput.concurrency import run_concurrency
from lmtune.tools.throughput.machine import full_device_name, git_commit
from lmtune.tools.throughput.results import BenchResult, ConcurrencyReport, FuseReport, FuseRow
from lmtune.training.compile import should_compile
from lmtune.training.config import RunConfig
from lmtune.training.coord_check import (
    DEFAULT_LR,
    PARAMETRIZATIONS,
    check_inputs,
    coord_check,
    slope_table,
    width_config,
    write_checks,
)
from lmtune.training.device import autocast_dtype, available_memory_bytes, resolve_device
from lmtune.training.memory import check_fits, run_memory_bytes
from lmtune.usercode.checks import check_code
from lmtune.usercode.config import add_code_arguments, code_from_arguments
from lmtune.usercode.spec import spec_for

DEFAULT_RESULTS = Path("benchmarks/results.jsonl")
# --coord-check's defaults: the quick budget's shape (head dim 32, 2 layers, context 128) at 4 sequences a batch,
# widths from 64 (narrower ones read as shrinking under μP: their updates are still mostly noise); about 2 minutes
# on a CPU core for both parametrizations.
COORD_BUDGET, COORD_BATCH, COORD_WIDTHS, COORD_OUT = "quick", 4, "64,128,256,512", Path("results/coord_check")


def _fmt_bytes(n: float | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:,.0f} MiB"


def format_result(r: BenchResult) -> str:
    lines = [
        f"lmtune bench: {r.model}, config {r.config}, batch {r.batch_size} x context {r.context_length}, "
        f"{r.params_non_embedding / 1e6:.2f}M non-embedding params",
        f"device {r.device}, torch {r.torch}, commit {r.commit}"
        + (f", load average {r.load_avg_1m:.1f}" if r.load_avg_1m is not None else ""),
        f"optimized ({r.optimized_variant}"
        + (f", mode {r.compile_mode}" if r.compile_mode else "")
        + f", {r.precision}, attention {r.attention_kernel}): {r.tokens_per_s:,.0f} tokens/s",
        f"  step {r.step_s * 1e3:.1f} ms = data wait {r.data_wait_s * 1e3:.2f} ms "
        f"({100 * r.data_wait_fraction:.1f}%) + compute {r.compute_s * 1e3:.1f} ms",
        f"  MFU {100 * r.mfu:.1f}% = tokens/s x FLOPs/token / peak = {r.tokens_per_s:,.0f} x "
        f"{r.flops_per_token / 1e6:.2f} MFLOP{' (estimated)' if r.flops_estimated else ''} / "
        f"{r.peak_flops / 1e12:.3g} TFLOP/s ({r.peak_flops_source})",
        f"  peak memory {_fmt_bytes(r.peak_memory_bytes)} ({r.peak_memory_kind})",
    ]
    if r.host_syncs_per_step is not None:
        lines.append(f"  host syncs per step: {r.host_syncs_per_step}")
    if r.eval_fraction is not None:
        lines.append(f"  eval: {r.eval_s:.2f} s per evaluation = {100 * r.eval_fraction:.1f}% of wall time")
    if r.compile is not None:
        lines.append(f"  eager {r.variant_tokens_per_s['eager']:,.0f} tokens/s, compiled "
                     f"{r.variant_tokens_per_s['compiled']:,.0f} tokens/s: compiled/eager {r.compile.speedup:.2f}x "
                     f"(paired repeats {r.compile.speedup_paired:.2f}x) "
                     f"(compile warm-up {r.warmup_s['compiled']:.1f} s)")
    if r.naive is not None:
        attention = "the model's own attention" if r.flops_estimated else "explicit-mask attention"
        lines.append(f"naive (float32, eager, {attention}, host-built batches, plain AdamW): "
                     f"{r.naive.tokens_per_s:,.0f} tokens/s")
        lines.append(f"optimized / naive: {r.naive.speedup:.2f}x "
                     f"(median of paired repeats {r.naive.speedup_paired:.2f}x)")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = command_parser("bench", description="Time lmtune's training step.")
    p.add_argument("--budget", "--config", dest="config", choices=list(CONFIGS),
                   help="named model/budget, as in run and train (default: default; --coord-check: "
                   f"{COORD_BUDGET}; --config is its older name)")
    p.add_argument("--batch-size", type=int, help=f"batch size (default: the config's; --coord-check: {COORD_BATCH})")
    p.add_argument("--steps", type=int, help="timed steps per repeat (default 10; --coord-check: steps at the "
                   "constant LR, default 5)")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats; the median is reported (default 3)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first, compilation included (default 3)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps (default auto)")
    p.add_argument("--compile", default="auto", choices=["auto", "on", "off", "both"],
                   help="auto: as training decides; both: time eager and compiled, report the faster")
    p.add_argument("--compile-mode", default="default", choices=COMPILE_MODES,
                   help="torch.compile mode of the compiled timing (default: default)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", default=[], help="override a config field")
    add_code_arguments(p, optimizer=False, schedule=False)
    p.add_argument("--no-naive", action="store_true", help="skip the naive baseline")
    p.add_argument("--measured-peak", action="store_true",
                   help="MFU against this device's measured matmul peak in the training dtype (an 8192^3 bf16 matmul "
                        "on a GPU), not its data-sheet figure")
    p.add_argument("--no-eval", action="store_true", help="skip timing the evaluation")
    p.add_argument("--concurrency", help="comma-separated K values: run K training processes at once")
    p.add_argument("--fuse", help="comma-separated K values: one fused process of K members against K separate "
                   "processes at once and against one alone (K runs one after another)")
    p.add_argument("--project", metavar="DEVICE", help="no timing: an ESTIMATE of what DEVICE (h100, a100, 4090, "
                   "m3max or all) should do with --budget, from the model's FLOPs and memory traffic per token")
    p.add_argument("--coord-check", action="store_true", help="no timing: μP's coordinate check, each layer's "
                   "activation and update scale across --widths after --steps steps (flat under mup, growing "
                   "under sp); writes coord_check.json and coord_check.png to --out")
    p.add_argument("--widths", default=COORD_WIDTHS, help="--coord-check: d_model values, multiples of the "
                   f"budget's head dimension (default {COORD_WIDTHS})")
    p.add_argument("--parametrization", default="both", choices=[*PARAMETRIZATIONS, "both"],
                   help="--coord-check: sp, mup or both (default both)")
    p.add_argument("--lr", type=float, default=DEFAULT_LR, help=f"--coord-check: the constant LR (default "
                   f"{DEFAULT_LR:g})")
    p.add_argument("--seeds", type=int, default=3, help="--coord-check: initialisations averaged (default 3)")
    p.add_argument("--data", type=Path, help="--coord-check: prepared data dir (default: the built-in corpus)")
    p.add_argument("--out", type=Path, default=COORD_OUT, help=f"--coord-check: folder (default {COORD_OUT})")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--record", action="store_true", help="append the JSON object to --results-file")
    p.add_argument("--results-file", type=Path, default=DEFAULT_RESULTS, help=f"default {DEFAULT_RESULTS}")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--barrier", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--barrier-count", type=int, default=1, help=argparse.SUPPRESS)
    return p


def _parse_ks(text: str, flag: str = "--concurrency", example: str = "1,2,4,7") -> list[int]:
    try:
        ks = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        ks = []
    if not ks or min(ks) < 1:
        raise LmtuneError(f"{flag} {shown(text)}: give positive integers separated by commas, e.g. {example}")
    return ks


# A bench worker's own resident memory before its model: the interpreter, torch and numpy (about 220 MB measured
# with torch 2.13 on CPU) with room for the data and allocator; it bounds how many workers the host holds.
WORKER_PROCESS_BYTES = 400 * 2**20
# More worker processes than this many per CPU core only time-slice the cores (a GPU still needs a core each).
WORKERS_PER_CORE = 4


def check_ks(ks: list[int], config: RunConfig, device: torch.device, flag: str) -> None:
    """Refuse, in one line, a K the machine cannot run: K worker processes at once (both --concurrency and
    --fuse start them), and for --fuse one process holding K models."""
    cores = os.cpu_count() or 1
    if max(ks) > WORKERS_PER_CORE * cores:
        raise LmtuneError(f"{flag}: K={max(ks)} would start {max(ks)} worker processes on {cores} CPU cores; use "
                          f"K <= {WORKERS_PER_CORE * cores} ({WORKERS_PER_CORE} per core)")
    spec = spec_for(config)
    per_worker = WORKER_PROCESS_BYTES + (0 if device.type != "cpu" else run_memory_bytes(config, False, spec=spec))
    host = available_memory_bytes(torch.device("cpu"))
    if host is not None and max(ks) * per_worker > host:
        fits = max(1, host // per_worker)
        raise LmtuneError(f"{flag}: K={max(ks)} worker processes need about {max(ks) * per_worker / 2**30:.1f} GiB "
                          f"and this machine has {host / 2**30:.1f} GiB free; use K <= {fits}")
    if flag == "--fuse":
        check_fits(config, device, members=max(ks), where=f"--fuse {max(ks)}", spec=spec)


def _batch_named(args: argparse.Namespace) -> str:
    """The options that set the timed batch, as a refusal names them."""
    return f"--batch-size {args.batch_size}" if args.batch_size is not None else f"--budget {args.config}"


def _worker_args(args: argparse.Namespace) -> list[str]:
    out = ["--config", args.config, "--steps", str(args.steps), "--repeats", str(args.repeats),
           "--warmup", str(args.warmup), "--device", args.device, "--compile", args.compile,
           "--compile-mode", args.compile_mode]
    if args.batch_size is not None:
        out += ["--batch-size", str(args.batch_size)]
    for pair in args.set:
        out += ["--set", pair]
    return out


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_cli_logging(logging.WARNING)
    code = code_from_arguments(args)
    lmtune_only = [flag for flag, given in (("--coord-check", args.coord_check), ("--concurrency", args.concurrency),
                                            ("--fuse", args.fuse), ("--project", args.project is not None)) if given]
    if code.model and lmtune_only:  # (flags that clash: --model with one that measures lmtune's own model)
        raise LmtuneError(f"--model times your model in lmtune's loop against the naive loop; {lmtune_only[0]} "
                          "measures lmtune's own model: drop one of them")
    if args.coord_check:
        return _main_coord_check(args)
    args.config = args.config or "default"
    args.steps = 10 if args.steps is None else args.steps
    overrides = parse_set_args(args.set)
    compile_choice = "auto" if args.compile == "both" else args.compile
    # --json: stdout holds the JSON alone; what the user's code prints (at import, in its forward) goes to stderr
    quiet = contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext()
    with quiet:
        config = bench_config(args.config, args.batch_size, overrides, args.device, compile_choice, code)
        check_code(config)
    if args.record:  # checked before the timing run, which takes minutes
        check_destination(args.results_file, "--results-file", kind="file")
    if args.project is not None:  # (an empty value is a wrong device, not "no --project")
        return _main_project(args, config)
    if args.concurrency and args.fuse:
        raise LmtuneError("--concurrency and --fuse measure separately; give one of them")
    if args.concurrency:
        return _main_concurrency(args, config, _command(argv))
    if args.fuse:
        return _main_fuse(args, config, _command(argv))
    if args.worker and args.compile == "both":
        raise LmtuneError("--compile both cannot be used with --concurrency; choose on, off or auto")
    if not args.worker:  # (a --concurrency worker: its parent checked, and the others' memory is not yet in use)
        # Before the timing run allocates its batch: the check --fuse makes (a batch no memory holds is one line).
        check_fits(config, resolve_device(config.train.device), where=_batch_named(args), spec=spec_for(config))
    with quiet:
        result = run_bench(
            config, steps=args.steps, repeats=args.repeats, warmup=args.warmup, compile_choice=args.compile,
            compile_mode=args.compile_mode, naive=not (args.no_naive or args.worker),
            measure_eval=not (args.no_eval or args.worker),
            barrier=(args.barrier, args.barrier_count) if args.barrier else None, config_name=args.config,
            measured_peak=args.measured_peak,
        )
    result = replace(result, command=_command(argv))
    if args.record:
        record(result, args.results_file)
    print(json.dumps(result.to_json(), sort_keys=True) if args.json else format_result(result))
    if args.record and not args.json:
        print(f"recorded to {args.results_file}")
    return 0


def _main_project(args: argparse.Namespace, config: RunConfig) -> int:
    choice = args.project.lower()
    if choice != "all" and choice not in DEVICES:
        raise LmtuneError(f"--project {shown(args.project)}: choose one of {', '.join(DEVICES)} or all")
    devices = list(DEVICES) if choice == "all" else [choice]
    if args.json:
        print(json.dumps([dataclasses.asdict(project(config, d)) for d in devices], sort_keys=True))
    else:
        print("\n".join(projection_table(config, devices)))
    return 0


def _main_coord_check(args: argparse.Namespace) -> int:
    """μP's coordinate check of the budget's model, sp and/or mup: a table of slopes, JSON and a figure."""
    given = (("--concurrency", args.concurrency), ("--fuse", args.fuse), ("--json", args.json),
             ("--project", args.project is not None), ("--record", args.record))
    others = [flag for flag, present in given if present]
    if others:
        raise LmtuneError(f"--coord-check measures no timing; drop {', '.join(others)}")
    widths = _parse_ks(args.widths, flag="--widths", example="64,128,256")
    overrides = parse_set_args(args.set)
    batch_size = COORD_BATCH if args.batch_size is None else args.batch_size
    config = bench_config(args.config or COORD_BUDGET, batch_size, overrides, args.device, "off")
    config.vocab_from_data = "vocab_size" not in overrides
    names = list(PARAMETRIZATIONS) if args.parametrization == "both" else [args.parametrization]
    steps = 5 if args.steps is None else args.steps
    for name in names:  # before the corpus is built, which takes a while the first time
        check_inputs(config, widths, name, steps, args.seeds, args.lr, where="--")
    widest = width_config(config, max(widths), names[0], args.lr, config.train.seed)
    check_fits(widest, resolve_device(config.train.device), where=f"--widths {max(widths)} at batch {batch_size}")
    check_destination(args.out, "--out")
    config.data_dir = str(args.data if args.data is not None else ensure_builtin_corpus())
    device = resolve_device(config.train.device)
    checks = [coord_check(config, widths, name, steps=steps, lr=args.lr, seeds=args.seeds, device=device)
              for name in names]
    args.out.mkdir(parents=True, exist_ok=True)
    write_checks(args.out / "coord_check.json", checks)
    from lmtune.searches.width.report_coord import plot_coord_check  # (matplotlib: only where a figure is drawn)

    plot_coord_check(checks, args.out / "coord_check.png")
    print(f"lmtune bench --coord-check: widths {','.join(map(str, checks[0].widths))}, {steps} steps at lr "
          f"{args.lr:g}, {args.seeds} seeds, data {config.data_dir}, device {device}")
    print(f"slope of ln(scale) vs ln(width) after step {steps} (about 0: flat; about +1: grows like width)")
    print("\n".join(slope_table(checks)))
    print(f"wrote {args.out / 'coord_check.json'} and {args.out / 'coord_check.png'}")
    return 0


def record(result: BenchResult | ConcurrencyReport | FuseReport, path: Path) -> None:
    """Append one result to the results file (one JSON object a line; appended, so earlier lines stay)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        handle.write(json.dumps(result.to_json(), sort_keys=True) + "\n")


def _command(argv: list[str] | None) -> str:
    return "python -m lmtune.bench " + " ".join(argv if argv is not None else sys.argv[1:])


def _main_concurrency(args: argparse.Namespace, config: RunConfig, command: str) -> int:
    if args.compile == "both":
        raise LmtuneError("--compile both cannot be used with --concurrency; choose on, off or auto")
    device = resolve_device(config.train.device)
    ks = _parse_ks(args.concurrency)
    check_fits(config, device, where=_batch_named(args), spec=spec_for(config))  # (one worker's run, as main's)
    check_ks(ks, config, device, "--concurrency")
    rows = run_concurrency(ks, _worker_args(args), device)
    amp = autocast_dtype(config, device) is not None
    estimate = run_memory_bytes(config, amp, spec=spec_for(config))
    recommended = None
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        measured_mem = max(row.per_process_peak_reserved_bytes or 0 for row in rows) or estimate
        recommended = recommend_trials_per_gpu(measured_mem, total, {r.k: r.aggregate_tokens_per_s for r in rows})
    result = ConcurrencyReport(config=args.config, device=full_device_name(device), torch=torch.__version__,
                               commit=git_commit(), batch_size=config.train.batch_size,
                               context_length=config.model.context_length, concurrency=rows,
                               estimated_trial_memory_bytes=estimate, recommended_trials_per_gpu=recommended,
                               command=command)
    if args.record:
        record(result, args.results_file)
    if args.json:
        print(json.dumps(result.to_json(), sort_keys=True))
        return 0
    base = rows[0].aggregate_tokens_per_s / rows[0].k
    print(f"lmtune bench --concurrency: config {args.config}, batch {config.train.batch_size}, "
          f"device {result.device}")
    for row in rows:
        print(f"  K={row.k}: aggregate {row.aggregate_tokens_per_s:,.0f} tokens/s "
              f"({row.aggregate_tokens_per_s / base:.2f}x one process), per-process peak memory "
              f"{_fmt_bytes(row.per_process_peak_memory_bytes)}")
    print(f"  estimated trial memory (model): {_fmt_bytes(estimate)}")
    print(f"  recommended trials per GPU: {recommended if recommended is not None else 'n/a (no CUDA device)'}")
    return 0


def _main_fuse(args: argparse.Namespace, config: RunConfig, command: str) -> int:
    """Fused K members in one process against K separate processes at once and one process alone."""
    if args.compile == "both":
        raise LmtuneError("--compile both cannot be used with --fuse; choose on, off or auto")
    device = resolve_device(config.train.device)
    ks = _parse_ks(args.fuse, flag="--fuse")
    check_ks(ks, config, device, "--fuse")
    compiled = should_compile(config, device, spec_for(config))
    measured = run_concurrency(sorted({1, *ks}), _worker_args(args), device)
    separate = {row.k: row.aggregate_tokens_per_s for row in measured}
    alone = separate[1]
    rows = [FuseRow.compare(fused_tokens_per_s(config, device, k, args.steps, args.repeats, args.warmup, compiled),
                            separate[k], alone) for k in ks]
    result = FuseReport(config=args.config, device=full_device_name(device), torch=torch.__version__,
                        commit=git_commit(), batch_size=config.train.batch_size,
                        context_length=config.model.context_length, compiled=compiled, steps=args.steps,
                        repeats=args.repeats, one_alone_tokens_per_s=alone, fuse=rows, command=command)
    if args.record:
        record(result, args.results_file)
    if args.json:
        print(json.dumps(result.to_json(), sort_keys=True))
        return 0
    print(f"lmtune bench --fuse: config {args.config}, batch {config.train.batch_size}, device {result.device}; "
          f"one process alone (= K runs one after another): {alone:,.0f} tokens/s")
    for row in rows:
        print(f"  K={row.k}: fused {row.fused_aggregate_tokens_per_s:,.0f} tokens/s "
              f"({row.fused_vs_one_alone:.2f}x one alone), {row.k} separate processes "
              f"{row.separate_aggregate_tokens_per_s:,.0f} tokens/s (fused {row.fused_vs_separate:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
