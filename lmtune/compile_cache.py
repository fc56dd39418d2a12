"""One torch.compile cache for every trial of a sweep.

Each trial of a sweep compiles the same model shape. Inductor can reuse the FX graphs, the
AOTAutograd graphs and the autotuning results of an earlier compile, but only if every trial process
looks in the same directory and the caches are switched on before the first ``torch.compile`` runs.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

log = logging.getLogger(__name__)


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
    # The config modules read the switches when imported; if they already are, the environment
    # alone would not take effect in this process.
    for module, name in (("torch._inductor.config", "fx_graph_cache"),
                         ("torch._functorch.config", "enable_autograd_cache")):
        config = sys.modules.get(module)
        if config is not None and hasattr(config, name):
            setattr(config, name, True)
    log.info("shared compile cache: %s", env["TORCHINDUCTOR_CACHE_DIR"])
