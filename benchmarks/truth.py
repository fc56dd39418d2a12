"""A search checked against the truth: a dense grid of LRs, at least TRUTH_SEEDS seeds each, every run trained
to the full budget with nothing stopping it early (benchmarks/lr_truth.py trains one).

The truth about failure needs no window: a run of the grid fails when it goes non-finite, ends its budget with the
loss above ℓ₀, or (above an LR that trained) ends no better than the data's unigram baseline. The grid is judged by
benchmarks.truth_rules, a small implementation of those definitions written apart from lmtune's analysis, so that
a bug in lmtune's own rules cannot pass both the search and its truth: best LR, basin, degraded region, edge.
``compare`` then asks of a sweep's summary what a careful reader would, each a check that can fail: is the
search's best LR inside the truth's basin (the LRs within 2 standard errors of its best, not the clearly worse LRs
around them), does its edge bracket overlap the truth's (where the truth's own seeds disagree about the edge, no
wider), and do its basin and degraded region overlap the truth's. ``compare_horizon`` asks of a horizon search's
prediction whether its loss on the truth's curve is within 2 standard errors of the truth's best. Each refuses,
in one line, a truth with fewer than TRUTH_SEEDS seeds at an LR it reads.

A truth answers for one setting (benchmarks.truth_setting): its runs must share it, and a sweep is compared
with it only where they agree on it; the LR and seed are what a grid varies.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from benchmarks import truth_rules as rules
from benchmarks.truth_setting import Setting, data_of, setting_differences, setting_of
from lmtune.data.dataset import data_unigram_loss
from lmtune.errors import LmtuneError
from lmtune.files import JsonObject, JsonValue
from lmtune.searches.textbook import TextbookRule, horizon_rule, width_rule
from lmtune.training.config import run_config_of
from lmtune.training.metric_registry import Row
from lmtune.training.metrics import METRICS_FILE, read_metrics

# A check reads at least this many seeds at each truth LR it uses: with two, one seed can decide the verdict
# (issue 32: a horizon prediction passed against a truth's first two seeds and missed against all three), and
# the pooled seed spread the 2-SE margins come from has 2 degrees of freedom per LR.
TRUTH_SEEDS = 3


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
    """It diverged (benchmarks.truth_rules.diverged): it went non-finite, or its budget ended with the loss above
    ℓ₀. (Failing also counts ending no better than the baseline: truth_rules.failed_runs.)"""
    non_finite: bool
    longest_above: int
    """The most steps its loss spent above ℓ₀ in one stretch."""
    rule_stops_at: int | None
    """Where the stopper given to ``read_truth`` would have ended it (None: never, or none given)."""
    setting: Setting
    """What it shares with every other run of its truth (``setting_of``)."""
    spikes: list[str] = field(default_factory=list)
    baseline: float | None = None
    """Its data's unigram baseline (lmtune.data.dataset.data_unigram_loss; None: the data dir is gone): ending no
    better, above an LR that trained, it failed (benchmarks.truth_rules.failed_runs)."""


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


Stopper = Callable[[list[Row], float, int], tuple[int | None, list[str]]]
"""A stopper's rule put to the truth (its rows, ℓ₀, its steps -> the step at which the rule would end it, None:
never; the spikes it names): what ``lr_truth.py table`` checks against the truth, never how the truth is judged."""


def read_truth(folder: Path, stopper: Stopper | None = None) -> list[TruthRun]:
    """Every finished run under ``folder`` (one run folder per LR and seed, as lmtune.training.loop writes);
    refused in one line where there are none or they differ in setting. ``stopper``: a rule whose verdict each
    run records (``rule_stops_at``, ``spikes``; None: none recorded)."""
    runs, data, baselines = [], {}, {}
    for run_dir in run_folders(folder):
        summary = _json_object(run_dir / "summary.json")
        config = run_config_of(_json_object(run_dir / "config.json"))
        if config is None:
            raise LmtuneError(f"{run_dir / 'config.json'} is not a run's config; retrain that run or move it out")
        if config.data_dir not in data:  # (each data dir's meta.json read once)
            data[config.data_dir], baselines[config.data_dir] = data_of(config.data_dir), _baseline(config.data_dir)
        setting = setting_of(config, data[config.data_dir])
        if runs and (differ := setting_differences(runs[0].setting, setting)):
            raise LmtuneError(f"truth {folder} mixes settings: {run_dir.name} differs from the others in {differ}; "
                              "a truth holds one setting: move the odd runs out")
        rows = read_metrics(run_dir / METRICS_FILE)
        ell0, steps = math.log(config.model.vocab_size), config.train.steps
        # (what the loop recorded: a gradient norm can go non-finite where no logged loss shows it)
        non_finite = summary["status"] == "diverged" and "non-finite" in (summary.get("reason") or "")
        last = rows[-1]["train_loss"] if rows else math.nan
        stops, spikes = stopper(rows, ell0, steps) if stopper else (None, [])
        val = {int(r["tokens"]): r["val_loss"] for r in rows if r.get("val_loss") is not None}
        full = rows and rows[-1]["step"] == steps and not non_finite
        runs.append(TruthRun(
            config.train.lr, config.train.seed, steps, config.tokens_per_step, ell0, val,
            rows[-1].get("val_loss") if full else None, rules.diverged(non_finite, last, ell0), non_finite,
            longest_above(rows, ell0), None if non_finite else stops, setting, spikes, baselines[config.data_dir]))
    return sorted(runs, key=lambda r: (r.lr, r.seed))


def _baseline(data_dir: str) -> float | None:
    try:
        return data_unigram_loss(Path(data_dir)) if data_dir else None
    except (LmtuneError, OSError):  # moved or deleted since: runs are judged by divergence alone
        return None


def longest_above(rows: list[Row], ell0: float) -> int:
    """The most steps the loss spent above ℓ₀ in one stretch (from its last row at or below it, step 0
    counting as at ℓ₀), to where it came back or where the run ended."""
    longest, below = 0, 0
    for row in rows:
        if row["train_loss"] <= ell0:
            below = row["step"]
        longest = max(longest, row["step"] - below)
    return longest


def truth_conclusion(runs: list[TruthRun]) -> JsonObject:
    """The grid judged by the truth's own rules (benchmarks.truth_rules, nothing of lmtune's analysis): best LR,
    basin, degraded region, the first LR at which a run failed (``failing_lr``) and at which one diverged, all at
    the full budget; in summary.json's keys, as ``compare`` reads them beside a sweep's summary.json, and
    ``grid``: each LR's seeds that came through and that failed."""
    failed = {id(r) for r in rules.failed_runs(runs)}
    grid = [{"lr": lr, "seeds_through": sorted(r.seed for r in runs if r.lr == lr and id(r) not in failed),
             "seeds_failed": sorted(r.seed for r in runs if r.lr == lr and id(r) in failed)}
            for lr in sorted({r.lr for r in runs})]
    ranked = rules.ranking(runs)
    sigma, spread_lrs = rules.pooled_spread(ranked)
    best = ranked[0] if ranked else None
    failing_low, failing = rules.failing_bracket(runs)
    divergence_low, divergence = rules.divergence_bracket(runs)
    return {"best_lr": best.lr if best else None, "best_lr_seed_losses": list(best.losses) if best else [],
            "best_lr_seeds": list(best.seeds) if best else [], "best_lr_mean_loss": best.mean if best else None,
            "seed_spread": sigma, "failing_lr_low": failing_low, "failing_lr": failing,
            "divergence_lr_low": divergence_low, "divergence_lr": divergence,
            "seed_dependent": [{"lr": row["lr"], "seeds_through": row["seeds_through"],
                                "seeds_diverged": row["seeds_failed"]}
                               for row in grid if row["seeds_through"] and row["seeds_failed"]],
            **_regions(ranked, sigma, spread_lrs, failing), "ranking": [r.to_json() for r in ranked], "grid": grid}


