"""Importing the user's code from a spec (``MODULE:NAME`` or ``PATH.py:NAME``; lmtune.usercode.config), in the driver
and again in every trial process, each problem one line naming the flag and the fix.

A module is looked up as ``python -m`` would: from the current directory (added to ``sys.path`` when the console script
started without it) and ``PYTHONPATH``. A file inside a package (its folder, and each above it, holding an
``__init__.py``: a CS336 assignment's ``cs336_basics/model.py``) is imported under its package's name, the folder
holding the top package appended to ``sys.path``, as pytest imports a test file under its rootdir: its relative imports
work, and the module it runs is required to be that very file. A loose file is loaded as a module of its own, its
folder appended to ``sys.path`` so that it can import its neighbours (last: a neighbour named as a standard module,
``profile.py``, shadows nothing, and is warned of). A package that is not installed (its ``__init__`` reading its own
version from installed metadata) and a missing third-party module are each one line naming the environment to install
into. Anything the import raises, ``SystemExit`` included, is one line naming the user's file and line
(lmtune.usercode.guard); ``sys.argv`` is [the module's file] meanwhile. ``code_path`` lists the folders the code came
from, which a sweep's trials add to their own ``sys.path``; an object handed over in Python
(``lmtune.Sweep(model=MyModel)``) is ``register``ed under a spec and travels to the trials as an object (``objects``).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import logging
import os
import sys
import traceback
from collections.abc import Iterable
from importlib.metadata import PackageNotFoundError
from pathlib import Path

from lmtune.errors import LmtuneError, UserCodeError, shown
from lmtune.usercode.config import is_file_spec
from lmtune.usercode.consent import check_import, reading_a_folder
from lmtune.usercode.guard import FIX, argv_of, guarded

log = logging.getLogger(__name__)

HANDED_OVER = "python"
"""The module part of the spec of an object handed over in Python that no import gives back (python:NAME)."""
_REGISTERED: dict[str, object] = {}
"""Objects handed over in Python, by the spec they stand for."""
_LOADED: dict[str, object] = {}


def load(spec: str, flag: str) -> object:
    """The object ``spec`` names (cached per process). LmtuneError, one line, when it cannot be imported, or when a
    command reading a results folder has no consent to it (lmtune.usercode.consent)."""
    if spec in _REGISTERED:
        return _REGISTERED[spec]
    check_import(spec, flag)
    if spec.startswith(f"{HANDED_OVER}:"):
        raise LmtuneError(f"{flag} {shown(spec)}: was handed over as a Python object by the script that started the "
                          "run, and there is none here; run it from that script (lmtune.Sweep(model=...)), or name "
                          "the code as MODULE:NAME or path/to/file.py:NAME")
    if spec not in _LOADED:
        where, _, name = spec.rpartition(":")
        module = _file_module(where, spec, flag) if is_file_spec(where) else _module(where, spec, flag)
        target: object = module
        for part in name.split("."):
            if not hasattr(target, part):
                own = [n for n, v in vars(module).items() if not n.startswith("_") and callable(v)
                       and getattr(v, "__module__", None) == module.__name__]
                raise LmtuneError(f"{flag} {shown(spec)}: {Path(where).name if is_file_spec(where) else where} has "
                                  f"no {name!r} (it defines: {', '.join(sorted(own))[:200] or 'no class or function'});"
                                  " name one of those")
            target = getattr(target, part)
        _LOADED[spec] = target
    return _LOADED[spec]


def _module(name: str, spec: str, flag: str):
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:  # the console script starts without it; python -m with it
        sys.path.append(cwd)
    try:
        with guarded(flag, spec, f"importing {name}", fix=import_fix), argv_of(name):
            return importlib.import_module(name)
    except LmtuneError as err:
        missing = err.__context__
        if isinstance(missing, ModuleNotFoundError) and not isinstance(missing, PackageNotFoundError) \
                and missing.name and name.startswith(missing.name) \
                and (missing.name == name or name[len(missing.name)] == "."):
            raise UserCodeError(f"{flag} {shown(spec)}: no module named {missing.name!r} from {cwd} or PYTHONPATH; "
                              "run from the folder that holds it, add that folder to PYTHONPATH, or give the file: "
                              f"path/to/{name.split('.')[-1]}.py:{spec.rpartition(':')[2]}") from None
        raise


def package_of(path: Path) -> tuple[Path, str] | None:
    """(the folder holding the top package, the dotted module name) of a file inside a package: a chain of folders
    each holding an ``__init__.py`` (repo/cs336_basics/model.py -> (repo, 'cs336_basics.model')); None for a loose
    file, or a name Python cannot import."""
    parts = [] if path.name == "__init__.py" else [path.stem]
    folder = path.parent
    while (folder / "__init__.py").is_file() and folder.name.isidentifier():
        parts.insert(0, folder.name)
        folder = folder.parent
    in_package = len(parts) > (0 if path.name == "__init__.py" else 1)
    return (folder, ".".join(parts)) if in_package and all(p.isidentifier() for p in parts) else None


def _file_module(where: str, spec: str, flag: str):
    path = Path(where).resolve()
    if not path.is_file():
        raise LmtuneError(missing_file(path, spec, flag))
    if (package := package_of(path)) is not None:
        return _package_module(path, *package, spec, flag)
    # One module per file, named after its path, so two files of one name never collide.
    name = f"lmtune_user_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    _append_to_sys_path(path.parent, spec, flag)
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # before running it: dataclasses, pickling and torch.compile look it up there
    try:
        with guarded(flag, spec, f"running {path.name}", fix=import_fix), argv_of(str(path)):
            module_spec.loader.exec_module(module)
    except LmtuneError:
        del sys.modules[name]
        raise
    return module


def _package_module(path: Path, root: Path, name: str, spec: str, flag: str):
    """The file ``path`` imported as module ``name`` of its package, ``root`` (the folder holding the package) on
    ``sys.path``: refused in one line where that name imports another file (the package installed as a copy)."""
    _append_to_sys_path(root, spec, flag)
    with guarded(flag, spec, f"importing {name} (from {root})", fix=import_fix), argv_of(str(path)):
        module = importlib.import_module(name)
    found = Path(getattr(module, "__file__", None) or "?").resolve()
    if found != path:
        top = name.split(".")[0]
        raise UserCodeError(f"{flag} {shown(spec)}: `import {name}` gives {found}, not this file: another {top} comes "
                          f"first on sys.path (installed as a copy?); install yours editable (`{sys.executable} -m pip "
                          f"install --no-deps -e {_project_of(root)}`) or name the module: "
                          f"{name}:{spec.rpartition(':')[2]}")
    return module


def _append_to_sys_path(folder: Path, spec: str, flag: str) -> None:
    """``folder`` appended to sys.path (last: a file there named as a standard module, profile.py, shadows nothing:
    warned of)."""
    if str(folder) not in sys.path:
        sys.path.append(str(folder))
        warn_shadowing(folder, spec, flag)


def import_fix(err: BaseException) -> str:
    """The fix for an error importing the user's code: for a package of theirs that is not installed in this
    environment (its __init__ reading installed metadata), both ways to install; for a missing module, where to
    install it; else lmtune's usual words."""
    environment = f"the Python that runs lmtune ({sys.prefix})"
    if isinstance(err, PackageNotFoundError):
        package = str(err.name or (err.args[0] if err.args else "your package"))
        return (f"your package {package!r} reads its installed metadata and is not installed in {environment}: "
                f"install it there, keeping its torch (`{sys.executable} -m pip install --no-deps -e "
                f"{_repo_of(err, package)}`), or install lmtune into your assignment's project (`uv add \"lmtune @ "
                'git+URL"`, then `uv run lmtune ...`)')
    if isinstance(err, ModuleNotFoundError) and err.name:
        top = err.name.split(".")[0]
        return (f"{top!r} is not installed in {environment}: install it there (`{sys.executable} -m pip install "
                f"{top}`; its name on PyPI may differ), or run lmtune from your assignment's environment "
                '(`uv add "lmtune @ git+URL"`, then `uv run lmtune ...`)')
    return FIX


