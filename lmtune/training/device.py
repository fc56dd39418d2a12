"""The device a run trains on: selection, backend settings, precision, and the peak FLOP/s MFU is measured against."""

from __future__ import annotations

import logging
import os
import types
from dataclasses import dataclass

import torch

from lmtune.errors import LmtuneError
from lmtune.training.config import RunConfig

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class Peak:
    """A device's dense (no sparsity) peaks in FLOP/s: bf16 on tensor cores with float32 accumulation (None:
    no bf16 tensor cores), and plain float32."""

    bf16: float | None
    fp32: float


# From the vendors' data sheets, matched by name in this order (the more specific name first). The RTX
# 4060 Ti's bf16 figure is derived: 34 SMs x 2.535 GHz x 512 FLOP per clock and SM, the RTX 4090's
# data-sheet rate (165.2 TFLOP/s over 128 SMs at 2.52 GHz). Apple publishes no FLOP/s; the M-series
# figures are shader ALUs x 2 x clock (the largest GPU of each chip: M2 Max 38 cores, M3 Max and M4 Max 40),
# and Apple GPUs run float16 and bfloat16 at the float32 rate.
PEAKS: dict[str, Peak] = {
    "H200": Peak(989e12, 67e12),
    "H100 PCIe": Peak(756e12, 51e12),
    "H100 NVL": Peak(835e12, 60e12),
    "H100": Peak(989e12, 67e12),  # SXM, "H100 80GB HBM3"
    "A100": Peak(312e12, 19.5e12),
    "A10G": Peak(70e12, 31.2e12),
    "A10": Peak(125e12, 31.2e12),
    "L40S": Peak(362e12, 91.6e12),
    "L4": Peak(121e12, 30.3e12),
    "RTX 4090": Peak(165.2e12, 82.6e12),
    "RTX 4060 Ti": Peak(44.1e12, 22.1e12),
    "RTX 3090": Peak(71e12, 35.6e12),
    "V100": Peak(None, 15.7e12),  # tensor cores for fp16 only: lmtune trains float32 there
    "T4": Peak(None, 8.1e12),
    "Apple M2 Max": Peak(13.6e12, 13.6e12),
    "Apple M3 Max": Peak(14.3e12, 14.3e12),
    "Apple M4 Max": Peak(17.2e12, 17.2e12),
}


def resolve_device(name: str = "auto") -> torch.device:
    """'auto' picks CUDA, then MPS, then CPU; explicit names are checked to exist."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise LmtuneError(f"unknown device '{name}'; use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise LmtuneError(f"device '{name}' requested but CUDA is not available; use --set device=cpu or auto")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise LmtuneError(f"device '{name}' requested but MPS is not available; use --set device=cpu or auto")
    if device.type not in ("cpu", "cuda", "mps"):
        raise LmtuneError(f"unsupported device '{name}'; use auto, cpu, cuda, cuda:N or mps")
    return device


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "mps":
        return apple_chip_name() or "Apple MPS"
    import platform

    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def apple_chip_name() -> str | None:
    """"Apple M3 Max" on a Mac (its CPU brand string names the chip, GPU included), else None."""
    import subprocess

    try:
        out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    name = out.stdout.strip()
    return name if name.startswith("Apple") else None


def peak_for(name: str) -> Peak | None:
    """The data-sheet peaks of the device called ``name`` (None: a device lmtune has no figures for)."""
    return next((peak for key, peak in PEAKS.items() if key in name), None)


def peak_flops(device: torch.device, dtype: torch.dtype | None = None, name: str | None = None) -> float | None:
    """The peak a run's MFU is measured against: the device's dense bf16 figure when it trains in bf16
    (``dtype``; None: bf16 where the device has it natively), float32 otherwise. None on a CPU and on a
    device without figures (no MFU is reported; bench measures a matmul instead)."""
    if device.type not in ("cuda", "mps"):
        return None
    peak = peak_for(name or device_name(device))
    if peak is None:
        return None
    if dtype is None:
        dtype = torch.bfloat16 if peak.bf16 else torch.float32
    return peak.bf16 if dtype == torch.bfloat16 and peak.bf16 else peak.fp32


def configure_backend(device: torch.device) -> None:
    """TF32 tensor cores for the float32 matmuls left outside autocast (CUDA only)."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.set_float32_matmul_precision("high")


def native_bf16(device: torch.device, cuda: types.ModuleType = torch.cuda) -> bool:
    """bf16 runs natively here: any CPU or MPS device; a CUDA GPU of compute capability 8.0 (Ampere) or
    later. Below it bf16 is emulated and Inductor does not compile bf16 graphs (pytorch#129288);
    ``torch.cuda.is_bf16_supported()`` counts emulation unless asked ``including_emulation=False``.
    (``cuda``: a stand-in in the tests.)"""
    return device.type != "cuda" or cuda.get_device_capability(device)[0] >= 8


def autocast_dtype(config: RunConfig, device: torch.device, cuda: types.ModuleType = torch.cuda) -> torch.dtype | None:
    """bf16 autocast where precision asks for it (auto: on a CUDA GPU with native bf16), else None (float32).
    precision=bf16 on a GPU without native bf16 is refused in one line."""
    precision = config.train.precision
    native = native_bf16(device, cuda)
    if precision == "bf16" and not native:
        major, minor = cuda.get_device_capability(device)
        raise LmtuneError(f"precision=bf16: this GPU (compute capability {major}.{minor}) has no bf16 tensor cores, so "
                          "bf16 would be emulated and left uncompiled; use precision=auto (float32 there) or fp32")
    if precision == "bf16" or (precision == "auto" and device.type == "cuda" and native):
        return torch.bfloat16
    if precision == "auto" and device.type == "cuda":
        major, minor = cuda.get_device_capability(device)
        log.info("compute capability %d.%d has no bf16 tensor cores: training in float32", major, minor)
    return None


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (timing needs it; CPU work is synchronous)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device: torch.device) -> int | None:
    """The most device memory tensors held since the last reset (CUDA); MPS keeps no peak, so the memory
    its driver holds now; None on CPU (bench reports the process's peak RSS there)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    if device.type == "mps":
        return torch.mps.driver_allocated_memory()
    return None


def available_memory_bytes(device: torch.device) -> int | None:
    """Memory a run on ``device`` can use: a CUDA GPU's total, MPS's recommended working set, the host's
    available RAM (MemAvailable, else physical RAM) for the CPU; None where it cannot be read."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    if device.type == "mps":
        return int(torch.mps.recommended_max_memory())
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