def _regions(ranked: list[rules.LrMean], sigma: float | None, spread_lrs: list[float],
             failing: float | None) -> JsonObject:
    """The basin (truth_rules.basin) and the degraded region above it, each end between two tried LRs (summary.json's
    form): the degraded region is the LRs above the basin's last, below the failing LR (None: fewer than one)."""
    if not ranked:
        return {"basin": None, "degraded": None}
    best, line = ranked[0], sorted(ranked, key=lambda r: r.lr)
    inside = rules.basin(ranked, sigma)
    low, high = line.index(inside[0]), line.index(inside[-1])
    above = [r for r in line[high:] if failing is None or r.lr < failing]
    basin = {"lrs": [r.lr for r in inside], "low": [line[low - 1].lr if low else None, inside[0].lr],
             "high": [inside[-1].lr, line[high + 1].lr if high + 1 < len(line) else failing],
             "best_loss": best.mean, "seed_spread": sigma, "spread_lrs": spread_lrs,
             "margin": rules.margin(best, best, sigma) if sigma is not None else None}
    return {"basin": basin, "degraded": _degraded(above, best, failing) if len(above) > 1 else None}


# The multiples of the best LR at which the degraded region's excess loss is stated (interpolated in log LR).
DEGRADED_AT = (2, 4, 10, 30, 100, 300)


