"""User-facing errors: one line that names the problem and the fix."""

from __future__ import annotations

import errno
import functools
import logging
import os
import reprlib
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


class LmtuneError(ValueError):
    """A bad input or environment, reported to the user as one line (no traceback)."""


class UserCodeError(LmtuneError):
    """The user's code failed: its import, its build, or a call into it (lmtune.usercode.guard). It fails the same way
    on every attempt, so a sweep's trial that raises it is not retried: the sweep stops (lmtune.sweep.stopping)."""


# The errors a write gets from a full disk, or from a user's exhausted quota (the same to the user: no room).
FULL_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
RUN_AGAIN = "free space, then run the command again"


class DiskFullError(OSError):
    """A write that found no space left on its device: nothing was written (the old file, if any, stands).

    ``path``: the file being written (an existing folder: one whose file is not known); ``size``: its bytes (None:
    not known). Its message is one line: what was being written, the room it needs, the room there is, and ``fix``.
    """

    def __init__(self, path: Path, size: int | None, message: str | None = None, fix: str = RUN_AGAIN):
        path = Path(path)
        if message is None:
            message = f"{disk_full_fact(path, size)}; {fix}"
        super().__init__(errno.ENOSPC, message)
        self.path, self.size = path, size

    @property
    def fact(self) -> str:
        """What the full disk stopped, without a fix (the caller knows what the user can do next)."""
        return disk_full_fact(self.path, self.size)

    def __reduce__(self):
        # Ray copies an error from a trial's process to the driver by pickling it: rebuilt from these, not from
        # OSError's (errno, message) pair, which this constructor does not take.
        return type(self), (self.path, self.size, self.strerror)


def disk_full_fact(path: Path, size: int | None) -> str:
    """``no space left on the disk of FOLDER to write NAME (needs SIZE; FREE free)``, the free space asked now (an
    existing folder for ``path``: its file is not known, and neither is ``size``)."""
    path = Path(path)
    folder, what = (path, "") if path.is_dir() else (path.parent, f" to write {path.name}")
    free = format_bytes(shutil.disk_usage(_existing(folder)).free)
    needs = f"needs {format_bytes(size)}; " if size is not None else ""
    return f"no space left on the disk of {folder}{what} ({needs}{free} free)"


def full_disk(err: BaseException | None, folder: Path) -> DiskFullError | None:
    """The full disk ``err`` is or came from (its ``__cause__``/``__context__`` chain: Ray wraps what it raises) as a
    DiskFullError; a plain ENOSPC or EDQUOT OSError becomes one about the file it names, else about ``folder``.
    None: no full disk."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, DiskFullError):
            return err
        if isinstance(err, OSError) and err.errno in FULL_DISK_ERRNOS:
            return DiskFullError(Path(os.fsdecode(err.filename)) if err.filename else Path(folder), None)
        err = err.__cause__ or err.__context__
    return None


def format_bytes(n: float) -> str:
    """``n`` bytes in decimal units to 2-3 significant figures: 512 B, 4.5 MB, 27 MB, 150 MB."""
    value, units = float(n), ("B", "kB", "MB", "GB")
    for unit in units:
        shown = round(value, 1) if value < 10 and unit != "B" else round(value)
        # Step up only when the rounded figure would read 1000 (999.7 kB is "1.0 MB", not "1000 kB").
        if shown < 1000 or unit == units[-1]:
            return f"{shown} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def _existing(path: Path) -> Path:
    """``path`` or the nearest folder above it that exists (lmtune.files.existing_ancestor, which this layer below it
    cannot import)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


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
    """Wrap a CLI ``main`` so an LmtuneError prints ``error: ...`` and exits with status 2, and a full disk (anywhere:
    ``full_disk``) prints ``error: no space left ...`` (what was being written, the room it needs and the
    room there is) and exits with status 1, as a sweep stopped by one does."""

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
        except Exception as err:
            if (full := full_disk(err, Path.cwd())) is None:
                raise
            print(f"error: {full.strerror}", file=sys.stderr)
            return 1

    return wrapper


def setup_cli_logging(level: int = logging.INFO) -> None:
    """Concise console logging for the CLIs; the library itself only uses ``logging``. The console's handler
    holds ``level`` itself: a run's training.log lowers the "lmtune" logger to INFO, and --quiet's console must
    still show only warnings."""
    console = logging.StreamHandler()
    console.setLevel(level)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S",
                        handlers=[console])
