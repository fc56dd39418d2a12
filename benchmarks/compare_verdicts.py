"""How often the compare search's verdict is right, the choice of each variant's best LR included: its false calls
per side where the variants are the same, and how often it sees a true difference. Simulated searches, Ray-free: the
real compare search with quick_ablations' settings (2 seeds at each best LR; ``--seeds N`` for N), driven as in
benchmarks/compare_start.py (each run's loss a skewed parabola in ln LR plus seed noise at the quick model's
run-to-run sd), so that every best LR is crowned as the real search crowns it, from the same candidates; then the
report's comparison (lmtune.searches.compare.comparison.difference).

Where the variants are the same (null scenarios): ``same`` (three identical variants), ``flatter`` (the later
variants' curve half as curved about the same best loss: more near-tied LRs for them to crown from than the
reference), ``start_reference`` (identical, the later variants' searches started from the reference's answer: a
different design from the reference's). The calibration: each null's per-side false-call rate under the same rule
with several location terms (LOCATIONS: the run-to-run sds a crowned LR's landing adds to its mean's error), the
shipped one LOCATION_SD; the level stays 2 SE. Where they differ (power): the later variants' best loss higher
(worse) or lower (better) by 0.02-0.05 nats. Beside each row, the rule before issue 55 (a later variant crowned with
its runs at the reference's best LR among its candidates, the degrees of freedom the spreads' sum, no location
term). Deterministic: search i draws from seed i.

    python benchmarks/compare_verdicts.py --scenarios same,flatter,start_reference --searches 1500
    python benchmarks/compare_verdicts.py --scenarios same,flatter --searches 600 --seeds 4
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import append_row  # noqa: E402
from benchmarks.compare_start import CURVATURE, EDGE_RATIO, NOISE, plan, searched  # noqa: E402
from lmtune.analysis.conclusion import conclude  # noqa: E402
from lmtune.analysis.locate import t_quantile  # noqa: E402
from lmtune.analysis.runs import full_budget_ranking, spread_lrs  # noqa: E402
from lmtune.searches.compare.comparison import (  # noqa: E402
    BETTER,
    LOCATION_SD,
    SIGNIFICANCE_SE,
    WORSE,
    compare_variants,
    pooled_spread,
)
from lmtune.searches.trial_order import RANGE_STAGE  # noqa: E402
from lmtune.sweep.plan import SweepPlan  # noqa: E402

# name: (the later variants' best loss minus the reference's, their curvature / the reference's, start)
SCENARIOS = {
    "same": (0.0, 1.0, "own"),
    "flatter": (0.0, 0.5, "own"),
    "start_reference": (0.0, 1.0, "reference"),
    **{f"worse_{d:g}": (d, 1.0, "own") for d in (0.02, 0.03, 0.05)},
    **{f"better_{d:g}": (-d, 1.0, "own") for d in (0.02, 0.03, 0.05)},
}
# The calibration: the same rule with these location terms (run-to-run sds a crowned LR's landing costs its mean,
# whatever its seeds); the shipped one is LOCATION_SD.
LOCATIONS = (0.0, 0.3, 0.4, 0.5, 0.7)


@dataclass(frozen=True)
class Compared:
    """One later variant against the reference: the shipped rule's difference and the rule before issue 55's."""

    value: float
    se: float
    dof: float
    verdict: str
    candidates: tuple[int, int]
    """Crown candidates (LRs with as many seeds as the best) of the variant and the reference."""
    sides: tuple[tuple[float, int, int], tuple[float, int, int]]
    """(pooled sd, its dof, seeds at the best LR) of the variant and the reference."""
    before_value: float
    before_verdict: str


def _before(runs: list, reference_runs: list, budget) -> tuple[float, str]:
    """The rule before issue 55: the variant crowned with its runs at the reference's best LR among its candidates,
    t for the sum of the two spreads' degrees of freedom."""
    var, ref = conclude(runs, budget), conclude(reference_runs, budget)
    value = var.best.mean - ref.best.mean
    if var.seed_spread is None or ref.seed_spread is None:
        return value, "none"
    se = math.sqrt(var.seed_spread ** 2 / len(var.best.losses) + ref.seed_spread ** 2 / len(ref.best.losses))
    dof = sum(len(r.losses) - 1 for c in (var, ref) for r in spread_lrs(list(c.ranking)))
    if abs(value) <= t_quantile(dof, SIGNIFICANCE_SE) * se:
        return value, "none"
    return value, BETTER if value < 0 else WORSE


def _candidates(conclusion) -> int:
    return sum(len(r.losses) == len(conclusion.best.losses) for r in conclusion.ranking)


