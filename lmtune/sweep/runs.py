"""What a sweep's runs show, Ray-free: each trial as a ``Run``, their losses compared at equal token
counts, the best LR crowned on as many seeds as the LRs it beats, where the loss degrades and where
training fails. The edge searcher decides from these functions while the sweep runs; the report and the
``run`` command's last lines read the same ones afterwards.

A run is judged by what its loss did (lmtune.training.divergence): *diverged* when it went non-finite or
did not come back below its initial loss within the recovery window (or ended its budget above it);
every comparison of losses is at one token count; an LR's full-budget loss is the mean over its seeds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from lmtune.training.divergence import NON_FINITE

# Two LRs closer than this ratio are one LR (a refinement LR next to a coarse one adds nothing).
SAME_LR = 1.02
# An LR is "clearly worse" than the best when its mean loss is more than this many standard errors above.
SIGNIFICANCE_SE = 2.0
# The run-to-run spread is pooled over LRs with several seeds within this factor of the best LR: near the
# optimum. Far above it runs differ much more from seed to seed (measured on the built-in corpus, seed
# standard deviations of 0.01-0.06 within 4x of the best LR, 0.2-0.3 at 10x), which would widen the basin.
SPREAD_WITHIN = 4.0
# The reason recorded for a trial a search planned again after a driver restart (the ledger never got it).
INTERRUPTED = ("interrupted: the sweep's driver stopped while it ran, before Ray recorded the trial; the search "
               "ran its plan again in another trial")


@dataclass(frozen=True)
class Budget:
    """What the analysis needs of the sweep's base config."""

    steps: int
    warmup_steps: int
    tokens_per_step: int
    seed: int
    """The base seed: seed 0 of the search; further seeds are seed + 1, seed + 2, ..."""
    rungs: tuple[int, ...]
    """Token counts at which LRs are compared (ASHA's rungs), the last one the full budget."""
    schedule: str = "cosine"
    """The LR schedule (cosine | wsd): under WSD a run of one budget can continue another's (lmtune.training.fork)."""

    @classmethod
    def of_config(cls, config: dict[str, Any], asha: dict[str, Any] | None) -> Budget:
        """The budget of a RunConfig (as a dict), compared at ASHA's rungs (``asha``: an AshaBudget dict)."""
        train, model = config["train"], config["model"]
        tokens_per_step = int(train["batch_size"]) * int(model["context_length"])
        steps = int(train["steps"])
        return cls(steps, int(train.get("warmup_steps", 0)), tokens_per_step, int(train.get("seed", 0)),
                   comparison_rungs(steps * tokens_per_step, asha), str(train.get("schedule", "cosine")))

    @property
    def full_tokens(self) -> int:
        return self.steps * self.tokens_per_step

    def at_steps(self, steps: int) -> Budget:
        """The same runs over ``steps`` steps, compared at their full token count only."""
        return replace(self, steps=steps, rungs=(steps * self.tokens_per_step,))


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