def _repo_of(err: BaseException, package: str) -> str:
    """The project folder of the package whose ``__init__`` raised ``err`` (PATH/TO/YOUR/REPO where not found)."""
    for frame in reversed(traceback.extract_tb(err.__traceback__)):
        path = Path(frame.filename)
        if path.name == "__init__.py" and path.parent.name == package:
            return str(_project_of(path.parent.parent))
    return "PATH/TO/YOUR/REPO"


def _project_of(root: Path) -> Path:
    """The project folder of a package root: the nearest folder at or above it holding a pyproject.toml (else
    ``root``)."""
    return next((p for p in (root, *root.parents) if (p / "pyproject.toml").is_file()), root)


def missing_file(path: Path, spec: str, flag: str) -> str:
    """The one line of a code file that is not there: a results folder's (sample, analyze: --model names the user's
    copy) or the user's own flag's."""
    if reading_a_folder():
        return (f"the checkpoint's model {shown(spec)}: no file {path} on this machine (moved, or trained elsewhere); "
                "give --model PATH:NAME naming your copy of the model's file")
    return (f"{flag} {shown(spec)}: no file {path} on this machine; give the path of your .py file, or install your "
            "code on every node and name it as MODULE:NAME")


def warn_shadowing(folder: Path, spec: str, flag: str) -> None:
    """Warn, by name, of the files and packages beside the user's file that a standard module's name would import
    from there if that folder came first on sys.path (lmtune appends it: the standard module is imported)."""
    names = sorted({p.stem for p in folder.glob("*.py")} | {p.parent.name for p in folder.glob("*/__init__.py")})
    shadowing = [name for name in names if name in sys.stdlib_module_names]
    if shadowing:
        log.warning("%s %s: %s beside it %s the name of Python's standard module%s: `import %s` gets the standard "
                    "one, not yours; rename yours", flag, spec, ", ".join(f"{n}.py" for n in shadowing),
                    "has" if len(shadowing) == 1 else "have", "" if len(shadowing) == 1 else "s", shadowing[0])