def _degraded(top: list[rules.LrMean], best: rules.LrMean, failing: float | None) -> JsonObject:
    """The degraded region from the basin's last LR (``top[0]``) up: each LR's excess over the best's mean, that
    excess at DEGRADED_AT multiples of the best LR within the LRs tried, and the least-squares slope of the excess
    against log2 LR (nats per doubling) with its straight-line standard error (None under 3 points)."""
    xs = np.log2([r.lr / best.lr for r in top])
    ys = np.array([r.mean - best.mean for r in top])
    slope, intercept = np.polyfit(xs, ys, 1)
    residual = ys - (slope * xs + intercept)
    se = math.sqrt(float(residual @ residual) / (len(xs) - 2) / float(((xs - xs.mean()) ** 2).sum())) \
        if len(xs) > 2 else None
    return {"low": [top[0].lr, top[1].lr], "high": [top[-1].lr, failing],
            "points": [{"lr": r.lr, "ratio_to_best": r.lr / best.lr, "loss": r.mean, "excess": r.mean - best.mean,
                        "seeds": len(r.losses)} for r in top[1:]],
            "excess_at": {str(f): float(np.interp(math.log2(f), xs, ys)) for f in DEGRADED_AT
                          if xs[0] <= math.log2(f) <= xs[-1]},
            "per_doubling": float(slope), "per_doubling_se": se}


def check_truth_seeds(truth: JsonObject, lrs: list[float | None]) -> None:
    """Refuse in one line where the truth has fewer than TRUTH_SEEDS seeds at an LR a check reads (``lrs``;
    None: none there), naming the seeds that would make it enough."""
    by_lr = {row["lr"]: [*row["seeds_through"], *row["seeds_failed"]] for row in truth.get("grid") or []}
    for lr in sorted({v for v in lrs if v is not None}):
        seeds = sorted(by_lr.get(lr, []))
        if len(seeds) < TRUTH_SEEDS:
            more = [s for s in range(TRUTH_SEEDS + len(seeds)) if s not in seeds][:TRUTH_SEEDS - len(seeds)]
            raise LmtuneError(f"the truth has {len(seeds)} seed{'s' * (len(seeds) != 1)} at lr {lr:.4g}: a check "
                              f"needs {TRUTH_SEEDS}; train it with --seeds {','.join(map(str, sorted(seeds + more)))}")


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
    truth_basin_lrs: Span
    """The truth's basin: its lowest and highest LR (within 2 standard errors of its best)."""
    predicted_over_truth_best: float | None
    """The predicted LR over the truth's best."""
    predicted_excess_in_truth: float | None
    """The predicted LR's loss on the truth's curve (log-LR interpolation between its two grid LRs) above the
    truth's best mean (None: the prediction lies outside the truth's LRs)."""
    truth_two_standard_errors: float | None
    """rules.SE_MARGIN standard errors of that difference, from the truth's own pooled seed spread and seed counts."""
    predicted_lr_in_truth_basin: bool
    """The excess is within those two standard errors: the prediction is as good as the truth's best."""
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
        return {**asdict(self), "predicted_lr_interval": list(self.predicted_lr_interval),
                "truth_basin_lrs": list(self.truth_basin_lrs)}


