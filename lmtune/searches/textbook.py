"""The textbook answer a horizon or width search's prediction must beat: the largest proxy's best LR carried to the
target by the rule a careful user would apply without any search (issue 55 item 4). It needs only that proxy's best
LR, so it costs nothing beyond the proxy's own LR search; a prediction that agrees with it adds nothing the user did
not already have, and the reports say so in one line (``rule_sentence``). benchmarks/truth.py puts the same rule to
each truth's check beside the search's prediction."""

from __future__ import annotations

from dataclasses import dataclass

# A prior exponent for LR* against the token horizon, LR* ∝ tokens^-PRIOR_BETA: not fitted by the search, the
# figure a user would take on trust. Source: this project's own horizon fits on the built-in corpus found about 0.3
# (quick_horizon's golden run, tests/golden/quick_horizon.summary.json: β 0.307; benchmarks/README.md, "The best
# LR across token horizons").
PRIOR_BETA = 0.3
# LR* against width, LR* ∝ width^-exponent. SP with Adam: 1 (μP's tables, Yang et al. 2022, "Tensor Programs V",
# give SP's Adam LR of hidden weights as 1/fan_in); μP: 0 (its promise: the LR tuned at one width holds at all).
WIDTH_EXPONENT = {"sp": 1.0, "mup": 0.0}


@dataclass(frozen=True)
class TextbookRule:
    """The rule's answer at the target and what it was carried from."""

    lr: float
    """The LR the rule gives at the target."""
    proxy_lr: float
    """The largest proxy's best LR (its crowned grid LR), all the rule needs."""
    name: str
    """The rule in words: "the widest proxy's best LR ÷ the width ratio (SP: LR* ∝ 1/width)"."""
    carried: str
    """How the proxy's LR was carried: "0.009 at d_model 128 ÷ 2"."""


def horizon_rule(proxy_lr: float, proxy_tokens: int, target_tokens: int) -> TextbookRule:
    """The largest searched budget's best LR x (target / its tokens)^-PRIOR_BETA."""
    ratio = target_tokens / proxy_tokens
    return TextbookRule(proxy_lr * ratio ** -PRIOR_BETA, proxy_lr,
                        f"the largest budget's best LR × (target / its tokens)^-{PRIOR_BETA:g} (a prior β)",
                        f"{proxy_lr:.3g} at {proxy_tokens:,} tokens × {ratio:.3g}^-{PRIOR_BETA:g}")


def width_rule(proxy_lr: float, proxy_width: int, target_width: int, parametrization: str) -> TextbookRule:
    """The widest proxy's best LR ÷ the width ratio under SP; unchanged under μP."""
    ratio = target_width / proxy_width
    if parametrization == "mup":
        return TextbookRule(proxy_lr, proxy_lr, "the widest proxy's best LR, unchanged (μP's rule)",
                            f"{proxy_lr:.3g} at d_model {proxy_width}, unchanged")
    return TextbookRule(proxy_lr * ratio ** -WIDTH_EXPONENT["sp"], proxy_lr,
                        "the widest proxy's best LR ÷ the width ratio (SP's rule: LR* ∝ 1/width)",
                        f"{proxy_lr:.3g} at d_model {proxy_width} ÷ {ratio:.3g}")


def largest_below(points: list[tuple[float, float | None]], target: float) -> tuple[float, float] | None:
    """The (size, best LR) of the largest proxy below the target with a best LR (None: no such proxy)."""
    below = [(size, best) for size, best in points if best and size < target]
    return max(below) if below else None


def agrees(rule: TextbookRule, interval: tuple[float, float] | None) -> bool:
    """The rule's LR lies within the prediction's interval."""
    return interval is not None and interval[0] <= rule.lr <= interval[1]


def rule_sentence(rule: TextbookRule, interval: tuple[float, float] | None, proxy: str) -> str:
    """One sentence (after "textbook rule: "): the rule's answer, whether the prediction agrees with it within the
    prediction's interval, and that the rule cost nothing beyond ``proxy``'s own LR search ("the widest proxy")."""
    head = f"{rule.name} gives {rule.lr:.3g} ({rule.carried})"
    costs = f"the rule cost nothing beyond {proxy}'s own LR search"
    if interval is None:
        return f"{head}; the prediction has no interval to hold it against; {costs}"
    span = f"{interval[0]:.3g}–{interval[1]:.3g}"
    if agrees(rule, interval):
        return f"{head}, inside the prediction's interval ({span}): the prediction agrees with it, and {costs}"
    return (f"{head}, outside the prediction's interval ({span}): the two disagree; {costs}, and only runs at the "
            "target tell which lies nearer the best")
