"""What a compare search's later variants save by starting from the reference's answer (``start: reference``), and
whether they still find their own best LR and edge: simulated searches, Ray-free, side by side with ``start: own``.

Each simulated search is the real lmtune compare search with quick_ablations' settings (the reference and two later
variants), driven by runs that "train" instantly: a run's final val loss is a curve in ln LR around its variant's
true best LR (loss = floor + curvature x^2 exp(skew x), x = ln(LR / LR*)) plus seed noise at the quick model's
measured run-to-run sd; a run at or above its variant's edge diverges; the range test finds a steepest descent
within 2x of the best LR and a blow-up within 1.35x of the edge. The same noise draws feed both starts (the same
seed per search). Scenarios: the later variants' optimum stays (x1, edge x1), moves a little (x0.5 and x2), moves
far (x0.2 with the edge x0.02), and the edge alone moves (x0.1).

    python benchmarks/compare_start.py --searches 200
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import append_row  # noqa: E402
from lmtune.analysis.conclusion import conclude  # noqa: E402 (lmtune from this checkout)
from lmtune.analysis.runs import effective_runs  # noqa: E402
from lmtune.searches.compare.search import CompareSearch  # noqa: E402
from lmtune.searches.deciding import FINISHED, WAIT  # noqa: E402
from lmtune.searches.trial_order import RANGE_STAGE  # noqa: E402
from lmtune.sweep.plan import SweepPlan  # noqa: E402
from lmtune.sweep.spaces import load_space  # noqa: E402
from lmtune.training.config import budget_config  # noqa: E402

SPACE = Path(__file__).resolve().parents[1] / "search_spaces" / "quick_ablations.yaml"
NOISE, CURVATURE, SKEW = 0.026, 0.25, 0.3  # as benchmarks/batch_coverage.py
EDGE_RATIO = 100.0  # the quick model's edge about 100x above its best LR
# (best LR x, edge x) of the two later variants against the reference's.
SCENARIOS = {
    "stays": ((1.0, 1.0), (1.0, 1.0)),
    "moves_2x": ((0.5, 0.5), (2.0, 2.0)),
    "moves_far": ((0.2, 0.02), (0.2, 0.02)),
    "edge_only": ((1.0, 0.1), (1.0, 0.1)),
}


class Simulated:
    def __init__(self, truths: dict[str, tuple[float, float]], tokens: int, seed: int,
                 floors: dict[str, float] | None = None, noise: float = NOISE,
                 curvatures: dict[str, float] | None = None):
        self.truths, self.tokens, self.floors = truths, tokens, floors or {}
        self.noise, self.curvatures = noise, curvatures or {}
        self.rng = np.random.default_rng(seed)
        self.draws: dict[tuple[str, float, int], float] = {}  # the same draw for the same run under either start

    def run(self, search: CompareSearch, trial_id: str, config: dict) -> None:
        best, edge = self.truths[config["variant"]]
        if config["stage"] == RANGE_STAGE:  # its steepest descent within 2x of the best LR, its blow-up near the edge
            steepest = best * math.exp(self.rng.uniform(-0.7, 0.7))
            blowup = edge * math.exp(self.rng.uniform(-0.3, 0.3))
            search.complete(trial_id, "range_test", {"tokens": self.tokens // 10, "steepest_lr": steepest,
                                                     "min_loss_lr": blowup / 3, "blowup_lr": blowup})
            return
        lr, seed = config["lr"], config["seed"]
        if lr >= edge:
            search.observe(trial_id, {"tokens": self.tokens // 4})
            search.complete(trial_id, "diverged", {"tokens": self.tokens // 4, "divergence": "non-finite"})
            return
        key = (config["variant"], round(math.log(lr), 6), seed)
        draw = self.draws.setdefault(key, float(self.rng.standard_normal()))
        x = math.log(lr / best)
        curvature = self.curvatures.get(config["variant"], CURVATURE)
        loss = self.floors.get(config["variant"], 2.0) + curvature * x * x * math.exp(SKEW * x) + self.noise * draw
        search.observe(trial_id, {"tokens": self.tokens, "val_loss": loss})
        search.complete(trial_id, "completed", {"tokens": self.tokens})


def plan() -> SweepPlan:
    space = load_space(str(SPACE))
    return SweepPlan.create(space, budget_config(space.budget, space.fixed))


def searched(start: str, truths: dict, seed: int, the_plan: SweepPlan, floors: dict[str, float] | None = None,
             noise: float = NOISE, curvatures: dict[str, float] | None = None) -> CompareSearch:
    """One simulated compare search to its end (``floors``, ``curvatures``: by variant, the defaults 2.0 and
    CURVATURE; ``noise``: the run-to-run sd)."""
    settings = replace(the_plan.space.strategy.settings, start=start)
    budget = the_plan.budget()
    search = CompareSearch(settings, budget, max_pending=1)
    runs = Simulated(truths, budget.full_tokens, seed, floors, noise, curvatures)
    for trial in range(800):
        config = search.suggest(f"t{trial:04d}")
        if config in (FINISHED, WAIT):
            break
        runs.run(search, f"t{trial:04d}", config)
    return search


def outcome(search: CompareSearch, name: str, truths: dict) -> dict:
    runs = [r for r in search.runs_of(name) if r.stage != RANGE_STAGE]
    c = conclude(effective_runs(runs), search.searches[name].budget)
    best, edge = truths[name]
    found = c.best_lr
    return {"tokens": sum(r.tokens for r in search.runs_of(name) if r.stage != "at_reference"),
            "trials": sum(r.stage != "at_reference" for r in search.runs_of(name)),
            "log_error": abs(math.log(found / best)) if found else math.inf,
            "edge_held": bool(c.edge.diverged_lr and (c.edge.stable_lr or 0) < edge <= c.edge.diverged_lr),
            "best_lr": found}


def study(name: str, searches: int, the_plan: SweepPlan) -> dict:
    factors = SCENARIOS[name]
    later = [v.name for v in the_plan.space.strategy.settings.variants[1:]]
    rows = {"own": [], "reference": []}
    same = 0
    for seed in range(searches):
        rng = np.random.default_rng(10_000 + seed)
        at = 0.01 * math.exp(rng.uniform(-0.5, 0.5))
        truths = {the_plan.space.strategy.settings.reference.name: (at, at * EDGE_RATIO)}
        truths |= {v: (at * f_best, at * EDGE_RATIO * f_edge) for v, (f_best, f_edge) in zip(later, factors,
                                                                                               strict=True)}
        per_start = {start: [outcome(searched(start, truths, seed, the_plan), v, truths) for v in later]
                     for start in rows}
        for start, outcomes in per_start.items():
            rows[start] += outcomes
        same += sum(a["best_lr"] is not None and b["best_lr"] is not None
                    and abs(math.log(a["best_lr"] / b["best_lr"])) < math.log(1.3)
                    for a, b in zip(per_start["own"], per_start["reference"], strict=True))
    result = {"scenario": name, "searches": searches, "variants": len(rows["own"]),
              "same_best": same / len(rows["own"])}
    for start, outcomes in rows.items():
        result[start] = {"tokens": float(np.mean([o["tokens"] for o in outcomes])),
                         "trials": float(np.mean([o["trials"] for o in outcomes])),
                         "within_1.5x": float(np.mean([o["log_error"] <= math.log(1.5) for o in outcomes])),
                         "median_log_error": float(np.median([o["log_error"] for o in outcomes])),
                         "edge_held": float(np.mean([o["edge_held"] for o in outcomes]))}
    result["tokens_saved"] = 1 - result["reference"]["tokens"] / result["own"]["tokens"]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--searches", type=int, default=50)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--jsonl", help="append each row to this file")
    args = parser.parse_args(argv)
    the_plan = plan()
    print(f"{'scenario':<10} {'start':<10} {'trials':>7} {'tokens':>10} {'≤1.5x':>7} {'med|ln err|':>12} "
          f"{'edge held':>10}   same best, tokens saved")
    for name in args.scenarios.split(","):
        row = study(name, args.searches, the_plan)
        for start in ("own", "reference"):
            r = row[start]
            tail = f"   {row['same_best']:.1%}, {row['tokens_saved']:+.1%}" if start == "reference" else ""
            print(f"{name:<10} {start:<10} {r['trials']:>7.1f} {r['tokens']:>10,.0f} {r['within_1.5x']:>7.1%} "
                  f"{r['median_log_error']:>12.3f} {r['edge_held']:>10.1%}{tail}", flush=True)
        append_row(args.jsonl, "compare_start", row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