@dataclass(frozen=True)
class TruthComparison:
    """A search's summary against the truth's conclusion (``compare``)."""

    best_lr_in_truth_basin: bool
    """The search's best LR lies inside the truth's basin: from its lowest to its highest LR (those whose mean
    is within 2 standard errors of the truth's best), give or take rules.LR_TOLERANCE; never out among the LRs clearly
    worse that bound it."""
    truth_basin_lrs: Span
    """The truth's basin: its lowest and highest LR."""
    search_best_lr: float | None
    """The search's best LR."""
    bracket_holds_first_failing_lr: bool
    """The search's edge bracket, both ends found, holds the truth's first LR that fails: low < it <= high."""
    truth_first_failing_lr: float | None
    """The truth's first LR at which a seed fails."""
    truth_last_lr_through: float | None
    """The truth's last LR below it at which every seed came through."""
    truth_edge_band: Span
    """Where the truth's own seeds place the edge: above its last LR through, up to its first LR at which every
    seed failed (None above: its seeds disagree up to its top LR)."""
    search_bracket: Span
    """The search's edge bracket (its last LR through, its divergence LR)."""
    edge_brackets_overlap: bool
    """The search's bracket (both ends found) and the truth's band share an edge: the intervals (low, high]
    overlap by more than a common end (where one says an LR trains through and the other that it fails)."""
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
    """A horizon search's prediction (summary.json keys) against the truth at its target budget: its loss on
    the truth's curve (between the two grid LRs either side, in log LR) within rules.SE_MARGIN standard errors
    of the truth's best mean, the error from the truth's own pooled seed spread; where the predicted LR lies
    against the truth's best; the tokens the search trained against the truth's. Refused in one line where the
    truth has fewer than TRUTH_SEEDS seeds at its best LR or at the two LRs the prediction is read between."""
    predicted, best = search.get("predicted_lr"), truth.get("best_lr")
    check_truth_seeds(truth, [best])
    excess, two_se = excess_in_truth(truth, predicted)
    low, high = search.get("predicted_lr_interval") or (None, None)
    spent = (search.get("compute") or {}).get("tokens_spent")
    return HorizonComparison(
        predicted, (low, high), best, basin_lrs(truth.get("basin")),
        predicted / best if predicted and best else None, excess, two_se,
        excess is not None and two_se is not None and excess <= two_se,
        bool(low and high and best and low <= best <= high),
        spent, truth_tokens, spent / truth_tokens if spent and truth_tokens else None)


def _read_between(truth: JsonObject, lr: float | None) -> tuple[JsonObject, JsonObject, float] | None:
    """The two truth LRs either side of ``lr`` and where it lies between them in log LR (None: outside them)."""
    ranking = sorted(truth.get("ranking") or [], key=lambda r: r["lr"])
    if lr is None or len(ranking) < 2 or not ranking[0]["lr"] <= lr <= ranking[-1]["lr"]:
        return None
    xs = [math.log(r["lr"]) for r in ranking]
    k = min(max(i for i, x in enumerate(xs) if x <= math.log(lr)), len(xs) - 2)
    return ranking[k], ranking[k + 1], (math.log(lr) - xs[k]) / (xs[k + 1] - xs[k])


def excess_in_truth(truth: JsonObject, lr: float | None) -> tuple[float | None, float | None]:
    """``lr``'s loss on the truth's curve (log-LR interpolation between its two grid LRs) above the truth's best
    mean, and rules.SE_MARGIN standard errors of that difference (None, None: ``lr`` lies outside the truth's LRs).
    Refused in one line where the truth has fewer than TRUTH_SEEDS seeds at the two LRs read."""
    between = _read_between(truth, lr)
    if between is None:
        return None, None
    below, above, t = between
    check_truth_seeds(truth, [below["lr"], above["lr"]])
    excess = below["mean"] + t * (above["mean"] - below["mean"]) - truth["best_lr_mean_loss"]
    sigma, n_best = truth.get("seed_spread"), len(truth.get("best_lr_seed_losses") or [])
    n_read = min(len(below["losses"]), len(above["losses"]))
    two_se = rules.SE_MARGIN * sigma * math.sqrt(1 / n_best + 1 / n_read) if sigma is not None else None
    return excess, two_se


# A check has power against a naive answer when that answer fails it with at least this probability (issue 44):
# a truth one of them passes in 1 - POWER (20%) of redrawn truths or more cannot tell (issue 55 item 4).
POWER = 0.8
# Truths redrawn per naive answer: the pass rate's binomial sd is then under 1 point.
REDRAWS = 4000


