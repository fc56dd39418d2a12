"""A search checked against the truth: a dense grid of LRs, several seeds each, every run trained to the
full budget with nothing stopping it early (benchmarks/lr_truth.py trains one).

The truth about failure needs no window: a run of the grid fails when it ends its budget with the loss above
ℓ₀ or goes non-finite. Its best LR, basin and degraded region are lmtune's own analysis
(lmtune.sweep.conclusion.conclude) applied to those runs. ``compare`` then asks of a sweep's summary the three
questions a careful reader would: is the search's best LR in the truth's basin, does its bracket hold the
truth's first LR that fails, and do its basin and degraded region overlap the truth's.

A truth answers for one setting (``setting_of``: model, budget, schedule, optimizer, data): its runs must
share it, and a sweep is compared with it only where they agree on it; the LR and seed are what a grid varies.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lmtune.data.dataset import read_meta
from lmtune.errors import LmtuneError
from lmtune.files import JsonObject, JsonValue
from lmtune.sweep.conclusion import conclude
from lmtune.sweep.record import run_config_of
from lmtune.sweep.runs import Budget, Run
from lmtune.sweep.sweep_file import SweepRecord
from lmtune.training.config import RunConfig
from lmtune.training.divergence import DEFAULT_RULE, WHOLE_RUN, DivergenceRule, judge
from lmtune.training.metric_registry import Row, RowValue
from lmtune.training.metrics import METRICS_FILE, read_metrics


@dataclass
class TruthRun:
    """One run of the grid: what its loss did over its whole budget."""

    lr: float
    seed: int
    steps: int
    tokens_per_step: int
    ell0: float
    val: dict[int, float]
    """Val loss by tokens."""
    end_val: float | None
    """Its val loss at the end of the budget (None: it went non-finite before)."""
    failed: bool
    """It went non-finite, or its budget ended with the loss above ℓ₀."""
    non_finite: bool
    longest_above: int
    """The most steps its loss spent above ℓ₀ in one stretch."""
    rule_stops_at: int | None
    """Where the stopper's rule (with the rule given to ``read_truth``) would have ended it."""
    setting: Setting
    """What it shares with every other run of its truth (``setting_of``)."""
    spikes: list[str] = field(default_factory=list)


