"""How often the compare search's batch reading holds what it prints: simulated searches, Ray-free.

Each simulated search is the real lmtune compare search (lmtune.searches.compare.search.CompareSearch) with a
batch-size space's settings (quick_batch's: batches 16, 8 and 48, or a wider set with --sizes), driven by runs that
"train" instantly: a run's final val loss is a curve in ln LR around its batch's true best LR (loss = floor +
curvature x^2 exp(skew x), x = ln(LR / LR*)) plus seed noise; a run at 100x its LR* or above diverges (the quick
model's edge lay about 100x above its best LR); the range test names the truth's steepest descent. The true LR*
moves as batch^k. The report's reading (lmtune.searches.compare.comparison.with_batches) prints k with a 90%
interval and each batch's LR* with one: how often do they hold the truth?

Nothing in the batch reading was tuned on these scenarios: its constants are the horizon search's
(lmtune.analysis.locate, lmtune.analysis.fit), chosen on benchmarks/horizon_coverage.py's tuned cases. So every
scenario here is held out.

    python benchmarks/batch_coverage.py --searches 300
    python benchmarks/batch_coverage.py --searches 300 --sizes 4,8,16,48,144   # five sizes, each dividing the tokens
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import append_row  # noqa: E402
from lmtune.searches.compare.comparison import compare_variants, with_batches  # noqa: E402 (lmtune from this checkout)
from lmtune.searches.compare.search import CompareSearch  # noqa: E402
from lmtune.searches.deciding import FINISHED, WAIT  # noqa: E402
from lmtune.sweep.plan import SweepPlan  # noqa: E402
from lmtune.sweep.spaces import load_space  # noqa: E402
from lmtune.training.config import budget_config  # noqa: E402

SPACE = Path(__file__).resolve().parents[1] / "search_spaces" / "quick_batch.yaml"
# The quick model's run-to-run sd at its best LR (quick_edge: ±0.026 over 3 seeds), and its loss rise at e x LR*
# (benchmarks/width_coverage.py's CURVATURE, SKEW, from the d_model-256 truths).
NOISE, CURVATURE, SKEW = 0.026, 0.25, 0.3
EDGE_RATIO = 100.0


@dataclass(frozen=True)
class Scenario:
    name: str
    k: float
    """LR* ∝ batch^k (at the largest batch when bent)."""
    k_smallest: float | None = None
    """A bent law: k at the smallest batch, moving linearly in ln batch to ``k`` at the largest."""
    noise: float = NOISE
    skew: float = SKEW
    floor_per_2x: float = 0.01
    """How much the loss floor rises per doubling of the batch at equal tokens."""

    def best(self, batch: int, reference: int, at_reference: float, sizes: tuple[int, ...]) -> float:
        x = math.log(batch / reference)
        if self.k_smallest is None:
            return at_reference * math.exp(self.k * x)
        lo, hi = math.log(min(sizes) / reference), math.log(max(sizes) / reference)
        slope = (self.k - self.k_smallest) / (hi - lo)  # dk/dln B
        k_at = lambda u: self.k_smallest + slope * (u - lo)  # noqa: E731
        return at_reference * math.exp((k_at(0.0) + k_at(x)) / 2 * x)  # ∫ k d ln B from the reference


SCENARIOS = {
    "sqrt": Scenario("sqrt", 0.5),
    "linear": Scenario("linear", 1.0),
    "flat": Scenario("flat", 0.0),
    "sqrt_noisy": Scenario("sqrt_noisy", 0.5, noise=2 * NOISE),
    "sqrt_skewed": Scenario("sqrt_skewed", 0.5, skew=0.8),
    "bent": Scenario("bent", 0.3, k_smallest=0.9),
}


class SimulatedBatches:
    def __init__(self, scenario: Scenario, truths: dict[str, float], tokens: int, rng: np.random.Generator):
        self.scenario, self.truths, self.tokens, self.rng = scenario, truths, tokens, rng

    def run(self, search: CompareSearch, trial_id: str, config: dict) -> None:
        best = self.truths[config["variant"]]
        if config["stage"] == "range":
            search.complete(trial_id, "range_test", {"tokens": self.tokens // 10, "steepest_lr": best,
                                                     "min_loss_lr": best * EDGE_RATIO / 3,
                                                     "blowup_lr": best * EDGE_RATIO})
            return
        lr = config["lr"]
        if lr >= EDGE_RATIO * best:
            search.observe(trial_id, {"tokens": self.tokens // 4})
            search.complete(trial_id, "diverged", {"tokens": self.tokens // 4, "divergence": "non-finite"})
            return
        x = math.log(lr / best)
        loss = 2.0 + CURVATURE * x * x * math.exp(self.scenario.skew * x)
        loss += self.scenario.floor_per_2x * math.log2(config.get("batch_size", 16) / 16)
        loss += self.scenario.noise * float(self.rng.standard_normal())
        search.observe(trial_id, {"tokens": self.tokens, "val_loss": loss})
        search.complete(trial_id, "completed", {"tokens": self.tokens})


def plan_for(sizes: tuple[int, ...]) -> SweepPlan:
    """quick_batch's space with the variants ``sizes`` (16 the reference, first)."""
    raw = yaml.safe_load(SPACE.read_text())
    ordered = sorted(sizes, key=lambda b: b != 16)
    raw["variants"] = {f"batch_{b}": ({} if b == 16 else {"batch_size": b}) for b in ordered}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "batch_coverage.yaml"
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
        space = load_space(str(path))
    return SweepPlan.create(space, budget_config(space.budget, space.fixed))