def compared_in(the_plan: SweepPlan, scenario: str, seed: int, noise: float) -> list[Compared]:
    """Search ``seed`` of ``scenario``: each later variant against the reference."""
    shift, flatter, start = SCENARIOS[scenario]
    settings = the_plan.space.strategy.settings
    names = [v.name for v in settings.variants]
    rng = np.random.default_rng(20_000 + seed)
    at = 0.01 * math.exp(rng.uniform(-0.5, 0.5))
    truths = {name: (at, at * EDGE_RATIO) for name in names}
    floors = {name: 2.0 + (shift if i else 0.0) for i, name in enumerate(names)}
    curvatures = {name: CURVATURE * (flatter if i else 1.0) for i, name in enumerate(names)}
    search = searched(start, truths, seed, the_plan, floors, noise, curvatures)
    runs = {name: [r for r in search.runs_of(name) if r.stage != RANGE_STAGE] for name in names}
    result = compare_variants(runs, settings, search.budget)
    out = []
    for v in result.variants[1:]:
        d = v.difference
        if d is None or d.se is None:
            continue
        before = _before(runs[v.name], runs[names[0]], v.budget)
        ref = result.reference.conclusion
        sa = pooled_spread(full_budget_ranking(runs[v.name]), v.conclusion.best)
        sb = pooled_spread(ref.ranking, ref.best)
        sides = ((sa.sd, sa.dof, len(v.conclusion.best.losses)), (sb.sd, sb.dof, len(ref.best.losses)))
        out.append(Compared(d.value, d.se, d.dof, d.verdict, (_candidates(v.conclusion), _candidates(ref)), sides,
                            *before))
    return out


def _upper95(k: int, n: int) -> float:
    """Wilson's 95% upper bound on a rate seen k times in n."""
    z, p = 1.96, k / n
    return (p + z * z / (2 * n) + z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))) / (1 + z * z / n)


def with_seeds(the_plan: SweepPlan, seeds: int) -> SweepPlan:
    """quick_ablations' plan with ``seeds`` at each variant's best LR (``edge: {seeds: N}``)."""
    strategy = the_plan.space.strategy
    settings = replace(strategy.settings, edge=replace(strategy.settings.edge, seeds=seeds))
    return replace(the_plan, space=replace(the_plan.space, strategy=replace(strategy, settings=settings)))


def study(the_plan: SweepPlan, scenario: str, searches: int, noise: float) -> dict:
    from scipy import stats

    rows = [c for seed in range(searches) for c in compared_in(the_plan, scenario, seed, noise)]
    n = len(rows)
    values = np.array([c.value for c in rows])
    dofs = np.array([c.dof for c in rows])
    better = sum(c.verdict == BETTER for c in rows)
    worse = sum(c.verdict == WORSE for c in rows)
    levels = {}
    for location in LOCATIONS:  # the same rule with other location terms: the calibration
        (sa, na, ma), (sb, nb, mb) = (np.array([c.sides[i] for c in rows]).T for i in (0, 1))
        ea, eb = sa ** 2 * (1 / ma + location ** 2), sb ** 2 * (1 / mb + location ** 2)
        welch = (ea + eb) ** 2 / (ea ** 2 / na + eb ** 2 / nb)
        threshold = stats.t.ppf(stats.norm.cdf(SIGNIFICANCE_SE), welch) * np.sqrt(ea + eb)
        levels[str(location)] = {"better": float(np.mean(values < -threshold)),
                                 "worse": float(np.mean(values > threshold))}
    return {"scenario": scenario, "true_difference": SCENARIOS[scenario][0], "noise": noise,
            "seeds": the_plan.space.strategy.settings.edge.seeds, "searches": searches,
            "comparisons": n, "mean_difference": float(values.mean()),
            "mean_difference_se": float(values.std(ddof=1) / math.sqrt(n)),
            "better": better / n, "better_upper95": _upper95(better, n),
            "worse": worse / n, "worse_upper95": _upper95(worse, n),
            "welch_dof_median": float(np.median(dofs)),
            "equal_candidates": float(np.mean([a == b for a, b in (c.candidates for c in rows)])),
            "location_sd": LOCATION_SD, "locations": levels,
            "before": {"mean_difference": float(np.mean([c.before_value for c in rows])),
                       "better": float(np.mean([c.before_verdict == BETTER for c in rows])),
                       "worse": float(np.mean([c.before_verdict == WORSE for c in rows]))}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--searches", type=int, default=200)
    parser.add_argument("--noise", type=float, default=NOISE, help="run-to-run sd (nats)")
    parser.add_argument("--seeds", type=int, help="seeds at each best LR (default: quick_ablations' 2)")
    parser.add_argument("--jsonl", help="append each row to this file")
    args = parser.parse_args(argv)
    the_plan = with_seeds(plan(), args.seeds) if args.seeds else plan()
    print(f"{'scenario':<16} {'true':>6} {'n':>5} {'mean diff':>16} {'better':>7} {'worse':>7} {'ν med':>6} "
          f"{'same k':>7}   before: mean, better, worse   location terms {LOCATIONS}: better/worse")
    for scenario in args.scenarios.split(","):
        r = study(the_plan, scenario, args.searches, args.noise)
        b = r["before"]
        levels = " ".join(f"{v['better']:.1%}/{v['worse']:.1%}" for v in r["locations"].values())
        print(f"{scenario:<16} {r['true_difference']:>+6.2f} {r['comparisons']:>5} "
              f"{r['mean_difference']:>+8.4f}±{r['mean_difference_se']:.4f} {r['better']:>7.1%} {r['worse']:>7.1%} "
              f"{r['welch_dof_median']:>6.2f} {r['equal_candidates']:>7.0%}   {b['mean_difference']:+.4f}, "
              f"{b['better']:.1%}, {b['worse']:.1%}   {levels}", flush=True)
        append_row(args.jsonl, "compare_verdicts", r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
