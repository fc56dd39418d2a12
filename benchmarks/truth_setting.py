"""What a truth's runs share (its setting: model, budget, schedule, optimizer, data), and the refusal to compare a
truth with a sweep of another setting. A truth answers for one setting: its runs must share it, and a sweep is
compared with it only where they agree on it; the LR and seed are what a grid varies (benchmarks.truth).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from lmtune.data.dataset import read_meta
from lmtune.errors import LmtuneError
from lmtune.files import JsonObject
from lmtune.sweep.sweep_file import SweepRecord
from lmtune.training.config import RunConfig
from lmtune.training.metric_registry import RowValue

# What two runs must share for their losses to be one truth, by group (a refusal names the group and field):
# everything that shapes the loss curve but the LR and seed. How often a run logs, evaluates or checkpoints,
# its device and compilation are bookkeeping; ``run_steps`` is the budget a search cuts its runs to.
# μP's fields (lmtune.training.model): a grid.json written before they existed trained the SP model.
PARAMETRIZATION_FIELDS = ("parametrization", "mup_base_width", "mup_base_head_dim")
OLDER_MODEL = {"parametrization": "sp", "mup_base_width": 128, "mup_base_head_dim": 32}
SETTING: dict[str, tuple[str, ...]] = {
    "model": ("vocab_size", "d_model", "d_ff", "n_layers", "n_heads", "rope_theta", "norm_eps", "qk_norm",
              "z_loss", *PARAMETRIZATION_FIELDS),
    "budget": ("steps", "batch_size", "context_length", "tokens"),
    "schedule": ("schedule", "warmup_steps", "min_lr_ratio", "cooldown_fraction", "cooldown_shape"),
    "optimizer": ("weight_decay", "beta1", "beta2", "eps", "grad_clip"),
}


@dataclass(frozen=True)
class TruthData:
    """A data dir as a truth knows it."""

    dir: str = ""
    """Its resolved path ("" where none was recorded)."""
    content_hash: str = ""
    """Its tokens' hash (meta.json's; "" where it could not be read)."""


@dataclass(frozen=True)
class Setting:
    """What every run of one truth shares: SETTING's fields by group (a config's values, None where a group's
    field means nothing to the run, or an older grid.json lacks it) and its data."""

    groups: dict[str, dict[str, RowValue]]
    """SETTING's groups (model, budget, schedule, optimizer), each its fields' values, in SETTING's order."""
    data: TruthData
    """The data its runs trained on."""

    def to_json(self) -> JsonObject:
        """grid.json's ``setting``: the groups, then ``data``."""
        return {**{group: dict(values) for group, values in self.groups.items()}, "data": asdict(self.data)}

    @classmethod
    def from_json(cls, raw: JsonObject) -> Setting:
        """grid.json's ``setting`` (a group or field it lacks: unknown, None)."""
        groups = {group: {k: v for k, v in (raw.get(group) or {}).items() if not isinstance(v, (list, dict))}
                  for group in SETTING if isinstance(raw.get(group) or {}, dict)}
        if "model" in groups and "parametrization" not in groups["model"]:
            groups["model"].update(OLDER_MODEL)
        data = raw.get("data") if isinstance(raw.get("data"), dict) else {}
        return cls(groups, TruthData(str(data.get("dir") or ""), str(data.get("content_hash") or "")))


def data_of(data_dir: str) -> TruthData:
    """A data dir as a truth knows it: its path and (while it can be read) its content hash."""
    try:
        digest = read_meta(Path(data_dir)).content_hash if data_dir else ""
    except LmtuneError:  # moved or deleted since: the path is all that is left to go by
        digest = ""
    return TruthData(str(Path(data_dir).resolve()) if data_dir else "", digest)


def setting_of(config: RunConfig, data: TruthData | None = None) -> Setting:
    """The setting of a run's config, by SETTING's groups, and its ``data`` (``data_of``; default: that of the
    config's data_dir)."""
    flat = {**asdict(config.model), **asdict(config.train), "tokens": config.total_tokens}
    if config.train.schedule != "wsd":  # the cooldown's settings mean nothing to another schedule
        flat["cooldown_fraction"] = flat["cooldown_shape"] = None
    return Setting({group: {k: flat.get(k) for k in keys} for group, keys in SETTING.items()},
                   data or data_of(config.data_dir))


def setting_differences(a: Setting, b: Setting) -> str:
    """Where two settings differ, in one line ("budget (steps 4 vs 8), data (A vs B)"); "" where they agree."""
    parts = []
    for group, keys in SETTING.items():
        ga, gb = a.groups.get(group) or {}, b.groups.get(group) or {}
        if changed := [f"{k} {ga.get(k)} vs {gb.get(k)}" for k in keys if ga.get(k) != gb.get(k)]:
            parts.append(f"{group} ({', '.join(changed)})")
    da, db = a.data, b.data
    if da.content_hash and db.content_hash and da.content_hash != db.content_hash:
        parts.append(f"data ({da.dir} vs {db.dir}: other tokens)" if da.dir == db.dir
                     else f"data ({da.dir} vs {db.dir})")
    elif not (da.content_hash and db.content_hash) and da.dir != db.dir:
        parts.append(f"data ({da.dir or '?'} vs {db.dir or '?'})")
    return ", ".join(parts)


def check_comparable(truth: Path, setting: Setting, sweep: Path, record: SweepRecord) -> None:
    """Refuse in one line to compare a truth of one setting with a sweep (sweep.json) of another: its best LR,
    basin and edge answer for that setting only."""
    if record.plan is None:
        raise LmtuneError(f"{sweep}/sweep.json records no base config, so its model and budget are unknown; "
                          "compare a sweep written by this version of lmtune")
    recorded = record.data
    data = TruthData(recorded.dir, recorded.meta.content_hash if recorded.meta else "") if recorded.dir else None
    theirs = setting_of(record.plan.base, data)
    fields = {k for keys in SETTING.values() for k in keys}
    if varied := [k for k in record.plan.space.swept if k in fields]:
        raise LmtuneError(f"sweep {sweep} varies {', '.join(varied)} from trial to trial, and truth {truth} holds "
                          "one setting; compare an LR sweep")
    if differ := setting_differences(setting, theirs):
        raise LmtuneError(f"truth {truth} and sweep {sweep} differ in {differ}; a truth answers only for its own "
                          "model, budget and data: train a truth of the sweep's setting")
