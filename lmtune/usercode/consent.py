"""A results folder is data, never code: when lmtune may import the code a checkpoint's or a sweep's config names
(its ``code``: ``--model``, ``--optimizer``, ``--schedule`` as the run recorded them).

Code runs only where the user named it on the command that runs it. ``sample`` and ``analyze`` read folders that may
come from anyone, so the code their configs name is imported only with the user's consent on that command
(``CodeConsent``): ``--model PATH:NAME`` given again (the user's own copy of the model, built in place of the
recorded one) or ``--trust-code`` (the recorded code, as Hugging Face's ``trust_remote_code``). lmtune's own model,
optimizer and schedules are not code of the folder and need none. While a command reads a folder
(``only_consented_code``), lmtune.usercode.imports.load refuses every other spec, whichever part of lmtune asks.

``run --resume`` continues the user's own sweep: sweep.json records, at the sweep's start, the path and SHA-256 of
every file of code it imports (``recorded_files``); a resume imports them as the sweep did when each is that same
file, unchanged, on the machine resuming (``check_recorded_files``), and asks for ``--trust-code`` otherwise.
``train --resume`` does the same with the run's ``RUN_RECORD`` (code_files.json), and also imports code the command
names again (``--model`` as the run recorded it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.machinery
import json
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from lmtune.errors import LmtuneError, shown
from lmtune.files import atomic_write_text
from lmtune.usercode.config import UserCode, is_file_spec, normalized

TRUST_FLAG = "--trust-code"
REFUSED_NOTE = "not drawn without your consent"
"""How a report's samples note begins when the model is code the folder names and the command gave no consent."""
HANDED_OVER = "python"
"""lmtune.usercode.imports.HANDED_OVER: an object handed over in Python, never imported."""


class FolderCodeRefused(LmtuneError):
    """Code a results folder names, not imported for want of the user's consent (one line naming both ways)."""


@dataclass(frozen=True)
class CodeConsent:
    """What code named by a results folder this command may import."""

    trust: bool = False
    """--trust-code: whatever the folder's configs name."""
    model: str = ""
    """--model given again (normalized): the user's model, built in place of the folder's recorded one."""
    own: frozenset[str] = frozenset()
    """Specs the user handed to this process itself (lmtune.Sweep's own code, reporting on its own sweep)."""

    def allows(self, spec: str) -> bool:
        return self.trust or spec == self.model or spec in self.own or spec.startswith(f"{HANDED_OVER}:")

    def code_for(self, code: UserCode, where: str) -> UserCode:
        """The code a checkpoint's config names (``where``: the file, for messages), as this command may build its
        model: --model's in place of the recorded model, or the recorded one where consented; FolderCodeRefused
        otherwise. lmtune's own model needs no consent."""
        if self.model:
            if not code.user_model:
                raise LmtuneError(f"--model {self.model}: {where} trained lmtune's own model, which needs no --model; "
                                  "drop --model")
            return dataclasses.replace(code, model=self.model)
        if code.user_model and not self.allows(code.model):
            raise FolderCodeRefused(refusal(code.model, where))
        return code


NO_CONSENT = CodeConsent()
"""The default: lmtune's own code only (and what was handed over in Python)."""


def refusal(spec: str, where: str) -> str:
    """The one line of a refused import: what the folder names, and both ways to consent."""
    return (f"{where} names code to import ({shown(spec)}), and lmtune runs no code a results folder names without "
            f"your say: give --model PATH:NAME (your own copy of the model) or {TRUST_FLAG} (import the recorded "
            "code; only for a folder you trust)")


def consent_from_arguments(args) -> CodeConsent:
    """The consent --model and --trust-code give (sample, analyze)."""
    return CodeConsent(trust=bool(getattr(args, "trust_code", False)),
                       model=normalized(getattr(args, "model", None) or "", "--model"))


def add_consent_arguments(parser) -> None:
    """--model and --trust-code, on a parser of a command that reads a results folder (sample, analyze)."""
    parser.add_argument("--model", metavar="PATH:NAME",
                        help="your own model's code (MODULE:CALLABLE or path/to/file.py:CALLABLE), built in place of "
                             "the one the checkpoint's config names; lmtune imports no code a results folder names "
                             "unless you give this or --trust-code")
    parser.add_argument(TRUST_FLAG, action="store_true",
                        help="import the model code the checkpoint's config names (as Hugging Face's "
                             "trust_remote_code): only for a results folder you trust")


_ACTIVE: list[CodeConsent] = []


