"""``python -m lmtune.diagnose``: is this machine training as fast as it should? And how far is a sweep?

Without arguments: checks the environment (device, CUDA and driver, bf16/TF32, torch.compile, free
memory), runs a short benchmark of the real training step while sampling the GPU's clocks,
temperature, power and throttle reasons through NVML, and says whether throughput is in the range
expected for the device and what to change if not (lmtune.tools.environment).

With a sweep directory (``python -m lmtune.diagnose results/NAME``): each trial's status, progress,
tokens/s and ETA, and the ETA of the whole sweep; works while the sweep runs (lmtune.tools.progress).
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path

import torch

from lmtune.cli import command_parser, device_flag
from lmtune.errors import cli_entry, setup_cli_logging
from lmtune.tools import environment, progress
from lmtune.tools.environment import NvmlSummary
from lmtune.tools.throughput import benchmark
from lmtune.tools.throughput.machine import full_device_name
from lmtune.tools.throughput.results import BenchResult


def print_environment(device: torch.device) -> bool:
    """The device, its CUDA and precision support, compile and free memory; returns whether compile works."""
    print(f"device: {full_device_name(device)} ({device})")
    print(f"torch: {torch.__version__}")
    if device.type == "cuda":
        env = environment.cuda_environment(device)
        print(f"CUDA: {env.cuda}, driver {env.driver}, compute capability {env.capability}")
        emulated = " (only emulated: bf16 would run slowly and uncompiled)" if env.bf16_emulated else ""
        print(f"bf16: {'native' if env.bf16 else 'NOT native' + emulated + '; lmtune trains in float32 here'}")
        print(f"TF32: {'supported' if env.tf32 else 'not supported'}"
              + (f", enabled for matmuls: {env.tf32_enabled}" if env.tf32 else ""))
    else:
        for what in ("CUDA", "bf16", "TF32"):
            print(f"{what}: n/a (no CUDA device)")
    if device.type == "cpu":
        print(f"CPU: {os.cpu_count()} logical cores, torch uses {torch.get_num_threads()} threads")
    compile_ok, compile_msg = environment.check_compile(device)
    print(f"torch.compile: {compile_msg}")
    free, total = environment.free_memory_bytes(device)
    kind = "GPU" if device.type == "cuda" else "host"
    print(f"free {kind} memory: " + (f"{free / 2**30:.1f} of {total / 2**30:.1f} GiB" if free and total else "unknown"))
    return compile_ok


def benchmark_with_nvml(device: torch.device, config_name: str, batch_size: int | None, steps: int,
                        repeats: int, device_arg: str) -> tuple[BenchResult, NvmlSummary | None]:
    """The optimized step's benchmark, with NVML sampling the GPU meanwhile (None without CUDA or NVML)."""
    config = benchmark.bench_config(config_name, batch_size, {}, device_arg, "auto")
    sampler = None
    if device.type == "cuda":
        try:
            sampler = environment.NvmlSampler(device)
            sampler.start()
        except Exception as err:  # noqa: BLE001 - NVML is optional: diagnose without it
            print(f"NVML: unavailable ({err}); no clock/thermal/power readings")
            sampler = None
    try:
        result = benchmark.run_bench(config, steps=steps, repeats=repeats, warmup=2, naive=False,
                                     measure_eval=False, config_name=config_name)
    finally:
        nvml = sampler.stop() if sampler is not None else None
    return result, nvml


def print_benchmark(result: BenchResult, nvml: NvmlSummary | None, device: torch.device, compile_ok: bool,
                    config_name: str) -> None:
    print(f"benchmark ({config_name}, batch {result.batch_size}, {result.optimized_variant}, "
          f"{result.precision}): {result.tokens_per_s:,.0f} tokens/s, MFU {100 * result.mfu:.1f}% "
          f"(peak {result.peak_flops / 1e12:.3g} TFLOP/s, {result.peak_flops_source})")
    print(f"step: {result.step_s * 1e3:.1f} ms, data wait {100 * result.data_wait_fraction:.1f}%, "
          f"attention {result.attention_kernel}")
    if nvml is None:
        print("GPU clocks/temperature/power: n/a (no CUDA device)" if device.type != "cuda" else
              "GPU clocks/temperature/power: not read")
    elif nvml.samples:
        print(f"GPU during the benchmark: SM clock {nvml.sm_clock_mhz_median} MHz (max {nvml.sm_clock_mhz_max}), "
              f"up to {nvml.temperature_c_max} C, up to {nvml.power_w_max:.0f} W"
              + (f" of {nvml.power_limit_w:.0f} W" if nvml.power_limit_w else "")
              + f"; throttle reasons: {', '.join(nvml.throttle_reasons) or 'none'}")
    low, high = environment.EXPECTED_MFU.get(device.type, (0.0, 1.0))
    ok, advice = environment.verdict(result, device.type, nvml, compile_ok)
    stall = result.data_wait_fraction > environment.DATA_STALL_FRACTION
    print(f"data loading: {'STALL' if stall else 'ok'}")
    print(f"verdict: {'OK' if ok else 'CHECK'}: throughput {'in' if result.mfu >= low else 'BELOW'} the expected "
          f"range (expected MFU {100 * low:.0f}-{100 * high:.0f}% on {device.type})")
    for line in advice:
        print(f"  - {line}")


def build_parser() -> argparse.ArgumentParser:
    p = command_parser("diagnose", description="Check this machine's training speed, or show a sweep's progress.")
    p.add_argument("sweep_dir", nargs="?", type=Path, help="a sweep's results dir: show its trials and ETA")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps (default auto)")
    budgets = ["default", "full", "low-resource", "quick"]
    p.add_argument("--budget", choices=budgets, help="budget to benchmark (default: default on CUDA, quick elsewhere)")
    p.add_argument("--config", dest="budget", choices=budgets, help=argparse.SUPPRESS)  # its old name, kept working
    p.add_argument("--batch-size", type=int, help="batch size of the benchmark (default: the budget's)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per repeat (default 10)")
    p.add_argument("--repeats", type=int, default=2, help="timed repeats (default 2)")
    p.add_argument("--watch", type=float, metavar="SECONDS", help="with a sweep dir: refresh every SECONDS")
    return p


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_cli_logging(logging.WARNING)
    if args.sweep_dir is None:
        device = device_flag(args.device)
        compile_ok = print_environment(device)
        config_name = args.budget or ("default" if device.type == "cuda" else "quick")
        result, nvml = benchmark_with_nvml(device, config_name, args.batch_size, args.steps, args.repeats,
                                           args.device)
        print_benchmark(result, nvml, device, compile_ok, config_name)
        return 0
    while True:
        trials, record = progress.sweep_status(args.sweep_dir)
        print(progress.format_sweep(args.sweep_dir, trials, record), flush=True)
        if not args.watch or not any(t.status == "running" for t in trials):
            return 0
        time.sleep(args.watch)
        print()


if __name__ == "__main__":
    raise SystemExit(main())
