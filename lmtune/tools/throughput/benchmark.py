"""The benchmark: time the optimized step (each compile variant asked for) and the naive baseline in one
process, repeats interleaved so that outside load hits every loop alike, and turn the timings into a
``BenchResult``."""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import numpy as np
import torch

from lmtune.data.batches import fixed_val_batches
from lmtune.errors import LmtuneError
from lmtune.tools.throughput.concurrency import wait_at_barrier
from lmtune.tools.throughput.loops import (
    FusedLoop,
    NaiveLoop,
    OptimizedLoop,
    TimedLoop,
    count_host_syncs,
    random_tokens,
    time_steps,
)
from lmtune.tools.throughput.machine import (
    full_device_name,
    git_commit,
    measured_matmul_peak,
    process_peak_rss_bytes,
    sdpa_kernel_used,
)
from lmtune.tools.throughput.results import BenchResult, CompileComparison, FusedTiming, NaiveComparison
from lmtune.training.compile import should_compile
from lmtune.training.config import RunConfig, budget_config
from lmtune.training.device import configure_backend, peak_flops, resolve_device, synchronize
from lmtune.training.step import evaluate
from lmtune.usercode.config import UserCode
from lmtune.usercode.spec import model_size, spec_for

log = logging.getLogger(__name__)

# --budget names (bench): "default" is the CS336 model at the full budget's batch size.
CONFIGS = {"default": "full", "full": "full", "low-resource": "low-resource", "quick": "quick"}
COMPILE_MODES = ("default", "max-autotune", "reduce-overhead")


def bench_config(name: str, batch_size: int | None = None, overrides: Mapping[str, object] | None = None,
                 device: str = "auto", compile_choice: str = "auto", code: UserCode | None = None) -> RunConfig:
    """The --budget ``name``'s config with the --set ``overrides`` (as parse_set_args parses them), for ``code``'s
    model (None: lmtune's)."""
    if name not in CONFIGS:
        raise LmtuneError(f"unknown --budget '{name}'; choose one of {', '.join(CONFIGS)}")
    merged = dict(overrides or {})
    if batch_size is not None:
        merged["batch_size"] = batch_size
    merged.setdefault("device", device)
    if compile_choice in ("on", "off", "auto"):
        merged.setdefault("compile", compile_choice)
    config = budget_config(CONFIGS[name], merged, code=code)
    config.vocab_from_data = False
    return config


@dataclass
class Timings:
    """Per loop: its warm-up seconds and its timed repeats as (wall seconds, data-wait seconds)."""

    warmup_s: dict[str, float] = field(default_factory=dict)
    repeats: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    peak_memory: int | None = None
    peak_reserved: int | None = None
    start_unix: float | None = None
    end_unix: float | None = None

    def rate(self, name: str, tokens_per_repeat: int) -> float:
        return statistics.median(tokens_per_repeat / wall for wall, _ in self.repeats[name])

    def paired(self, a: str, b: str) -> float:
        """Median over repeats of wall(b)/wall(a): repeat i of a and of b ran next to each other, under the
        same outside load, so this resists load that drifts over the run, unlike the ratio of the medians."""
        pairs = zip(self.repeats[a], self.repeats[b], strict=True)
        return statistics.median(wall_b / wall_a for (wall_a, _), (wall_b, _) in pairs)


def compile_variants(compile_choice: str, config: RunConfig, device: torch.device) -> dict[str, bool]:
    """Optimized loops to time, by name: auto (``should_compile``), on, off, or both (eager and compiled)."""
    if compile_choice == "both":
        return {"eager": False, "compiled": True}
    compiled = should_compile(config, device, spec_for(config)) if compile_choice == "auto" else compile_choice == "on"
    return {"compiled" if compiled else "eager": compiled}


def warm_up(name: str, loop: TimedLoop, device: torch.device, steps: int, timings: Timings) -> None:
    t0 = time.perf_counter()
    for _ in range(steps):
        loop.step()
    synchronize(device)
    timings.warmup_s[name] = time.perf_counter() - t0
    timings.repeats[name] = []


def first_repeats(loops: dict[str, OptimizedLoop], device: torch.device, steps: int, warmup: int,
                  barrier: tuple[Path, int] | None, timings: Timings) -> None:
    """Each optimized loop's warm-up (compilation included) and first timed repeat, before anything else
    is built, so the peak memory read after the first one is its own."""
    for name, loop in loops.items():
        warm_up(name, loop, device, warmup, timings)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        if barrier is not None and name == list(loops)[-1]:
            wait_at_barrier(*barrier)
            timings.start_unix = time.time()
        timings.repeats[name].append(time_steps(loop, steps, device))
        if timings.peak_memory is None:
            cuda = device.type == "cuda"
            timings.peak_memory = torch.cuda.max_memory_allocated(device) if cuda else process_peak_rss_bytes()
            timings.peak_reserved = torch.cuda.max_memory_reserved(device) if cuda else None


