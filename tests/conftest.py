"""Shared fixtures: the built-in corpus (built once per session) and a tiny, fast training config."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from lmtune.config import RunConfig, budget_config
from lmtune.prepare import ensure_builtin_corpus

# One intra-op thread: the tests' models are tiny, the CI/dev machines have 2 shared cores, and
# measured on them a quick-budget run took 122 s with 1 thread vs 436 s with 2 (oversubscription).
# Single-threaded CPU math is also deterministic run to run, which the resume tests rely on.
torch.set_num_threads(1)

TINY = dict(
    d_model=32, d_ff=64, n_layers=2, n_heads=2, context_length=32, batch_size=8, steps=30, warmup_steps=5,
    log_interval=5, eval_interval=10, eval_batches=2, checkpoint_interval=10, device="cpu", compile="off",
)


@pytest.fixture(scope="session")
def builtin_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built-in story corpus, generated and tokenized once per test session."""
    return ensure_builtin_corpus(tmp_path_factory.mktemp("data") / "builtin")


@pytest.fixture(scope="session")
def make_tiny_config(builtin_data: Path) -> Callable[..., RunConfig]:
    """``make_tiny_config(**overrides)``: a fresh tiny config on the built-in corpus (usable from any scope)."""

    def make(**overrides) -> RunConfig:
        return budget_config("quick", {**TINY, **overrides}, data_dir=str(builtin_data))

    return make


@pytest.fixture
def tiny_config(make_tiny_config: Callable[..., RunConfig]) -> RunConfig:
    """A ~1 s run: d_model 32, 2 layers, context 32, batch 8, 30 steps, checkpoints every 10, CPU, eager."""
    return make_tiny_config()


def run_lmtune(module: str, *args: str, timeout: float = 600, cwd: Path | None = None,
               env: dict[str, str] | None = None):
    """Run ``python -m lmtune.MODULE ARGS`` in a subprocess; returns the CompletedProcess."""
    import os
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", f"lmtune.{module}", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="session")
def quick_sweep(tmp_path_factory: pytest.TempPathFactory, builtin_data: Path) -> Path:
    """A real `quick` sweep (Ray Tune on a local cluster, 6 trials), run once per test session."""
    results = tmp_path_factory.mktemp("results")
    proc = run_lmtune("run", "--space", "quick", "--name", "quick", "--results", str(results),
                      "--data", str(builtin_data), "--no-dashboard", "--quiet", "--num-cpus", "2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return results / "quick"
