"""How the report writes its numbers in words: LRs, losses, token counts, markdown tables, the intervals the
conclusions are given with. Shared by lr_sweep_analysis.md, the CLIs' last lines and the figures' labels."""

from __future__ import annotations

import math
from collections.abc import Sequence

from lmtune.analysis.conclusion import Conclusion, NothingTrained
from lmtune.analysis.landscape import Degraded
from lmtune.analysis.runs import SAME_LR
from lmtune.findings.stability import INITIAL_ESTIMATED, INITIAL_FROM_VOCAB

Cell = float | int | bool | str | None

# A range wider than a decade is no answer: on the built-in corpus the loss 10x above the best LR is 1.5 nats
# worse (benchmarks/README.md, the truth grid), so a reader told "between 0.003 and 300" knows no more than
# before the sweep.
# A 3.16x grid's best LR between its two neighbours spans exactly this (SAME_LR allows for their rounding).
WIDEST_ANSWER = 10.0


def fmt(value: Cell, digits: int = 4) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "—"
        return f"{value:.{digits}g}"
    return str(value)


def tokens(value: float | None) -> str:
    if value is None:
        return "—"
    value = float(value)
    if value >= 1e6:
        return f"{value / 1e6:.2f}M"
    if value >= 1e3:
        return f"{value / 1e3:.1f}k"
    return f"{value:.0f}"


def lr(value: float | None, missing: str = "—") -> str:
    return missing if value is None else f"{value:.3g}"


