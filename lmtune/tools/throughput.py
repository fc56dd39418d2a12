"""Throughput of lmtune's real training step against a naive baseline (the command: python -m lmtune.bench).

The optimized step is exactly the one training runs: ``TrainState.create``, ``Runtime.build`` (compile
when ``should_compile`` says so, or as ``--compile`` forces; bf16 autocast where the config's precision
enables it) and ``train_step``, with batches prefetched by ``DeviceBatches`` and no host sync on GPU.
The naive baseline is the loop most first implementations start from: the same model in float32,
eager, hand-written attention with an explicit mask, a batch built from Python lists every step, an
un-fused AdamW and a ``loss.item()`` per step. Both are timed in the same process, repeats
interleaved, after warm-up (and compilation), synchronized on CUDA; the median over repeats is reported.

``run_concurrency`` instead runs K worker processes at once (as fractional-GPU trials do) and
measures aggregate tokens/s and per-process memory for each K; lmtune.sweep.placement turns such
measurements into the sweep's packing.
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lmtune.data.batches import BatchSampler, DeviceBatches, fixed_val_batches
from lmtune.errors import LmtuneError
from lmtune.fused.state import FusedState
from lmtune.fused.step import fused_train_step
from lmtune.private_apis import sdpa_backend_name
from lmtune.training.compile import should_compile
from lmtune.training.config import ModelConfig, RunConfig, budget_config
from lmtune.training.device import configure_backend, device_name, peak_flops, resolve_device, synchronize
from lmtune.training.evaluate import evaluate
from lmtune.training.metrics import IntervalMeter
from lmtune.training.model import TransformerLM, count_parameters, flops_per_token
from lmtune.training.schedule import scheduled_lr
from lmtune.training.state import TrainState, seed_everything
from lmtune.training.step import Runtime, train_step

log = logging.getLogger(__name__)

# --budget names (bench): "default" is the CS336 model at the full budget's batch size.
CONFIGS = {"default": "full", "full": "full", "low-resource": "low-resource", "quick": "quick"}
COMPILE_MODES = ("default", "max-autotune", "reduce-overhead")
# Fields every bench JSON object carries (the tests check them; --record writes them).
REQUIRED_FIELDS = (
    "config", "device", "torch", "commit", "batch_size", "context_length", "tokens_per_s", "mfu",
    "naive_tokens_per_s", "speedup_vs_naive", "data_wait_fraction", "peak_memory_bytes",
)


# ---------------------------------------------------------------------------------------------
# Configuration and environment


def bench_config(name: str, batch_size: int | None = None, overrides: dict[str, Any] | None = None,
                 device: str = "auto", compile_choice: str = "auto") -> RunConfig:
    if name not in CONFIGS:
        raise LmtuneError(f"unknown --budget '{name}'; choose one of {', '.join(CONFIGS)}")
    merged = dict(overrides or {})
    if batch_size is not None:
        merged["batch_size"] = batch_size
    merged.setdefault("device", device)
    if compile_choice in ("on", "off", "auto"):
        merged.setdefault("compile", compile_choice)
    config = budget_config(CONFIGS[name], merged)
    config.vocab_from_data = False
    return config


def random_tokens(vocab_size: int, n: int = 1 << 20, seed: int = 0) -> np.ndarray:
    """Uniform random token ids: throughput does not depend on the text, so no corpus is needed."""
    if vocab_size > 65536:
        raise LmtuneError(f"vocab_size {vocab_size} does not fit uint16 tokens; bench a vocab_size <= 65536")
    return np.random.default_rng(seed).integers(0, vocab_size, size=n, dtype=np.uint16)


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def full_device_name(device: torch.device) -> str:
    """device_name, with the CPU's model name where /proc/cpuinfo gives one."""
    name = device_name(device)
    if device.type != "cpu":
        return name
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} {name}"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()} {name}"


def process_peak_rss_bytes() -> int:
    # ru_maxrss is KiB on Linux, bytes on macOS.
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def measured_matmul_peak(device: torch.device, dtype: torch.dtype, n: int | None = None, repeats: int = 5) -> float:
    """Best FLOP/s of an n^3 matmul: the MFU denominator where no data-sheet peak is known."""
    n = n or (8192 if device.type == "cuda" else 1024)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    synchronize(device)
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best


