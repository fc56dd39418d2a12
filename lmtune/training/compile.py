"""torch.compile for the training step: whether to compile, with which backend, compiling for real before
the first step (with a loud fall-back to eager), and one Inductor cache shared by every trial of a sweep.

``torch.compile`` compiles lazily, at the first call of the compiled module, and AOTAutograd compiles the
backward at the first backward: a missing Triton or C compiler surfaces there, not in ``torch.compile``.
``warm_up`` makes those first calls (a forward and backward in training mode, a forward in evaluation
mode, on batches of the run's shapes) before training starts, so a failure falls back to eager once,
with one warning, instead of failing every step of every trial.

Each trial of a sweep compiles the same model shape. Inductor can reuse the FX graphs, the
AOTAutograd graphs and the autotuning results of an earlier compile, but only if every trial process
looks in the same directory and the caches are switched on before the first ``torch.compile`` runs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import cast

import torch
from torch import nn

from lmtune.private_apis import switch_on_inductor_caches
from lmtune.training.config import RunConfig
from lmtune.training.spec import TrainSpec, lmtune_spec

log = logging.getLogger(__name__)

# CPU, measured (benchmarks/README.md): compile made the default model (112 MFLOP/token) 1.4-1.8x
# faster, while for small models like quick (10.6 MFLOP/token) its ~65 s cold start and Inductor's
# CPU code lose to eager ATen over a minutes-long run.
CPU_COMPILE_MIN_FLOPS_PER_TOKEN = 50e6


def should_compile(config: RunConfig, device: torch.device, spec: TrainSpec | None = None) -> bool:
    """The config's ``compile``; "auto": on CUDA and MPS, and on the CPU for a model (by ``spec``, None: lmtune's
    own) of at least CPU_COMPILE_MIN_FLOPS_PER_TOKEN."""
    choice = config.train.compile
    if choice in ("on", "off"):
        return choice == "on"
    if device.type in ("cuda", "mps"):
        return True
    return (spec or lmtune_spec(config)).model.size(config).flops_per_token >= CPU_COMPILE_MIN_FLOPS_PER_TOKEN


def compile_backend(config: RunConfig, device: torch.device) -> str | Callable:
    """The config's ``compile_backend``; "auto": aot_eager on MPS (Inductor does not target it), else inductor."""
    choice = config.train.compile_backend
    if choice != "auto":
        return choice
    return "aot_eager" if device.type == "mps" else "inductor"


def compile_model(model: nn.Module, backend: str | Callable, mode: str = "default") -> nn.Module:
    """torch.compile of ``model`` (nothing is compiled until its first call: see ``warm_up``)."""
    return cast(nn.Module, torch.compile(model, backend=backend, mode=None if mode == "default" else mode))


def warm_up(forward: nn.Module, model: nn.Module, train_x: torch.Tensor, eval_x: torch.Tensor,
            autocast: contextlib.AbstractContextManager) -> BaseException | None:
    """Run the compiled ``forward`` once as training does (forward and backward) and once as evaluation
    does (eval mode, no grad), on zero tokens of the run's shapes: every graph the run needs compiles
    here. Returns the error if compiling failed (None when it worked). The model is left as it was: no
    gradient kept, training mode on."""
    try:  # (inputs and targets distinct tensors, as in training: Dynamo guards on their aliasing too)
        with autocast:
            loss = forward(train_x, train_x.clone())
        loss.sum().backward()
        forward.train(False)
        with torch.no_grad(), autocast:
            forward(eval_x, eval_x.clone())
    except Exception as err:  # noqa: BLE001 - any compile failure must degrade, loudly, to eager
        return err
    finally:
        forward.train(True)
        for param in model.parameters():
            param.grad = None
    return None


def compile_failed(backend: str | Callable, err: BaseException) -> None:
    """Say once, in the log and on stderr, that compiling failed and the run trains eager."""
    root = err
    # torch wraps the backend's own error (BackendCompilerFailed keeps it as inner_exception)
    while (inner := root.__cause__ or getattr(root, "inner_exception", None)) is not None:
        root = inner
    text = str(root).strip()
    why = f"{type(root).__name__}: {text.splitlines()[0][:300]}" if text else type(root).__name__
    log.warning("torch.compile (backend %s) FAILED at its first call (%s): training in eager mode, expect lower "
                "throughput", getattr(backend, "__name__", backend), why)
    print(f"WARNING: torch.compile failed ({why}); running eager (slower)", file=sys.stderr)


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
