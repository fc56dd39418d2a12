"""The horizon search's prediction two ways, on the same simulated searches (issue 44 item 2): the search's own (the
loss surface fitted to every budget's runs, lmtune.analysis.surface, or the line where the surface's law test fails)
against the line through the budgets' located LR*s alone (lmtune.analysis.fit, the method before it). Ray-free; the
searches are benchmarks/horizon_coverage.py's (the real HorizonSearch driven by runs on known curves), tuned and
held-out scenarios alike.

    python benchmarks/horizon_joint_fit.py --searches 1000            # every tuned and held-out scenario
    python benchmarks/horizon_joint_fit.py --searches 200 --scenario all_at_once
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import horizon_coverage as hc  # noqa: E402 (the simulated searches)

from lmtune.analysis.fit import SURFACE, HorizonFit, fit_horizon  # noqa: E402
from lmtune.searches.horizon.budgets import locate_budgets  # noqa: E402


@dataclass(frozen=True)
class Paired:
    """One simulated search, both fits' predictions against the truth at the target."""

    truth: float
    line: HorizonFit
    default: HorizonFit


def paired(scenario: hc.Scenario, seed: int) -> Paired | None:
    """One search as horizon_coverage.simulate runs it (its fit the surface where it fits), and the line through its
    located LR*s beside it."""
    done = hc.searched(scenario, seed)
    search, truth = done.search, done.truth
    if search.fit is None:
        return None
    located = [p for p in locate_budgets(search.runs.values(), hc.SETTINGS, hc.TARGET) if p is not None]
    try:
        line = fit_horizon(located, hc.TARGET.full_tokens)
    except Exception:  # noqa: BLE001 - the line cannot be fitted where fewer than two budgets are located
        return None
    return Paired(truth, line, search.fit)


def fit_columns(both: list, get) -> str:
    """One fit's columns over the searches ``both`` (each with its ``truth``; ``get(r)``: that fit of search r, with
    a predicted_lr and its interval): how often its 90% interval held the truth, its median width, the 90th
    percentile and median of |ln(predicted / truth)|."""
    errors = np.abs([math.log(get(r).predicted_lr / r.truth) for r in both])
    covered = np.mean([get(r).predicted_lr_interval[0] <= r.truth <= get(r).predicted_lr_interval[1] for r in both])
    width = np.median([get(r).predicted_lr_interval[1] / get(r).predicted_lr_interval[0] for r in both])
    return f"{covered:.1%} | {width:.2f}× | {np.percentile(errors, 90):.3f} | {np.median(errors):.3f}"


def summary(name: str, results: list[Paired | None]) -> str:
    both = [r for r in results if r is not None]
    surface = np.mean([r.default.method == SURFACE for r in both])
    flagged = np.mean([r.default.law_holds is False for r in both])
    return (f"| {name} | {len(both)}/{len(results)} | {fit_columns(both, lambda r: r.line)} | "
            f"{fit_columns(both, lambda r: r.default)} | {surface:.0%} | {flagged:.0%} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--searches", type=int, default=200)
    parser.add_argument("--scenario", action="append", choices=sorted({**hc.SCENARIOS, **hc.HELD_OUT}))
    args = parser.parse_args(argv)
    every = {**hc.SCENARIOS, **hc.HELD_OUT}
    print("| scenario | searches both fitted | line: 90% holds | median width | 90th pct abs ln error | median | "
          "the search's: 90% holds | median width | 90th pct abs ln error | median | by the surface | law flagged |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.scenario or list(every):
        print(summary(name + (" (held out)" if name in hc.HELD_OUT else ""),
                      [paired(every[name], k) for k in range(args.searches)]))
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