# What two runs must share for their losses to be one truth, by group (a refusal names the group and field):
# everything that shapes the loss curve but the LR and seed. How often a run logs, evaluates or checkpoints,
# its device and compilation are bookkeeping; ``run_steps`` is the budget a search cuts its runs to.
SETTING: dict[str, tuple[str, ...]] = {
    "model": ("vocab_size", "d_model", "d_ff", "n_layers", "n_heads", "rope_theta", "norm_eps", "qk_norm",
              "z_loss"),
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


def _json_object(path: Path) -> JsonObject:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise LmtuneError(f"{path} is unreadable ({type(err).__name__}); retrain that run or move it out") from None
    if not isinstance(value, dict):
        raise LmtuneError(f"{path} is not a JSON object; retrain that run or move it out")
    return value


def run_folders(folder: Path) -> list[Path]:
    """The finished runs (a summary.json) of a truth folder, refused in one line where there are none."""
    folder = Path(folder)
    if not folder.is_dir():
        what = "is a file" if folder.exists() else "does not exist"
        raise LmtuneError(f"truth {folder} {what}; give the folder lr_truth.py train wrote (its --out)")
    runs = sorted(p for p in folder.iterdir() if (p / "summary.json").is_file())
    if not runs:
        raise LmtuneError(f"truth {folder} holds no finished run; train it first (lr_truth.py train --out {folder})")
    return runs


def read_truth(folder: Path, rule: DivergenceRule = DEFAULT_RULE) -> list[TruthRun]:
    """Every finished run under ``folder`` (one run folder per LR and seed, as lmtune.training.loop writes);
    refused in one line where there are none or they differ in setting."""
    runs, data = [], {}
    for run_dir in run_folders(folder):
        summary = _json_object(run_dir / "summary.json")
        config = run_config_of(_json_object(run_dir / "config.json"))
        if config is None:
            raise LmtuneError(f"{run_dir / 'config.json'} is not a run's config; retrain that run or move it out")
        data.setdefault(config.data_dir, data_of(config.data_dir))  # (each data dir's meta.json read once)
        setting = setting_of(config, data[config.data_dir])
        if runs and (differ := setting_differences(runs[0].setting, setting)):
            raise LmtuneError(f"truth {folder} mixes settings: {run_dir.name} differs from the others in {differ}; "
                              "a truth holds one setting: move the odd runs out")
        rows = read_metrics(run_dir / METRICS_FILE)
        ell0, steps = math.log(config.model.vocab_size), config.train.steps
        non_finite = summary["status"] == "diverged" and "non-finite" in (summary.get("reason") or "")
        last = rows[-1]["train_loss"] if rows else math.nan
        watch = judge([(r["step"], r["train_loss"]) for r in rows], ell0, steps, steps, rule)
        val = {int(r["tokens"]): r["val_loss"] for r in rows if r.get("val_loss") is not None}
        full = rows and rows[-1]["step"] == steps and not non_finite
        runs.append(TruthRun(
            config.train.lr, config.train.seed, steps, config.tokens_per_step, ell0, val,
            rows[-1].get("val_loss") if full else None,
            non_finite or not (math.isfinite(last) and last <= ell0), non_finite, longest_above(rows, ell0),
            watch.verdict.step if watch.verdict.stop and not non_finite else None, setting,
            [s.describe() for s in watch.all_spikes()]))
    return sorted(runs, key=lambda r: (r.lr, r.seed))


def longest_above(rows: list[Row], ell0: float) -> int:
    """The most steps the loss spent above ℓ₀ in one stretch (from its last row at or below it, step 0
    counting as at ℓ₀), to where it came back or where the run ended."""
    longest, below = 0, 0
    for row in rows:
        if row["train_loss"] <= ell0:
            below = row["step"]
        longest = max(longest, row["step"] - below)
    return longest


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


def truth_conclusion(runs: list[TruthRun]) -> JsonObject:
    """lmtune's analysis of the grid (nothing stopped its runs): best LR, basin, degraded region, and the
    first LR at which a run failed (``divergence_lr``), all at the full budget; in summary.json's keys, as
    ``compare`` reads them beside a sweep's summary.json."""
    first = runs[0]
    full = first.steps * first.tokens_per_step
    as_runs = [Run(r.lr, r.seed, "grid", full, full, "diverged" if r.failed else "completed", full, r.val,
                   divergence=WHOLE_RUN) for r in runs]
    return conclude(as_runs, Budget(first.steps, 0, first.tokens_per_step, 0, (full,))).to_json()


Span = tuple[float | None, float | None]
"""An LR interval: its low and high end (None: open, or nothing to bound)."""


@dataclass(frozen=True)
class HorizonComparison:
    """A horizon search's prediction against the truth at its target budget (``compare_horizon``)."""

    predicted_lr: float | None
    """The search's predicted LR."""
    predicted_lr_interval: Span
    """The search's interval around it."""
    truth_best_lr: float | None
    """The truth's best LR."""
    truth_basin: Span
    """The truth's basin, at its widest."""
    predicted_over_truth_best: float | None
    """The predicted LR over the truth's best."""
    predicted_excess_in_truth: float | None
    """The predicted LR's loss on the truth's curve (log-LR interpolation) above the truth's best mean."""
    truth_two_standard_errors: float | None
    """Two standard errors of a difference of two LRs' means in the truth (None: no seed spread)."""
    predicted_lr_in_truth_basin: bool
    """The excess is within those two standard errors."""
    interval_holds_truth_best: bool
    """The search's interval holds the truth's best LR."""
    search_tokens: int | None
    """Tokens the search trained."""
    truth_tokens: int
    """Tokens the truth trained."""
    search_over_truth_tokens: float | None
    """The first over the second."""

    def to_json(self) -> JsonObject:
        """The comparison as lr_truth.py prints it (its intervals as [low, high])."""
        return {**asdict(self), "predicted_lr_interval": list(self.predicted_lr_interval)}


@dataclass(frozen=True)
class TruthComparison:
    """A search's summary against the truth's conclusion (``compare``)."""

    best_lr_in_truth_basin: bool
    """The search's best LR lies among the LRs the truth found in its basin."""
    best_lr_within_truth_basin_bounds: bool
    """... or at least not outside the bounds of the truth's basin (between the grid LRs its boundaries lie
    between), which is all a coarse grid can tell."""
    truth_basin: Span
    """The truth's basin, at its widest."""
    search_best_lr: float | None
    """The search's best LR."""
    bracket_holds_first_failing_lr: bool
    """The search's edge bracket holds the truth's first LR that fails."""
    truth_first_failing_lr: float | None
    """The truth's first LR that fails."""
    truth_last_lr_through: float | None
    """The truth's last LR that came through below it."""
    search_bracket: Span
    """The search's edge bracket (its last LR through, its divergence LR)."""
    edges_overlap: bool
    """The two brackets can hold the same edge: (truth's last LR through, first failing] meets the search's."""
    basins_overlap: bool
    """The truth's and the search's basins share an LR."""
    degraded_overlap: bool
    """The truth's and the search's degraded regions share an LR."""
    truth_degraded: Span
    """The truth's degraded region, at its widest."""
    search_degraded: Span
    """The search's degraded region, at its widest."""
    search_basin: Span
    """The search's basin, at its widest."""

    def to_json(self) -> JsonObject:
        """The comparison as lr_truth.py prints it."""
        return asdict(self)


def compare_horizon(truth: JsonObject, search: JsonObject, truth_tokens: int) -> HorizonComparison:
    """A horizon search's prediction (summary.json keys) against the truth at its target budget: whether the
    predicted LR lies in the truth's basin (its loss, read off the truth's curve between grid LRs in log LR,
    within 2 standard errors of the truth's best mean), where it lies against the truth's best LR, and the
    tokens the search trained against the truth's."""
    predicted, best = search.get("predicted_lr"), truth.get("best_lr")
    ranking = sorted(truth.get("ranking") or [], key=lambda r: r["lr"])
    excess = two_se = None
    if predicted is not None and ranking and ranking[0]["lr"] <= predicted <= ranking[-1]["lr"]:
        xs, ys = [math.log(r["lr"]) for r in ranking], [r["mean"] for r in ranking]
        k = max(i for i, x in enumerate(xs) if x <= math.log(predicted))
        k = min(k, len(xs) - 2)
        t = (math.log(predicted) - xs[k]) / (xs[k + 1] - xs[k])
        excess = ys[k] + t * (ys[k + 1] - ys[k]) - truth["best_lr_mean_loss"]
        sigma, n = truth.get("seed_spread"), len(truth.get("best_lr_seed_losses") or [])
        two_se = 2 * sigma * math.sqrt(2 / n) if sigma is not None and n else None
    low, high = search.get("predicted_lr_interval") or (None, None)
    spent = (search.get("compute") or {}).get("tokens_spent")
    return HorizonComparison(
        predicted, (low, high), best, region_span(truth.get("basin")),
        predicted / best if predicted and best else None, excess, two_se,
        excess is not None and two_se is not None and excess <= two_se,
        bool(low and high and best and low <= best <= high),
        spent, truth_tokens, spent / truth_tokens if spent and truth_tokens else None)


def _overlap(a: Span, b: Span) -> bool:
    """Two LR intervals (None: open on that side) share a point."""
    low = max(x for x in (a[0], b[0], 0.0) if x is not None)
    high = min(x for x in (a[1], b[1], math.inf) if x is not None)
    return low <= high


def region_span(region: JsonValue) -> Span:
    """The widest an LR region (summary.json's form) can be: from its lower boundary's low end to its upper
    boundary's high end."""
    if not region:
        return None, None
    return region["low"][0], region["high"][1]


def compare(truth: JsonObject, search: JsonObject) -> TruthComparison:
    """The three checks of a search's summary (summary.json keys) against the truth's conclusion."""
    t_basin, s_basin = truth.get("basin"), search.get("basin")
    best = search.get("best_lr")
    # Within the LRs the truth found in its basin (the basin's boundaries lie beyond them, between grid LRs).
    in_basin = bool(t_basin and best is not None and t_basin["lrs"][0] <= best <= t_basin["lrs"][-1])
    first_fail = truth.get("divergence_lr")
    low, high = search.get("edge_lr_low"), search.get("divergence_lr")
    bracket_holds = first_fail is not None and high is not None and (low is None or low < first_fail) \
        and first_fail <= high
    return TruthComparison(
        best_lr_in_truth_basin=in_basin,
        best_lr_within_truth_basin_bounds=bool(t_basin and best is not None
                                               and _overlap((best, best), region_span(t_basin))),
        truth_basin=region_span(t_basin), search_best_lr=best,
        bracket_holds_first_failing_lr=bracket_holds,
        truth_first_failing_lr=first_fail, truth_last_lr_through=truth.get("edge_lr_low"),
        search_bracket=(low, high),
        edges_overlap=first_fail is not None and high is not None
        and _overlap((truth.get("edge_lr_low"), first_fail), (low, high)),
        basins_overlap=bool(t_basin and s_basin and _overlap(region_span(t_basin), region_span(s_basin))),
        degraded_overlap=bool(truth.get("degraded") and search.get("degraded")
                              and _overlap(region_span(truth["degraded"]), region_span(search["degraded"]))),
        truth_degraded=region_span(truth.get("degraded")), search_degraded=region_span(search.get("degraded")),
        search_basin=region_span(s_basin))
