"""sweep.json, the one record of what a sweep ran: written whole when it starts (and on each resume), read back
whole by ``SweepRecord.read`` for --resume, the report, diagnose and the truth check alike.

Reading is two steps, in this order: ``check_sweep_json`` refuses, in one line naming the file and the key, a file
(edited, or damaged) whose values a reader cannot use; then every value is parsed into its type once: the plan
(lmtune.sweep.plan.SweepPlan: the space, the base config, ASHA's rungs) and where and how the sweep ran. Keys this
version does not know are left alone (a sweep of another version may hold them); missing ones take defaults.
"""

from __future__ import annotations

import json
import math
import types
import typing
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from lmtune.analysis.runs import AshaBudget
from lmtune.data.dataset import DataMeta, validation_record
from lmtune.errors import LmtuneError, shown
from lmtune.files import JsonObject, atomic_write_json
from lmtune.searches import STRATEGIES
from lmtune.searches.base import Fail, settings_section
from lmtune.sweep.disk import Keep
from lmtune.sweep.plan import SweepPlan
from lmtune.sweep.record import SWEEP_FILE
from lmtune.sweep.spaces import SCHEDULERS, SchedulerSpec, StopperSpec
from lmtune.training.config import MODEL_FIELDS, TRAIN_FIELDS
from lmtune.training.divergence import DivergenceRule


@dataclass(frozen=True)
class DataRecord:
    """What the trials trained on, as the sweep recorded it when it started."""

    dir: str = ""
    """The prepared data dir (resolved); "" where sweep.json does not say."""
    meta: DataMeta | None = None
    """Its meta.json as it was then (lmtune.prepare's); None where sweep.json does not hold it."""

    def to_json(self) -> JsonObject:
        meta = {k: v for k, v in asdict(self.meta).items() if k not in ("unigram_loss", "validation") or v is not None
                } if self.meta else {}
        return {**({"dir": self.dir} if self.dir else {}), **({"meta": meta} if meta else {})}