def rate(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def too_wide(low: float | None, high: float | None) -> bool:
    """Both ends known and more than WIDEST_ANSWER apart."""
    return low is not None and high is not None and low > 0 and high / low > WIDEST_ANSWER * SAME_LR


def between(low: float | None, high: float | None) -> str:
    """Where a region's boundary lies, between two tried LRs (an end no LR found, in words)."""
    if low is not None and high is not None:
        return f"between {low:.3g} and {high:.3g}"
    if low is not None:
        return f"above {low:.3g} (not found: no LR tried beyond it)"
    if high is not None:
        return f"below {high:.3g} (not found: no LR tried beyond it)"
    return "where no LR was tried"


def basin_lrs(lrs: Sequence[float], dash: str = " to ") -> str:
    """The basin's LRs as a span, "lr 0.003 to 0.03"; one LR alone as "lr 0.0107 alone" (not "0.0107 to 0.0107")."""
    return f"lr {lr(lrs[0])} alone" if len(lrs) == 1 else f"lr {lr(lrs[0])}{dash}{lr(lrs[-1])}"


def basin_ends(low: tuple[float | None, float | None], high: tuple[float | None, float | None]) -> str:
    """Where the basin's two ends lie, for a one-line summary."""
    return f"its lower end lies {between(*low)}, its upper end {between(*high)}"


def per_doubling(degraded: Degraded) -> str:
    """The degraded region's mean rate and what it rests on: "+0.62 nats per doubling of the LR on average over
    7 one-seed LRs (between neighbouring LRs +0.07 to +2.1)". The curve saturates, so the slopes between
    neighbours are its spread (a straight line's ± would only measure how far it is from a line); from 2 LRs
    there is one slope, and nothing says how well it is known."""
    seeds, slopes = degraded.seeds, degraded.neighbour_slopes
    lrs = f"{len(seeds)} one-seed LRs" if seeds and all(n == 1 for n in seeds) else f"{len(seeds)} LRs"
    rate = f"{degraded.per_doubling:+.2g} nats per doubling of the LR"
    if len(slopes) < 2:
        return f"{rate} (from {lrs}: no error)"
    return f"{rate} on average over {lrs} (between neighbouring LRs {min(slopes):+.2g} to {max(slopes):+.2g})"


def interval_line(low: float | None, high: float | None) -> str:
    """Where the best LR lies, between the nearest LRs on either side that were clearly worse (where they are
    more than WIDEST_ANSWER apart, that it is not resolved and what would resolve it)."""
    if too_wide(low, high):
        return (f"the best LR is not resolved by this grid (the nearest LRs clearly worse, {low:.3g} and "
                f"{high:.3g}, are {high / low:.3g}x apart): train more seeds at the LRs around the best, or a finer "
                "grid without early stopping")
    if low is not None and high is not None:
        return f"the best LR lies between {low:.3g} and {high:.3g} (the nearest LRs clearly worse)"
    if high is not None:
        return f"the best LR lies below {high:.3g} (no smaller LR tried was clearly worse)"
    if low is not None:
        return f"the best LR lies above {low:.3g} (no larger LR tried was clearly worse)"
    return "no LR tried was clearly worse than the best: the optimum may lie outside the LRs tried"


def ratio_range_text(smallest: float | None, largest: float | None, reading: str | None = None) -> str:
    """The edge / best ratio as a range; an open end where the best LR's interval is open. A range more than
    WIDEST_ANSWER wide that no one ``reading`` covers is said to be unresolved, with what would resolve it."""
    if too_wide(smallest, largest) and not reading:
        return (f"not resolved by this grid (its ends, {smallest:.3g} and {largest:.3g}, are {largest / smallest:.3g}x "
                "apart): narrow the best LR's interval (more seeds at the LRs around the best, or a finer grid "
                "without early stopping) and the edge bracket")
    if smallest is not None and largest is not None:
        return f"between {smallest:.3g} and {largest:.3g}"
    if smallest is not None:
        return f"at least {smallest:.3g} (no upper bound: the best LR's interval is open below)"
    if largest is not None:
        return f"at most {largest:.3g} (no lower bound: the best LR's interval is open above)"
    return "unbounded either way (the best LR's interval is open on both sides)"


def initial_loss_text(value: float | None, found: str | None, digits: int = 4, short: bool = False) -> str:
    """ℓ₀ as the report states it, saying how it was found: "ℓ₀ = ln(vocab) = 8.243" where the vocabulary is known,
    "ℓ₀ ≈ 7.5, estimated as ..." where it is the trials' median first train loss (never called ln(vocab) then;
    ``short``: "ℓ₀ ≈ 7.5, an estimate: the median first train loss")."""
    if value is None:
        return "ℓ₀ not known (no vocabulary size, and no train loss logged to estimate it from)"
    if found == INITIAL_FROM_VOCAB:
        return f"ℓ₀ = ln(vocab) = {value:.{digits}g}"
    if found == INITIAL_ESTIMATED and short:
        return f"ℓ₀ ≈ {value:.{digits}g}, an estimate: the median first train loss"
    if found == INITIAL_ESTIMATED:
        return (f"ℓ₀ ≈ {value:.{digits}g}, estimated as the median over the runs of the first train loss each logged "
                "(the vocabulary size, which gives ln(vocab), is not known)")
    return f"ℓ₀ = {value:.{digits}g}"


def lr_list(lrs: Sequence[float]) -> str:
    """LRs in words: "0.5", "0.5 and 1.5", "0.1, 0.5 and 1.5"."""
    named = [f"{v:.3g}" for v in lrs]
    return named[0] if len(named) == 1 else f"{', '.join(named[:-1])} and {named[-1]}"


def set_aside_text(conclusion: Conclusion) -> str | None:
    """The LRs at which a run failed below the failing and divergence LRs' floor (Bracket.failed_below: where no
    smaller LR trained, or below the best LR), in one sentence saying they are not the edge; None: none."""
    diverged = conclusion.divergence.failed_below
    failed = tuple(v for v in conclusion.edge.failed_below if v not in diverged)
    if not diverged and not failed:
        return None
    ran = [r.lr for r in conclusion.ranking]
    groups = []
    for lrs, how in ((diverged, "diverged"), (failed, "ended no better than the data's unigram baseline")):
        bottom = [v for v in lrs if not any(x < v for x in ran)]  # no smaller LR ran its budget
        between = [v for v in lrs if v not in bottom]
        groups += [f"lr {lr_list(bottom)} {how} where no smaller LR trained"] if bottom else []
        best = f" ({conclusion.best_lr:.3g})" if conclusion.best_lr is not None else ""
        groups += [f"lr {lr_list(between)} {how} below the best LR{best}, above an LR that trained"] if between else []
    trained = [v for v in ran if v > min(diverged + failed)]
    where = f" ({lr_list(trained)} did)" if trained else ""
    return (f"{'; '.join(groups)}{where}: not the edge (the failing and divergence LRs lie above LRs that train, "
            "not below the best), so that run broke for another reason than a large LR: look at it")


def nothing_trained_text(nothing: NothingTrained) -> str:
    """Why no best LR is named where no run beat the data's unigram baseline, with both numbers."""
    return (f"nothing trained: no run ended better than the data's unigram baseline (the best final val loss, "
            f"{nothing.loss:.4f} at lr {nothing.lr:.3g}, against the baseline's {nothing.baseline:.4f} nats: "
            "predicting each token by its frequency does as well), so no best LR is named; a longer budget, or other "
            "LRs, may train")