@dataclass(frozen=True)
class NaiveAnswer:
    """An answer a user could take without the search, put to the same check as the search's prediction."""

    name: str
    lr: float
    passes: bool | None
    """Its loss on the truth's curve is within 2 SE of the truth's best (None: it lies outside the truth's LRs)."""
    pass_rate: float | None
    """How often it passes that check against truths redrawn from this truth's curve and noise (each LR's mean
    redrawn with sd sigma / sqrt(its seeds), the best taken afresh): the check's false-pass rate for it."""


def naive_pass_rate(truth: JsonObject, lr: float, draws: int = REDRAWS, seed: int = 0) -> float | None:
    """How often ``lr`` passes the prediction's check (within 2 SE of the best) against truths redrawn from this
    truth's own curve (its LRs' means) and noise (its pooled seed spread, each LR's seed count); None where ``lr``
    lies outside the truth's LRs or the truth has no spread."""
    ranking = sorted(truth.get("ranking") or [], key=lambda r: r["lr"])
    sigma = truth.get("seed_spread")
    between = _read_between(truth, lr)
    if between is None or not sigma:
        return None
    below, above, t = between
    means = np.array([r["mean"] for r in ranking])
    seeds = np.array([len(r["losses"]) for r in ranking])
    drawn = means + sigma / np.sqrt(seeds) * np.random.default_rng(seed).standard_normal((draws, len(ranking)))
    best = drawn.argmin(axis=1)
    i, j = ranking.index(below), ranking.index(above)
    excess = drawn[:, i] + t * (drawn[:, j] - drawn[:, i]) - drawn[np.arange(draws), best]
    two_se = rules.SE_MARGIN * sigma * np.sqrt(1 / seeds[best] + 1 / min(seeds[i], seeds[j]))
    return float(np.mean(excess <= two_se))


def naive_answers(truth: JsonObject, candidates: dict[str, float]) -> list[NaiveAnswer]:
    """Each candidate (name -> LR) put to the prediction's check, with its false-pass rate."""
    answers = []
    for name, lr in candidates.items():
        excess, two_se = excess_in_truth(truth, lr)
        passes = None if excess is None or two_se is None else excess <= two_se
        answers.append(NaiveAnswer(name, lr, passes, naive_pass_rate(truth, lr)))
    return answers


def cannot_tell(answers: list[NaiveAnswer]) -> str | None:
    """Why a passed check has not shown the search works, where an answer taken without the search (naive_candidates:
    the textbook rule among them) passes it in 1 - POWER of redrawn truths or more, or has no known rate (None: every
    one's rate is known and under 1 - POWER)."""
    weak = [a for a in answers if a.pass_rate is None or a.pass_rate >= round(1 - POWER, 9)]
    if not weak:
        return None
    named = "; ".join(f"{a.name} ({a.lr:.3g}) passes {'?' if a.pass_rate is None else f'{a.pass_rate:.0%}'}"
                      for a in weak)
    return (f"the truth cannot tell a good answer from a naive one here: {named} of redrawn truths (validated "
            f"only where each passes under {1 - POWER:.0%} of them). What would: more seeds per truth LR (2 SE "
            "shrinks as 1/sqrt(seeds)), a longer target or a larger extrapolation ratio (the naive answers then "
            "lie further from the truth's best)")


def textbook_rule(summary: JsonObject) -> TextbookRule | None:
    """The textbook rule at a horizon or width search's target (lmtune.searches.textbook), from its summary.json:
    the largest budget's best LR x (target / its tokens)^-0.3; the widest proxy's best LR ÷ the width ratio under
    SP, unchanged under μP (None: no proxy below the target crowned an LR)."""
    if "target_width" in summary:
        target, size, proxies = summary["target_width"], "d_model", summary.get("widths") or []
    else:
        target, size, proxies = summary.get("horizon_target_tokens"), "tokens", summary.get("budgets") or []
    below = [p for p in proxies if p.get("crowned_lr") and target and p.get(size) and p[size] < target]
    if not below:
        return None
    largest = max(below, key=lambda p: p[size])
    if size == "tokens":
        return horizon_rule(largest["crowned_lr"], largest[size], target)
    return width_rule(largest["crowned_lr"], largest[size], target, summary.get("parametrization") or "sp")


