"""The horizon search's power law in words, for its report (lmtune.searches.horizon.report): how it was fitted (one
loss surface through every budget's runs, lmtune.analysis.surface, or the line through the located LR*s it falls
back to, lmtune.analysis.fit), how its intervals were made, and what they say."""

from __future__ import annotations

from lmtune.analysis.fit import SURFACE, HorizonFit
from lmtune.analysis.surface import WIDENING as SURFACE_WIDENING
from lmtune.analysis.surface import WINDOW as SURFACE_WINDOW

# Said wherever beta's 90% interval includes 0 (lmtune.analysis.fit.HorizonFit.resolved).
NOT_RESOLVED = ("β not resolved by these budgets: its 90% interval includes 0, so LR* may not move between them; "
                "the prediction's interval includes the largest budget's LR*")


def fit_sentences(fit: HorizonFit) -> list[str]:
    """The fit, how its intervals were made, and what they say (resolved, the law's fit), for the markdown."""
    out = surface_sentences(fit) if fit.method == SURFACE else line_sentences(fit)
    if fit.law_holds is False:
        out.append(f"**The power law does not fit these budgets** (lack-of-fit p = {fit.lack_of_fit_p:.3g}): the "
                   "prediction extrapolates a law the data reject.")
    elif fit.lack_of_fit_p is not None:
        out.append(f"(Lack-of-fit p = {fit.lack_of_fit_p:.2f}.)")
    if not fit.resolved:
        out.append(f"**{NOT_RESOLVED}.**")
    return out


def surface_sentences(fit: HorizonFit) -> list[str]:
    """How the surface (lmtune.analysis.surface) was fitted and its intervals made."""
    (blo, bhi), (alo, ahi) = fit.beta_interval, fit.intercept_interval
    birge = f" and by the Birge ratio {fit.scale:.2f} (the runs scatter about it more than their seeds allow)" \
        if fit.scale > 1.0005 else ""
    out = [f"**Fit**: one loss surface through every searched budget's runs within {SURFACE_WINDOW:g}x of its "
           "crowned LR, loss = floor_D + curvature_D · u² · exp(skew · u) with u = ln LR − (a − β ln D): β and the "
           "skew shared by the budgets, a floor and a curvature each, every run weighted by its budget's seed "
           f"spread. β = {fit.beta:.3f} (90% interval {blo:.3f} to {bhi:.3f}), a = {fit.intercept:.3f} "
           f"(interval {alo:.3f} to {ahi:.3f}, its coverage not measured): from the fit's covariance, widened "
           f"{SURFACE_WIDENING:g}x (what held 90% of simulated searches){birge}. The budgets' located LR*s above "
           "are shown beside it; the fit does not go through them."]
    if fit.dof == 0:
        out.append("With two budgets any two optima lie on a line: whether the power law fits them cannot be seen.")
    else:
        out.append(f"Whether one power law holds: the same surface with a free optimum per budget fits better by "
                   f"χ² = {fit.chi2:.2f} on {fit.dof} degree{'s' * (fit.dof > 1)} of freedom.")
    return out


def line_sentences(fit: HorizonFit) -> list[str]:
    """How the line through the budgets' located LR*s (lmtune.analysis.fit) was fitted and its intervals made."""
    (blo, bhi), (alo, ahi) = fit.beta_interval, fit.intercept_interval
    usable = [p for p in fit.points if p.usable]
    flat = sum(not p.located for p in usable)
    carried = f" ({flat} not located: carried as the span it may lie in)" if flat else ""
    out = [f"**Fit**: ln LR* = a − β ln D through the {len(usable)} searched budgets' LR*s{carried}, each weighted by "
           f"its SE from the seeds: β = {fit.beta:.3f} (90% interval {blo:.3f} to {bhi:.3f}), a = {fit.intercept:.3f} "
           f"(interval {alo:.3f} to {ahi:.3f}, its coverage not measured)."]
    left_out = [p for p in fit.points if not p.usable]
    if left_out:
        out.append("Not fitted (no finite SE): " + "; ".join(f"{p.tokens:,} tokens ({p.why})" for p in left_out) + ".")
    if fit.dof == 0:
        out.append("With two budgets the line has no residual: whether the power law fits them cannot be seen.")
    elif fit.scale > 1:
        out.append(f"The budgets scatter about the line more than their errors allow (χ² = {fit.chi2:.2f} on "
                   f"{fit.dof} degree{'s' * (fit.dof > 1)} of freedom), so every interval is widened by "
                   f"sqrt(χ²/dof) = {fit.scale:.2f} (the Birge ratio).")
    else:
        out.append(f"χ² = {fit.chi2:.2f} on {fit.dof} degree{'s' * (fit.dof > 1)} of freedom: the budgets lie about "
                   "the line within their errors, so the intervals are not widened (were they to scatter more, "
                   "by sqrt(χ²/dof), the Birge ratio).")
    if fit.dof == 1:
        out.append("With one degree of freedom a lack of fit is seen, but barely.")
    return out


def fit_headline(fit: HorizonFit) -> list[str]:
    low, high = fit.beta_interval
    scatter = f", widened {fit.scale:.2f}x for scatter" if fit.scale > 1 else ""
    how = ("one loss surface through every budget's runs" if fit.method == SURFACE
           else f"weighted by each budget's LR* SE from the seeds, chi2 {fit.chi2:.2f} on {fit.dof} dof")
    lines = [f"fit: LR* ∝ tokens^-beta, beta {fit.beta:.2f} (90% interval {low:.2f} to {high:.2f}; {how}{scatter})"]
    if not fit.resolved:
        lines.append(f"  {NOT_RESOLVED}")
    if fit.law_holds is False:
        lines.append(f"  the power law does not fit these budgets (lack-of-fit p = {fit.lack_of_fit_p:.3g})")
    return lines