@dataclass(frozen=True)
class SweepRecord:
    """sweep.json: what a sweep ran (its plan), on which data and machine, with which versions, and how."""

    name: str = ""
    """The sweep's name (--name; its folder's name when it ran)."""
    plan: SweepPlan | None = None
    """The space, base config and ASHA's rungs (None: sweep.json records no space or no base config, as a file
    written by hand may not; --resume refuses it, the report goes by the trials' own files)."""
    data: DataRecord = field(default_factory=DataRecord)
    """The data the trials trained on."""
    versions: JsonObject = field(default_factory=dict)
    """lmtune, torch, ray, optuna and python versions: sweep.json's JSON, carried as written, shown, never computed
    with."""
    hardware: JsonObject = field(default_factory=dict)
    """The platform, CPU count and CUDA devices: descriptive JSON, as the versions."""
    resources_per_trial: dict[str, float] = field(default_factory=dict)
    """What each trial asked Ray for (cpu, gpu), as Ray takes it."""
    max_concurrent: int | None = None
    """Trials run at once."""
    time_budget_s: float | None = None
    """The sweep's time budget (--time-budget-s; None: none)."""
    address: str | None = None
    """The Ray cluster it ran on (None: a local Ray instance)."""
    start_time: str = ""
    """When it started, as %Y-%m-%dT%H:%M:%S%z."""
    command: tuple[str, ...] = ()
    """The command line that started it."""
    resumed_at: tuple[str, ...] = ()
    """When it was resumed, as start_time, oldest first."""
    keep: Keep = Keep.BEST
    """What an ended trial keeps (--keep; lmtune.sweep.retention)."""
    model_fingerprint: str = ""
    """A user's model: its parameters' names and shapes at the base config, as a digest
    (lmtune.usercode.model.parameter_fingerprint), which a resume checks its code still builds; "": lmtune's model."""
    code_files: JsonObject = field(default_factory=dict)
    """The user's code the sweep imports: per spec, its file's absolute path and SHA-256 at the start
    (lmtune.usercode.consent.recorded_files), which a resume checks before importing it; {}: lmtune's code."""
    ended: JsonObject = field(default_factory=dict)
    """How its last driver ended (lmtune.sweep.runner.finish): ``outcomes``, the ledger's count of its trials by
    outcome (errored ones included, though they wrote no records of their own), ``unfinished``, and ``stopped_by``
    (a signal, a full disk, an error no retry cures) with its ``note``; {}: still running, or never ended."""

    @property
    def num_trials(self) -> int | None:
        """Trials its space planned (None: its search decides as it goes, or no space is recorded)."""
        return self.plan.space.num_trials if self.plan else None

    @property
    def divergence_rule(self) -> DivergenceRule:
        """The divergence rule its stopper section set (the defaults where no space is recorded)."""
        return self.plan.divergence_rule if self.plan else DivergenceRule()

    def resumed(self, when: str) -> SweepRecord:
        """The record of this sweep resumed at ``when`` (running again: not ended)."""
        return replace(self, resumed_at=(*self.resumed_at, when), ended={})

    def to_json(self) -> JsonObject:
        plan = self.plan.to_json() if self.plan else {"space": {}, "budget": "", "base_config": {}, "asha": None}
        return {"name": self.name, **plan, "data": self.data.to_json(), "versions": self.versions,
                "hardware": self.hardware, "resources_per_trial": self.resources_per_trial,
                "max_concurrent": self.max_concurrent, "time_budget_s": self.time_budget_s, "address": self.address,
                "start_time": self.start_time, "command": list(self.command), "resumed_at": list(self.resumed_at),
                "keep": str(self.keep), **({"model_fingerprint": self.model_fingerprint} if self.model_fingerprint
                                           else {}), **({"code_files": self.code_files} if self.code_files else {}),
                **({"ended": self.ended} if self.ended else {})}

    def write(self, sweep_dir: Path) -> None:
        atomic_write_json(Path(sweep_dir) / SWEEP_FILE, self.to_json())

    @classmethod
    def read(cls, sweep_dir: Path) -> SweepRecord:
        """sweep.json of ``sweep_dir``, checked (``check_sweep_json``) and parsed into its types."""
        path = Path(sweep_dir) / SWEEP_FILE
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise LmtuneError(f"{sweep_dir} is not an lmtune sweep (no {SWEEP_FILE}); give results/NAME, a folder "
                              "written by python -m lmtune.run") from None
        except (OSError, ValueError) as err:
            raise LmtuneError(f"{path} (the sweep's record) is unreadable ({type(err).__name__}: {err}); "
                              "restore it or re-run the sweep") from None
        if not isinstance(raw, dict):
            raise LmtuneError(f"{path} is not a JSON object; restore it or re-run the sweep")
        check_sweep_json(raw, path)  # before any value of it is used
        try:
            plan = SweepPlan.from_json(raw) if raw.get("space") and raw.get("base_config") else None
        except LmtuneError as err:
            raise LmtuneError(f"{path}: {err}") from None
        return cls._parsed(raw, plan)

    @classmethod
    def _parsed(cls, raw: JsonObject, plan: SweepPlan | None) -> SweepRecord:
        """The record of a checked sweep.json (the JSON types of its values are as SWEEP_JSON says)."""
        data = raw.get("data") or {}
        keep = raw.get("keep", Keep.BEST)
        return cls(
            name=raw.get("name", ""), plan=plan, data=DataRecord(data.get("dir", ""), data_meta(data.get("meta"))),
            versions=raw.get("versions") or {}, hardware=raw.get("hardware") or {},
            resources_per_trial={k: float(v) for k, v in (raw.get("resources_per_trial") or {}).items()},
            max_concurrent=_maybe(int, raw.get("max_concurrent")),
            time_budget_s=_maybe(float, raw.get("time_budget_s")), address=raw.get("address"),
            start_time=raw.get("start_time", ""), command=tuple(raw.get("command") or ()),
            resumed_at=tuple(raw.get("resumed_at") or ()), keep=Keep(keep) if keep in set(Keep) else Keep.BEST,
            model_fingerprint=raw.get("model_fingerprint", ""), code_files=raw.get("code_files") or {},
            ended=raw.get("ended") or {})


def _maybe(kind: type, value: Any) -> Any:
    """``value`` as ``kind``, or None."""
    return None if value is None else kind(value)


# The fields of DataMeta a meta.json must hold (lmtune.data.dataset.read_meta); the others have defaults.
META_REQUIRED = ("vocab_size", "dtype", "train_tokens", "val_tokens", "max_token_id")


