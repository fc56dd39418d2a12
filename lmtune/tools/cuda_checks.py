"""``python -m lmtune.tools.cuda_checks``: what only a real CUDA GPU can show.

Each check is a function of the data dir and a scratch folder that raises AssertionError saying what went
wrong. ``python -m lmtune.gpu_check`` runs this module on a GPU, and tests/test_cuda.py calls the same
functions (tests/test_gpu_paths.py exercises the same decisions on the CPU). Prints a line per check and
exits 1 if any failed; without a CUDA GPU it refuses in one line (exit 2).
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import cast

import numpy as np
import torch

from lmtune.data.batches import BatchSampler, DeviceBatches
from lmtune.errors import LmtuneError, cli_entry
from lmtune.tools.throughput.loops import synchronizing_calls
from lmtune.training.config import RunConfig, budget_config

# The checks' model and run: a few seconds on any GPU.
TINY = dict(d_model=32, d_ff=64, n_layers=2, n_heads=2, context_length=32, batch_size=8, steps=30, warmup_steps=5,
            log_interval=5, eval_interval=10, eval_batches=2, checkpoint_interval=10, device="cuda", compile="off")


def tiny_config(data_dir: Path, **overrides) -> RunConfig:
    """The quick budget's config shrunk to TINY, on the GPU, with ``overrides`` on top."""
    return budget_config("quick", {**TINY, **overrides}, data_dir=str(data_dir))


def check_device_batches_on_cuda_match_the_cpu_batches(data_dir: Path, work: Path) -> None:
    tokens = np.arange(5000, dtype=np.uint16)
    sampler = BatchSampler(tokens, 4, 16, seed=3)
    with DeviceBatches(sampler, torch.device("cuda"), start_step=2) as prefetched:
        for step in range(2, 8):
            x, y = prefetched.next()
            assert x.is_cuda and y.is_cuda, f"step {step}: the prefetched batch is on {x.device}, not the GPU"
            assert torch.equal(x.cpu(), sampler.batch(step)[0]), f"step {step}: the inputs differ from the CPU's"
            assert torch.equal(y.cpu(), sampler.batch(step)[1]), f"step {step}: the targets differ from the CPU's"


def check_the_quick_model_trains_compiled_in_bf16_on_the_gpu(data_dir: Path, work: Path) -> None:
    from lmtune.training.loop import train

    result = train(tiny_config(data_dir, compile="auto", precision="auto"), work / "compiled")
    native = torch.cuda.get_device_capability()[0] >= 8
    expected = "bfloat16" if native else "float32"
    assert result.status == "completed", f"the run ended {result.status}, not completed"
    assert result.summary["compiled"], "compile=auto did not compile the model on the GPU"
    assert result.summary["precision"] == expected, (f"precision=auto chose {result.summary['precision']}; "
                                                     f"expected {expected} on this GPU")
    best = cast(float, result.summary["best_val_loss"])
    assert math.isfinite(best), f"best val loss {best}"


def check_a_training_step_on_the_gpu_never_synchronizes(data_dir: Path, work: Path) -> None:
    from lmtune.training.state import TrainState
    from lmtune.training.step import Runtime, train_step

    config = tiny_config(data_dir)
    device = torch.device("cuda")
    state = TrainState.create(config, device)
    runtime = Runtime.build(state.model, config, device)
    x, y = (t.to(device) for t in BatchSampler(np.arange(20000, dtype=np.uint16) % 300, 8,
                                               config.model.context_length, 0).batch(0))
    train_step(state, runtime, x, y, 1e-3, config.train)
    syncs = synchronizing_calls(lambda: train_step(state, runtime, x, y, 2e-3, config.train))
    assert not syncs, f"a training step synchronized with the GPU {len(syncs)} time(s): {syncs[0]}"


CHECKS: tuple[Callable[[Path, Path], None], ...] = (
    check_device_batches_on_cuda_match_the_cpu_batches,
    check_the_quick_model_trains_compiled_in_bf16_on_the_gpu,
    check_a_training_step_on_the_gpu_never_synchronizes,
)


def run_checks(data_dir: Path, work: Path) -> list[str]:
    """Run every check, printing ``NAME: ok (S s)`` or ``NAME: FAILED: why``; returns the failed ones' names."""
    failed = []
    for check in CHECKS:
        name = check.__name__.removeprefix("check_").replace("_", " ")
        started = time.perf_counter()
        try:
            check(data_dir, work)
        except AssertionError as err:
            failed.append(name)
            print(f"{name}: FAILED: {err}", flush=True)
        except Exception as err:  # a crash is a failed check too, with where it happened
            failed.append(name)
            print(f"{name}: FAILED: {type(err).__name__}: {err}\n{traceback.format_exc()}", flush=True)
        else:
            print(f"{name}: ok ({time.perf_counter() - started:.1f} s)", flush=True)
    return failed


@cli_entry
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lmtune.tools.cuda_checks",
                                     description="Check what only a real CUDA GPU can show.")
    parser.add_argument("--data", type=Path, help="prepared data dir (default: the built-in corpus)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise LmtuneError("no CUDA GPU here (torch.cuda.is_available() is False); run the CUDA checks on a machine "
                          "with one and a CUDA build of torch")
    from lmtune.data.prepare import ensure_builtin_corpus

    data_dir = args.data if args.data is not None else ensure_builtin_corpus()
    with tempfile.TemporaryDirectory(prefix="lmtune-cuda-checks-") as work:
        failed = run_checks(data_dir, Path(work))
    print(f"{len(CHECKS)} CUDA checks: " + (f"{len(failed)} failed ({', '.join(failed)})" if failed else "all passed"))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
