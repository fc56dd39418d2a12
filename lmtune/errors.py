"""User-facing errors: one line that names the problem and the fix."""

from __future__ import annotations

import functools
import logging
import os
import reprlib
import sys
from collections.abc import Callable
from typing import Any


class LmtuneError(ValueError):
    """A bad input or environment, reported to the user as one line (no traceback)."""


class UserCodeError(LmtuneError):
    """The user's code failed: its import, its build, or a call into it (lmtune.usercode.guard). It fails the same way
    on every attempt, so a sweep's trial that raises it is not retried: the sweep stops (lmtune.sweep.stopping)."""


_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = 60
_SHOWN.maxlist = _SHOWN.maxdict = _SHOWN.maxtuple = 4
_SHOWN.maxlevel = 2


def shown(value: Any) -> str:
    """``repr(value)`` cut to a few dozen characters: what an error message may echo of a user's input
    (a YAML alias bomb expands to gigabytes, and one line must stay one line)."""
    return _SHOWN.repr(value)


def first_line(err: BaseException) -> str:
    """``err`` in one short line: its type and the first line of its message."""
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0][:200]}" if text else type(err).__name__


def cli_entry(main: Callable[..., int | None]) -> Callable[..., int]:
    """Wrap a CLI ``main`` so an LmtuneError prints ``error: ...`` and exits with status 2."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs) -> int:
        try:
            return main(*args, **kwargs) or 0
        except LmtuneError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
        except BrokenPipeError:  # `lmtune run --list-spaces | head`: the reader left; say nothing more
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # (else Python's exit flush raises again)
            return 141  # 128 + SIGPIPE, as a shell reports it

    return wrapper


def setup_cli_logging(level: int = logging.INFO) -> None:
    """Concise console logging for the CLIs; the library itself only uses ``logging``. The console's handler
    holds ``level`` itself: a run's training.log lowers the "lmtune" logger to INFO, and --quiet's console must
    still show only warnings."""
    console = logging.StreamHandler()
    console.setLevel(level)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S",
                        handlers=[console])
