"""How often the width search's 90% intervals hold what they claim: simulated searches, Ray-free.

Each simulated search is the real lmtune width search (lmtune.searches.width.conclusion.WidthSearch, with
quick_width's settings: proxies d_model 32, 64 and 128, target 256) driven by runs that "train" instantly: a run's
final val loss is a curve in ln LR around the width's true best LR (loss = floor + curvature x^2 exp(skew x),
x = ln(LR / LR*)) plus seed noise drawn for every run. The true LR* falls as width^-gamma: gamma = 1 is what the SP
truths on the built-in corpus showed from d_model 128 to 256 (x0.50), gamma = 0 is μP's promise (the μP truths:
x1.08). The noise is the run-to-run sd the searches measured at each width on the built-in corpus.

    python benchmarks/width_coverage.py --searches 200
    python benchmarks/width_coverage.py --variants --searches 150   # other settings: coverage, width and FLOPs
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lmtune.analysis.runs import Budget  # noqa: E402 (lmtune from this checkout)
from lmtune.searches.deciding import FINISHED, WAIT  # noqa: E402
from lmtune.searches.width.conclusion import WidthSearch  # noqa: E402
from lmtune.searches.width.settings import WidthSettings  # noqa: E402

TARGET = Budget(steps=162, warmup_steps=18, tokens_per_step=1024, seed=0, rungs=(162 * 1024,), d_model=256, d_ff=768,
                n_heads=8)
# quick_width's settings (search_spaces/quick_width.yaml); the confirmation adds nothing to the fit: 1 seed.
SETTINGS = WidthSettings(widths=(32, 64, 128), lr_min=0.004, lr_max=0.06, ratio=1.5, seeds=2, edge_probes=0,
                         confirm_seeds=1)
# Run-to-run sd by width as the two searches measured it (the crowned LR's 2 seeds, pooled over SP and μP;
# qw-sp and qw-mup in benchmarks/README.md): 0.035/0.094 at 32, 0.084/0.011 at 64, 0.034 at 128.
NOISE = {32: 0.07, 64: 0.06, 128: 0.034, 256: 0.02}
# The loss rise at e x LR*: the d_model-256 truths rose 0.24 (SP) and 0.17 (μP) nats at about 2.4x their LR*.
CURVATURE, SKEW = 0.25, 0.3


@dataclass(frozen=True)
class Outcome:
    covered: bool
    """The predicted LR's 90% interval holds the true LR* at the target width."""
    gamma_covered: bool
    resolved: bool
    ratio: float
    """The predicted interval's high / low."""
    log_error: float
    """ln(predicted / true)."""
    trials: int
    flops: float
    """Training FLOPs, with a 6-run confirmation at the target, at the quick family's measured per-run cost."""


# One run's training FLOPs at each width (quick_edge's budget, the built-in corpus's vocabulary; qw-sp's report), and
# the edge search's at d_model 256 (edge-w256: 3.27M tokens), to state a search's cost as a share of it.
RUN_FLOPS = {32: 0.156e12, 64: 0.365e12, 128: 0.942e12, 256: 2.731e12}
EDGE_SEARCH_FLOPS = 53.9e12


def simulate(gamma: float, seed: int, settings: WidthSettings = SETTINGS) -> Outcome | None:
    rng = np.random.default_rng(seed)
    at_target = 0.006 * math.exp(rng.uniform(-0.4, 0.4))  # the grid falls differently on the truth each time

    def best(width: int) -> float:
        return at_target * (width / TARGET.d_model) ** -gamma

    search, trials, per_width = WidthSearch(settings, TARGET), 0, Counter()
    while search.fit is None and search.fit_problem is None and trials < 400:
        config = search.suggest(f"t{trials:04d}")
        if config in (FINISHED, WAIT):
            break
        x = math.log(config["lr"] / best(config["d_model"]))
        loss = 2.0 + CURVATURE * x * x * math.exp(SKEW * x) + NOISE[config["d_model"]] * rng.standard_normal()
        search.observe(f"t{trials:04d}", {"tokens": TARGET.full_tokens, "val_loss": float(loss)})
        search.complete(f"t{trials:04d}", "completed", {"tokens": TARGET.full_tokens})
        per_width[config["d_model"]] += 1
        trials += 1
    fit = search.fit
    if fit is None:
        return None
    low, high = fit.predicted_lr_interval
    glow, ghigh = fit.law.exponent_interval
    flops = sum(RUN_FLOPS[w] * n for w, n in per_width.items()) + 6 * RUN_FLOPS[TARGET.d_model]
    return Outcome(low <= best(TARGET.d_model) <= high, glow <= gamma <= ghigh, fit.resolved, high / low,
                   math.log(fit.predicted_lr / best(TARGET.d_model)), trials, flops)


# What other settings would buy (the FLOPs question: can the search cost <= 50% of an edge search at the target?).
VARIANTS = {
    "shipped (32, 64, 128; refine)": SETTINGS,
    "no refine": replace(SETTINGS, refine=False),
    "no refine, 1 wall, grid 1 below / 1 above": replace(SETTINGS, refine=False, walls=1, below=1, above=1),
    "proxies 32, 64 only": replace(SETTINGS, widths=(32, 64)),
    "proxies 32, 64, 3 seeds": replace(SETTINGS, widths=(32, 64), seeds=3),
    "proxies 32, 64, 4 seeds": replace(SETTINGS, widths=(32, 64), seeds=4),
}


def variants(searches: int) -> None:
    print("| settings | true gamma | 90% interval holds LR* | median interval | FLOPs / edge search at 256 (median) |")
    print("|---|---|---|---|---|")
    for name, settings in VARIANTS.items():
        for gamma in (1.0, 0.0):
            fitted = [o for o in (simulate(gamma, k, settings) for k in range(searches)) if o is not None]
            print(f"| {name} | {gamma:g} | {sum(o.covered for o in fitted) / len(fitted):.0%} | "
                  f"{np.median([o.ratio for o in fitted]):.1f}x | "
                  f"{np.median([o.flops for o in fitted]) / EDGE_SEARCH_FLOPS:.0%} |")
            sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--searches", type=int, default=200)
    parser.add_argument("--variants", action="store_true", help="instead: other settings' coverage and FLOPs")
    args = parser.parse_args(argv)
    if args.variants:
        variants(args.searches)
        return 0
    print("| true gamma | searches fitted | 90% interval holds LR* at 256 | gamma's interval holds gamma | "
          "gamma resolved | median interval | rms ln error | median trials |")
    print("|---|---|---|---|---|---|---|---|")
    for gamma in (1.0, 0.0):
        outcomes = [simulate(gamma, k) for k in range(args.searches)]
        fitted = [o for o in outcomes if o is not None]
        n = len(fitted)
        covered = sum(o.covered for o in fitted) / n
        print(f"| {gamma:g} | {n}/{len(outcomes)} | {covered:.0%} ± {math.sqrt(covered * (1 - covered) / n):.0%} | "
              f"{sum(o.gamma_covered for o in fitted) / n:.0%} | {sum(o.resolved for o in fitted) / n:.0%} | "
              f"{np.median([o.ratio for o in fitted]):.1f}x | "
              f"{np.sqrt(np.mean([o.log_error ** 2 for o in fitted])):.2f} | "
              f"{np.median([o.trials for o in fitted]):.0f} |")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
