"""The edge search (``search: edge``): which LR is best for the budget, where training breaks, and how
far apart the two are, decided step by step from what the sweep has seen. Ray-free: the Tune
Searcher that drives it is lmtune.sweep.edge_searcher; the report reads the same functions.

Five stages in one sweep:

1. **range**: the LR range test (lmtune.training.lr_range): one short run with a rising LR gives the
   steepest-descent LR and the blow-up LR.
2. **coarse**: log-spaced LRs from well below the steepest descent to the blow-up, under ASHA and
   the stopper, the most promising first (asynchronous ASHA can only cut against results already in).
3. **bisect**: stability probes between the largest stable LR and the smallest diverged one, until
   their ratio is at most ``tolerance``. A probe trains to the stability horizon (the end of warm-up
   plus ``horizon`` of the budget) with the full run's schedule, and ASHA never cuts it. An LR is
   *stable* when a trial at it trained past the horizon and no trial at it diverged.
4. **refine**: LRs within a factor ``refine_factor`` of the best full-budget LR, trained to the full
   budget; and every LR below it that ASHA cut within ``rerun_margin`` of its rung's leader, re-run
   to the full budget (early rungs favour the faster early learner, the larger LR).
5. **seeds**: the best ``seed_lrs`` LRs again with further seeds, so the best LR is chosen on the mean.

Bisection and refinement run side by side; the search ends when every stage is done and the
bracket is resolved (or cannot be: nothing diverged, or everything did, even after extending).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from lmtune.errors import LmtuneError

STAGES = ("range", "coarse", "bisect", "refine", "seeds")
ASHA_STAGES = frozenset({"coarse"})  # the only stage ASHA may cut
WAIT, FINISHED = "wait", "finished"
# Two LRs closer than this ratio are one LR (a refinement LR next to a coarse one adds nothing).
SAME_LR = 1.02
# Bisection rounds before the search gives up on a bracket that keeps moving (noise near the edge).
MAX_BISECT_ROUNDS = 12
# The reason recorded for a trial that was planned again after a driver restart (EdgeSearch.requeue).
INTERRUPTED = ("interrupted: the sweep's driver stopped while it ran, before Ray recorded the trial; the search "
               "ran its plan again in another trial")
# An LR is "clearly worse" than the best when its mean loss is more than this many standard errors above.
SIGNIFICANCE_SE = 2.0


@dataclass(frozen=True)
class EdgeSettings:
    """The ``edge:`` section of a space with ``search: edge``."""

    range_min_lr: float = 1e-5
    """The range test's first LR."""
    range_max_lr: float = 10.0
    """The range test's last LR, if the loss has not blown up before."""
    range_steps: int = 100
    """Steps of the range test (the LR is multiplied by the same factor at each)."""
    range_blowup_factor: float = 1.5
    """The range test stops when its smoothed loss exceeds this x its lowest value."""
    coarse_below: float = 10.0
    """The coarse grid starts this factor below the range test's steepest-descent LR."""
    coarse_above: float = 1.0
    """... and ends at the first LR at or above the blow-up LR x this."""
    coarse_ratio: float = 3.16
    """Neighbouring coarse LRs differ by this factor (3.16: two per decade)."""
    tolerance: float = 1.25
    """Bisection ends when smallest diverged LR / largest stable LR <= this."""
    horizon: float = 0.1
    """The stability horizon: the end of warm-up plus this fraction of the budget's steps."""
    bisect_points: int = 1
    """Probes per bisection round (1: halve the bracket in log-LR; k: cut it into k + 1 parts)."""
    refine_factor: float = 2.0
    """Refinement LRs lie within best / refine_factor .. best x refine_factor."""
    refine_points: int = 4
    """Refinement LRs (log-spaced, half below and half above the best)."""
    rerun_margin: float = 0.05
    """An LR below the best that ASHA cut is re-run to the full budget when its val loss at its last
    rung was within this fraction of that rung's best."""
    seeds: int = 3
    """Runs per LR for the best LRs, the first seed included."""
    seed_lrs: int = 2
    """How many of the best LRs get the further seeds."""
    max_extensions: int = 3
    """When no LR diverged (or every LR did), probes this many times further out, coarse_ratio^2 apart."""

    def validate(self, where: str = "edge") -> None:
        """Raise LmtuneError (one line naming the key) for settings no search could use."""
        checks = [
            ("range_min_lr", self.range_min_lr > 0, "must be > 0, e.g. 1e-5"),
            ("range_max_lr", self.range_max_lr > self.range_min_lr,
             f"must be above range_min_lr ({self.range_min_lr:g})"),
            ("range_steps", self.range_steps >= 10, "must be at least 10"),
            ("range_blowup_factor", self.range_blowup_factor > 1, "must be above 1, e.g. 1.5"),
            ("coarse_below", self.coarse_below >= 1, "must be >= 1 (a factor below the steepest descent)"),
            ("coarse_above", self.coarse_above > 0, "must be > 0 (a factor on the blow-up LR)"),
            ("coarse_ratio", self.coarse_ratio > 1, "must be above 1, e.g. 3.16"),
            ("tolerance", 1 < self.tolerance <= self.coarse_ratio,
             f"must be above 1 and at most coarse_ratio ({self.coarse_ratio:g}), e.g. 1.25"),
            ("horizon", 0 <= self.horizon <= 1, "must be a fraction of the budget in [0, 1], e.g. 0.1"),
            ("bisect_points", self.bisect_points >= 1, "must be at least 1"),
            ("refine_factor", self.refine_factor > 1, "must be above 1, e.g. 2"),
            ("refine_points", self.refine_points >= 0 and self.refine_points % 2 == 0,
             "must be an even number >= 0 (half below the best, half above)"),
            ("rerun_margin", self.rerun_margin >= 0, "must be >= 0 (a fraction, e.g. 0.05)"),
            ("seeds", self.seeds >= 1, "must be at least 1 (1: no further seeds)"),
            ("seed_lrs", self.seed_lrs >= 1, "must be at least 1"),
            ("max_extensions", self.max_extensions >= 0, "must be >= 0"),
        ]
        for key, ok, message in checks:
            if not ok:
                raise LmtuneError(f"{where}.{key}: {message} (got {getattr(self, key)!r})")

    @classmethod
    def of_space(cls, space: dict[str, Any]) -> EdgeSettings | None:
        """The settings sweep.json recorded for a search: edge (None for other searches)."""
        if space.get("search") != "edge":
            return None
        return cls(**{k: v for k, v in (space.get("edge") or {}).items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Budget:
    """What the search needs of the sweep's base config."""

    steps: int
    warmup_steps: int
    tokens_per_step: int
    seed: int
    """The base seed: seed 0 of the search; further seeds are seed + 1, seed + 2, ..."""
    rungs: tuple[int, ...]
    """Token counts at which LRs are compared (ASHA's rungs), the last one the full budget."""

    @classmethod
    def of_config(cls, config: dict[str, Any], asha: dict[str, Any] | None) -> Budget:
        """The budget of a RunConfig (as a dict), compared at ASHA's rungs (``asha``: an AshaBudget dict)."""
        train, model = config["train"], config["model"]
        tokens_per_step = int(train["batch_size"]) * int(model["context_length"])
        steps = int(train["steps"])
        return cls(steps, int(train.get("warmup_steps", 0)), tokens_per_step, int(train.get("seed", 0)),
                   comparison_rungs(steps * tokens_per_step, asha))

    @property
    def full_tokens(self) -> int:
        return self.steps * self.tokens_per_step

    def horizon_steps(self, settings: EdgeSettings) -> int:
        return min(self.steps, math.ceil(self.warmup_steps + settings.horizon * self.steps))

    def horizon_tokens(self, settings: EdgeSettings) -> int:
        return self.horizon_steps(settings) * self.tokens_per_step


def comparison_rungs(full_tokens: int, asha: dict[str, Any] | None) -> tuple[int, ...]:
    """The token counts at which LRs are compared: ASHA's rungs (grace period x reduction factor^k below
    max_t) and the full budget; without ASHA, the full budget alone."""
    rungs = []
    if asha:
        rung, factor = float(asha["grace_period"]), float(asha["reduction_factor"])
        while rung < min(asha["max_t"], full_tokens) - 0.5:
            rungs.append(int(round(rung)))
            rung *= factor
    return (*rungs, int(full_tokens))


# ---------------------------------------------------------------------------------------------
# What a trial is to the search


@dataclass
class Run:
    """One trial as the search (and the report) sees it."""

    lr: float
    seed: int
    stage: str
    budget_tokens: int
    """Tokens of its whole schedule (the budget)."""
    run_tokens: int
    """Tokens it was planned to train: the budget, or a stability probe's horizon."""
    outcome: str | None = None
    """None while it runs; then the ledger's outcome (completed, probed, diverged, stopped_early, ...)."""
    tokens: int = 0
    """Tokens trained so far."""
    val: dict[int, float] = field(default_factory=dict)
    """Val loss by tokens, at each evaluation."""
    others: tuple[tuple[str, Any], ...] = ()
    """The other parameters a grid varied (batch_size, ...): runs are grouped by LR and these."""

    @property
    def done(self) -> bool:
        return self.outcome is not None

    @property
    def diverged(self) -> bool:
        return self.outcome == "diverged"

    def loss_at(self, tokens: int) -> float | None:
        return loss_at_tokens(self.val, tokens)

    def stable(self, horizon_tokens: int) -> bool:
        """Trained past the stability horizon without diverging (so far)."""
        return not self.diverged and self.tokens >= horizon_tokens and bool(self.val or self.done)

    def full_loss(self) -> float | None:
        """Its val loss at the end of its budget, if it trained that far without diverging."""
        return None if self.diverged or self.tokens < self.budget_tokens else self.loss_at(self.budget_tokens)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "val": [[t, v] for t, v in sorted(self.val.items())], "others": list(self.others)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Run:
        return cls(**{**data, "val": {int(t): float(v) for t, v in data.get("val", [])},
                      "others": tuple(tuple(pair) for pair in data.get("others", []))})


def loss_at_tokens(val: dict[int, float], tokens: float) -> float | None:
    """The val loss at exactly ``tokens``: linear interpolation between the evaluations either side;
    None outside the evaluated range (a trial stopped at a rung has no loss beyond it)."""
    points = sorted((t, v) for t, v in val.items() if math.isfinite(v))
    if not points or tokens < points[0][0] or tokens > points[-1][0]:
        return None
    for (t0, v0), (t1, v1) in zip(points, points[1:], strict=False):
        if t0 <= tokens <= t1:
            return v0 if t1 == t0 else v0 + (v1 - v0) * (tokens - t0) / (t1 - t0)
    return points[-1][1]


def equal_token_losses(runs: Iterable[Run], rungs: Iterable[int]) -> dict[int, dict[float, list[float]]]:
    """For every rung, the val loss at exactly that token count of every run that reached it, by LR
    (a list: one per seed). Diverged runs are left out (they are marked apart)."""
    table: dict[int, dict[float, list[float]]] = {}
    for rung in rungs:
        by_lr: dict[float, list[float]] = {}
        for run in runs:
            loss = None if run.diverged else run.loss_at(rung)
            if loss is not None:
                by_lr.setdefault(run.lr, []).append(loss)
        table[int(rung)] = dict(sorted(by_lr.items()))
    return table


# ---------------------------------------------------------------------------------------------
# The edge


@dataclass(frozen=True)
class Bracket:
    """Where training breaks: between the largest stable LR and the smallest diverged one."""

    stable_lr: float | None
    """The largest LR below diverged_lr that trained past the horizon, no trial at it diverging."""
    diverged_lr: float | None
    """The smallest LR at which a trial diverged."""
    stable_above: tuple[float, ...] = ()
    """Stable LRs above diverged_lr (divergence is not monotone in LR there: seed or chance)."""

    @property
    def ratio(self) -> float | None:
        if self.stable_lr is None or self.diverged_lr is None:
            return None
        return self.diverged_lr / self.stable_lr

    def resolved(self, tolerance: float) -> bool:
        return self.ratio is not None and self.ratio <= tolerance


def bracket(runs: Iterable[Run], horizon_tokens: int) -> Bracket:
    runs = list(runs)
    diverged = sorted({r.lr for r in runs if r.diverged})
    if not diverged:
        stable = [r.lr for r in runs if r.stable(horizon_tokens)]
        return Bracket(max(stable) if stable else None, None)
    edge = diverged[0]
    stable = {r.lr for r in runs if r.stable(horizon_tokens)} - set(diverged)
    below = [lr for lr in stable if lr < edge]
    return Bracket(max(below) if below else None, edge, tuple(sorted(lr for lr in stable if lr > edge)))


def bisect_lrs(edge: Bracket, points: int) -> list[float]:
    """``points`` LRs cutting [stable_lr, diverged_lr] into equal parts in log-LR."""
    lo, hi = edge.stable_lr, edge.diverged_lr
    return [lo * (hi / lo) ** (k / (points + 1)) for k in range(1, points + 1)]


# ---------------------------------------------------------------------------------------------
# The best LR


@dataclass(frozen=True)
class LrResult:
    """The full-budget val losses of one LR (one per seed that trained the whole budget)."""

    lr: float
    losses: tuple[float, ...]
    others: tuple[tuple[str, Any], ...] = ()
    """The other varied parameters these runs share (a grid over more than the LR)."""

    @property
    def mean(self) -> float:
        return sum(self.losses) / len(self.losses)

    @property
    def spread(self) -> float | None:
        """Sample standard deviation over seeds (None with one seed)."""
        n = len(self.losses)
        if n < 2:
            return None
        return math.sqrt(sum((v - self.mean) ** 2 for v in self.losses) / (n - 1))


def full_budget_ranking(runs: Iterable[Run]) -> list[LrResult]:
    """LRs (with the other varied parameters) by their mean full-budget val loss, lowest first. An LR at
    which any trial diverged is left out (whatever its other seeds did), as are trials that did not
    train their whole budget."""
    runs = list(runs)
    diverged = {(r.lr, r.others) for r in runs if r.diverged}
    losses: dict[tuple[float, tuple], list[float]] = {}
    for run in runs:
        loss = run.full_loss()
        if loss is not None and (run.lr, run.others) not in diverged:
            losses.setdefault((run.lr, run.others), []).append(loss)
    ranked = [LrResult(lr, tuple(values), others) for (lr, others), values in losses.items()]
    return sorted(ranked, key=lambda r: (r.mean, r.lr))


def pooled_seed_spread(ranking: Iterable[LrResult]) -> float | None:
    """The run-to-run standard deviation of the full-budget loss, pooled over LRs with several seeds."""
    squares, dof = 0.0, 0
    for result in ranking:
        if len(result.losses) > 1:
            squares += (len(result.losses) - 1) * result.spread ** 2
            dof += len(result.losses) - 1
    return math.sqrt(squares / dof) if dof else None


def clearly_worse(result: LrResult, best: LrResult, sigma: float | None) -> bool:
    """Its mean is more than SIGNIFICANCE_SE standard errors of the difference above the best's
    (with no seed spread measured, any higher loss counts)."""
    if sigma is None:
        return result.mean > best.mean
    error = sigma * math.sqrt(1 / len(result.losses) + 1 / len(best.losses))
    return result.mean - best.mean > SIGNIFICANCE_SE * error


def best_lr_interval(ranking: list[LrResult], edge: Bracket | None = None) -> tuple[float | None, float | None]:
    """Where the best LR lies: strictly between the nearest LRs on either side whose loss is clearly
    worse than the best's (a diverged LR above counts as worse). None for a side where no tried LR
    is clearly worse: the optimum may lie beyond the LRs tried."""
    if not ranking:
        return None, None
    best, sigma = ranking[0], pooled_seed_spread(ranking)
    worse = sorted(r.lr for r in ranking[1:] if r.others == best.others and clearly_worse(r, best, sigma))
    below = [lr for lr in worse if lr < best.lr]
    above = [lr for lr in worse if lr > best.lr]
    if edge is not None and edge.diverged_lr is not None and edge.diverged_lr > best.lr:
        above.append(edge.diverged_lr)
    return (max(below) if below else None), (min(above) if above else None)


def edge_ratio_range(edge: Bracket, interval: tuple[float | None, float | None]) -> tuple[float | None, float | None]:
    """The ratio (edge LR / best LR) as a range carrying both uncertainties: the edge lies in
    [stable_lr, diverged_lr] and the best LR in the open interval (low, high). None for an unbounded end."""
    low, high = interval
    smallest = edge.stable_lr / high if edge.stable_lr is not None and high else None
    largest = edge.diverged_lr / low if edge.diverged_lr is not None and low else None
    return smallest, largest


# ---------------------------------------------------------------------------------------------
# The stages' choices


def coarse_lrs(steepest_lr: float | None, blowup_lr: float | None, settings: EdgeSettings) -> tuple[list[float], str]:
    """The coarse grid (most promising first) and why: from steepest / coarse_below up to the first LR
    at or above blowup x coarse_above, coarse_ratio apart. A range test without a steepest descent or a
    blow-up falls back to its own LR bounds on that side."""
    low = (steepest_lr or settings.range_min_lr * settings.coarse_below) / settings.coarse_below
    high = (blowup_lr or settings.range_max_lr) * settings.coarse_above
    count = max(2, math.ceil(math.log(high / low) / math.log(settings.coarse_ratio) - 1e-9) + 1)
    lrs = [low * settings.coarse_ratio ** k for k in range(count)]
    centre = steepest_lr or math.sqrt(low * high)
    lrs.sort(key=lambda lr: (abs(math.log(lr / centre)), lr))
    why = (f"{count} LRs a factor {settings.coarse_ratio:g} apart from {low:.3g} (the range test's steepest descent "
           f"{_g(steepest_lr)} / {settings.coarse_below:g}) up to {lrs and max(lrs):.3g} (at or above its blow-up "
           f"{_g(blowup_lr)} x {settings.coarse_above:g}); nearest the steepest descent first, so that ASHA's early "
           "rungs hold good results to cut the others against")
    return lrs, why


def refine_lrs(best: LrResult, runs: Iterable[Run], edge: Bracket, settings: EdgeSettings,
               budget: Budget) -> list[float]:
    """refine_points LRs log-spaced within best / refine_factor .. best x refine_factor, and the coarse
    grid's neighbours of the best (best / coarse_ratio, best x coarse_ratio: they bound where the best
    LR can lie, and ASHA may have cut them early), leaving out LRs at or above a known divergence and
    LRs that already have a full-budget run at the first seed."""
    half = settings.refine_points // 2
    candidates = [best.lr * settings.refine_factor ** (k / half) for k in range(-half, half + 1) if k] if half else []
    candidates += [best.lr / settings.coarse_ratio, best.lr * settings.coarse_ratio]
    runs = list(runs)
    tried = sorted({r.lr for r in runs})
    covered = [r.lr for r in runs if _full_budget_at_first_seed(r, budget.seed)]
    chosen: list[float] = []
    for lr in sorted(_snap(lr, tried) for lr in candidates):
        if edge.diverged_lr is not None and lr >= edge.diverged_lr:
            continue
        if not any(max(lr, other) / min(lr, other) < SAME_LR for other in covered + chosen):
            chosen.append(lr)
    return chosen


def _snap(lr: float, tried: list[float]) -> float:
    """An LR already tried within SAME_LR of ``lr`` (so a re-run shares its LR exactly), else ``lr``."""
    return next((other for other in tried if max(lr, other) / min(lr, other) < SAME_LR), lr)


def _full_budget_at_first_seed(run: Run, seed: int) -> bool:
    """A first-seed run that trained, or will train, the whole budget (a coarse one only if ASHA let it)."""
    if run.seed != seed or run.diverged:
        return False
    return run.tokens >= run.budget_tokens if run.stage == "coarse" else run.run_tokens >= run.budget_tokens


def rerun_lrs(best: LrResult, runs: Iterable[Run], settings: EdgeSettings, budget: Budget) -> list[tuple[float, str]]:
    """Coarse LRs below the best that ASHA cut while within rerun_margin of their last rung's leader:
    (lr, why) each, to be trained to the full budget."""
    runs = list(runs)
    chosen = []
    for run in runs:
        if run.stage != "coarse" or run.outcome != "stopped_early" or run.lr >= best.lr:
            continue
        rung = max((r for r in budget.rungs if run.loss_at(r) is not None), default=None)
        if rung is None:
            continue
        leader = min(loss for other in runs if (loss := None if other.diverged else other.loss_at(rung)) is not None)
        mine = run.loss_at(rung)
        if mine <= leader * (1 + settings.rerun_margin):
            chosen.append((run.lr, f"ASHA cut lr {run.lr:.3g} at {format_tokens(rung)} tokens with val {mine:.4f}, "
                                   f"within {100 * (mine / leader - 1):.1f}% of that rung's best {leader:.4f}"))
    return chosen


def seed_lrs(ranking: list[LrResult], settings: EdgeSettings) -> list[LrResult]:
    return ranking[: settings.seed_lrs] if settings.seeds > 1 else []


def _g(value: float | None) -> str:
    return "—" if value is None else f"{value:.3g}"


def format_tokens(tokens: float) -> str:
    """1.2M, 30.5k, 800: token counts in the search's and the sweep's messages."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if tokens >= scale:
            return f"{tokens / scale:.1f}{unit}"
    return f"{tokens:.0f}"


# ---------------------------------------------------------------------------------------------
# What the search concludes


def conclude(runs: Iterable[Run], budget: Budget, settings: EdgeSettings) -> dict[str, Any]:
    """The best LR (lowest mean full-budget loss), where it may lie, the bracket, and the ratio."""
    runs = [r for r in runs if r.stage != "range"]
    ranking = full_budget_ranking(runs)
    edge = bracket(runs, budget.horizon_tokens(settings))
    interval = best_lr_interval(ranking, edge)
    best = ranking[0] if ranking else None
    ratio = edge.diverged_lr / best.lr if best and edge.diverged_lr else None
    return {
        "best_lr": best.lr if best else None,
        "best_lr_seed_losses": list(best.losses) if best else [],
        "best_lr_mean_loss": best.mean if best else None,
        "best_lr_spread": best.spread if best else None,
        "seed_spread": pooled_seed_spread(ranking),
        "best_lr_interval": list(interval),
        "edge_lr_low": edge.stable_lr,
        "divergence_lr": edge.diverged_lr,
        "bracket_ratio": edge.ratio,
        "stable_above_divergence": list(edge.stable_above),
        "edge_ratio": ratio,
        "edge_ratio_range": list(edge_ratio_range(edge, interval)),
        "ranking": [{"lr": r.lr, **dict(r.others), "losses": list(r.losses), "mean": r.mean} for r in ranking],
    }


# ---------------------------------------------------------------------------------------------
# The search, stage by stage


@dataclass
class Planned:
    """A trial the search asks for, and why."""

    stage: str
    lr: float | None
    seed: int
    run_steps: int = 0
    """A stability probe's horizon in steps (0: the whole budget)."""
    why: str = ""

    def config(self) -> dict[str, Any]:
        """The trial's Tune config: its stage, LR and seed (and a probe's run_steps)."""
        config: dict[str, Any] = {"stage": self.stage, "seed": self.seed}
        if self.lr is not None:
            config["lr"] = self.lr
        if self.run_steps:
            config["run_steps"] = self.run_steps
        return config


class EdgeSearch:
    """The edge search's state and decisions: which trial to run next, given what has been seen.

    Ray-free and deterministic: the Tune Searcher (lmtune.sweep.edge_searcher) feeds it results and
    asks it for trials; a test can drive it the same way without Ray. Its whole state is JSON."""

    def __init__(self, settings: EdgeSettings, budget: Budget, max_pending: int = 1):
        self.settings, self.budget, self.max_pending = settings, budget, max_pending
        self.runs: dict[str, Run] = {}
        self.plans: dict[str, dict[str, Any]] = {}  # trial id -> the Planned it got, as JSON
        self.queue: list[Planned] = []
        self.decisions: list[dict[str, Any]] = []  # {stage, lrs, why}, in the order decided
        self.range: dict[str, Any] | None = None  # the range test's finding, once it ended
        self.bisect_rounds = 0
        self.extensions = 0
        self.finished = False
        self.interrupted: dict[str, str] = {}  # trial id -> why its plan was run again in another trial

    # -- what Tune asks and tells ------------------------------------------------------------

    def suggest(self, trial_id: str) -> dict[str, Any] | str:
        """The next trial's config, WAIT (nothing to start now) or FINISHED."""
        if self.finished:
            return FINISHED
        if sum(not r.done for r in self.runs.values()) >= self.max_pending:
            return WAIT
        if not self.queue:
            self._decide()
        if not self.queue:
            return FINISHED if self.finished else WAIT
        planned = self.queue.pop(0)
        run_steps = planned.run_steps or self.budget.steps
        self.runs[trial_id] = Run(planned.lr or 0.0, planned.seed, planned.stage, self.budget.full_tokens,
                                  run_steps * self.budget.tokens_per_step)
        self.plans[trial_id] = asdict(planned)
        return planned.config()

    def observe(self, trial_id: str, result: dict[str, Any]) -> None:
        """A result the trial reported: its tokens and, at an evaluation, its val loss."""
        run = self.runs.get(trial_id)
        if run is None:
            return
        tokens = result.get("tokens")
        if isinstance(tokens, (int, float)) and math.isfinite(tokens):
            run.tokens = max(run.tokens, int(tokens))
            loss = result.get("val_loss")
            if isinstance(loss, (int, float)) and math.isfinite(loss):
                run.val[int(tokens)] = float(loss)

    def complete(self, trial_id: str, outcome: str, result: dict[str, Any] | None = None) -> None:
        """The trial ended with ``outcome`` (the ledger's word for it). For the range test, ``result``
        carries its finding (steepest_lr, min_loss_lr, blowup_lr)."""
        run = self.runs.get(trial_id)
        if run is None:
            return
        self.observe(trial_id, result or {})
        run.outcome = outcome
        if run.stage == "range":
            found = {k: (result or {}).get(k) for k in ("steepest_lr", "min_loss_lr", "blowup_lr")}
            self.range = {**found, "outcome": outcome, "tokens": run.tokens}

    def requeue(self, trial_id: str, why: str) -> None:
        """A trial that can never report (its driver died before Tune's snapshot knew of it): forget its
        run and plan it again, first."""
        self.runs.pop(trial_id, None)
        plan = self.plans.pop(trial_id, None)
        if plan is not None:
            self.queue.insert(0, Planned(**plan))
        self.interrupted[trial_id] = why

    # -- deciding ----------------------------------------------------------------------------

    def _decide(self) -> None:
        started = {d["stage"] for d in self.decisions}
        if "range" not in started:
            s = self.settings
            self._plan("range", [Planned("range", None, self.budget.seed)],
                       f"one run with the LR rising from {s.range_min_lr:g} to {s.range_max_lr:g} over "
                       f"{s.range_steps} steps, stopped when its smoothed loss exceeds {s.range_blowup_factor:g}x "
                       "its lowest")
            return
        if self.range is None:
            return
        if "coarse" not in started:
            steepest, blowup = self.range.get("steepest_lr"), self.range.get("blowup_lr")
            lrs, why = coarse_lrs(steepest, blowup, self.settings)
            if self.range.get("outcome") == "error":
                why = "the range test failed, so its LR bounds are used: " + why
            self._plan("coarse", [Planned("coarse", lr, self.budget.seed) for lr in lrs], why)
            return
        if self._busy("coarse"):
            return
        self._bisect()
        if "refine" not in started:
            self._refine()
        elif "seeds" not in started and not self._busy("refine"):
            self._seeds()
        if not self.queue and not self._busy() and "seeds" in started and self._bracket_settled():
            self.finished = True

    def _plan(self, stage: str, planned: list[Planned], why: str, first: bool = False) -> None:
        for p in planned:
            p.why = why
            if p.lr is not None:  # 4 significant digits: readable, and seeds of one LR share it exactly
                p.lr = float(f"{p.lr:.4g}")
        self.queue = planned + self.queue if first else self.queue + planned
        self.decisions.append({"stage": stage, "lrs": [p.lr for p in planned if p.lr is not None], "why": why})

    def _busy(self, stage: str | None = None) -> bool:
        """A trial of ``stage`` (of any, if None) is queued or running."""
        return any(p.stage == stage or stage is None for p in self.queue) or any(
            not r.done and (r.stage == stage or stage is None) for r in self.runs.values())

    def _lr_runs(self) -> list[Run]:
        return [r for r in self.runs.values() if r.stage != "range"]

    def _bracket_settled(self) -> bool:
        edge = bracket(self._lr_runs(), self.budget.horizon_tokens(self.settings))
        if edge.resolved(self.settings.tolerance) or self.bisect_rounds >= MAX_BISECT_ROUNDS:
            return True
        return (edge.diverged_lr is None or edge.stable_lr is None) and self.extensions >= self.settings.max_extensions

    def _bisect(self) -> None:
        if self._busy("bisect") or self._bracket_settled():
            return
        horizon = self.budget.horizon_steps(self.settings)
        edge = bracket(self._lr_runs(), horizon * self.budget.tokens_per_step)
        tried = sorted({r.lr for r in self._lr_runs()})
        if edge.diverged_lr is None:
            lrs = [max(tried) * self.settings.coarse_ratio ** 2]
            why = f"no LR diverged up to {max(tried):.3g}: a probe further up"
            self.extensions += 1
        elif edge.stable_lr is None:
            unproven = [r.lr for r in self._lr_runs() if r.lr < edge.diverged_lr and not r.diverged]
            if unproven:  # ASHA cut it before the horizon: prove it stable (or not) first
                lrs, why = [max(unproven)], "no LR below the smallest diverged one has passed the horizon yet"
            else:
                lrs = [min(tried) / self.settings.coarse_ratio ** 2]
                why = f"every LR diverged down to {min(tried):.3g}: a probe further down"
                self.extensions += 1
        else:
            lrs = bisect_lrs(edge, self.settings.bisect_points)
            self.bisect_rounds += 1
            why = f"bracket [{edge.stable_lr:.3g}, {edge.diverged_lr:.3g}] {edge.ratio:.2f} wide"
        why += f" (probes train to the stability horizon, step {horizon} of {self.budget.steps})" \
            if not any(d["stage"] == "bisect" for d in self.decisions) else ""
        self._plan("bisect", [Planned("bisect", lr, self.budget.seed, horizon) for lr in lrs], why, first=True)

    def _refine(self) -> None:
        ranking = full_budget_ranking(self._lr_runs())
        if not ranking:
            self._plan("refine", [], "no LR trained the full budget without diverging: nothing to refine around")
            return
        best = ranking[0]
        edge = bracket(self._lr_runs(), self.budget.horizon_tokens(self.settings))
        lrs = refine_lrs(best, self._lr_runs(), edge, self.settings, self.budget)
        reruns = rerun_lrs(best, self._lr_runs(), self.settings, self.budget)
        why = (f"{len(lrs)} LRs around the best full-budget LR {best.lr:.3g} (val {best.mean:.4f}): within "
               f"{self.settings.refine_factor:g}x of it, and its coarse neighbours {self.settings.coarse_ratio:g}x "
               "away to bound it; trained to the full budget without early cuts")
        if reruns:
            why += "; re-run to the full budget: " + "; ".join(reason for _, reason in reruns)
        extra = [lr for lr, _ in reruns if not any(max(lr, x) / min(lr, x) < SAME_LR for x in lrs)]
        planned = [Planned("refine", lr, self.budget.seed) for lr in sorted(lrs + extra)]
        self._plan("refine", planned, why)

    def _seeds(self) -> None:
        ranking = full_budget_ranking(self._lr_runs())
        chosen = seed_lrs(ranking, self.settings)
        seeds = [self.budget.seed + k for k in range(1, self.settings.seeds)]
        if not chosen:
            why = ("one seed per LR (seeds: 1)" if self.settings.seeds == 1
                   else "no LR trained the full budget without diverging: no seeds to add")
            self._plan("seeds", [], why)
            return
        why = (f"the best {len(chosen)} LRs by full-budget val loss ("
               + ", ".join(f"{r.lr:.3g}: {r.mean:.4f}" for r in chosen)
               + f") again with seeds {', '.join(map(str, seeds))}: the best LR is chosen on the mean")
        self._plan("seeds", [Planned("seeds", r.lr, s) for r in chosen for s in seeds], why)

    # -- state -------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "settings": asdict(self.settings), "budget": asdict(self.budget), "max_pending": self.max_pending,
            "runs": {tid: run.to_json() for tid, run in self.runs.items()}, "plans": self.plans,
            "queue": [asdict(p) for p in self.queue], "decisions": self.decisions, "range": self.range,
            "bisect_rounds": self.bisect_rounds, "extensions": self.extensions, "finished": self.finished,
            "interrupted": self.interrupted,
            "conclusion": conclude(self._lr_runs(), self.budget, self.settings),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EdgeSearch:
        budget = data["budget"]
        search = cls(EdgeSettings(**data["settings"]), Budget(**{**budget, "rungs": tuple(budget["rungs"])}),
                     data.get("max_pending", 1))
        search.runs = {tid: Run.from_json(run) for tid, run in data["runs"].items()}
        search.plans = data["plans"]
        search.queue = [Planned(**p) for p in data["queue"]]
        search.decisions = data["decisions"]
        search.range = data["range"]
        search.bisect_rounds, search.extensions = data["bisect_rounds"], data["extensions"]
        search.finished = data["finished"]
        search.interrupted = dict(data.get("interrupted") or {})
        return search