def sdpa_kernel_used(config: ModelConfig, device: torch.device, dtype: torch.dtype | None, batch: int = 2) -> str:
    """The attention kernel SDPA picks for this head_dim, dtype and device."""
    head_dim = config.d_model // config.n_heads
    shape = (batch, config.n_heads, config.context_length, head_dim)
    q = torch.randn(shape, device=device, dtype=dtype or torch.float32, requires_grad=True)
    try:
        name = sdpa_backend_name(q, q, q)
    except (AttributeError, RuntimeError) as err:
        return f"unknown ({err})"
    return f"{name} (head_dim {head_dim}, {str(q.dtype).removeprefix('torch.')})"


# ---------------------------------------------------------------------------------------------
# The two training loops


class OptimizedLoop:
    """lmtune's training step, as the training loop runs it: the same state, runtime and train_step."""

    def __init__(self, config: RunConfig, device: torch.device, tokens: np.ndarray, compiled: bool,
                 compile_mode: str = "default"):
        m, t = config.model, config.train
        self.config, self.device = config, device
        self.state = TrainState.create(config, device)
        self.runtime = Runtime.build(self.state.model, config, device, compile_mode, compiled=compiled)
        self.batches = DeviceBatches(BatchSampler(tokens, t.batch_size, m.context_length, t.seed), device)
        self.meter = IntervalMeter(device, config.tokens_per_step, flops_per_token(m), None)
        self.wait_s = 0.0

    def step(self) -> None:
        t = self.config.train
        x, y = self.batches.next()
        self.wait_s += self.batches.last_wait_s
        lr = scheduled_lr(self.state.step, t)
        self.meter.add(self.state.step + 1, train_step(self.state, self.runtime, x, y, lr, t), 0.0)

    def close(self) -> None:
        self.batches.close()


class NaiveLoop:
    """The usual "before": float32, eager, explicit-mask attention, per-step host batches from Python
    lists, AdamW without foreach/fused kernels, and the loss read back every step."""

    def __init__(self, config: RunConfig, device: torch.device, tokens: np.ndarray):
        t = config.train
        self.config, self.device, self.tokens = config, device, tokens
        seed_everything(t.seed)
        self.model = TransformerLM(config.model).to(device)
        for block in self.model.blocks:
            block.attn.use_sdpa = False
        decay = [p for p in self.model.parameters() if p.ndim >= 2]
        no_decay = [p for p in self.model.parameters() if p.ndim < 2]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": t.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=t.lr, betas=(t.beta1, t.beta2), eps=t.eps, foreach=False, fused=False)
        self.params = list(self.model.parameters())
        self.rng = np.random.default_rng(t.seed)
        self.wait_s = 0.0

    def _batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        b, ctx = self.config.train.batch_size, self.config.model.context_length
        xs, ys = [], []
        for _ in range(b):
            start = int(self.rng.integers(0, len(self.tokens) - ctx - 1))
            window = [int(v) for v in self.tokens[start:start + ctx + 1]]
            xs.append(window[:-1])
            ys.append(window[1:])
        return torch.tensor(xs, dtype=torch.long).to(self.device), torch.tensor(ys, dtype=torch.long).to(self.device)

    def step(self) -> None:
        t0 = time.perf_counter()
        x, y = self._batch()
        self.wait_s += time.perf_counter() - t0
        loss = self.model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, self.config.train.grad_clip, foreach=False)
        self.optimizer.step()
        self.optimizer.zero_grad()
        loss.item()

    def close(self) -> None:
        pass


class FusedLoop:
    """K members of the config fused into one model (lmtune.fused), LRs spread 2x apart around the
    config's: the fused loop's step as ``train_fused`` runs it, one batch shared by every member."""

    def __init__(self, config: RunConfig, device: torch.device, tokens: np.ndarray, members: int, compiled: bool):
        m, t = config.model, config.train
        self.config, self.device, self.members = config, device, members
        configs = []
        for k in range(members):
            member = RunConfig.from_dict(config.to_dict())
            member.train.lr = t.lr * 2.0 ** (k - (members - 1) / 2)
            configs.append(member)
        self.state = FusedState.create(configs, device)
        self.runtime = Runtime.build(self.state.model, config, device, compiled=compiled)
        self.batches = DeviceBatches(BatchSampler(tokens, t.batch_size, m.context_length, t.seed), device)
        self.lrs = torch.tensor([c.train.lr for c in configs], device=device)
        self.wait_s = 0.0

    def step(self) -> None:
        x, y = self.batches.next()
        self.wait_s += self.batches.last_wait_s
        fused_train_step(self.state, self.runtime, x, y, self.lrs, self.config.train.grad_accum_steps)

    def close(self) -> None:
        self.batches.close()