def data_meta(meta: Any) -> DataMeta | None:
    """sweep.json's data.meta as the DataMeta it was written from (None: none recorded); ValueError when it is not
    one (what lmtune.data.dataset.read_meta reads from a meta.json, it reads from here)."""
    if meta is None:
        return None
    if not isinstance(meta, dict) or any(k not in meta for k in META_REQUIRED):
        raise ValueError(f"not a mapping with {', '.join(META_REQUIRED)}")
    if not isinstance(meta.get("sources", []), list):
        raise ValueError("its sources are not a list")
    return DataMeta(vocab_size=_whole(meta["vocab_size"]), dtype=str(meta["dtype"]),
                    train_tokens=_whole(meta["train_tokens"]), val_tokens=_whole(meta["val_tokens"]),
                    max_token_id=_whole(meta["max_token_id"]), eot_id=_maybe(_whole, meta.get("eot_id")),
                    content_hash=str(meta.get("content_hash", "")), sources=list(meta.get("sources", [])),
                    tokenizer=meta.get("tokenizer"), validation=validation_record(meta.get("validation")),
                    unigram_loss=_maybe(float, meta.get("unigram_loss")))


def _whole(value: Any) -> int:
    if not _json_is(value, int):
        raise ValueError(f"{shown(value)} is not a whole number")
    return int(value)


# ---------------------------------------------------------------------------------------------
# sweep.json as read back: every value a reader uses checked before anything is done with it

RESTORE = "restore the file from a copy of the sweep, or start a new sweep"
# The JSON type of each top-level key this version reads (as SweepRecord.to_json writes it).
SWEEP_JSON: dict[str, object] = {
    "name": str, "space": dict, "budget": str, "base_config": dict, "asha": dict | None, "data": dict,
    "versions": dict, "hardware": dict, "resources_per_trial": dict[str, float], "max_concurrent": int | None,
    "time_budget_s": float | None, "address": str | None, "start_time": str, "command": list[str],
    "resumed_at": list[str], "keep": str, "model_fingerprint": str, "code_files": dict, "ended": dict}
# What a JSON value of each type is called in a refusal.
JSON_WORDS = {dict: "a mapping", list: "a list", str: "a string", int: "a whole number", float: "a number",
              bool: "true or false"}


def check_sweep_json(raw: JsonObject, path: Path) -> None:
    """Refuse, in one line naming the file and the key, a sweep.json (edited, or damaged) whose values the
    readers (analyze, diagnose, run --resume) cannot use: a key of the wrong JSON type, the space's scheduler,
    stopper and search settings checked as a space file's are, the base config's fields each of its type, ASHA's
    rungs, the data's meta.json. Keys this version does not know are left alone (a sweep of another version may
    hold them)."""
    def fail(key: str, message: str) -> LmtuneError:
        return LmtuneError(f"{path}: {key} {message}; {RESTORE}")

    for name, hint in SWEEP_JSON.items():
        if name in raw and not _json_is(raw[name], hint):
            raise fail(name, f"is {_shown(raw[name])}, not {_json_words(hint)}")
    _check_space(raw.get("space") or {}, fail)
    _check_base_config(raw.get("base_config") or {}, fail)
    _check_asha(raw.get("asha"), fail)
    data = raw.get("data") or {}
    if not isinstance(data.get("dir", ""), str):
        raise fail("data.dir", f"is {_shown(data.get('dir'))}, not a string")
    try:
        data_meta(data.get("meta"))
    except ValueError as err:
        raise fail("data.meta", f"is not the meta.json lmtune.prepare writes ({err})") from None


