"""Waiting on a call that may block in a network client (object storage): in a thread of its own, the driver's main
thread waiting in short slices, so that SIGINT and SIGTERM still stop the sweep (Python runs signal handlers in the
main thread only, between bytecodes: never while it sits in a blocked C call)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def interruptible(call: Callable[[], T], what: str) -> T:
    """``call()`` in a thread of its own (named ``what``), waited for in short slices, so that SIGINT and SIGTERM
    reach this thread meanwhile, even while ``call`` blocks in a network client; its value, or its exception."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread
            box["error"] = err

    worker = threading.Thread(target=run, daemon=True, name=f"lmtune: {what}")
    worker.start()
    while worker.is_alive():
        worker.join(0.1)
    if "error" in box:
        raise box["error"]
    return box.get("value")


def first_line(err: BaseException) -> str:
    """``err`` in one short line: its type and the first line of its message."""
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0][:200]}" if text else type(err).__name__