def interleaved_repeats(loops: dict[str, TimedLoop], device: torch.device, steps: int, repeats: int,
                        timings: Timings) -> None:
    """The remaining repeats, one of each loop in turn, so load from other processes hits every loop alike.
    Round 0 is the naive loop's first repeat, next to the optimized loops' first ones."""
    for r in range(repeats):
        for name, loop in loops.items():
            if r > 0 or name == "naive":
                timings.repeats[name].append(time_steps(loop, steps, device))
    timings.end_unix = time.time()


def run_bench(config: RunConfig, *, steps: int = 10, repeats: int = 3, warmup: int = 3, compile_choice: str = "auto",
              compile_mode: str = "default", naive: bool = True, measure_eval: bool = True,
              barrier: tuple[Path, int] | None = None, config_name: str = "",
              measured_peak: bool = False) -> BenchResult:
    """Time the optimized step (and the naive baseline) on ``config``.
    With ``compile_choice`` both, the faster of eager and compiled is reported as the optimized step. ``measured_peak``:
    MFU against this device's measured matmul peak in the training dtype, not its data-sheet figure."""
    if steps < 1 or repeats < 1 or warmup < 1:
        raise LmtuneError("--steps, --repeats and --warmup must each be >= 1")
    m, t = config.model, config.train
    device = resolve_device(t.device)
    configure_backend(device)
    tokens = random_tokens(m.vocab_size, max(1 << 20, 4 * t.batch_size * (m.context_length + 1)), seed=t.seed)
    variants = compile_variants(compile_choice, config, device)
    optimized: dict[str, OptimizedLoop] = {}
    loops: dict[str, TimedLoop] = {}
    timings = Timings()
    try:
        for name, compiled in variants.items():
            loops[name] = optimized[name] = OptimizedLoop(config, device, tokens, compiled, compile_mode)
            if compiled and not optimized[name].runtime.compiled:
                log.warning("the compiled variant fell back to eager: its figures are eager ones")
        first_repeats(optimized, device, steps, warmup, barrier, timings)
        if naive:
            loops["naive"] = NaiveLoop(config, device, tokens)
            warm_up("naive", loops["naive"], device, warmup, timings)
        interleaved_repeats(loops, device, steps, repeats, timings)
        best = max(variants, key=lambda n: timings.rate(n, steps * config.tokens_per_step))
        primary = optimized[best]
        kernel = sdpa_kernel_used(m, device, primary.runtime.amp_dtype) if spec_for(config).model.exposes_layers \
            else "the model's own"
        host_syncs = count_host_syncs(primary)
        eval_s, eval_fraction = eval_cost(primary, config, tokens, timings, best, steps) if measure_eval \
            else (None, None)
        details = StepDetails(host_syncs, kernel, eval_s, eval_fraction)
    finally:
        for loop in loops.values():
            loop.close()
    return bench_result(config, config_name, device, timings, list(variants), best, primary, steps, repeats, warmup,
                        compile_mode, barrier is not None, details, measured_peak)


@dataclass(frozen=True)
class StepDetails:
    """What run_bench measures of the optimized step besides its speed."""

    host_syncs_per_step: int | None
    """Host syncs in one step (None off CUDA)."""
    attention_kernel: str
    """The kernel SDPA picks."""
    eval_s: float | None
    """Seconds per evaluation (None: not timed)."""
    eval_fraction: float | None
    """Evaluation's share of wall time (None: not timed)."""


