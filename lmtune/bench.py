"""Throughput of lmtune's real training step against a naive baseline. Also ``python -m lmtune.bench``.

The optimized step is the one ``lmtune.train`` runs: TransformerLM with SDPA, ``build_optimizer``,
``compile_model`` when ``should_compile`` says so (or as ``--compile`` forces), bf16 autocast where
``autocast_dtype`` enables it, batches prefetched by ``DeviceBatches``, no host sync on GPU. The naive
baseline is what the seeds ran: the same model in float32, eager, hand-written attention with an
explicit mask, a batch built from Python lists every step, an un-fused AdamW and a ``loss.item()``
per step. Both are timed in the same process, repeats interleaved, after warm-up (and compilation),
synchronized on CUDA; the median over repeats is reported.

``--concurrency 1,2,4`` instead runs K worker processes at once (as fractional-GPU trials do) and
reports aggregate tokens/s and per-process memory for each K; ``recommend_trials_per_gpu`` turns
such measurements into the sweep's default packing.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lmtune.config import ModelConfig, RunConfig, budget_config, parse_set_args
from lmtune.data import BatchSampler, DeviceBatches, fixed_val_batches
from lmtune.errors import LmtuneError, cli_entry, setup_cli_logging
from lmtune.hardware import device_name, peak_flops, resolve_device
from lmtune.model import TransformerLM, count_parameters, flops_per_token
from lmtune.schedule import lr_at
from lmtune.train import (
    autocast_dtype,
    build_optimizer,
    compile_model,
    configure_backend,
    evaluate,
    forward_backward,
    seed_everything,
    should_compile,
)

log = logging.getLogger(__name__)

# --config names: "default" is the CS336 model at the full budget's batch size.
CONFIGS = {"default": "full", "full": "full", "low-resource": "low-resource", "quick": "quick"}
DEFAULT_RESULTS = Path("benchmarks/results.jsonl")
COMPILE_MODES = ("default", "max-autotune", "reduce-overhead")
# Fields every bench JSON object carries (the tests check them; --record writes them).
REQUIRED_FIELDS = (
    "config", "device", "torch", "commit", "batch_size", "context_length", "tokens_per_s", "mfu",
    "naive_tokens_per_s", "speedup_vs_naive", "data_wait_fraction", "peak_memory_bytes",
)
# Per-process CUDA context, cuBLAS workspace and allocator slack that torch's allocator does not count.
CUDA_CONTEXT_BYTES = 600 * 2**20
# Share of GPU memory left free when packing trials: allocator fragmentation and eval-time spikes.
MEMORY_HEADROOM = 0.10
# A higher K must beat the best smaller K by this much to be worth its slower individual trials.
PACKING_MIN_GAIN = 0.05
# Without measurements, pack at most this many trials per GPU (time-slicing gains flatten out).
UNMEASURED_MAX_TRIALS = 4


# ---------------------------------------------------------------------------------------------
# Configuration and environment


def bench_config(name: str, batch_size: int | None = None, overrides: dict[str, Any] | None = None,
                 device: str = "auto", compile_choice: str = "auto") -> RunConfig:
    if name not in CONFIGS:
        raise LmtuneError(f"unknown --config '{name}'; choose one of {', '.join(CONFIGS)}")
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


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


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
    """The backend ``F.scaled_dot_product_attention`` picks for this head_dim, dtype and device: flash,
    efficient, cudnn or math (the unfused fallback, which materializes the T x T scores)."""
    from torch.nn.attention import SDPBackend

    head_dim = config.d_model // config.n_heads
    shape = (batch, config.n_heads, config.context_length, head_dim)
    q = torch.randn(shape, device=device, dtype=dtype or torch.float32, requires_grad=True)
    try:
        # The same private dispatcher SDPA itself consults; public API offers no way to ask.
        choice = torch._fused_sdp_choice(q, q, q, is_causal=True)
    except (AttributeError, RuntimeError) as err:
        return f"unknown ({err})"
    backend = SDPBackend(choice) if isinstance(choice, int) else choice
    return f"{backend.name.lower()} (head_dim {head_dim}, {str(q.dtype).removeprefix('torch.')})"


# ---------------------------------------------------------------------------------------------
# The two training loops


class OptimizedLoop:
    """lmtune.train's hot loop, step for step (lr set, prefetched batch, forward_backward, device-side
    non-finite bookkeeping, optimizer step)."""

    def __init__(self, config: RunConfig, device: torch.device, tokens: np.ndarray, compiled: bool,
                 compile_mode: str = "default"):
        m, t = config.model, config.train
        self.config, self.device = config, device
        seed_everything(t.seed)
        self.model = TransformerLM(m).to(device)
        self.optimizer = build_optimizer(self.model, config, device)
        self.amp_dtype = autocast_dtype(config, device)
        if not compiled:
            self.run_model = self.model
        elif compile_mode == "default":
            self.run_model = compile_model(self.model, device)
        else:
            self.run_model = torch.compile(self.model, mode=compile_mode)
        self.compiled = self.run_model is not self.model
        self.params = list(self.model.parameters())
        self.batches = DeviceBatches(BatchSampler(tokens, t.batch_size, m.context_length, t.seed), device)
        self.loss_sum = torch.zeros((), device=device)
        self.first_bad = torch.full((), -1, dtype=torch.long, device=device)
        self.step_index = 0
        self.wait_s = 0.0

    def step(self) -> None:
        t = self.config.train
        lr = lr_at(self.step_index, t.lr, t.min_lr_ratio, t.warmup_steps, t.steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        x, y = self.batches.next()
        self.wait_s += self.batches.last_wait_s
        loss, grad_norm = forward_backward(self.run_model, self.params, x, y, self.amp_dtype, t.grad_clip)
        bad = ~(torch.isfinite(loss) & torch.isfinite(grad_norm))
        if self.device.type == "cpu":
            bad.item()  # the real loop checks every step on CPU, where a sync costs nothing
        self.step_index += 1
        self.first_bad = torch.where(bad & (self.first_bad < 0), torch.full_like(self.first_bad, self.step_index),
                                     self.first_bad)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.loss_sum += loss.float()

    def close(self) -> None:
        self.batches.close()


class NaiveLoop:
    """The seeds' "before": float32, eager, explicit-mask attention, per-step host batches from
    Python lists, AdamW without foreach/fused kernels, and the loss read back every step."""

    def __init__(self, config: RunConfig, device: torch.device, tokens: np.ndarray):
        m, t = config.model, config.train
        self.config, self.device, self.tokens = config, device, tokens
        seed_everything(t.seed)
        self.model = TransformerLM(m).to(device)
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


def run_bench(config: RunConfig, *, steps: int = 10, repeats: int = 3, warmup: int = 3, compile_choice: str = "auto",
              compile_mode: str = "default", naive: bool = True, measure_eval: bool = True,
              barrier: tuple[Path, int] | None = None, config_name: str = "") -> dict[str, Any]:
    """Time the optimized step (and the naive baseline) on ``config``; one result dict (see REQUIRED_FIELDS).

    ``compile_choice``: auto (``should_compile``), on, off, or both (time eager and compiled
    optimized loops and report the faster as "the" optimized step).
    """
    if steps < 1 or repeats < 1 or warmup < 1:
        raise LmtuneError("--steps, --repeats and --warmup must each be >= 1")
    m, t = config.model, config.train
    device = resolve_device(t.device)
    configure_backend(device)
    tokens = random_tokens(m.vocab_size, max(1 << 20, 4 * t.batch_size * (m.context_length + 1)), seed=t.seed)
    tokens_per_step = t.batch_size * m.context_length
    if compile_choice == "both":
        variants = {"eager": False, "compiled": True}
    elif compile_choice == "auto":
        variants = {"compiled" if should_compile(config, device) else "eager": should_compile(config, device)}
    else:
        variants = {"compiled" if compile_choice == "on" else "eager": compile_choice == "on"}

    loops: dict[str, Any] = {}
    warmup_s: dict[str, float] = {}
    times: dict[str, list[tuple[float, float]]] = {}
    peak_memory = peak_reserved = None
    try:
        # The optimized loops first, one repeat each before anything else exists, so the peak
        # memory read afterwards is theirs alone.
        for name, compiled in variants.items():
            loops[name] = loop = OptimizedLoop(config, device, tokens, compiled, compile_mode)
            if compiled and not loop.compiled:
                log.warning("the compiled variant fell back to eager: its figures are eager ones")
            t0 = time.perf_counter()
            for _ in range(warmup):
                loop.step()
            synchronize(device)
            warmup_s[name] = time.perf_counter() - t0
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            if barrier is not None and name == list(variants)[-1]:
                wait_at_barrier(*barrier)
                timed_start = time.time()
            times[name] = [time_steps(loop, steps, device)]
            if peak_memory is None:
                if device.type == "cuda":
                    peak_memory = torch.cuda.max_memory_allocated(device)
                    peak_reserved = torch.cuda.max_memory_reserved(device)
                else:
                    peak_memory = process_peak_rss_bytes()
        if naive:
            loops["naive"] = NaiveLoop(config, device, tokens)
            for _ in range(warmup):
                loops["naive"].step()
            times["naive"] = []
        # Interleaved repeats, so load from other processes hits every variant alike.
        for r in range(repeats):
            for name, loop in loops.items():
                if r == 0 and name != "naive":
                    continue
                times[name].append(time_steps(loop, steps, device))
        timed_end = time.time()

        def rate(name: str) -> float:
            return statistics.median(steps * tokens_per_step / wall for wall, _ in times[name])

        rates = {name: rate(name) for name in times}
        best = max((n for n in variants), key=lambda n: rates[n])
        primary: OptimizedLoop = loops[best]
        walls = [wall for wall, _ in times[best]]
        waits = [wait for _, wait in times[best]]
        step_s = statistics.median(walls) / steps
        wait_fraction = sum(waits) / sum(walls)
        host_syncs = count_host_syncs(primary)
        eval_fraction = eval_s = None
        if measure_eval:
            eval_s, eval_fraction = _eval_cost(primary, config, tokens, step_s)
        attention = sdpa_kernel_used(m, device, primary.amp_dtype)
    finally:
        for loop in loops.values():
            loop.close()

    flops_tok = flops_per_token(m)
    peak = peak_flops(device)
    peak_source = "data-sheet dense bf16"
    if peak is None:
        dtype = primary.amp_dtype or torch.float32
        peak = measured_matmul_peak(device, dtype)
        peak_source = f"measured {str(dtype).removeprefix('torch.')} matmul on this device (no data-sheet figure)"
    tokens_per_s = rates[best]
    result: dict[str, Any] = {
        "config": config_name or config.budget, "device": full_device_name(device), "device_type": device.type,
        "torch": torch.__version__, "commit": git_commit(), "batch_size": t.batch_size,
        "context_length": m.context_length, "params_non_embedding": count_parameters(m)["non_embedding"],
        "steps": steps, "repeats": repeats, "warmup": warmup,
        "tokens_per_s": tokens_per_s, "mfu": tokens_per_s * flops_tok / peak, "flops_per_token": flops_tok,
        "peak_flops": peak, "peak_flops_source": peak_source,
        "optimized_variant": best, "compile_mode": compile_mode if primary.compiled else None,
        "precision": str(primary.amp_dtype).removeprefix("torch.") if primary.amp_dtype else "float32",
        "attention_kernel": attention, "step_s": step_s, "data_wait_s": step_s * wait_fraction,
        "compute_s": step_s * (1 - wait_fraction), "data_wait_fraction": wait_fraction,
        "peak_memory_bytes": peak_memory,
        "peak_memory_kind": "cuda max_memory_allocated" if device.type == "cuda" else "process peak RSS",
        "peak_reserved_bytes": peak_reserved, "host_syncs_per_step": host_syncs,
        "warmup_s": warmup_s, "eval_s": eval_s, "eval_fraction": eval_fraction,
        "timed_tokens": steps * repeats * tokens_per_step,
        # Other processes on the same cores slow every variant; the 1-minute load says how busy it was.
        "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }
    for name in times:
        # Every repeat, so the spread (noise from other load) can be judged, not just the median.
        result[f"{name}_repeat_tokens_per_s"] = [steps * tokens_per_step / wall for wall, _ in times[name]]
    for name in variants:
        result[f"{name}_tokens_per_s"] = rates[name]
    def paired(a: str, b: str) -> float:
        # Repeat i of a and of b ran next to each other, under the same outside load; the median of
        # their ratios is robust to load that drifts over the run, unlike the ratio of the medians.
        pairs = zip(times[a], times[b], strict=True)
        return statistics.median(wall_b / wall_a for (wall_a, _), (wall_b, _) in pairs)

    if len(variants) == 2:
        result["compile_speedup"] = rates["compiled"] / rates["eager"]
        result["compile_speedup_paired"] = paired("compiled", "eager")
    if naive:
        result["naive_tokens_per_s"] = rates["naive"]
        result["speedup_vs_naive"] = tokens_per_s / rates["naive"]
        result["speedup_vs_naive_paired"] = paired(best, "naive")
        naive_walls = [w for w, _ in times["naive"]]
        result["naive_data_wait_fraction"] = sum(w for _, w in times["naive"]) / sum(naive_walls)
    if barrier is not None:
        result["timed_start_unix"], result["timed_end_unix"] = timed_start, timed_end
    return result


def _eval_cost(loop: OptimizedLoop, config: RunConfig, tokens: np.ndarray, step_s: float) -> tuple[float, float]:
    """Seconds per evaluation and its share of wall time at the config's eval_interval."""
    t = config.train
    batches = fixed_val_batches(tokens, t.batch_size, config.model.context_length, min(t.eval_batches, 3), seed=1)
    evaluate(loop.run_model, batches[:1], loop.device, loop.amp_dtype)  # compiles the no-grad graph
    t0 = time.perf_counter()
    evaluate(loop.run_model, batches, loop.device, loop.amp_dtype)
    eval_s = (time.perf_counter() - t0) / len(batches) * t.eval_batches
    return eval_s, eval_s / (eval_s + t.eval_interval * step_s)


