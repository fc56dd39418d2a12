"""The lmtune a sweep's Ray workers import: the same as the driver's, from any working folder.

Ray puts the driver's working folder (and its script's folder, where that is on the driver's ``sys.path``) first on
every worker's ``sys.path`` (ray/_private/worker.py, ``connect``: ``job_config._py_driver_sys_path``). A folder named
``lmtune`` there then shadows lmtune in the workers: a clone's top folder (no ``__init__.py``) becomes a namespace
package ahead of an editable install (whose finder Python asks only after the path), and the clone's ``data/`` (the
built-in corpus) becomes ``lmtune.data``, so every trial died with "No module named 'lmtune.data.dataset'" while the
driver, started by the console script, never saw it. So a sweep starts Ray from an empty folder of its own
(``own_ray_folder``), and a Tuner of the user's is refused in one line where its workers would import
another lmtune (``check_workers_import_this_lmtune``).
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from lmtune.errors import LmtuneError

THIS_LMTUNE = Path(__file__).resolve().parents[1]
"""The lmtune package this process runs."""


def ray_code_paths() -> list[str]:
    """The folders Ray will put first on the workers' ``sys.path`` for a driver in this process: its script's folder
    (where the driver's ``sys.path`` holds it) and the working folder."""
    folders = []
    script = os.path.dirname(os.path.realpath(sys.argv[0])) if sys.argv and sys.argv[0] else ""
    if script and script in sys.path:
        folders.append(script)
    folders.append(os.path.abspath(os.curdir))
    return folders


def lmtune_in(folders: list[str]) -> Path | None:
    """The lmtune a process whose ``sys.path`` starts with ``folders`` imports, where that is not this one (None: this
    one, or none found on the path but by this one's installed finder)."""
    found = importlib.machinery.PathFinder.find_spec("lmtune", [*folders, *sys.path])
    if found is None:
        return None
    where = Path(found.origin).parent if found.origin else Path(next(iter(found.submodule_search_locations or ["."])))
    return None if where.resolve() == THIS_LMTUNE else where.resolve()


def check_workers_import_this_lmtune(folders: list[str] | None = None) -> None:
    """Refuse, in one line, a sweep whose Ray workers would import another lmtune than this process's (``folders``:
    those Ray puts first on their ``sys.path``, default ``ray_code_paths()``)."""
    folders = ray_code_paths() if folders is None else folders
    other = lmtune_in(folders)
    if other is not None:
        holder = other.parent
        raise LmtuneError(f"Ray's workers would import lmtune from {other}, not this lmtune ({THIS_LMTUNE}): Ray puts "
                          f"{holder} first on their sys.path, and the folder named lmtune there shadows it; run from "
                          "another folder (one that holds no folder named lmtune)")


@contextlib.contextmanager
def own_ray_folder() -> Iterator[str]:
    """An empty folder of the sweep's own while this is open (removed on leaving), to start Ray from
    (``working_folder``): the folder Ray then puts first on its workers' ``sys.path``, where nothing can shadow
    lmtune or the user's code, and the working folder of the local instance's workers until Tune moves each trial
    into its own. The user's code travels by its own folders (lmtune.usercode.imports.code_path); every path lmtune
    hands the trials is absolute."""
    own = tempfile.mkdtemp(prefix="lmtune-ray-")
    try:
        yield own
    finally:
        shutil.rmtree(own, ignore_errors=True)


@contextlib.contextmanager
def working_folder(folder: str) -> Iterator[None]:
    """``folder`` as the working folder while this is open (back to the one before on leaving)."""
    here = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(here)