def bench_result(config: RunConfig, config_name: str, device: torch.device, timings: Timings, variants: list[str],
                 best: str, primary: OptimizedLoop, steps: int, repeats: int, warmup: int, compile_mode: str,
                 with_barrier: bool, details: StepDetails, measured_peak: bool = False) -> BenchResult:
    m, t = config.model, config.train
    per_repeat = steps * config.tokens_per_step
    size = model_size(config)
    flops_tok = size.flops_per_token
    dtype = primary.runtime.amp_dtype or torch.float32
    peak = None if measured_peak else peak_flops(device, dtype)
    peak_source = f"data-sheet dense {'bf16' if dtype == torch.bfloat16 else 'float32'}"
    if peak is None:
        peak = measured_matmul_peak(device, dtype)
        peak_source = f"measured {str(dtype).removeprefix('torch.')} matmul on this device" + \
            ("" if measured_peak else " (no data-sheet figure)")
    tokens_per_s = timings.rate(best, per_repeat)
    walls, waits = zip(*timings.repeats[best], strict=True)
    step_s, wait_fraction = statistics.median(walls) / steps, sum(waits) / sum(walls)
    return BenchResult(
        config=config_name or config.budget, device=full_device_name(device), device_type=device.type,
        torch=torch.__version__, commit=git_commit(), batch_size=t.batch_size, context_length=m.context_length,
        params_non_embedding=size.non_embedding, steps=steps, repeats=repeats, warmup=warmup,
        tokens_per_s=tokens_per_s, mfu=tokens_per_s * flops_tok / peak, flops_per_token=flops_tok,
        peak_flops=peak, peak_flops_source=peak_source, optimized_variant=best,
        compile_mode=compile_mode if primary.runtime.compiled else None,
        precision=str(primary.runtime.amp_dtype).removeprefix("torch.") if primary.runtime.amp_dtype else "float32",
        attention_kernel=details.attention_kernel, host_syncs_per_step=details.host_syncs_per_step,
        step_s=step_s, data_wait_s=step_s * wait_fraction, compute_s=step_s * (1 - wait_fraction),
        data_wait_fraction=wait_fraction, peak_memory_bytes=timings.peak_memory,
        peak_memory_kind="cuda max_memory_allocated" if device.type == "cuda" else "process peak RSS",
        peak_reserved_bytes=timings.peak_reserved, warmup_s=timings.warmup_s, timed_tokens=repeats * per_repeat,
        # Other processes on the same cores slow every variant; the 1-minute load says how busy it was.
        load_avg_1m=os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        eval_s=details.eval_s, eval_fraction=details.eval_fraction,
        # Every repeat, so the spread (noise from other load) can be judged, not just the median.
        repeat_tokens_per_s={name: [per_repeat / wall for wall, _ in runs] for name, runs in timings.repeats.items()},
        variant_tokens_per_s={name: timings.rate(name, per_repeat) for name in variants},
        compile=CompileComparison(timings.rate("compiled", per_repeat) / timings.rate("eager", per_repeat),
                                  timings.paired("compiled", "eager")) if len(variants) == 2 else None,
        naive=_against_naive(timings, best, per_repeat, tokens_per_s),
        timed_span=cast(tuple[float, float], (timings.start_unix, timings.end_unix)) if with_barrier else None,
        model=config.code.describe(), flops_estimated=size.estimated,
    )


def _against_naive(timings: Timings, best: str, per_repeat: int, tokens_per_s: float) -> NaiveComparison | None:
    if "naive" not in timings.repeats:
        return None
    naive_walls, naive_waits = zip(*timings.repeats["naive"], strict=True)
    naive_tokens_per_s = timings.rate("naive", per_repeat)
    return NaiveComparison(naive_tokens_per_s, tokens_per_s / naive_tokens_per_s, timings.paired(best, "naive"),
                           sum(naive_waits) / sum(naive_walls))


def eval_cost(loop: OptimizedLoop, config: RunConfig, tokens: np.ndarray, timings: Timings, name: str,
              steps: int) -> tuple[float, float]:
    """Seconds per evaluation and its share of wall time at the config's eval_interval."""
    t = config.train
    step_s = statistics.median(wall for wall, _ in timings.repeats[name]) / steps
    batches = fixed_val_batches(tokens, t.batch_size, config.model.context_length, min(t.eval_batches, 3))
    evaluate(loop.runtime, batches[:1], t.grad_accum_steps)  # compiles the no-grad graph
    t0 = time.perf_counter()
    evaluate(loop.runtime, batches, t.grad_accum_steps)
    eval_s = (time.perf_counter() - t0) / len(batches) * t.eval_batches
    return eval_s, eval_s / (eval_s + t.eval_interval * step_s)


def fused_tokens_per_s(config: RunConfig, device: torch.device, members: int, steps: int, repeats: int,
                       warmup: int, compiled: bool) -> FusedTiming:
    """One fused process of ``members`` members: aggregate tokens/s (all members' tokens, median of
    ``repeats`` timings of ``steps`` steps after ``warmup`` untimed ones) and its peak memory."""
    tokens = random_tokens(config.model.vocab_size)
    loop = FusedLoop(config, device, tokens, members, compiled)
    try:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        for _ in range(warmup):
            loop.step()
        walls = sorted(time_steps(loop, steps, device)[0] for _ in range(repeats))
    finally:
        loop.close()
    wall = walls[len(walls) // 2]
    return FusedTiming(members, members * steps * config.tokens_per_step / wall,
                       torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None)
