"""The batches of a fused group: one stream shared by every member (common random numbers: the members
differ only in their hyperparameters, never in the data they saw), or one stream per member when their
seeds differ, each the stream an unfused run with that seed reads."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from lmtune.data.batches import BatchSampler, DeviceBatches
from lmtune.training.config import RunConfig


class MemberBatches:
    def __init__(self, tokens: np.ndarray, configs: Sequence[RunConfig], members: Sequence[int],
                 device: torch.device, start_step: int):
        first = configs[0]
        seeds = {configs[m].train.seed for m in members}

        def stream(seed: int) -> DeviceBatches:
            sampler = BatchSampler(tokens, first.train.batch_size, first.model.context_length, seed,
                                   first.model.vocab_size)
            return DeviceBatches(sampler, device, start_step=start_step)

        self.shared = stream(seeds.pop()) if len(seeds) == 1 else None
        self.streams = {} if self.shared else {m: stream(configs[m].train.seed) for m in members}
        self.last_wait_s = 0.0

    def next(self, members: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y): (B, T) for every member alike, or (K, B, T) with the members' own batches in order."""
        if self.shared is not None:
            x, y = self.shared.next()
            self.last_wait_s = self.shared.last_wait_s
            return x, y
        pairs = [self.streams[m].next() for m in members]
        self.last_wait_s = sum(self.streams[m].last_wait_s for m in members)
        return torch.stack([x for x, _ in pairs]), torch.stack([y for _, y in pairs])

    def keep(self, members: Sequence[int]) -> None:
        for m in [m for m in self.streams if m not in members]:
            self.streams.pop(m).close()

    def close(self) -> None:
        for s in [self.shared, *self.streams.values()]:
            if s is not None:
                s.close()

    def __enter__(self) -> MemberBatches:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
