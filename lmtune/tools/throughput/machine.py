"""What a benchmark ran on: the commit, the device's full name, the process's peak memory, the matmul peak
where no data-sheet figure is known, and the attention kernel SDPA picks."""

from __future__ import annotations

import math
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

from lmtune.private_apis import sdpa_backend_name
from lmtune.training.device import device_name, synchronize
from lmtune.training.model_config import ModelConfig


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