UNCHANGED = "the largest proxy's best LR, unchanged"
MUP_RULE = "μP's rule: the widest proxy's best LR, unchanged"


def naive_candidates(summary: JsonObject, first_grid: tuple[float, float] | None = None,
                     direct: list[DirectSearch] | tuple = ()) -> dict[str, float]:
    """What a user could take without the search's prediction (name -> LR): the largest proxy's best LR unchanged
    (under μP that is μP's rule, named so); the textbook rule where it differs (textbook_rule); the middle of the
    first grid (in log LR, ``first_grid``: the search's lr_min and lr_max); and the direct local search's answer at
    the target (``direct``: one per seed of the truth, where the summary has target runs to size it; seeds that
    agree named together). The direct answer was chosen on one of the truth's own seeds, so its pass rate leans
    high: it can only make "validated" harder to earn."""
    candidates, rule = {}, textbook_rule(summary)
    if rule is not None:
        mup = summary.get("parametrization") == "mup" and "target_width" in summary
        candidates[MUP_RULE if mup else UNCHANGED] = rule.proxy_lr
        if rule.lr != rule.proxy_lr:
            candidates[f"the textbook rule: {rule.name}"] = rule.lr
    if first_grid is not None:
        candidates["the middle of the first grid"] = math.sqrt(first_grid[0] * first_grid[1])
    answers: dict[float, list[int]] = {}
    for found in direct:
        answers.setdefault(found.answer, []).append(found.seed)
    for answer, seeds in answers.items():
        which = f"seed{'s' * (len(seeds) > 1)} {', '.join(map(str, seeds))}"
        candidates[f"the direct local search's answer ({which})"] = answer
    return candidates


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


def basin_lrs(basin: JsonValue) -> Span:
    """A basin's (summary.json's form) lowest and highest LR: the LRs tried within 2 SE of the best."""
    return (basin["lrs"][0], basin["lrs"][-1]) if basin else (None, None)


def truth_edge_band(truth: JsonObject) -> Span:
    """Where the truth's own seeds place the edge: above its last LR at which every seed came through (below
    its first failing LR), up to its first LR at which every seed failed (None: no such LR in its grid)."""
    first_fail = truth.get("failing_lr")
    if first_fail is None:
        return truth.get("failing_lr_low"), None
    all_failed = [row["lr"] for row in truth["grid"] if row["lr"] >= first_fail and not row["seeds_through"]]
    return truth.get("failing_lr_low"), min(all_failed, default=None)


def edge_brackets_overlap(band: Span, bracket: Span) -> bool:
    """Two edge brackets, each (last LR through, first LR failing], can hold the same edge: the search's has
    both ends, and the two overlap by more than a shared end."""
    low, high = bracket
    if low is None or high is None:
        return False
    return max(low, band[0] or 0.0) < min(high, band[1] or math.inf)


def compare(truth: JsonObject, search: JsonObject) -> TruthComparison:
    """The checks of a search's summary (summary.json keys) against the truth's conclusion, each one that can
    fail; refused in one line where the truth has fewer than TRUTH_SEEDS seeds at an LR they read (its basin's
    LRs and the clearly worse LRs either side, and the LRs that bound its edge)."""
    t_basin, s_basin = truth.get("basin"), search.get("basin")
    band = truth_edge_band(truth)
    first_fail = truth.get("failing_lr")
    check_truth_seeds(truth, [*(t_basin["lrs"] if t_basin else []), *(t_basin["low"] if t_basin else []),
                              *(t_basin["high"] if t_basin else []), *band, first_fail])
    best, (lowest, highest) = search.get("best_lr"), basin_lrs(t_basin)
    close = rules.LR_TOLERANCE  # (a search's best a grid point away by rounding is at that grid point)
    in_basin = best is not None and lowest is not None and lowest / close <= best <= highest * close
    low, high = search.get("failing_lr_low"), search.get("failing_lr")
    return TruthComparison(
        best_lr_in_truth_basin=in_basin, truth_basin_lrs=(lowest, highest), search_best_lr=best,
        bracket_holds_first_failing_lr=None not in (first_fail, low, high) and low < first_fail <= high,
        truth_first_failing_lr=first_fail, truth_last_lr_through=truth.get("failing_lr_low"),
        truth_edge_band=band, search_bracket=(low, high),
        edge_brackets_overlap=first_fail is not None and edge_brackets_overlap(band, (low, high)),
        basins_overlap=bool(t_basin and s_basin and _overlap(region_span(t_basin), region_span(s_basin))),
        degraded_overlap=bool(truth.get("degraded") and search.get("degraded")
                              and _overlap(region_span(truth["degraded"]), region_span(search["degraded"]))),
        truth_degraded=region_span(truth.get("degraded")), search_degraded=region_span(search.get("degraded")),
        search_basin=region_span(s_basin))