# ---------------------------------------------------------------------------------------------
# Concurrency and packing


def run_concurrency(ks: list[int], worker_args: list[str], device: torch.device,
                    timeout_s: float = 1800.0) -> list[dict[str, Any]]:
    """For each K, K worker processes running the optimized step at once; aggregate tokens/s is all
    timed tokens over the span from the first worker's timed start to the last one's end."""
    import tempfile

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


def estimate_trial_memory_bytes(model_config: ModelConfig, batch_size: int, amp: bool) -> int:
    """Device memory of one training trial, without the CUDA context.

    Persistent: float32 parameters, gradients and AdamW's two moments = 16 bytes per parameter.
    Activations kept for backward, per token and layer: about 10 d_model-sized tensors (norm inputs,
    q/k/v before and after RoPE, attention output, residuals) and 4 d_ff-sized ones (gate, up, SiLU,
    product), at 2 bytes under bf16 autocast, 4 without; attention itself adds nothing with a fused
    SDPA kernel. The output layer keeps the logits (2 or 4 bytes) plus the float32 copy the loss
    computes in and its gradient (8 bytes) per vocabulary entry. Plus 20% for allocator fragmentation.
    """
    m = model_config
    params = count_parameters(m)["total"]
    act_bytes = 2 if amp else 4
    tokens = batch_size * m.context_length
    per_token = m.n_layers * (10 * m.d_model + 4 * m.d_ff) * act_bytes + m.vocab_size * (act_bytes + 8)
    return int(1.2 * (16 * params + tokens * per_token))