def _check_space(space: JsonObject, fail: Fail) -> None:
    """The space's sections the readers use, as a space file's are checked (lmtune.sweep.spaces)."""
    def section(name: str, cls: type) -> Any:
        values = space.get(name)
        if isinstance(values, dict):  # another version's keys are left out, not refused
            values = {k: v for k, v in values.items() if k in cls.__dataclass_fields__}
        return settings_section(values, f"space.{name}", cls, fail)

    scheduler = section("scheduler", SchedulerSpec)
    if scheduler.name not in SCHEDULERS or scheduler.reduction_factor <= 1 or scheduler.grace_period <= 0:
        raise fail("space.scheduler", f"is {_shown(space.get('scheduler'))}: not a scheduler {', '.join(SCHEDULERS)} "
                                      "with grace_period > 0 and reduction_factor > 1")
    stopper = section("stopper", StopperSpec)
    try:
        stopper.rule.validate("space.stopper")
    except LmtuneError as err:  # "space.stopper.KEY: what is wrong (got VALUE)"
        key, _, message = str(err).partition(": ")
        raise fail(key, message) from None
    search = space.get("search", "grid")
    if not isinstance(search, str) or search not in STRATEGIES:
        raise fail("space.search", f"is {_shown(search)}, not one of {', '.join(STRATEGIES)}")
    strategy = STRATEGIES[search].strategy
    if hasattr(strategy, "section"):  # a search with a section of its own (edge:, horizon:), as its YAML is checked
        name, settings_class = strategy.section()
        for key, message in section(name, settings_class).problems():  # (the report divides by them, too)
            raise fail(f"space.{name}.{key}", message)
    for key, kind in (("name", str), ("path", str), ("description", str), ("yaml", str), ("fuse", int),
                      ("fixed", dict)):
        if key in space and not _json_is(space[key], kind):
            raise fail(f"space.{key}", f"is {_shown(space[key])}, not {_json_words(kind)}")


def _check_base_config(config: JsonObject, fail: Fail) -> None:
    for part, fields_of in (("model", MODEL_FIELDS), ("train", TRAIN_FIELDS)):
        values = config.get(part, {})
        if not isinstance(values, dict):
            raise fail(f"base_config.{part}", f"is {_shown(values)}, not a mapping")
        for key, value in values.items():
            kind = fields_of[key].type if key in fields_of else None
            hint = {"int": int, "float": float, "bool": bool, "str": str}.get(str(kind))
            if hint is not None and not _json_is(value, hint):
                raise fail(f"base_config.{part}.{key}", f"is {_shown(value)}, not {_json_words(hint)}")
    for key, kind in (("budget", str), ("data_dir", str), ("vocab_from_data", bool)):
        if key in config and not _json_is(config[key], kind):
            raise fail(f"base_config.{key}", f"is {_shown(config[key])}, not {_json_words(kind)}")


def _check_asha(asha: JsonObject | None, fail: Fail) -> None:
    """ASHA's rungs in tokens (AshaBudget): a rung of 1 token or more, growing by a factor above 1 (its rungs are
    counted up to max_t: a factor of 1 would never get there)."""
    if asha is None:
        return
    tokens = [asha.get(k) for k in ("max_t", "grace_period")]
    if set(asha) != {f.name for f in fields(AshaBudget)} or not all(_json_is(t, int) and t >= 1 for t in tokens) \
            or not (_json_is(asha["reduction_factor"], float) and asha["reduction_factor"] > 1):
        raise fail("asha", f"is {_shown(asha)}, not ASHA's max_t and grace_period in tokens and a reduction_factor "
                           "above 1")


def _json_is(value: Any, hint: Any) -> bool:
    """Whether a JSON value has the type ``hint`` (str, int, float, bool, dict[str, X], list[X], X | None)."""
    if isinstance(hint, types.UnionType):
        return any(_json_is(value, h) for h in typing.get_args(hint))
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    origin, args = typing.get_origin(hint) or hint, typing.get_args(hint)
    if origin is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if origin is int:
        return _json_is(value, float) and float(value).is_integer()
    if not isinstance(value, origin):
        return False
    if origin is dict and args:
        return all(_json_is(v, args[1]) for v in value.values())
    if origin is list and args:
        return all(_json_is(v, args[0]) for v in value)
    return True


def _json_words(hint: Any) -> str:
    """``hint`` in words: "a mapping of numbers", "a string or null"."""
    kinds = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    words = []
    for kind in kinds:
        origin, item = typing.get_origin(kind) or kind, (typing.get_args(kind) or (Any,))[-1]
        word = JSON_WORDS.get(origin, "null")
        words.append(word if item is Any else f"{word} of {JSON_WORDS[item].split(' ', 1)[1]}s")
    return " or ".join(words)


def _shown(value: Any) -> str:
    return "null" if value is None else shown(value)
