"""How often the compare search's verdict is right: its false calls where two variants are the same, and how often it
sees a true difference, with quick_ablations' seeds (2 at each best LR). Simulated searches, Ray-free: the real
compare search driven as in benchmarks/compare_start.py, each later variant's loss floor a given number of nats above
the reference's (its best LR and edge the reference's), then the report's comparison (its verdict at 2 SE of a
difference, lmtune.searches.compare.comparison.difference).

    python benchmarks/compare_verdicts.py --searches 300
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import append_row  # noqa: E402
from benchmarks.compare_start import EDGE_RATIO, plan, searched  # noqa: E402
from lmtune.searches.compare.comparison import BETTER, WORSE, compare_variants  # noqa: E402
from lmtune.searches.trial_order import RANGE_STAGE  # noqa: E402

DIFFERENCES = (0.0, 0.02, 0.05, 0.1)  # nats: none, about the quick model's seed sd, twice it, four times it


def study(difference: float, searches: int) -> dict:
    the_plan = plan()
    settings = the_plan.space.strategy.settings
    names = [v.name for v in settings.variants]
    verdicts: Counter = Counter()
    for seed in range(searches):
        rng = np.random.default_rng(20_000 + seed)
        at = 0.01 * math.exp(rng.uniform(-0.5, 0.5))
        truths = {name: (at, at * EDGE_RATIO) for name in names}
        floors = {name: 2.0 + (difference if name != names[0] else 0.0) for name in names}
        search = searched("own", truths, seed, the_plan, floors)
        runs = {name: [r for r in search.runs_of(name) if r.stage != RANGE_STAGE] for name in names}
        result = compare_variants(runs, settings, search.budget)
        verdicts.update(v.difference.verdict if v.difference else "none" for v in result.variants[1:])
    total = sum(verdicts.values())
    wrong = verdicts[BETTER] if difference > 0 else verdicts[BETTER] + verdicts[WORSE]
    return {"difference": difference, "comparisons": total, "verdicts": dict(verdicts),
            "false_calls": wrong / total, "found_worse": verdicts[WORSE] / total}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--searches", type=int, default=100)
    parser.add_argument("--jsonl", help="append each row to this file")
    args = parser.parse_args(argv)
    print(f"{'difference':>10} {'comparisons':>12} {'false calls':>12} {'found worse':>12}   verdicts")
    for difference in DIFFERENCES:
        row = study(difference, args.searches)
        print(f"{difference:>10.2f} {row['comparisons']:>12} {row['false_calls']:>12.1%} {row['found_worse']:>12.1%}"
              f"   {row['verdicts']}", flush=True)
        append_row(args.jsonl, "compare_verdicts", row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