# A direct local search at the target, the baseline a horizon or width search's cost is held against (issue 44
# items 4-6): the largest proxy's best LR carried to the target by the textbook rule a user would otherwise take
# (textbook_rule: for a horizon LR* falling as tokens^-0.3, lmtune.searches.textbook.PRIOR_BETA; for width 1/width
# under SP, unchanged under μP), and as many runs at the target as the search trained there, on the truth's grid
# LRs nearest it, one seed: what a user skipping the proxies would train. Its runs are the truth's own runs at those
# LRs and that seed (the same config: the same run); both answers are then judged on the truth's other seeds, so
# that the noise the direct search picked by does not also judge it.


@dataclass(frozen=True)
class DirectSearch:
    centre: float
    """The LR it centres on: the largest proxy's best scaled to the target (direct_centre)."""
    lrs: list[float]
    """Its LRs: the truth's grid LRs nearest the centre (as many as the search trained at the target)."""
    seed: int
    answer: float
    """Its best LR: the lowest final loss of its runs."""
    tokens: int
    """What it trains: one target run per LR."""
    answer_excess: float | None
    """Its answer's loss on the truth's curve of its other seeds, above that curve's best (None: off the grid)."""
    prediction_excess: float | None
    """The search's prediction, read on the same curve."""


def held_out_excess(runs: list[TruthRun], lr: float | None, seed: int) -> float | None:
    """``lr``'s loss on the curve of the truth's seeds other than ``seed`` (each LR's mean, log-LR interpolation),
    above that curve's lowest mean (None: ``lr`` lies outside the truth's LRs)."""
    by_lr: dict[float, list[float]] = {}
    for run in runs:
        if run.seed != seed and run.end_val is not None and not run.failed:
            by_lr.setdefault(run.lr, []).append(run.end_val)
    lrs = sorted(by_lr)
    if lr is None or len(lrs) < 2 or not lrs[0] <= lr <= lrs[-1]:
        return None
    means = [float(np.mean(by_lr[x])) for x in lrs]
    loss = float(np.interp(math.log(lr), [math.log(x) for x in lrs], means))
    return loss - min(means)


def direct_local_search(runs: list[TruthRun], centre: float, count: int, predicted: float | None,
                        seed: int = 0) -> DirectSearch:
    """The direct local search of ``count`` runs at the target around ``centre``, from the truth's runs of
    ``seed``; ``predicted``: the search's prediction, judged beside it."""
    grid = sorted({r.lr for r in runs})
    nearest = min(range(len(grid)), key=lambda i: abs(math.log(grid[i] / centre)))
    start = min(max(nearest - (count - 1) // 2, 0), max(len(grid) - count, 0))
    lrs = grid[start:start + count]
    ends = {r.lr: r.end_val for r in runs if r.seed == seed and r.lr in lrs}
    answer = min(lrs, key=lambda lr: math.inf if ends.get(lr) is None else ends[lr])
    one = next(r for r in runs if r.lr in lrs)
    return DirectSearch(centre, lrs, seed, answer, len(lrs) * one.steps * one.tokens_per_step,
                        held_out_excess(runs, answer, seed), held_out_excess(runs, predicted, seed))


def direct_centre(summary: JsonObject) -> tuple[float, int] | None:
    """A horizon or width search's summary: the direct search's centre, the textbook rule's LR at the target
    (textbook_rule), and how many runs the search trained at the target (None: no proxy below the target crowned an
    LR, or nothing trained at the target)."""
    count = sum(len(row["seeds"]) for row in (summary.get("confirmed") or {}).get("losses") or [])
    rule = textbook_rule(summary)
    if rule is None or not count:
        return None
    return rule.lr, count