def recommend_trials_per_gpu(memory_per_trial_bytes: int, gpu_memory_bytes: int,
                             measured: dict[int, float] | None = None) -> int:
    """Trials to run at once on one GPU.

    Memory bound: K trials fit when K * (trial memory + CUDA context) <= 90% of the GPU. With
    ``measured`` (K -> aggregate tokens/s from ``--concurrency``), take the K that fits with the
    highest aggregate, except that a larger K must beat the best smaller one by 5%: more trials
    at once make each trial slower, which delays ASHA's early decisions for little gain. Without
    measurements, the memory bound capped at 4.
    """
    per_trial = memory_per_trial_bytes + CUDA_CONTEXT_BYTES
    fits = max(1, int((1 - MEMORY_HEADROOM) * gpu_memory_bytes // per_trial))
    if not measured:
        return min(fits, UNMEASURED_MAX_TRIALS)
    candidates = sorted(k for k in measured if 1 <= k <= fits)
    if not candidates:
        return 1
    choice = candidates[0]
    for k in candidates[1:]:
        if measured[k] > (1 + PACKING_MIN_GAIN) * measured[choice]:
            choice = k
    return choice


# ---------------------------------------------------------------------------------------------
# CLI


def _fmt_bytes(n: float | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:,.0f} MiB"


def format_result(r: dict[str, Any]) -> str:
    lines = [
        f"lmtune bench: config {r['config']}, batch {r['batch_size']} x context {r['context_length']}, "
        f"{r['params_non_embedding'] / 1e6:.2f}M non-embedding params",
        f"device {r['device']}, torch {r['torch']}, commit {r['commit']}"
        + (f", load average {r['load_avg_1m']:.1f}" if r.get("load_avg_1m") is not None else ""),
        f"optimized ({r['optimized_variant']}"
        + (f", mode {r['compile_mode']}" if r.get("compile_mode") else "")
        + f", {r['precision']}, attention {r['attention_kernel']}): {r['tokens_per_s']:,.0f} tokens/s",
        f"  step {r['step_s'] * 1e3:.1f} ms = data wait {r['data_wait_s'] * 1e3:.2f} ms "
        f"({100 * r['data_wait_fraction']:.1f}%) + compute {r['compute_s'] * 1e3:.1f} ms",
        f"  MFU {100 * r['mfu']:.1f}% = tokens/s x FLOPs/token / peak = {r['tokens_per_s']:,.0f} x "
        f"{r['flops_per_token'] / 1e6:.2f} MFLOP / {r['peak_flops'] / 1e12:.3g} TFLOP/s ({r['peak_flops_source']})",
        f"  peak memory {_fmt_bytes(r['peak_memory_bytes'])} ({r['peak_memory_kind']})",
    ]
    if r.get("host_syncs_per_step") is not None:
        lines.append(f"  host syncs per step: {r['host_syncs_per_step']}")
    if r.get("eval_fraction") is not None:
        lines.append(f"  eval: {r['eval_s']:.2f} s per evaluation = {100 * r['eval_fraction']:.1f}% of wall time")
    if "compile_speedup" in r:
        lines.append(f"  eager {r['eager_tokens_per_s']:,.0f} tokens/s, compiled {r['compiled_tokens_per_s']:,.0f} "
                     f"tokens/s: compiled/eager {r['compile_speedup']:.2f}x "
                     f"(paired repeats {r['compile_speedup_paired']:.2f}x) "
                     f"(compile warm-up {r['warmup_s']['compiled']:.1f} s)")
    if "naive_tokens_per_s" in r:
        lines.append(f"naive (float32, eager, explicit-mask attention, host-built batches, plain AdamW): "
                     f"{r['naive_tokens_per_s']:,.0f} tokens/s")
        lines.append(f"optimized / naive: {r['speedup_vs_naive']:.2f}x "
                     f"(median of paired repeats {r['speedup_vs_naive_paired']:.2f}x)")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lmtune.bench", description="Time lmtune's training step.")
    p.add_argument("--config", default="default", choices=list(CONFIGS), help="model/budget (default: default)")
    p.add_argument("--batch-size", type=int, help="batch size (default: the config's)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per repeat (default 10)")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats; the median is reported (default 3)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first, compilation included (default 3)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps (default auto)")
    p.add_argument("--compile", default="auto", choices=["auto", "on", "off", "both"],
                   help="auto: as training decides; both: time eager and compiled, report the faster")
    p.add_argument("--compile-mode", default="default", choices=COMPILE_MODES)
    p.add_argument("--set", action="append", metavar="KEY=VALUE", default=[], help="override a config field")
    p.add_argument("--no-naive", action="store_true", help="skip the naive baseline")
    p.add_argument("--no-eval", action="store_true", help="skip timing the evaluation")
    p.add_argument("--concurrency", help="comma-separated K values: run K training processes at once")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--record", action="store_true", help="append the JSON object to --results-file")
    p.add_argument("--results-file", type=Path, default=DEFAULT_RESULTS, help=f"default {DEFAULT_RESULTS}")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--barrier", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--barrier-count", type=int, default=1, help=argparse.SUPPRESS)
    return p


def _parse_ks(text: str) -> list[int]:
    try:
        ks = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        ks = []
    if not ks or min(ks) < 1:
        raise LmtuneError(f"--concurrency {text!r}: give positive integers separated by commas, e.g. 1,2,4,8")
    return ks


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
    overrides = parse_set_args(args.set)
    compile_choice = "auto" if args.compile == "both" else args.compile
    config = bench_config(args.config, args.batch_size, overrides, args.device, compile_choice)
    if args.concurrency:
        return _main_concurrency(args, config, _command(argv))
    if args.worker and args.compile == "both":
        raise LmtuneError("--compile both cannot be used with --concurrency; choose on, off or auto")
    result = run_bench(
        config, steps=args.steps, repeats=args.repeats, warmup=args.warmup, compile_choice=args.compile,
        compile_mode=args.compile_mode, naive=not (args.no_naive or args.worker),
        measure_eval=not (args.no_eval or args.worker),
        barrier=(args.barrier, args.barrier_count) if args.barrier else None, config_name=args.config,
    )
    result["command"] = _command(argv)
    if args.record:
        args.results_file.parent.mkdir(parents=True, exist_ok=True)
        with open(args.results_file, "a") as handle:
            handle.write(json.dumps(result, sort_keys=True) + "\n")
    print(json.dumps(result, sort_keys=True) if args.json else format_result(result))
    if args.record and not args.json:
        print(f"recorded to {args.results_file}")
    return 0


def _command(argv: list[str] | None) -> str:
    return "python -m lmtune.bench " + " ".join(argv if argv is not None else sys.argv[1:])


def _main_concurrency(args: argparse.Namespace, config: RunConfig, command: str) -> int:
    if args.compile == "both":
        raise LmtuneError("--compile both cannot be used with --concurrency; choose on, off or auto")
    device = resolve_device(config.train.device)
    ks = _parse_ks(args.concurrency)
    rows = run_concurrency(ks, _worker_args(args), device)
    amp = autocast_dtype(config, device) is not None
    estimate = estimate_trial_memory_bytes(config.model, config.train.batch_size, amp)
    recommended = None
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        measured_mem = max(row["per_process_peak_reserved_bytes"] or 0 for row in rows) or estimate
        recommended = recommend_trials_per_gpu(measured_mem, total, {r["k"]: r["aggregate_tokens_per_s"] for r in rows})
    result = {"config": args.config, "device": full_device_name(device), "torch": torch.__version__,
              "commit": git_commit(), "batch_size": config.train.batch_size,
              "context_length": config.model.context_length, "concurrency": rows,
              "estimated_trial_memory_bytes": estimate, "recommended_trials_per_gpu": recommended,
              "command": command}
    if args.record:
        args.results_file.parent.mkdir(parents=True, exist_ok=True)
        with open(args.results_file, "a") as handle:
            handle.write(json.dumps(result, sort_keys=True) + "\n")
    if args.json:
        print(json.dumps(result, sort_keys=True))
        return 0
    base = rows[0]["aggregate_tokens_per_s"] / rows[0]["k"]
    print(f"lmtune bench --concurrency: config {args.config}, batch {config.train.batch_size}, "
          f"device {result['device']}")
    for row in rows:
        print(f"  K={row['k']}: aggregate {row['aggregate_tokens_per_s']:,.0f} tokens/s "
              f"({row['aggregate_tokens_per_s'] / base:.2f}x one process), per-process peak memory "
              f"{_fmt_bytes(row['per_process_peak_memory_bytes'])}")
    print(f"  estimated trial memory (model): {_fmt_bytes(estimate)}")
    print(f"  recommended trials per GPU: {recommended if recommended is not None else 'n/a (no CUDA device)'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
