"""torch.compile for the training step: whether to compile, compiling with a loud fall-back, and
one Inductor cache shared by every trial of a sweep.

Each trial of a sweep compiles the same model shape. Inductor can reuse the FX graphs, the
AOTAutograd graphs and the autotuning results of an earlier compile, but only if every trial process
looks in the same directory and the caches are switched on before the first ``torch.compile`` runs.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import torch
from torch import nn

from lmtune.private_apis import switch_on_inductor_caches
from lmtune.training.config import RunConfig
from lmtune.training.model import flops_per_token

log = logging.getLogger(__name__)

# CPU, measured (benchmarks/README.md): compile made the default model (112 MFLOP/token) 1.4-1.8x
# faster, while for small models like quick (10.6 MFLOP/token) its ~65 s cold start and Inductor's
# CPU code lose to eager ATen over a minutes-long run.
CPU_COMPILE_MIN_FLOPS_PER_TOKEN = 50e6


def should_compile(config: RunConfig, device: torch.device) -> bool:
    choice = config.train.compile
    if choice in ("on", "off"):
        return choice == "on"
    if device.type in ("cuda", "mps"):
        return True
    return flops_per_token(config.model) >= CPU_COMPILE_MIN_FLOPS_PER_TOKEN


def compile_model(model: nn.Module, device: torch.device, mode: str = "default") -> nn.Module:
    """torch.compile with a log line saying so; a failure falls back to eager with a visible warning."""
    backend = "aot_eager" if device.type == "mps" else "inductor"
    try:
        compiled = torch.compile(model, backend=backend, mode=None if mode == "default" else mode)
        log.info("torch.compile active (backend=%s%s)", backend, "" if mode == "default" else f", mode={mode}")
        return compiled
    except Exception as err:  # noqa: BLE001 - any compile failure must degrade, loudly, to eager
        log.warning("torch.compile FAILED (%s): training in eager mode, expect lower throughput", err)
        print(f"WARNING: torch.compile failed ({err}); running eager (slower)", file=sys.stderr)
        return model


def compile_cache_env(directory: Path) -> dict[str, str]:
    """The environment variables that point Inductor's caches at ``directory`` (for worker processes,
    e.g. a Ray ``runtime_env``)."""
    directory = Path(directory).expanduser().resolve()
    return {
        "TORCHINDUCTOR_CACHE_DIR": str(directory),
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
        "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
        # Triton's own kernel cache defaults to ~/.triton; keep it next to Inductor's so one
        # directory holds everything a later trial can reuse.
        "TRITON_CACHE_DIR": str(directory / "triton"),
    }


def enable_shared_compile_cache(directory: Path) -> None:
    """Point this process's (and its children's) Inductor caches at ``directory``; call before compiling."""
    env = compile_cache_env(directory)
    Path(env["TORCHINDUCTOR_CACHE_DIR"]).mkdir(parents=True, exist_ok=True)
    os.environ.update(env)
    switch_on_inductor_caches()
    log.info("shared compile cache: %s", env["TORCHINDUCTOR_CACHE_DIR"])
