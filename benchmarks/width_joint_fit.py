"""The width search's prediction two ways, on the same simulated searches (issue 44 item 2, for width): with ``fit:
surface`` (the loss surface fitted to every proxy's runs, lmtune.analysis.surface, or the line where the surface's
law test fails) against the line through the proxies' located LR*s alone (lmtune.analysis.fit, the default).
Ray-free; the searches are benchmarks/width_coverage.py's (the real WidthSearch driven by runs on known curves),
the tuned cases (gamma 1 under SP, 0 under μP) and the held-out scenarios alike.

    python benchmarks/width_joint_fit.py --searches 300
    python benchmarks/width_joint_fit.py --searches 200 --scenario all_at_once
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import width_coverage as wc  # noqa: E402 (the simulated searches)
from horizon_joint_fit import fit_columns  # noqa: E402 (the same columns as the horizon search's comparison)

from lmtune.analysis.fit import SURFACE, PowerLaw, fit_power_law  # noqa: E402
from lmtune.searches.width.conclusion import locate_widths  # noqa: E402

SURFACE_SETTINGS = replace(wc.SETTINGS, fit=SURFACE)
TUNED = {"gamma 1 (SP)": wc.Scenario("gamma 1 (SP)", 1.0), "gamma 0 (μP)": wc.Scenario("gamma 0 (μP)", 0.0)}


@dataclass(frozen=True)
class Paired:
    """One simulated search, both fits' predictions against the truth at the target width."""

    truth: float
    line: PowerLaw
    default: PowerLaw
    method: str


def paired(scenario: wc.Scenario, seed: int) -> Paired | None:
    """One search as width_coverage.simulate runs it, with fit: surface (the surface where it fits), and the line
    through its located LR*s beside it."""
    done = wc.searched(scenario, seed, SURFACE_SETTINGS)
    if done is None:
        return None
    search, truth = done
    located = [(w, p) for w, p in zip(sorted(wc.SETTINGS.widths), locate_widths(search.runs.values(), wc.SETTINGS,
                                                                               wc.TARGET), strict=True)
               if p is not None and p.usable]
    if len(located) < 2:
        return None
    line = fit_power_law([float(w) for w, _ in located], [p for _, p in located], float(wc.TARGET.d_model))
    return Paired(truth, line, search.fit.law, search.fit.method)


def summary(name: str, results: list[Paired | None]) -> str:
    both = [r for r in results if r is not None]
    surface = np.mean([r.method == SURFACE for r in both])
    return (f"| {name} | {len(both)}/{len(results)} | {fit_columns(both, lambda r: r.line)} | "
            f"{fit_columns(both, lambda r: r.default)} | {surface:.0%} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--searches", type=int, default=200)
    every = {**TUNED, **wc.HELD_OUT}
    parser.add_argument("--scenario", action="append", choices=sorted(every))
    args = parser.parse_args(argv)
    print("| scenario | searches both fitted | line: 90% holds | median width | 90th pct abs ln error | median | "
          "fit surface: 90% holds | median width | 90th pct abs ln error | median | by the surface |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.scenario or list(every):
        print(summary(name + (" (held out)" if name in wc.HELD_OUT else ""),
                      [paired(every[name], k) for k in range(args.searches)]))
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
