"""The one guard around every call into the user's code: its import, its build, lmtune's checks of it, and the
forward that ``sample`` and a report's samples run.

    with guarded("--model", spec, "forward(token_ids of shape (2, 31)) in the gradient check"):
        loss = lm_loss(model(x), y)

Whatever the user's code raises there, ``SystemExit`` included (a module calling ``sys.exit`` or argparse's
``parse_args`` at import), becomes one line (a UserCodeError): the flag and spec, what lmtune was doing, the error's
first line, and the user's file and line it came from (the traceback's last frame in the spec's file, else in any file
outside lmtune, Python and the installed packages). An LmtuneError passes through as it is; Ctrl-C and a GPU's
out-of-memory error (which lmtune's callers explain themselves) too.
"""

from __future__ import annotations

import sys
import sysconfig
import traceback
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

from lmtune.errors import LmtuneError, UserCodeError

FIX = "fix it and run again"
_LMTUNE = Path(__file__).resolve().parents[1]
_LIBRARIES = tuple({Path(p).resolve() for key in ("stdlib", "platstdlib", "purelib", "platlib")
                    if (p := sysconfig.get_paths().get(key))})
_PASS_THROUGH = ("OutOfMemoryError",)
"""Errors of these names pass through (torch.cuda.OutOfMemoryError: lmtune.training.memory explains it)."""


@contextmanager
def guarded(flag: str, spec: str, what: str, fix: str | Callable[[BaseException], str] = FIX) -> Iterator[None]:
    """Turn anything the user's code ``spec`` (given by ``flag``) raises while ``what`` runs into one line, ending in
    ``fix`` (or what ``fix(err)`` says for that error)."""
    try:
        yield
    except (LmtuneError, KeyboardInterrupt):
        raise
    except BaseException as err:  # noqa: BLE001 - anything the user's code raises, SystemExit included
        if type(err).__name__ in _PASS_THROUGH:
            raise
        advice = fix(err) if callable(fix) else fix
        raise UserCodeError(f"{flag} {spec}: {what} {failure(err, spec)}; {advice}") from None


def user_call(spec: str, what: str, flag: str = "--model") -> AbstractContextManager:
    """``guarded`` where ``spec`` names the user's code; nothing where it is empty (lmtune's own model)."""
    return guarded(flag, spec, what) if spec else nullcontext()


def failure(err: BaseException, spec: str) -> str:
    """What ``err`` was, in a few words, and where in the user's code it was raised: 'raised ValueError: bad
    (model.py:12)', 'called sys.exit(0) (model.py:3)'."""
    if isinstance(err, SyntaxError):
        return f"has a SyntaxError: {err.msg} ({Path(err.filename or '?').name}:{err.lineno})"
    at = location(err, spec)
    where = f" ({at})" if at else ""
    if isinstance(err, SystemExit):
        return f"called sys.exit({err.code!r}){where}"
    text = str(err).strip()
    message = f": {clipped(text.splitlines()[0])}" if text else ""
    return f"raised {type(err).__name__}{message}{where}"


def clipped(text: str, limit: int = 200) -> str:
    """``text`` up to ``limit`` characters, cut at a word's end and marked (torch's messages run to hundreds)."""
    if len(text) <= limit:
        return text
    cut = text[:limit]
    return f"{cut[:cut.rfind(' ')] if ' ' in cut else cut} …"


def location(err: BaseException, spec: str) -> str:
    """FILE:LINE of the innermost frame of ``err``'s traceback in the user's code ('' when there is none)."""
    frames = traceback.extract_tb(err.__traceback__)
    own = _spec_file(spec)
    for frame in reversed(frames):
        if own is not None and _resolved(frame.filename) == own:
            return f"{own.name}:{frame.lineno}"
    for frame in reversed(frames):
        path = _resolved(frame.filename)
        if path is not None and not _is_library(path):
            return f"{path}:{frame.lineno}"
    return ""


def _spec_file(spec: str) -> Path | None:
    from lmtune.usercode.consent import code_file

    try:
        return code_file(spec)
    except (ImportError, ValueError, OSError):
        return None


def _resolved(filename: str) -> Path | None:
    if not filename or filename.startswith("<"):
        return None
    try:
        return Path(filename).resolve()
    except OSError:
        return None


def _is_library(path: Path) -> bool:
    return path.is_relative_to(_LMTUNE) or any(path.is_relative_to(root) for root in _LIBRARIES) \
        or "importlib" in path.parts or "site-packages" in path.parts


@contextmanager
def argv_of(path: str) -> Iterator[None]:
    """``sys.argv`` as the user's module would see it run as a script with no arguments ([its file]) while it is
    imported: a module-level ``parse_args`` then sees none of lmtune's flags."""
    saved = sys.argv
    sys.argv = [path]
    try:
        yield
    finally:
        sys.argv = saved