def fused_tokens_per_s(config: RunConfig, device: torch.device, members: int, steps: int, repeats: int,
                       warmup: int, compiled: bool) -> dict[str, Any]:
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
    return {"k": members, "fused_aggregate_tokens_per_s": members * steps * config.tokens_per_step / wall,
            "fused_peak_memory_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None}


def time_steps(loop, steps: int, device: torch.device) -> tuple[float, float]:
    """(wall seconds, data-wait seconds) of ``steps`` steps, synchronized at both ends."""
    synchronize(device)
    loop.wait_s = 0.0
    t0 = time.perf_counter()
    for _ in range(steps):
        loop.step()
    synchronize(device)
    return time.perf_counter() - t0, loop.wait_s


def count_host_syncs(loop: OptimizedLoop) -> int | None:
    """Host syncs in one optimized step (CUDA only: torch's sync debug mode warns on each)."""
    if loop.device.type != "cuda":
        return None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            loop.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message).lower() for w in caught)


def wait_at_barrier(directory: Path, count: int, timeout_s: float = 900.0) -> None:
    """Concurrency workers meet here after warm-up, so their timed phases overlap."""
    (directory / f"ready-{os.getpid()}").touch()
    deadline = time.monotonic() + timeout_s
    while len(list(directory.glob("ready-*"))) < count:
        if time.monotonic() > deadline:
            raise LmtuneError(f"concurrency barrier: only {len(list(directory.glob('ready-*')))} of {count} "
                              "workers got ready; lower --concurrency or check worker errors")
        time.sleep(0.05)


# ---------------------------------------------------------------------------------------------
# The benchmark


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
    compiled = should_compile(config, device) if compile_choice == "auto" else compile_choice == "on"
    return {"compiled" if compiled else "eager": compiled}


def warm_up(name: str, loop, device: torch.device, steps: int, timings: Timings) -> None:
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


def interleaved_repeats(loops: dict[str, Any], device: torch.device, steps: int, repeats: int,
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
              barrier: tuple[Path, int] | None = None, config_name: str = "") -> dict[str, Any]:
    """Time the optimized step (and the naive baseline) on ``config``; one result dict (see REQUIRED_FIELDS).
    With ``compile_choice`` both, the faster of eager and compiled is reported as the optimized step."""
    if steps < 1 or repeats < 1 or warmup < 1:
        raise LmtuneError("--steps, --repeats and --warmup must each be >= 1")
    m, t = config.model, config.train
    device = resolve_device(t.device)
    configure_backend(device)
    tokens = random_tokens(m.vocab_size, max(1 << 20, 4 * t.batch_size * (m.context_length + 1)), seed=t.seed)
    variants = compile_variants(compile_choice, config, device)
    loops: dict[str, Any] = {}
    timings = Timings()
    try:
        for name, compiled in variants.items():
            loops[name] = OptimizedLoop(config, device, tokens, compiled, compile_mode)
            if compiled and not loops[name].runtime.compiled:
                log.warning("the compiled variant fell back to eager: its figures are eager ones")
        first_repeats(dict(loops), device, steps, warmup, barrier, timings)
        if naive:
            loops["naive"] = NaiveLoop(config, device, tokens)
            warm_up("naive", loops["naive"], device, warmup, timings)
        interleaved_repeats(loops, device, steps, repeats, timings)
        best = max(variants, key=lambda n: timings.rate(n, steps * config.tokens_per_step))
        primary: OptimizedLoop = loops[best]
        extra = {"host_syncs_per_step": count_host_syncs(primary),
                 "attention_kernel": sdpa_kernel_used(m, device, primary.runtime.amp_dtype)}
        extra["eval_s"], extra["eval_fraction"] = eval_cost(primary, config, tokens, timings, best, steps) \
            if measure_eval else (None, None)
    finally:
        for loop in loops.values():
            loop.close()
    return bench_result(config, config_name, device, timings, variants, best, primary, steps, repeats, warmup,
                        compile_mode, barrier is not None, extra)


