"""The training loops a benchmark times: lmtune's optimized step, the naive baseline, and the fused loop
of K members; each steps, counts the seconds it waited for data, and closes."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Protocol

import numpy as np
import torch

from lmtune.data.batches import BatchSampler, DeviceBatches
from lmtune.errors import LmtuneError
from lmtune.fused.state import FusedState
from lmtune.fused.step import fused_train_step
from lmtune.training.config import RunConfig
from lmtune.training.device import synchronize
from lmtune.training.lm import LanguageModelLoss
from lmtune.training.metrics import IntervalMeter
from lmtune.training.state import TrainState, seed_everything
from lmtune.training.step import Runtime, train_step
from lmtune.usercode.spec import spec_for


class TimedLoop(Protocol):
    wait_s: float
    """Seconds the steps since it was last reset waited for their batch."""

    def step(self) -> None: ...

    def close(self) -> None: ...


def random_tokens(vocab_size: int, n: int = 1 << 20, seed: int = 0) -> np.ndarray:
    """Uniform random token ids: throughput does not depend on the text, so no corpus is needed."""
    if vocab_size > 65536:
        raise LmtuneError(f"vocab_size {vocab_size} does not fit uint16 tokens; bench a vocab_size <= 65536")
    return np.random.default_rng(seed).integers(0, vocab_size, size=n, dtype=np.uint16)


class OptimizedLoop:
    """lmtune's training step, as the training loop runs it: the same state, runtime and train_step."""

    def __init__(self, config: RunConfig, device: torch.device, tokens: np.ndarray, compiled: bool,
                 compile_mode: str = "default"):
        m, t = config.model, config.train
        self.config, self.device = config, device
        spec = spec_for(config)
        self.state = TrainState.create(config, device, spec)
        self.runtime = Runtime.build(self.state.model, config, device, compile_mode, compiled=compiled, spec=spec)
        self.batches = DeviceBatches(BatchSampler(tokens, t.batch_size, m.context_length, t.seed), device)
        self.meter = IntervalMeter(device, config.tokens_per_step, spec.model.size(config).flops_per_token, None)
        self.lr_of_step = spec.schedule.lr_function(config)
        self.wait_s = 0.0

    def step(self) -> None:
        t = self.config.train
        x, y = self.batches.next()
        self.wait_s += self.batches.last_wait_s
        lr = self.lr_of_step(self.state.step)
        self.meter.add(self.state.step + 1, train_step(self.state, self.runtime, x, y, lr, t), 0.0)

    def close(self) -> None:
        self.batches.close()


class NaiveLoop:
    """The usual "before": float32, eager, explicit-mask attention (lmtune's model; a user's model keeps its own),
    per-step host batches from Python lists, AdamW without foreach/fused kernels, and the loss read back every step."""

    def __init__(self, config: RunConfig, device: torch.device, tokens: np.ndarray):
        t = config.train
        self.config, self.device, self.tokens = config, device, tokens
        seed_everything(t.seed)
        spec = spec_for(config).model
        self.model = spec.build(config, device)
        spec.plain_attention(self.model)  # (the explicit-mask attention of the usual "before")
        self.loss = LanguageModelLoss(self.model, config.model.z_loss)
        decay = [p for p in self.model.parameters() if p.ndim >= 2]
        no_decay = [p for p in self.model.parameters() if p.ndim < 2]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": t.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=t.lr, betas=(t.beta1, t.beta2), eps=t.eps, foreach=False, fused=False)
        self.params = list(self.model.parameters())
        self.rng = np.random.default_rng(t.seed)
        self.wait_s = 0.0

    def _batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        b, ctx = self.config.train.batch_size, self.config.model.context_length
        xs, ys = [], []
        for _ in range(b):
            start = int(self.rng.integers(0, len(self.tokens) - ctx - 1))
            window = [int(v) for v in self.tokens[start:start + ctx + 1]]
            xs.append(window[:-1])
            ys.append(window[1:])
        return torch.tensor(xs, dtype=torch.long).to(self.device), torch.tensor(ys, dtype=torch.long).to(self.device)

    def step(self) -> None:
        t0 = time.perf_counter()
        x, y = self._batch()
        self.wait_s += time.perf_counter() - t0
        loss = self.loss(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, self.config.train.grad_clip, foreach=False)
        self.optimizer.step()
        self.optimizer.zero_grad()
        loss.item()

    def close(self) -> None:
        pass


class FusedLoop:
    """K members of the config fused into one model (lmtune.fused), LRs spread 2x apart around the
    config's: the fused loop's step as ``train_fused`` runs it, one batch shared by every member."""

    def __init__(self, config: RunConfig, device: torch.device, tokens: np.ndarray, members: int, compiled: bool):
        m, t = config.model, config.train
        self.config, self.device, self.members = config, device, members
        configs = []
        for k in range(members):
            member = RunConfig.from_dict(config.to_dict())
            member.train.lr = t.lr * 2.0 ** (k - (members - 1) / 2)
            configs.append(member)
        spec = spec_for(config)
        self.state = FusedState.create(configs, device, spec=spec)
        self.runtime = Runtime.build(self.state.model, config, device, compiled=compiled, spec=spec)
        self.batches = DeviceBatches(BatchSampler(tokens, t.batch_size, m.context_length, t.seed), device)
        self.lrs = torch.tensor([c.train.lr for c in configs], device=device)
        self.wait_s = 0.0

    def step(self) -> None:
        x, y = self.batches.next()
        self.wait_s += self.batches.last_wait_s
        fused_train_step(self.state, self.runtime, x, y, self.lrs, self.config.train.grad_accum_steps)

    def close(self) -> None:
        self.batches.close()


def time_steps(loop: TimedLoop, steps: int, device: torch.device) -> tuple[float, float]:
    """(wall seconds, data-wait seconds) of ``steps`` steps, synchronized at both ends."""
    synchronize(device)
    loop.wait_s = 0.0
    t0 = time.perf_counter()
    for _ in range(steps):
        loop.step()
    synchronize(device)
    return time.perf_counter() - t0, loop.wait_s


def count_host_syncs(loop: OptimizedLoop) -> int | None:
    """Host syncs in one optimized step (CUDA only: torch's sync debug mode warns on each)."""
    if loop.device.type != "cuda":
        return None
    return len(synchronizing_calls(loop.step))


def synchronizing_calls(step: Callable[[], object]) -> list[str]:
    """What torch's sync debug mode ("warn") reports as a host sync while ``step`` runs (CUDA only)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return synchronizations([str(w.message) for w in caught])


def synchronizations(warned: list[str]) -> list[str]:
    """The warnings of torch's sync debug mode ("warn") that report a sync. Setting the mode itself warns that
    "Synchronization debug mode is a prototype feature": no sync (counted as one on an H200, it made every step
    seem to sync once; with the mode at "error" the step raised nothing)."""
    return [m for m in warned if "synchroniz" in m.lower() and "debug mode is a prototype" not in m.lower()]