def simulate(scenario: Scenario, plan: SweepPlan, sizes: tuple[int, ...], seed: int) -> dict | None:
    rng = np.random.default_rng(seed)
    at_reference = 0.01 * math.exp(rng.uniform(-0.5, 0.5))  # the grid falls differently on the truth each time
    settings, budget = plan.space.strategy.settings, plan.budget()
    batch_of = {v.name: int(v.settings.get("batch_size", 16)) for v in settings.variants}
    truths = {name: scenario.best(b, 16, at_reference, sizes) for name, b in batch_of.items()}
    search = CompareSearch(settings, budget, max_pending=1)
    runs = SimulatedBatches(scenario, truths, budget.full_tokens, rng)
    for trial in range(600):
        config = search.suggest(f"t{trial:04d}")
        if config in (FINISHED, WAIT):
            break
        runs.run(search, f"t{trial:04d}", {**config, "batch_size": batch_of[config["variant"]]})
    by_variant = {name: list(s.runs.values()) for name, s in search.searches.items()}
    scaling = with_batches(compare_variants(by_variant, settings, budget), {}).batch
    points = [p for p in scaling.points if p.located is not None and p.located.usable]
    held = [p.located.interval()[0] <= truths[p.variant] <= p.located.interval()[1] for p in points]
    if scaling.law is None:
        return {"fitted": False, "trials": trial, "points_held": sum(held), "points": len(held)}
    low, high = scaling.exponent_interval
    truth_k = scenario.k if scenario.k_smallest is None else None
    # a bent law: its mean slope over the batches, what one line through them estimates
    mean_k = (math.log(truths[f"batch_{max(sizes)}"] / truths[f"batch_{min(sizes)}"])
              / math.log(max(sizes) / min(sizes)))
    return {"fitted": True, "trials": trial, "k": scaling.exponent, "k_interval": (low, high),
            "covered": low <= (truth_k if truth_k is not None else mean_k) <= high,
            "sqrt_allowed": low <= 0.5 <= high, "linear_allowed": low <= 1.0 <= high,
            "points_held": sum(held), "points": len(held), "width": high - low,
            "law_rejected": scaling.law.law_holds is False}


def study(name: str, searches: int, sizes: tuple[int, ...]) -> dict:
    plan = plan_for(sizes)
    outcomes = [simulate(SCENARIOS[name], plan, sizes, seed) for seed in range(searches)]
    fitted = [o for o in outcomes if o and o["fitted"]]
    points = sum(o["points"] for o in outcomes if o)
    row = {"scenario": name, "sizes": list(sizes), "searches": searches, "fitted": len(fitted),
           "k_coverage": sum(o["covered"] for o in fitted) / max(len(fitted), 1),
           "median_k": float(np.median([o["k"] for o in fitted])) if fitted else None,
           "median_interval_width": float(np.median([o["width"] for o in fitted])) if fitted else None,
           "sqrt_allowed": sum(o["sqrt_allowed"] for o in fitted) / max(len(fitted), 1),
           "linear_allowed": sum(o["linear_allowed"] for o in fitted) / max(len(fitted), 1),
           "lr_star_coverage": sum(o["points_held"] for o in outcomes if o) / max(points, 1),
           "law_rejected": sum(o["law_rejected"] for o in fitted) / max(len(fitted), 1),
           "median_trials": float(np.median([o["trials"] for o in outcomes if o]))}
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--searches", type=int, default=100)
    parser.add_argument("--sizes", default="8,16,48", help="batch sizes, 16 (the reference) among them")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--jsonl", help="append each row to this file")
    args = parser.parse_args(argv)
    sizes = tuple(int(s) for s in args.sizes.split(","))
    print(f"{'scenario':<12} {'fitted':>7} {'k cover':>8} {'median k':>9} {'width':>7} {'sqrt ok':>8} {'lin ok':>7} "
          f"{'LR* cover':>10} {'law rej':>8} {'trials':>7}")
    for name in args.scenarios.split(","):
        started = time.monotonic()
        row = study(name, args.searches, sizes)
        print(f"{name:<12} {row['fitted']:>7} {row['k_coverage']:>8.1%} {row['median_k'] or 0:>9.2f} "
              f"{row['median_interval_width'] or 0:>7.2f} {row['sqrt_allowed']:>8.1%} {row['linear_allowed']:>7.1%} "
              f"{row['lr_star_coverage']:>10.1%} {row['law_rejected']:>8.1%} {row['median_trials']:>7.0f}"
              f"  ({time.monotonic() - started:.0f} s)", flush=True)
        append_row(args.jsonl, "batch_coverage", row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
