"""A deciding search's state file, decisions/SEARCH_search.json (``SEARCH``: its ``search:`` value): written by
the search's Tune adapter at every decision (lmtune.sweep.searcher), read back by a resumed searcher, the search's
``finished`` and its report part. One module for every search, by name: a new search needs no line here."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from lmtune.errors import shown
from lmtune.files import JsonObject, JsonValue

log = logging.getLogger(__name__)

DECISIONS_DIR = "decisions"
SEARCH_STATE_SUFFIX = "_search.json"  # decisions/SEARCH_search.json: a deciding search's state (edge_search.json, ...)


def decisions_dir(sweep_dir: Path) -> Path:
    return Path(sweep_dir) / DECISIONS_DIR


def search_state_path(sweep_dir: Path, search: str) -> Path:
    """decisions/SEARCH_search.json: a deciding search's state and decisions (``search``: its ``search:`` value),
    mirrored by its searcher at every decision."""
    return decisions_dir(sweep_dir) / f"{search}{SEARCH_STATE_SUFFIX}"


def read_search_state(sweep_dir: Path, search: str) -> JsonObject | None:
    """The ``search`` search's state in a sweep folder, or None: absent, or unreadable (warned)."""
    return read_state_file(search_state_path(sweep_dir, search))


def read_search_states(sweep_dir: Path) -> dict[str, JsonObject]:
    """Every deciding search's state the sweep folder holds, by search name (the readable ones)."""
    found = {path.name.removesuffix(SEARCH_STATE_SUFFIX): read_state_file(path)
             for path in sorted(decisions_dir(sweep_dir).glob(f"*{SEARCH_STATE_SUFFIX}"))}
    return {name: state for name, state in found.items() if state is not None}


_WARNED: set[tuple[str, str]] = set()  # (path, problem) already warned about: said once per process


def read_state_file(path: Path) -> JsonObject | None:
    """A searcher's mirrored state, or None: absent, or unreadable (warned), also when a key the readers use has the
    wrong shape (an edited file: none of it is taken)."""
    if not path.exists():
        return None
    problem: str | None
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        problem = f"{type(err).__name__}: {err}"
    else:
        problem = _search_state_problem(value)
    if problem is not None:
        if (str(path), problem) not in _WARNED:  # once: the report and the searchers read it several times
            _WARNED.add((str(path), problem))
            log.warning("ignoring %s (%s); the report goes by the trials' own files", path, problem)
        return None
    return value


def _search_state_problem(value: JsonValue) -> str | None:
    """What makes a search state unusable to its readers (the report, a resumed searcher), or None."""
    if not isinstance(value, dict):
        return f"a JSON {type(value).__name__}, not an object"
    interrupted, decisions = value.get("interrupted") or {}, value.get("decisions") or []
    if not (isinstance(interrupted, dict) and all(isinstance(v, str) for v in interrupted.values())):
        return f"interrupted is {shown(interrupted)}, not a mapping of trial ids to reasons"
    if not (isinstance(decisions, list) and all(
            isinstance(d, dict) and isinstance(d.get("stage"), str) and isinstance(d.get("why"), str)
            for d in decisions)):
        return f"decisions is {shown(decisions)}, not a list of stages with their reasons"
    if not isinstance(value.get("runs", {}), dict) or not isinstance(value.get("finished", False), bool):
        return "runs is not a mapping of trial ids, or finished not true or false"
    return None
