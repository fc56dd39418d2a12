"""Where a batch is built: random token windows as a pure function of (seed, step), prefetched to the
device on a background thread, and the fixed validation batches.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import types

import numpy as np
import torch

from lmtune.errors import LmtuneError

log = logging.getLogger(__name__)


class BatchSampler:
    """Random windows: start positions uniform over every valid start [0, N - context - 1]."""

    def __init__(self, tokens: np.ndarray, batch_size: int, context_length: int, seed: int,
                 vocab_size: int | None = None):
        if tokens.shape[0] < context_length + 1:
            raise LmtuneError(f"{tokens.shape[0]} tokens is fewer than context_length + 1 = {context_length + 1}; "
                              "use a smaller context_length (--set context_length=...) or more data")
        self.tokens = tokens
        self.batch_size = batch_size
        self.context_length = context_length
        self.seed = seed
        self.vocab_size = vocab_size  # ids at or above it are refused (an edited meta.json), not an IndexError
        self._offsets = np.arange(context_length + 1, dtype=np.int64)
        # Largest start is N - context - 1, so the target of the last input (index start + context) exists.
        self._num_starts = tokens.shape[0] - context_length

    def starts(self, step: int) -> np.ndarray:
        """Start positions for global ``step``; a pure function of (seed, step) so resume and
        prefetch need no sampler state."""
        rng = np.random.default_rng([self.seed, step])
        return rng.integers(0, self._num_starts, size=self.batch_size, dtype=np.int64)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """CPU int64 (B, T) inputs and the targets shifted by one, from a single gather."""
        idx = self.starts(step)[:, None] + self._offsets
        windows = self.tokens[idx].astype(np.int64)
        if self.vocab_size is not None and (top := int(windows.max())) >= self.vocab_size:
            raise LmtuneError(f"the training data holds token id {top} (batch of step {step}), outside the "
                              f"model's vocab_size {self.vocab_size}: meta.json understates the ids; "
                              "re-prepare the data dir with python -m lmtune.prepare --force")
        # Contiguous copies, so callers can .view() the tensors freely.
        x = torch.from_numpy(np.ascontiguousarray(windows[:, :-1]))
        y = torch.from_numpy(np.ascontiguousarray(windows[:, 1:]))
        return x, y


class DeviceBatches:
    """Yields (x, y) on `device` for steps start_step, start_step+1, ...; the next batch is built
    on a background thread (one or two ahead) while the current step runs. On CUDA the thread pins it
    and copies it on a side stream (non_blocking), and the consumer's stream waits for that copy; on any
    other non-CPU device (MPS) the consumer copies it when it takes it."""

    def __init__(self, sampler: BatchSampler, device: torch.device, start_step: int = 0, prefetch: int = 2,
                 cuda: types.ModuleType = torch.cuda):
        self.sampler = sampler
        self.device = torch.device(device)
        self.last_wait_s = 0.0
        self.cuda = cuda  # (a stand-in in the tests that check the order of the CUDA calls)
        self._cuda = self.device.type == "cuda"
        self._stream = cuda.Stream(device=self.device) if self._cuda else None
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, prefetch))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._work, args=(start_step,), name="lmtune-batches", daemon=True)
        self._thread.start()

    def _work(self, step: int) -> None:
        try:
            while not self._stop.is_set():
                x, y = self.sampler.batch(step)
                event = None
                if self._cuda:
                    # A side stream lets the host-to-device copy overlap the step running on the main stream.
                    with self.cuda.stream(self._stream):
                        x = x.pin_memory().to(self.device, non_blocking=True)
                        y = y.pin_memory().to(self.device, non_blocking=True)
                        event = self.cuda.Event()
                        event.record(self._stream)
                if not self._put((x, y, event)):
                    return
                step += 1
        except BaseException as err:  # surfaced to the consumer in next()
            self._put(err)

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next batch; blocks only if the background thread is behind."""
        t0 = time.perf_counter()
        item = self._queue.get()
        self.last_wait_s = time.perf_counter() - t0
        if isinstance(item, BaseException):
            self.close()
            raise item
        x, y, event = item
        if event is not None:
            stream = self.cuda.current_stream(self.device)
            stream.wait_event(event)
            # The tensors were allocated on the side stream; tell the allocator they are used here.
            x.record_stream(stream)
            y.record_stream(stream)
        elif x.device != self.device:  # MPS (or any other device): copied here, on the consumer's thread
            x, y = x.to(self.device), y.to(self.device)
        return x, y

    __next__ = next

    def __iter__(self):
        return self

    def close(self) -> None:
        """Stop the background thread (idempotent)."""
        self._stop.set()
        while True:  # unblock a put() in progress
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def __enter__(self) -> DeviceBatches:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def fixed_val_batches(val_tokens: np.ndarray, batch_size: int, context_length: int,
                      num_batches: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The evaluation set (CPU tensors), the same for every trial and evaluation: ``num_batches`` batches of
    non-overlapping windows spread evenly over the validation split, so no token is scored twice.

    A split too short for that many windows is evaluated on all of its windows (whole batches; a single
    smaller batch if it holds fewer than ``batch_size``), with a warning that names the shortfall.
    """
    available = (val_tokens.shape[0] - 1) // context_length
    if available < 1:
        raise LmtuneError(f"{val_tokens.shape[0]} validation tokens is fewer than context_length + 1 = "
                          f"{context_length + 1}; use a smaller context_length or prepare more validation data")
    wanted = num_batches * batch_size
    if available < wanted:
        batch_size = min(batch_size, available)
        log.warning("the validation split holds %d tokens, only %d non-overlapping windows of %d tokens, fewer than "
                    "the %d (eval_batches x batch_size) asked for: evaluating on %d of them; prepare more validation "
                    "data for a steadier val loss", val_tokens.shape[0], available, context_length, wanted,
                    available // batch_size * batch_size)
        num_batches, wanted = available // batch_size, available // batch_size * batch_size
    starts = (np.arange(wanted, dtype=np.int64) * available // wanted) * context_length
    windows = val_tokens[starts[:, None] + np.arange(context_length + 1, dtype=np.int64)].astype(np.int64)
    x = torch.from_numpy(np.ascontiguousarray(windows[:, :-1])).view(num_batches, batch_size, context_length)
    y = torch.from_numpy(np.ascontiguousarray(windows[:, 1:])).view(num_batches, batch_size, context_length)
    return list(zip(x.unbind(0), y.unbind(0), strict=True))
