"""The device a run trains on: selection, backend settings, precision, and the peak FLOP/s MFU is measured against."""

from __future__ import annotations

import logging

import torch

from lmtune.errors import LmtuneError
from lmtune.training.config import RunConfig

log = logging.getLogger(__name__)

# Dense (no sparsity) bf16 tensor-core peaks from the vendors' data sheets, FLOP/s.
PEAK_BF16_FLOPS: dict[str, float] = {
    "H200": 989e12,
    "H100 SXM": 989e12,
    "H100 80GB HBM3": 989e12,
    "H100 PCIe": 756e12,
    "H100 NVL": 835e12,
    "H100": 989e12,
    "A100": 312e12,
    "A10G": 70e12,
    "A10": 125e12,
    "L40S": 362e12,
    "L4": 121e12,
    "RTX 4090": 165e12,
    "RTX 3090": 71e12,
    "V100": 125e12,  # fp16: V100 has no bf16; autocast falls back
    "T4": 65e12,
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
        return "Apple MPS"
    import platform

    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def peak_flops(device: torch.device) -> float | None:
    """Dense bf16 peak of a CUDA device, matched by name; None where unknown (no MFU is reported)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, flops in PEAK_BF16_FLOPS.items():
        if key in name:
            return flops
    return None


def configure_backend(device: torch.device) -> None:
    """TF32 tensor cores for the float32 matmuls left outside autocast (CUDA only)."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.set_float32_matmul_precision("high")


def autocast_dtype(config: RunConfig, device: torch.device) -> torch.dtype | None:
    """bf16 autocast where precision asks for it (auto: on CUDA), else None (float32)."""
    precision = config.train.precision
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (timing needs it; CPU work is synchronous)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