def code_path(specs: Iterable[str]) -> list[str]:
    """The folders the code of ``specs`` was imported from (each spec loaded first): a file's folder, a module's
    entry of ``sys.path``; what another process adds to its ``sys.path`` to import the same code."""
    folders: list[str] = []
    for spec in specs:
        if spec in _REGISTERED:
            continue
        where = spec.rpartition(":")[0]
        if is_file_spec(where):
            path = Path(where).resolve()
            folder = str(package[0] if (package := package_of(path)) else path.parent)
        else:  # the folder holding the top-level module or package
            top = sys.modules.get(where.split(".")[0])
            origin = getattr(top, "__file__", None)
            locations = list(getattr(top, "__path__", []))
            if origin is None and not locations:
                continue
            path = Path(origin).resolve() if origin else Path(locations[0]).resolve() / "__init__.py"
            folder = str(path.parents[1] if path.name == "__init__.py" else path.parent)
        if folder not in folders:
            folders.append(folder)
    return folders


def add_to_sys_path(folders: Iterable[str]) -> None:
    """Put ``folders`` (``code_path``'s) at the end of this process's ``sys.path`` where they are missing."""
    for folder in folders:
        if folder not in sys.path:
            sys.path.append(folder)


def register(obj: object) -> str:
    """A spec for an object handed over in Python (a class, a function, a functools.partial or any callable but a
    model's instance): its module and name where importing them gives this very object, else ``python:NAME`` (a
    class of a script, or of a notebook), kept in this process and sent to the trials as the object itself
    (``objects``)."""
    if _is_module_instance(obj):
        raise LmtuneError(f"a {type(obj).__name__} instance (a built torch.nn.Module) is not a class or function: "
                          f"lmtune builds a fresh model for every run; give its class ({type(obj).__name__}), or a "
                          "function returning an instance")
    if not callable(obj):
        raise LmtuneError(f"a {type(obj).__name__} ({shown(obj)[:40]!r}) is not a class or function; give one, or "
                          "its MODULE:NAME")
    module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if module and name and module != "__main__" and "<locals>" not in name:
        try:
            if load(f"{module}:{name}", "model") is obj:
                return f"{module}:{name}"
        except LmtuneError:
            pass
    inner = getattr(obj, "func", None)  # a functools.partial: named after what it calls
    base = (name or getattr(inner, "__qualname__", None) or type(obj).__name__).replace("<locals>.", "")
    spec = f"{HANDED_OVER}:{base}" if name else f"{HANDED_OVER}:{base}_{type(obj).__name__}"
    taken = 1
    while _REGISTERED.get(spec, obj) is not obj:  # another object of that name handed over before: a spec of its own
        taken += 1
        spec = f"{HANDED_OVER}:{base}_{taken}"
    _REGISTERED[spec] = obj
    return spec


def _is_module_instance(obj: object) -> bool:
    """Whether ``obj`` is a torch.nn.Module instance (without importing torch here)."""
    return not isinstance(obj, type) and any(
        cls.__name__ == "Module" and cls.__module__.startswith("torch.nn") for cls in type(obj).__mro__)


def objects(specs: Iterable[str]) -> dict[str, object]:
    """The registered objects among ``specs``: what a trial process must be handed, having no module to import."""
    return {spec: _REGISTERED[spec] for spec in specs if spec in _REGISTERED}


def adopt(registered: dict[str, object]) -> None:
    """Take objects registered in another process (``objects``) as this process's own."""
    _REGISTERED.update(registered)
