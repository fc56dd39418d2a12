"""A progress bar with an ETA for the commands a person watches (``train``, ``lr_find``, ``analyze --sharpness``):
tqdm when stderr is a terminal, nothing otherwise (a log file, a pipe, CI, a Ray worker: none has a terminal), so
logs stay as they were."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterable, Iterator
from typing import IO, Any, TypeVar

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from lmtune.training.metrics import Row

T = TypeVar("T")


def attached(stream: IO[str] | None = None) -> bool:
    """Whether ``stream`` (default stderr) is a terminal a person watches."""
    stream = stream or sys.stderr
    return bool(getattr(stream, "isatty", lambda: False)())


def bar(total: int, desc: str, unit: str, file: IO[str] | None = None, initial: int = 0) -> tqdm:
    """A tqdm bar on ``file`` (default stderr), disabled where that is no terminal."""
    return tqdm(total=total, initial=initial, desc=desc, unit=unit, file=file or sys.stderr,
                disable=not attached(file), dynamic_ncols=True, leave=True)


class ProgressSink:
    """A training run's steps as a bar (a MetricsSink: it sees each log interval's row), the train loss beside."""

    def __init__(self, total_steps: int, desc: str = "train", file: IO[str] | None = None):
        self.bar = bar(total_steps, desc, "step", file)

    def write(self, row: Row, checkpoint: Any) -> None:
        step = int(row.get("step") or 0)
        if step > self.bar.n:
            self.bar.update(step - self.bar.n)
        if (loss := row.get("train_loss")) is not None:
            self.bar.set_postfix(loss=f"{loss:.4f}", refresh=False)

    def close(self, result: Any) -> None:
        self.bar.close()


def each(items: Iterable[T], total: int, desc: str, unit: str, file: IO[str] | None = None) -> Iterator[T]:
    """``items`` with a bar (estimating sharpness checkpoint by checkpoint, say)."""
    with bar(total, desc, unit, file) as shown:
        for item in items:
            yield item
            shown.update(1)


@contextlib.contextmanager
def logs_above_the_bar() -> Iterator[None]:
    """On a terminal, the console's log lines printed above a bar rather than through it, each console handler's
    level kept (--quiet's stays WARNING); elsewhere nothing changes."""
    if not attached():
        yield
        return
    levels = [h.level for h in logging.root.handlers if isinstance(h, logging.StreamHandler)]
    with logging_redirect_tqdm():
        for handler in logging.root.handlers:
            handler.setLevel(max(levels, default=logging.NOTSET))
        yield
