"""K benchmark workers at once, as fractional-GPU trials run: each K's aggregate tokens/s and per-process
memory (``run_concurrency``). The workers are ``python -m lmtune.bench --worker`` processes; they meet at a
barrier after warm-up so that their timed phases overlap."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from lmtune.errors import LmtuneError
from lmtune.tools.throughput.results import ConcurrencyRow


def wait_at_barrier(directory: Path, count: int, timeout_s: float = 900.0) -> None:
    """Concurrency workers meet here after warm-up, so their timed phases overlap."""
    (directory / f"ready-{os.getpid()}").touch()
    deadline = time.monotonic() + timeout_s
    while len(list(directory.glob("ready-*"))) < count:
        if time.monotonic() > deadline:
            raise LmtuneError(f"concurrency barrier: only {len(list(directory.glob('ready-*')))} of {count} "
                              "workers got ready; lower --concurrency or check worker errors")
        time.sleep(0.05)


def run_concurrency(ks: list[int], worker_args: list[str], device: torch.device,
                    timeout_s: float = 1800.0) -> list[ConcurrencyRow]:
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
            results = []  # each worker's BenchResult JSON, as it printed it
            for proc in procs:
                out, err = proc.communicate(timeout=timeout_s)
                if proc.returncode != 0:
                    tail = (err.strip().splitlines() or ["no output"])[-1]
                    raise LmtuneError(f"concurrency {k}: a worker failed ({tail}); try a smaller K or batch size")
                results.append(json.loads(out.strip().splitlines()[-1]))
        span = max(r["timed_end_unix"] for r in results) - min(r["timed_start_unix"] for r in results)
        rows.append(ConcurrencyRow(
            k=k, aggregate_tokens_per_s=sum(r["timed_tokens"] for r in results) / span,
            per_process_tokens_per_s=[r["tokens_per_s"] for r in results],
            per_process_peak_memory_bytes=max(r["peak_memory_bytes"] for r in results),
            per_process_peak_reserved_bytes=max((r["peak_reserved_bytes"] or 0) for r in results) or None,
        ))
    return rows