@contextmanager
def only_consented_code(consent: CodeConsent) -> Iterator[None]:
    """While a command reads a results folder: lmtune.usercode.imports.load imports only what ``consent`` allows."""
    _ACTIVE.append(consent)
    try:
        yield
    finally:
        _ACTIVE.pop()


def reading_a_folder() -> bool:
    """Whether a command is reading a results folder's code now (``only_consented_code``)."""
    return bool(_ACTIVE)


def check_import(spec: str, flag: str) -> None:
    """Refuse, in one line, importing ``spec`` where a command reads a folder without consent to it."""
    if _ACTIVE and not _ACTIVE[-1].allows(spec):
        raise FolderCodeRefused(refusal(spec, f"the results folder's {flag}"))


# ---------------------------------------------------------------------------------------------
# run --resume: the sweep's own code, the same file, unchanged


def recorded_files(specs: Iterable[str]) -> dict[str, dict[str, str]]:
    """sweep.json's ``code_files``: for each spec of code the sweep imports, its file's absolute path and SHA-256."""
    recorded = {}
    for spec in dict.fromkeys(specs):
        path = code_file(spec)
        if path is not None and path.is_file():
            recorded[spec] = {"path": str(path), "sha256": file_sha256(path)}
    return recorded


def check_recorded_files(specs: Iterable[str], recorded: Mapping[str, object], trust: bool, *, whose: str = "sweep",
                         record: str = "sweep.json", folder: Path | None = None, fix: str = "restore it") -> None:
    """Refuse, in one line, resuming with code that is not the file the ``whose`` (sweep, run) recorded at its start
    in ``record`` (another path, changed bytes, or none recorded), unless --trust-code. A file inside the results
    ``folder`` itself is never the user's own: the folder was empty when the record was written, so such a record was
    written by someone else. Nothing is imported to tell."""
    if trust:
        return
    for spec in dict.fromkeys(specs):
        if spec.startswith(f"{HANDED_OVER}:"):
            continue
        why = _not_recorded(spec, recorded.get(spec), whose, record, folder)
        if why:
            raise FolderCodeRefused(f"--resume: the {whose}'s code {shown(spec)} is not imported: {why}; {fix}, or "
                                    f"give {TRUST_FLAG} to import it as it is now (only for a results folder you "
                                    "trust)")


def _not_recorded(spec: str, entry: object, whose: str, record: str, folder: Path | None) -> str:
    """Why ``spec``'s file is not the one ``entry`` (its record) names, unchanged ('': it is)."""
    path = code_file(spec)
    if not isinstance(entry, Mapping) or not isinstance(entry.get("path"), str):
        return f"{record} records no file and hash of it (written by an earlier lmtune, missing or edited)"
    if path is None or str(path) != entry["path"] or not path.is_file():
        return f"it is not the file the {whose} started with ({entry['path']})"
    if folder is not None and path.is_relative_to(Path(folder).resolve()):
        return f"it lies in the {whose}'s own folder, which holds data, never the code it started with"
    if file_sha256(path) != entry.get("sha256"):
        return f"{path} changed since the {whose} started"
    return ""


RUN_RECORD = "code_files.json"
"""A training run's ``recorded_files`` (written by ``lmtune train`` as it starts), which ``train --resume`` checks."""


def write_run_record(out: Path, code: UserCode) -> None:
    """The run's RUN_RECORD of the files of its code as they are now (none: lmtune's own code, nothing to record)."""
    if code.specs:
        atomic_write_text(Path(out) / RUN_RECORD, json.dumps(recorded_files(code.specs.values()), indent=2) + "\n")


def read_run_record(out: Path) -> Mapping[str, object]:
    """A run's RUN_RECORD ({} where there is none or it is unreadable: nothing recorded, so nothing vouched for)."""
    try:
        record = json.loads((Path(out) / RUN_RECORD).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return record if isinstance(record, Mapping) else {}


def code_file(spec: str) -> Path | None:
    """The file ``spec``'s code is in, found without running any of it (None: none found, or handed over)."""
    where = spec.rpartition(":")[0]
    if spec.startswith(f"{HANDED_OVER}:") or not where:
        return None
    if is_file_spec(where):
        return Path(where).resolve()
    loaded = getattr(sys.modules.get(where), "__file__", None)
    if loaded:
        return Path(loaded).resolve()
    search = None if os.getcwd() in sys.path or "" in sys.path else [*sys.path, os.getcwd()]
    found = None
    for part in where.split("."):
        found = importlib.machinery.PathFinder.find_spec(part, search)
        if found is None:
            return None
        search = list(found.submodule_search_locations or [])
    return Path(found.origin).resolve() if found is not None and found.origin else None


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