def bench_result(config: RunConfig, config_name: str, device: torch.device, timings: Timings,
                 variants: dict[str, bool], best: str, primary: OptimizedLoop, steps: int, repeats: int, warmup: int,
                 compile_mode: str, with_barrier: bool, extra: dict[str, Any]) -> dict[str, Any]:
    m, t = config.model, config.train
    per_repeat = steps * config.tokens_per_step
    flops_tok = flops_per_token(m)
    dtype = primary.runtime.amp_dtype or torch.float32
    peak = peak_flops(device, dtype)
    peak_source = f"data-sheet dense {'bf16' if dtype == torch.bfloat16 else 'float32'}"
    if peak is None:
        peak = measured_matmul_peak(device, dtype)
        peak_source = f"measured {str(dtype).removeprefix('torch.')} matmul on this device (no data-sheet figure)"
    tokens_per_s = timings.rate(best, per_repeat)
    walls, waits = zip(*timings.repeats[best], strict=True)
    step_s, wait_fraction = statistics.median(walls) / steps, sum(waits) / sum(walls)
    result: dict[str, Any] = {
        "config": config_name or config.budget, "device": full_device_name(device), "device_type": device.type,
        "torch": torch.__version__, "commit": git_commit(), "batch_size": t.batch_size,
        "context_length": m.context_length, "params_non_embedding": count_parameters(m)["non_embedding"],
        "steps": steps, "repeats": repeats, "warmup": warmup,
        "tokens_per_s": tokens_per_s, "mfu": tokens_per_s * flops_tok / peak, "flops_per_token": flops_tok,
        "peak_flops": peak, "peak_flops_source": peak_source,
        "optimized_variant": best, "compile_mode": compile_mode if primary.runtime.compiled else None,
        "precision": str(primary.runtime.amp_dtype).removeprefix("torch.") if primary.runtime.amp_dtype else "float32",
        "step_s": step_s, "data_wait_s": step_s * wait_fraction, "compute_s": step_s * (1 - wait_fraction),
        "data_wait_fraction": wait_fraction, "peak_memory_bytes": timings.peak_memory,
        "peak_memory_kind": "cuda max_memory_allocated" if device.type == "cuda" else "process peak RSS",
        "peak_reserved_bytes": timings.peak_reserved, "warmup_s": timings.warmup_s,
        "timed_tokens": repeats * per_repeat,
        # Other processes on the same cores slow every variant; the 1-minute load says how busy it was.
        "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None, **extra,
    }
    for name in timings.repeats:
        # Every repeat, so the spread (noise from other load) can be judged, not just the median.
        result[f"{name}_repeat_tokens_per_s"] = [per_repeat / wall for wall, _ in timings.repeats[name]]
    for name in variants:
        result[f"{name}_tokens_per_s"] = timings.rate(name, per_repeat)
    if len(variants) == 2:
        result["compile_speedup"] = result["compiled_tokens_per_s"] / result["eager_tokens_per_s"]
        result["compile_speedup_paired"] = timings.paired("compiled", "eager")
    if "naive" in timings.repeats:
        naive_walls, naive_waits = zip(*timings.repeats["naive"], strict=True)
        result["naive_tokens_per_s"] = timings.rate("naive", per_repeat)
        result["speedup_vs_naive"] = tokens_per_s / result["naive_tokens_per_s"]
        result["speedup_vs_naive_paired"] = timings.paired(best, "naive")
        result["naive_data_wait_fraction"] = sum(naive_waits) / sum(naive_walls)
    if with_barrier:
        result["timed_start_unix"], result["timed_end_unix"] = timings.start_unix, timings.end_unix
    return result


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


# ---------------------------------------------------------------------------------------------
# Concurrency


def run_concurrency(ks: list[int], worker_args: list[str], device: torch.device,
                    timeout_s: float = 1800.0) -> list[dict[str, Any]]:
    """For each K, K worker processes running the optimized step at once; aggregate tokens/s is all
    timed tokens over the span from the first worker's timed start to the last one's end."""
    rows = []
    for k in ks:
        with tempfile.TemporaryDirectory(prefix="lmtune-bench-") as barrier:
            cmd = [sys.executable, "-m", "lmtune.bench", *worker_args, "--worker", "--json",
                   "--barrier", barrier, "--barrier-count", str(k)]
            env = dict(os.environ)
            if device.type == "cpu":
                # K processes on the same cores: split the threads instead of oversubscribing them.
                env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // k))
            procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                     for _ in range(k)]
            results = []
            for proc in procs:
                out, err = proc.communicate(timeout=timeout_s)
                if proc.returncode != 0:
                    tail = (err.strip().splitlines() or ["no output"])[-1]
                    raise LmtuneError(f"concurrency {k}: a worker failed ({tail}); try a smaller K or batch size")
                results.append(json.loads(out.strip().splitlines()[-1]))
        span = max(r["timed_end_unix"] for r in results) - min(r["timed_start_unix"] for r in results)
        rows.append({
            "k": k, "aggregate_tokens_per_s": sum(r["timed_tokens"] for r in results) / span,
            "per_process_tokens_per_s": [r["tokens_per_s"] for r in results],
            "per_process_peak_memory_bytes": max(r["peak_memory_bytes"] for r in results),
            "per_process_peak_reserved_bytes": max((r["peak_reserved_bytes"] or 0) for r in results) or None,
        })
    return rows
