"""The few distributions the horizon fit needs, in closed form (numpy has none; scipy is not a dependency)."""

from __future__ import annotations

import math

# z of a two-sided 90% interval. An interval enters the power law as a point with SE = its half-width / Z90.
Z90 = 1.6448536269514722


def chi2_survival(chi2: float, dof: int) -> float:
    """P(X >= chi2) for X chi-square with ``dof`` degrees of freedom (closed forms; no scipy)."""
    half = chi2 / 2
    if dof % 2 == 0:
        term, total = 1.0, 1.0
        for k in range(1, dof // 2):
            term *= half / k
            total += term
        return math.exp(-half) * total
    total = math.erfc(math.sqrt(half))
    term = math.sqrt(half) * math.exp(-half) / math.gamma(1.5)
    for k in range(1, (dof + 1) // 2):
        total += term
        term *= half / (k + 0.5)
    return min(1.0, total)


def t_quantile(dof: int, z: float = Z90) -> float:
    """Student's t quantile matching the normal's ``z`` for ``dof`` degrees of freedom (Cornish-Fisher expansion;
    within 1% of the exact value from 3 degrees of freedom, and wider, so conservative, below)."""
    if dof <= 0:
        return math.inf
    z3, z5, z7 = z ** 3, z ** 5, z ** 7
    return (z + (z3 + z) / (4 * dof) + (5 * z5 + 16 * z3 + 3 * z) / (96 * dof ** 2)
            + (3 * z7 + 19 * z5 + 17 * z3 - 15 * z) / (384 * dof ** 3))
