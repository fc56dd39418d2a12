"""What only a real CUDA GPU can show, run by ``scripts/gpu_check.sh`` on a machine that has one (skipped
elsewhere: no machine of this project has a GPU; tests/test_gpu_paths.py exercises the same decisions on
the CPU)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from lmtune.data.batches import BatchSampler, DeviceBatches

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_device_batches_on_cuda_match_the_cpu_batches():
    tokens = np.arange(5000, dtype=np.uint16)
    sampler = BatchSampler(tokens, 4, 16, seed=3)
    with DeviceBatches(sampler, torch.device("cuda"), start_step=2) as prefetched:
        for step in range(2, 8):
            x, y = prefetched.next()
            assert x.is_cuda and torch.equal(x.cpu(), sampler.batch(step)[0])
            assert torch.equal(y.cpu(), sampler.batch(step)[1])


def test_the_quick_model_trains_compiled_in_bf16_on_the_gpu(make_tiny_config, tmp_path):
    from lmtune.training.loop import train

    result = train(make_tiny_config(device="cuda", compile="auto", precision="auto", steps=30), tmp_path / "r")
    native = torch.cuda.get_device_capability()[0] >= 8
    assert result.status == "completed" and result.summary["compiled"]
    assert result.summary["precision"] == ("bfloat16" if native else "float32")
    assert math.isfinite(result.summary["best_val_loss"])


def test_a_training_step_on_the_gpu_never_synchronizes(tiny_config):
    from lmtune.training.state import TrainState
    from lmtune.training.step import Runtime, train_step

    config = tiny_config.__class__.from_dict({**tiny_config.to_dict(), "train": {**tiny_config.to_dict()["train"],
                                                                                 "device": "cuda"}})
    device = torch.device("cuda")
    state = TrainState.create(config, device)
    runtime = Runtime.build(state.model, config, device)
    x, y = (t.to(device) for t in BatchSampler(np.arange(20000, dtype=np.uint16) % 300, 8,
                                               config.model.context_length, 0).batch(0))
    train_step(state, runtime, x, y, 1e-3, config.train)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            train_step(state, runtime, x, y, 2e-3, config.train)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert not [w for w in caught if "synchroniz" in str(w.message).lower()]