def format_tokens(tokens: float) -> str:
    """1.2M, 30.5k, 800: token counts in the search's and the sweep's messages."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if tokens >= scale:
            return f"{tokens / scale:.1f}{unit}"
    return f"{tokens:.0f}"


# ---------------------------------------------------------------------------------------------
# One trial


@dataclass
class Run:
    """One trial as the search (and the report) sees it."""

    lr: float
    seed: int
    stage: str
    budget_tokens: int
    """Tokens of its whole schedule (the budget)."""
    run_tokens: int
    """Tokens it was planned to train (the budget, unless a search asked for less)."""
    outcome: str | None = None
    """None while it runs; then the ledger's outcome (completed, diverged, stopped_early, ...)."""
    tokens: int = 0
    """Tokens trained so far."""
    val: dict[int, float] = field(default_factory=dict)
    """Val loss by tokens, at each evaluation."""
    others: tuple[tuple[str, Any], ...] = ()
    """The other parameters a grid varied (batch_size, ...): runs are grouped by LR and these."""
    diverged_tokens: int | None = None
    """Where its divergence was decided (a diverged run)."""
    divergence: str | None = None
    """How its divergence was established: NON_FINITE, BY_RULE or WHOLE_RUN (a diverged run)."""
    spikes: list[dict[str, Any]] = field(default_factory=list)
    """Its spikes (lmtune.training.divergence.Spike as dicts)."""
    trial_id: str = ""
    continue_from: str | None = None
    """The trial id of the (ASHA-cut) run this one continues: that run's rows are the first of this one's."""

    @property
    def done(self) -> bool:
        return self.outcome is not None

    @property
    def diverged(self) -> bool:
        return self.outcome == "diverged"

    @property
    def full(self) -> bool:
        """Trained its whole budget (its whole trajectory is known)."""
        return self.tokens >= self.budget_tokens

    def loss_at(self, tokens: int) -> float | None:
        return loss_at_tokens(self.val, tokens)

    def full_loss(self) -> float | None:
        """Its val loss at the end of its budget, if it trained that far without diverging."""
        return None if self.diverged or not self.full else self.loss_at(self.budget_tokens)

    def trained_through(self) -> bool:
        """Trained its whole budget without diverging: proven not to diverge at this budget."""
        return self.done and not self.diverged and self.full

    def divergence_confirmed(self) -> bool:
        """Diverged on evidence no rule supplied: a non-finite value, or its whole budget seen."""
        return self.diverged and (self.divergence == NON_FINITE or self.full)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "val": [[t, v] for t, v in sorted(self.val.items())], "others": list(self.others)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Run:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**{**known, "val": {int(t): float(v) for t, v in data.get("val", [])},
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


def effective_runs(runs: Iterable[Run]) -> list[Run]:
    """The runs that stand (the range test left out): a run continued by another is that other run (its rows
    are the first of the continuation's), and a finished confirmation run replaces the stopped run it
    retrained without early stopping (same LR, seed and other settings)."""
    runs = [r for r in runs if r.stage != "range"]
    continued = {r.continue_from for r in runs if r.continue_from}
    confirmed = {(r.lr, r.seed, r.others) for r in runs if r.stage == "confirm" and r.done and r.outcome != "error"}
    return [r for r in runs if (not r.trial_id or r.trial_id not in continued)
            and (r.stage == "confirm" or (r.lr, r.seed, r.others) not in confirmed)]


def equal_token_losses(runs: Iterable[Run], rungs: Iterable[int]) -> dict[int, dict[float, list[float]]]:
    """For every rung, the val loss at exactly that token count of every run that reached it, by LR
    (a list: one per seed). Diverged runs are left out (they are marked apart)."""
    runs = effective_runs(runs)
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
# The best LR, on as many seeds as the LRs it beats


@dataclass(frozen=True)
class LrResult:
    """The full-budget val losses of one LR, by seed (the seeds that trained the whole budget)."""

    lr: float
    losses: tuple[float, ...]
    others: tuple[tuple[str, Any], ...] = ()
    """The other varied parameters these runs share (a grid over more than the LR)."""
    seeds: tuple[int, ...] = ()
    """The seed of each loss, in the same order."""

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

    def mean_over(self, seeds: set[int]) -> float | None:
        values = [v for v, s in zip(self.losses, self.seeds, strict=True) if s in seeds]
        return sum(values) / len(values) if values else None


def full_budget_ranking(runs: Iterable[Run]) -> list[LrResult]:
    """LRs (with the other varied parameters) by their mean full-budget val loss, lowest first. An LR at
    which any trial diverged is left out (whatever its other seeds did), as are trials that did not
    train their whole budget. A seed trained twice (a refinement re-run) counts once, the first time."""
    runs = effective_runs(runs)
    diverged = {(r.lr, r.others) for r in runs if r.diverged}
    losses: dict[tuple[float, tuple], dict[int, float]] = {}
    for run in runs:
        loss = run.full_loss()
        if loss is not None and (run.lr, run.others) not in diverged:
            losses.setdefault((run.lr, run.others), {}).setdefault(run.seed, loss)
    ranked = [LrResult(lr, tuple(by_seed.values()), others, tuple(by_seed))
              for (lr, others), by_seed in losses.items()]
    return sorted(ranked, key=lambda r: (r.mean, r.lr))


def beats(challenger: LrResult, holder: LrResult) -> bool:
    """The challenger's loss is lower than the holder's on the seeds both have (a one-seed LR is compared
    seed for seed, never one draw against a mean); without a common seed, on their means."""
    common = set(challenger.seeds) & set(holder.seeds)
    if not common:
        return challenger.mean < holder.mean
    return challenger.mean_over(common) < holder.mean_over(common)


def crown(ranking: list[LrResult]) -> tuple[LrResult | None, list[LrResult]]:
    """The best LR and its contenders. Only an LR with as many seeds as any other can be crowned (the
    lowest mean among them); an LR with fewer seeds that beats it seed for seed is a contender, which
    must be given the seeds before the crown is settled."""
    if not ranking:
        return None, []
    most = max(len(r.losses) for r in ranking)
    best = min((r for r in ranking if len(r.losses) == most), key=lambda r: (r.mean, r.lr))
    contenders = [r for r in ranking if len(r.losses) < most and beats(r, best)]
    return best, contenders


def crowned_ranking(ranking: list[LrResult]) -> list[LrResult]:
    """The ranking with the crowned best first (the rest by mean)."""
    best, _ = crown(ranking)
    return [best, *[r for r in ranking if r is not best]] if best is not None else []


def spread_lrs(ranking: list[LrResult]) -> list[LrResult]:
    """The LRs the run-to-run spread is pooled over: those with several seeds within SPREAD_WITHIN of the
    crowned best (all LRs with several seeds when none is that close)."""
    seeded = [r for r in ranking if len(r.losses) > 1]
    best, _ = crown(ranking)
    near = [r for r in seeded if best is not None and max(r.lr / best.lr, best.lr / r.lr) <= SPREAD_WITHIN]
    return near or seeded


def pooled_seed_spread(ranking: list[LrResult]) -> float | None:
    """The run-to-run standard deviation of the full-budget loss near the best LR (spread_lrs), pooled."""
    squares, dof = 0.0, 0
    for result in spread_lrs(ranking):
        squares += (len(result.losses) - 1) * result.spread ** 2
        dof += len(result.losses) - 1
    return math.sqrt(squares / dof) if dof else None


def standard_error(result: LrResult, best: LrResult, sigma: float | None) -> float | None:
    """The standard error of (its mean - the best's mean), from the pooled run-to-run spread."""
    return None if sigma is None else sigma * math.sqrt(1 / len(result.losses) + 1 / len(best.losses))


def clearly_worse(result: LrResult, best: LrResult, sigma: float | None) -> bool:
    """Its mean is more than SIGNIFICANCE_SE standard errors of the difference above the best's
    (with no seed spread measured, any higher loss counts)."""
    error = standard_error(result, best, sigma)
    if error is None:
        return result.mean > best.mean
    return result.mean - best.mean > SIGNIFICANCE_SE * error


# ---------------------------------------------------------------------------------------------
# Where training fails


@dataclass(frozen=True)
class Bracket:
    """Where training breaks: between the largest LR proven to train through its budget and the smallest
    LR at which a run diverged."""

    stable_lr: float | None
    """The largest LR below diverged_lr whose every run trained its whole budget without diverging."""
    diverged_lr: float | None
    """The smallest LR at which a run diverged."""
    stable_above: tuple[float, ...] = ()
    """Stable LRs above diverged_lr (divergence is not monotone in LR there: seed or chance)."""

    @property
    def ratio(self) -> float | None:
        if self.stable_lr is None or self.diverged_lr is None:
            return None
        return self.diverged_lr / self.stable_lr

    def resolved(self, tolerance: float) -> bool:
        return self.ratio is not None and self.ratio <= tolerance


def bracket(runs: Iterable[Run]) -> Bracket:
    runs = effective_runs(runs)
    diverged = sorted({r.lr for r in runs if r.diverged})
    through = {r.lr for r in runs if r.trained_through()}
    if not diverged:
        return Bracket(max(through) if through else None, None)
    edge = diverged[0]
    stable = through - set(diverged)
    below = [lr for lr in stable if lr < edge]
    return Bracket(max(below) if below else None, edge, tuple(sorted(lr for lr in stable if lr > edge)))


def seed_dependent_lrs(runs: Iterable[Run]) -> list[dict[str, Any]]:
    """LRs where one seed trained through its budget and another diverged: the edge moves with the seed there."""
    by_lr: dict[float, dict[str, list[int]]] = {}
    for run in effective_runs(runs):
        if run.diverged or run.trained_through():
            by_lr.setdefault(run.lr, {"through": [], "diverged": []})["diverged" if run.diverged else "through"].append(
                run.seed)
    return [{"lr": lr, "seeds_through": sorted(v["through"]), "seeds_diverged": sorted(v["diverged"])}
            for lr, v in sorted(by_lr.items()) if v["through"] and v["diverged"]]


def bisect_lrs(edge: Bracket, points: int) -> list[float]:
    """``points`` LRs cutting [stable_lr, diverged_lr] into equal parts in log-LR."""
    lo, hi = edge.stable_lr, edge.diverged_lr
    return [lo * (hi / lo) ** (k / (points + 1)) for k in range(1, points + 1)]


def edge_runs(runs: Iterable[Run], edge: Bracket) -> tuple[list[Run], list[Run]]:
    """The runs at the bracket's two ends: (stable end's, diverged end's)."""
    runs = effective_runs(runs)
    return ([r for r in runs if r.lr == edge.stable_lr], [r for r in runs if r.lr == edge.diverged_lr])


def edge_confirmation(runs: Iterable[Run], edge: Bracket) -> dict[str, Any]:
    """How each end of the bracket was established: by training (the whole budget seen, or a non-finite
    value), or only by the stopper's rule (then it still needs a confirmation run)."""
    stable, diverged = edge_runs(runs, edge)
    failed = [r for r in diverged if r.diverged]
    decided = min((r.diverged_tokens for r in failed if r.diverged_tokens is not None), default=None)
    return {
        "stable_end": [{"seed": r.seed, "tokens": r.tokens, "how": "trained its whole budget without diverging"}
                       for r in stable],
        "diverged_end": [{"seed": r.seed, "tokens": r.tokens, "decided_at_tokens": r.diverged_tokens,
                          "how": _how_diverged(r), "confirmed": r.divergence_confirmed(), "stage": r.stage}
                         for r in failed],
        "decided_at_tokens": decided,
        "confirmed": bool(stable) and bool(failed) and all(r.divergence_confirmed() for r in failed),
    }


def _how_diverged(run: Run) -> str:
    if run.divergence == NON_FINITE:
        return "its loss went non-finite (no run comes back from that)"
    if run.full:
        return "trained its whole budget without early stopping and did not recover"
    return "the stopper ended it (above its initial loss for the whole recovery window); not yet retrained"


def needs_confirmation(runs: Iterable[Run], edge: Bracket) -> list[Run]:
    """The diverged end's runs that only the stopper's rule judged: to be retrained without early stop."""
    _, diverged = edge_runs(runs, edge)
    return [r for r in diverged if r.diverged and not r.divergence_confirmed()]


# ---------------------------------------------------------------------------------------------
# The landscape: basin, degraded, diverged


def best_lr_interval(ranking: list[LrResult], edge: Bracket | None = None) -> tuple[float | None, float | None]:
    """Where the best LR lies: strictly between the nearest LRs on either side whose loss is clearly
    worse than the best's (a diverged LR above counts as worse). None for a side where no tried LR
    is clearly worse: the optimum may lie beyond the LRs tried."""
    best, _ = crown(ranking)
    if best is None:
        return None, None
    sigma = pooled_seed_spread(ranking)
    worse = sorted(r.lr for r in ranking if r is not best and r.others == best.others and clearly_worse(r, best, sigma))
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


def landscape(ranking: list[LrResult], edge: Bracket) -> dict[str, Any]:
    """The three regions, each an LR interval whose ends are known to lie between two tried LRs:

    - basin: LRs whose mean full-budget loss is within SIGNIFICANCE_SE standard errors of the best's
      (the contiguous run of tried LRs around the best; with no seed spread measured, the best LR alone);
    - degraded: above the basin, up to the edge: trained through without diverging, loss clearly worse
      (how much worse per doubling of the LR: the slope of loss against log2 LR between neighbours);
    - diverged: from the edge up."""
    best, _ = crown(ranking)
    if best is None:
        return {"basin": None, "degraded": None, "diverged": _diverged_region(edge)}
    sigma = pooled_seed_spread(ranking)
    line = sorted((r for r in ranking if r.others == best.others), key=lambda r: r.lr)
    i = line.index(best)
    lo = hi = i
    while lo > 0 and not clearly_worse(line[lo - 1], best, sigma):
        lo -= 1
    while hi < len(line) - 1 and not clearly_worse(line[hi + 1], best, sigma):
        hi += 1
    margin = standard_error(best, best, sigma)
    basin = {"lrs": [r.lr for r in line[lo:hi + 1]],
             "low": [line[lo - 1].lr if lo > 0 else None, line[lo].lr],
             "high": [line[hi].lr, line[hi + 1].lr if hi + 1 < len(line) else edge.diverged_lr],
             "best_loss": best.mean, "seed_spread": sigma, "spread_lrs": [r.lr for r in spread_lrs(ranking)],
             "margin": None if margin is None else SIGNIFICANCE_SE * margin}
    return {"basin": basin, "degraded": _degraded(line[hi:], best, edge), "diverged": _diverged_region(edge)}


# How much worse the loss is at these multiples of the best LR (the report's answer to "how fast does it degrade").
DEGRADED_AT = (2, 4, 10, 30, 100, 300)


def _degraded(above: list[LrResult], best: LrResult, edge: Bracket) -> dict[str, Any] | None:
    """The LRs above the basin's last one (``above[0]``) that trained through, below the edge: each one's
    loss over the best's, that excess at round multiples of the best LR (interpolated in log LR between
    the LRs tried, never beyond them), and the least-squares slope of loss against log2 LR with its
    standard error (a mean rate: the curve is rarely a straight line)."""
    top = [r for r in above if edge.diverged_lr is None or r.lr < edge.diverged_lr]
    if len(top) < 2:
        return None
    points = [{"lr": r.lr, "ratio_to_best": r.lr / best.lr, "loss": r.mean, "excess": r.mean - best.mean,
               "seeds": len(r.losses)} for r in top[1:]]
    xs, ys = [math.log2(r.lr / best.lr) for r in top], [r.mean - best.mean for r in top]
    at = {str(f): _interpolate(xs, ys, math.log2(f)) for f in DEGRADED_AT if xs[0] <= math.log2(f) <= xs[-1]}
    slope, error = _slope(xs, ys)
    return {"low": [top[0].lr, top[1].lr], "high": [top[-1].lr, edge.diverged_lr], "points": points,
            "excess_at": at, "per_doubling": slope, "per_doubling_se": error}


def _interpolate(xs: list[float], ys: list[float], x: float) -> float:
    for (x0, y0), (x1, y1) in zip(zip(xs, ys, strict=True), zip(xs[1:], ys[1:], strict=True), strict=False):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return ys[-1]


def _slope(xs: list[float], ys: list[float]) -> tuple[float, float | None]:
    """Least-squares slope of ys on xs and its standard error (None with fewer than 3 points)."""
    n, mx, my = len(xs), sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    if n < 3:
        return slope, None
    residual = sum((y - my - slope * (x - mx)) ** 2 for x, y in zip(xs, ys, strict=True))
    return slope, math.sqrt(residual / (n - 2) / sxx)


def _diverged_region(edge: Bracket) -> dict[str, Any] | None:
    if edge.diverged_lr is None:
        return None
    return {"low": [edge.stable_lr, edge.diverged_lr]}


# ---------------------------------------------------------------------------------------------
# What the runs conclude


def conclude(runs: Iterable[Run], budget: Budget) -> dict[str, Any]:
    """The best LR (crowned on as many seeds as it beats), where it may lie, the bracket and how it was
    established, the ratio, and the landscape's regions."""
    runs = effective_runs(runs)
    ranking = full_budget_ranking(runs)
    best, contenders = crown(ranking)
    edge = bracket(runs)
    interval = best_lr_interval(ranking, edge)
    ratio = edge.diverged_lr / best.lr if best and edge.diverged_lr else None
    regions = landscape(ranking, edge)
    return {
        "best_lr": best.lr if best else None,
        "best_lr_seed_losses": list(best.losses) if best else [],
        "best_lr_seeds": list(best.seeds) if best else [],
        "best_lr_mean_loss": best.mean if best else None,
        "best_lr_spread": best.spread if best else None,
        "best_lr_contenders": [{"lr": r.lr, "seeds": list(r.seeds), "losses": list(r.losses)} for r in contenders],
        "seed_spread": pooled_seed_spread(ranking),
        "best_lr_interval": list(interval),
        "edge_lr_low": edge.stable_lr,
        "divergence_lr": edge.diverged_lr,
        "bracket_ratio": edge.ratio,
        "stable_above_divergence": list(edge.stable_above),
        "seed_dependent": seed_dependent_lrs(runs),
        "edge_confirmation": edge_confirmation(runs, edge) if edge.diverged_lr is not None else None,
        "edge_ratio": ratio,
        "edge_ratio_range": list(edge_ratio_range(edge, interval)),
        **regions,
        "ranking": [{"lr": r.lr, **dict(r.others), "seeds": list(r.seeds), "losses": list(r.losses), "mean": r.mean}
                    for r in crowned_ranking(ranking)],
    }
