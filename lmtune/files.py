"""Atomic file writes (a reader sees the old file or the whole new one, never half of either) and the lock
that keeps a folder to one writer.

Every file lmtune writes (checkpoints, metrics, the sweep's records, the report) goes through here.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# (a full disk's error lives with the other errors; imported from here by every writer, as it always was)
from lmtune.errors import FULL_DISK_ERRNOS, DiskFullError, format_bytes, full_disk  # noqa: F401

LOCK_FILE = ".lmtune.lock"

# JSON as it crosses a file's boundary (sweep.json, the ledger, a search's state, summary.json, a space's YAML
# before it is checked): read into these, checked, and turned into typed values at once; typed values become
# these only to be written. Nothing inside lmtune passes them further.
JsonValue = None | bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"]
JsonObject = dict[str, JsonValue]


@contextlib.contextmanager
def writer_lock(folder: Path, refusal: Callable[[str], str]) -> Iterator[None]:
    """This process alone writes ``folder`` while the block runs: an exclusive ``flock`` on
    folder/.lmtune.lock, which the OS releases when the process ends however it ends (a SIGKILLed writer
    leaves no stale lock). A second writer gets ``LmtuneError(refusal(holder's pid))``."""
    import fcntl  # POSIX only, as Ray's local clusters are

    from lmtune.errors import LmtuneError

    handle = open(Path(folder) / LOCK_FILE, "a+")  # noqa: SIM115 - held open for the whole block
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            raise LmtuneError(refusal(handle.read().strip() or "unknown")) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield
    finally:
        handle.close()  # releases the lock


def atomic_write_bytes(path: Path, data: bytes, mirror: bool = True) -> None:
    """Write ``data`` to ``path``: a temp file beside it, fsynced, then renamed over it. A full disk raises
    DiskFullError, and a folder at ``path`` LmtuneError (one line); either leaves nothing behind: neither the temp
    file nor a partial ``path``. ``mirror`` False: not copied to a mirrored folder's storage (a file that came from
    there)."""
    path = Path(path)
    refuse_folder_at(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        if err.errno in FULL_DISK_ERRNOS:
            raise DiskFullError(path, len(data)) from err
        refuse_folder_at(path)  # (made there meanwhile)
        raise
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:  # some filesystems cannot fsync a directory; the rename is still atomic
        pass
    if _MIRRORS and mirror:
        _mirror(path)


def refuse_folder_at(path: Path) -> None:
    """A folder where a file is to be written (a report's figure replaced by one) refused in one line: a rename
    cannot replace it, and removing someone's folder is not lmtune's to do."""
    from lmtune.errors import LmtuneError

    if path.is_dir() and not path.is_symlink():
        raise LmtuneError(f"{path} is a folder, where lmtune writes its file {path.name}; remove or rename it, then "
                          "run the command again")


# Folders whose files are copied elsewhere as they are written (lmtune.files.mirrored): folder -> copier.
_MIRRORS: dict[Path, Callable[[Path, Path], None]] = {}


@contextlib.contextmanager
def mirrored(folder: Path, copy: Callable[[Path, Path], None]) -> Iterator[None]:
    """While the block runs, every file written under ``folder`` through this module is then handed to
    ``copy(folder, path)``: a sweep's driver records go to its object storage as they are written."""
    folder = Path(folder).resolve()
    _MIRRORS[folder] = copy
    try:
        yield
    finally:
        _MIRRORS.pop(folder, None)


def _mirror(path: Path) -> None:
    resolved = path.resolve()
    for folder, copy in list(_MIRRORS.items()):
        if resolved.is_relative_to(folder):
            copy(folder, resolved)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: Path, value: Any) -> None:
    """``value`` as indented JSON (numpy scalars and paths as their plain values)."""
    atomic_write_text(path, json.dumps(value, indent=2, default=_plain) + "\n")


STAGING_PREFIX = ".lmtune-staging-"


@contextlib.contextmanager
def staged_folder(folder: Path) -> Iterator[Path]:
    """A set of files for ``folder`` written into a staging folder the block gets, then moved into ``folder``
    together once the block ends (each by a rename: no room needed), so a failure on the way (a full disk) leaves
    ``folder`` as it was: its earlier files whole, or, where it did not exist, no folder. Files of ``folder`` the
    block did not write stay. A file whose place in ``folder`` a folder holds is refused before any is moved."""
    folder = Path(folder)
    made = [p for p in (folder, *folder.parents) if not p.exists()]
    staging = folder / f"{STAGING_PREFIX}{os.getpid()}"
    try:
        for stale in folder.glob(f"{STAGING_PREFIX}*"):  # (of a writer killed mid-way: its process is gone)
            if not _running(stale.name.removeprefix(STAGING_PREFIX)):
                remove_tree(stale)
        remove_tree(staging)
        staging.mkdir(parents=True)
        yield staging
        names = sorted(p.name for p in staging.iterdir())  # (sorted: a dot file, a folder's marker, goes first)
        for name in names:
            refuse_folder_at(folder / name)
        for name in names:
            os.replace(staging / name, folder / name)
    except BaseException:
        remove_tree(staging)
        for made_here in made:  # (the folders this made, emptied again; one holding anything else stays)
            with contextlib.suppress(OSError):
                made_here.rmdir()
        raise
    remove_tree(staging)


def _running(pid: str) -> bool:
    """Whether a process ``pid`` (a number's text) runs on this machine (one of another user's counts)."""
    try:
        os.kill(int(pid), 0)
    except PermissionError:
        return True
    except (ValueError, OSError):
        return False
    return True


def link_or_copy(source: Path, target: Path) -> None:
    """``target`` as a hard link to ``source`` (one file, two names: no bytes stored twice), or a copy where the
    two lie on different filesystems."""
    Path(target).parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def remove_tree(folder: Path) -> None:
    """``folder`` and all below it removed (errors ignored), a Ctrl-C meanwhile delivered once it is done.

    Why: CPython's ``shutil.rmtree`` closes a directory's descriptor in a ``finally``; a KeyboardInterrupt raised
    just after its first close makes it close the descriptor again, and the EBADF OSError that escapes replaces
    the interrupt (a second Ctrl-C during Tune's last save ended a sweep with a traceback instead of status 130).
    """
    with _sigint_deferred():
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[None]:
    """SIGINT noted while the block runs and raised again, to the handler before it, when the block ends (only
    the main thread can set handlers; elsewhere the block just runs)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    before = signal.signal(signal.SIGINT, lambda signum, frame: came.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before if before is not None else signal.default_int_handler)
        if came:
            signal.raise_signal(signal.SIGINT)


def existing_ancestor(path: Path) -> Path:
    """``path`` or the nearest folder above it that exists (what a disk-usage query can be asked about)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_destination(path: Path, option: str, kind: str = "folder", fix: str | None = None) -> Path:
    """Refuse, before any work is done, a destination that cannot take the files a command will write:
    ``kind`` "folder" (a folder to create or add to) or "file" (a file to create or replace). Raises
    LmtuneError with one line naming ``option`` and ``fix`` (default: choose another OPTION); writes nothing
    (a probe file in the nearest existing folder is created and removed at once)."""
    from lmtune.errors import LmtuneError

    path = Path(path)
    fix = fix or f"choose another {option}"
    if path.is_symlink() and not path.exists():
        raise LmtuneError(f"{option} {path} is a symlink to {os.readlink(path)}, which does not exist; {fix}")
    if kind == "file" and path.is_dir():
        raise LmtuneError(f"{option} {path} is a folder, not a file; {fix}")
    if kind == "folder" and path.exists() and not path.is_dir():
        raise LmtuneError(f"{option} {path} is a file, not a folder; {fix}")
    folder = path.parent if kind == "file" else path
    existing = existing_ancestor(folder)
    if not existing.is_dir():
        raise LmtuneError(f"{option} {path} lies under {existing}, which is a file, not a folder; {fix}")
    probe = existing / f".lmtune-write-test-{os.getpid()}"
    try:
        probe.write_bytes(b"x")
        probe.unlink()
    except OSError as err:
        raise LmtuneError(f"cannot write to {existing} ({err.strerror or err}), where {option} {path} goes; "
                          f"{fix}, or fix its permissions") from None
    return path


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    return str(value)


def yaml_error_line(err: Exception) -> int | None:
    """The 1-based line a YAML parser error points at (None: it names none)."""
    mark = getattr(err, "problem_mark", None)
    return mark.line + 1 if mark is not None else None


def plain(value: object) -> object:
    """``value`` with every numpy scalar in it (a user's optimizer's state may hold one) made the Python number it
    holds: what ``torch.load(weights_only=True)`` reads back, and what JSON writes."""
    import numpy as np  # (here, not at the top: most of what imports this module needs no numpy)

    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        items = [plain(item) for item in value]
        return items if isinstance(value, list) else tuple(items)
    return value

