"""A width search's part of the report: its summary (the target width's runs, or the widest width's while none has
trained at the target, with every width's conclusion, the fit, the confirmation and the cost: WidthResult), its
section of lr_sweep_analysis.md, width.png, and its lines before the CLIs' common ones."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import ScalarFormatter  # noqa: E402

from lmtune.analysis.fit import SURFACE  # noqa: E402
from lmtune.analysis.runs import Budget  # noqa: E402
from lmtune.analysis.surface import WINDOW as SURFACE_WINDOW  # noqa: E402
from lmtune.findings.comparison import Pair, record_runs  # noqa: E402
from lmtune.findings.part import ReportFigure, SweepInputs  # noqa: E402
from lmtune.findings.summary import SweepSummary, summarize_runs  # noqa: E402
from lmtune.findings.text import lr, table, tokens  # noqa: E402
from lmtune.searches.axis.held_out import held_out_sentence, held_out_span, interval_words  # noqa: E402
from lmtune.searches.axis.report_points import (  # noqa: E402
    LrAgainstAxis,
    best_loss_text,
    confirmation_markdown,
    draw_lr_against_axis,
    located_text,
)
from lmtune.searches.textbook import largest_below, rule_sentence, width_rule  # noqa: E402
from lmtune.searches.width.conclusion import WIDTH_WIDENING, WidthFit  # noqa: E402
from lmtune.searches.width.report_conclusion import WidthResult, WidthRow, width_settings, width_summary  # noqa: E402
from lmtune.searches.width.report_coord import (  # noqa: E402
    SweepCoordCheck,
    plot_coord_check,  # noqa: E402
    sweep_coord_check,
)
from lmtune.training.coord_check import CoordCheck  # noqa: E402
from lmtune.training.figures import (
    readable_lr_axis,  # noqa: E402
    save_figure,  # noqa: E402
)

# What the width search's 90% intervals held on simulated searches it was not tuned on, the lowest and highest over
# those scenarios (benchmarks/width_coverage.py --held-out, 1,000 searches each; benchmarks/README.md): printed
# beside the intervals until they reach their level there. tests/test_width_report.py holds these to
# benchmarks/results.jsonl.
WIDTH_HELD_OUT_COVERAGE = {"located": (0.929, 0.991), "predicted": (0.537, 0.977)}
WIDTH_HELD_OUT_DEPARTURES = ("a bent power law in width, the curve sharper when narrower, noise growing above the "
                             "best LR, seed effects shared across LRs, skew changing with width")


# Said wherever gamma's 90% interval includes 0 (lmtune.searches.width.conclusion.WidthFit.resolved).
NOT_RESOLVED = "γ not resolved by these widths: LR* may not move between them"
# ... and what that means under μP, whose point is an LR that does not move with width.
MU_TRANSFER = "consistent with μ-transfer"
MU_FAILED = "μ-transfer failed on this data"
# The file a coord check (python -m lmtune.training.coord_check) leaves in the sweep's folder.
COORD_FIGURE = "coord_check.png"


class WidthSection:
    """``search: width``."""

    def summarize(self, sweep: SweepInputs) -> SweepSummary[WidthResult]:
        """The usual summary of the target width's runs (the widest width with runs, while none has trained at the
        target yet), every trial's row, and the width search's own results (lmtune.searches.width.report_conclusion)."""
        # (a width search's sweep.json holds its plan: its base, strategy and baseline are set)
        target = Budget.of_run(sweep.base, None, sweep.unigram_loss)
        pairs = record_runs(sweep.trials, target)  # every trial as a run, once: each width's are among them
        settings = width_settings(sweep.strategy)
        result = width_summary([run for run, _ in pairs], settings, sweep.base, sweep.sweep_dir)
        widths = [*sorted(settings.widths), sweep.base.model.d_model]
        result = replace(result, coord=sweep_coord_check(sweep.sweep_dir, sweep.base, widths))
        width = _compared_width(result)
        at = next((row.point for row in result.widths if row.point.value == width and row.point.trials), None)
        chosen = _pairs_at(pairs, at.value) if at else pairs
        records = [record for _, record in chosen] if at else list(sweep.trials)
        return summarize_runs(records, chosen, target.at_steps(target.steps), target=sweep.target,
                               vocab_size=sweep.vocab_size, search="width",
                               conclusion=at.conclusion if at else None, every_record=sweep.trials,
                               search_result=result)

    def markdown(self, summary: SweepSummary[WidthResult]) -> list[str]:
        """Each width's model, crowned LR and located LR*, the fit, the prediction, the confirmation, the cost."""
        result = summary.search_result
        lines = ["## The best LR at the target width, predicted across widths", "", _method(result, summary), "",
                 *width_table(result), ""]
        fit = result.fit
        if fit is None:
            lines += [f"**No fit**: {result.fit_problem or 'fewer than two widths have a best LR'}.", ""]
        else:
            low, high = fit.predicted_lr_interval
            widest = max(fit.widths)
            lines += [" ".join(fit_sentences(fit, result.parametrization)), "",
                      f"**Predicted best LR at the target width**: {fit.predicted_lr:.3g} "
                      f"({interval_words(WIDTH_HELD_OUT_COVERAGE, 'predicted')} {low:.3g} – "
                      f"{high:.3g}) at d_model {result.target_width}, {result.target_width / widest:.2g}x the widest "
                      f"proxy fitted (d_model {widest}).", "",
                      held_out_sentence(WIDTH_HELD_OUT_COVERAGE, WIDTH_HELD_OUT_DEPARTURES, "width"), ""]
            if rule := textbook_sentence(result):
                lines += [f"**Textbook rule**: {rule}.", ""]
        lines += confirmation_markdown(result.confirmed, result.predicted_lr, _confirmation_cost(result),
                                       f"the target width, d_model {result.target_width}")
        lines += [cost_sentence(result), ""]
        extra = coord_check_lines(result.coord)
        return lines + ([*extra, ""] if extra else [])

    def figures(self) -> tuple[ReportFigure, ...]:
        return (ReportFigure("width.png", lambda _: True, lambda f, path: plot_width(path, f.summary)),
                ReportFigure(COORD_FIGURE, lambda f: _coord(f.summary) is not None,
                             lambda f, path: plot_coord_check([_coord(f.summary)], path)))

    def headline(self, summary: SweepSummary[WidthResult]) -> list[str]:
        """The prediction at the target width with gamma, the confirmation's verdict and the cost; then which
        width the common lines are at."""
        result = summary.search_result
        fit = result.fit
        if fit is None:
            lines = [f"width search ({parametrization_text(result)}): no fit: {result.fit_problem}"]
        else:
            low, high = fit.predicted_lr_interval
            lines = [f"width search ({parametrization_text(result)}): predicted best lr at d_model "
                     f"{result.target_width} (the target): {fit.predicted_lr:.3g} "
                     f"({interval_words(WIDTH_HELD_OUT_COVERAGE, 'predicted')} {low:.3g} to "
                     f"{high:.3g}; such intervals held {held_out_span(WIDTH_HELD_OUT_COVERAGE, 'predicted')} of "
                     f"simulated searches the method was not tuned on); {gamma_text(fit, result.parametrization)}"]
            if rule := textbook_sentence(result):
                lines.append(f"  textbook rule: {rule}")
        lines.append(f"  confirmation: {result.confirmed.verdict}")
        lines.append(f"  cost: {_flops(result.search_flops)} training FLOPs, "
                     f"{_equal(result)} full runs at the target width")
        width = _compared_width(result)
        which = "the target" if width == result.target_width else "the widest width with runs"
        return [*lines, f"at d_model {width} ({which}), {summary.compared_at_tokens or 0:,} tokens:"]


def textbook_sentence(result: WidthResult) -> str | None:
    """The prediction against the textbook rule (the widest proxy's best LR ÷ the width ratio under SP, unchanged
    under μP), in one sentence (None: no fit, or no proxy has a best LR)."""
    proxies = [(row.point.value, row.point.conclusion.best_lr) for row in result.widths]
    widest = largest_below(proxies, result.target_width)
    if result.fit is None or widest is None:
        return None
    rule = width_rule(widest[1], int(widest[0]), result.target_width, result.parametrization)
    return rule_sentence(rule, result.fit.predicted_lr_interval, "the widest proxy")


def _pairs_at(pairs: list[Pair], width: int) -> list[Pair]:
    return [(run, record) for run, record in pairs if dict(run.others).get("d_model") == width]


def _compared_width(result: WidthResult) -> int:
    """The width the common summary is of: the widest with runs (the target, once the confirmation has run)."""
    with_trials = [row.point.value for row in result.widths if row.point.trials]
    return max(with_trials, default=result.target_width)


def coord_check_lines(coord: SweepCoordCheck | None) -> list[str]:
    """The coord check's verdict and each layer's slopes (ln scale against ln width after the check's steps), or
    why there is none."""
    if coord is None:
        return []
    if coord.check is None:
        return [f"**Coord check**: {coord.note}."]
    c, v = coord.check, coord.verdict
    name = "μP" if c.parametrization == "mup" else "SP"
    lines = [f"**Coord check** ({COORD_FIGURE}; {coord.note}): {name} at d_model "
             f"{', '.join(map(str, c.widths))}, {c.steps} steps at a constant lr {c.lr:g}, {c.seeds} seeds. Each "
             "layer's slope of ln(scale) against ln(width): about 0 flat (μP's promise), about +1 growing like "
             f"width (SP with Adam). {v.reason}.", ""]
    rows = [[layer.name, f"{layer.activation_slope:+.2f}", f"{layer.update_slope:+.2f}"] for layer in c.layers]
    return lines + table(["layer", "activation slope", "update slope"], rows)


def _coord(summary: SweepSummary[WidthResult]) -> CoordCheck | None:
    coord = summary.search_result.coord
    return coord.check if coord else None


def parametrization_text(result: WidthResult) -> str:
    if result.parametrization == "mup":
        return f"μP, base width {result.mup_base_width}"
    return "SP"


def _method(result: WidthResult, summary: SweepSummary[WidthResult]) -> str:
    model = ("μP (the maximal-update parametrization) with base width "
             f"{result.mup_base_width}: equal to SP at d_model {result.mup_base_width}, and an LR tuned at one width "
             "should hold at every other (γ = 0)" if result.parametrization == "mup"
             else "SP (the standard parametrization): the best Adam LR is expected to fall as the model widens")
    return (f"**Model**: {model}. Target: d_model {result.target_width}. Every width trains the same "
            f"{tokens(summary.compared_at_tokens)} tokens and its LRs are compared at that full token count; the "
            "crowned LR is the lowest mean over as many seeds as the LRs it beats; LR* is located between grid "
            "points by a quadratic in ln LR around it, its 90% interval Fieller's (every LR at which the fitted "
            "curve's slope is within t standard errors of flat) widened 3x in ln LR, its SE (of ln LR*, so "
            "relative, as the fit weighs it) Fieller's half-width x 1.5 / 1.645: the widenings that brought each "
            "to 90% on simulated searches. Parameters are non-embedding; FLOPs per token are training's (6 x the "
            "non-embedding and output parameters, plus attention).")


def width_table(result: WidthResult) -> list[str]:
    return table(["d_model", "parameters", "training FLOPs / token", "trials", "crowned lr",
                  "val loss ± sd (seeds)", "LR* (located), 90% interval"],
                 [_row(row, result.target_width) for row in result.widths])


def _row(row: WidthRow, target: int) -> list[str]:
    p, at = row.point, row.point.located
    if p.value == target:
        star = "predicted and confirmed (below)"
    elif at is None:
        star = row.not_located
    else:
        star = located_text(at)
    return [f"{p.value}" + (" (target)" if p.value == target else ""), f"{row.params:,}",
            _flops(row.flops_per_token), str(p.trials), lr(p.conclusion.best_lr), best_loss_text(p.conclusion), star]


def gamma_text(fit: WidthFit, parametrization: str) -> str:
    """gamma with its interval, and what it says (resolved or not; under μP, whether the LR transfers)."""
    low, high = fit.law.exponent_interval
    text = f"γ {fit.gamma:.2f} (90% interval {low:.2f} to {high:.2f})"
    if not fit.resolved:
        return f"{text}: {NOT_RESOLVED}" + (f", {MU_TRANSFER}" if parametrization == "mup" else "")
    if parametrization == "mup":
        return f"{text}: {MU_FAILED} (LR* moves with width)"
    return f"{text}: LR* x{2 ** -fit.gamma:.2f} per doubling of the width"


def fit_sentences(fit: WidthFit, parametrization: str) -> list[str]:
    """The fit, what gamma says under this parametrization, and whether the law fits the widths."""
    law, (low, high) = fit.law, fit.law.exponent_interval
    if fit.method == SURFACE:
        birge = f" and by the Birge ratio {law.scale:.2f}" if law.scale > 1.0005 else ""
        out = [f"**Fit**: one loss surface through every proxy's runs within {SURFACE_WINDOW:g}x of its crowned LR, "
               "loss = floor_w + curvature_w · u² · exp(skew · u) with u = ln LR − (a − γ ln d_model): γ and the skew "
               "shared by the widths, a floor and a curvature each, every run weighted by its width's seed spread. "
               f"γ = {fit.gamma:.3f} (90% interval {low:.3f} to {high:.3f}): from the fit's covariance, widened "
               f"{WIDTH_WIDENING:g}x (what held 90% of simulated searches){birge}. The located LR*s above are shown "
               "beside it; the fit does not go through them."]
    else:
        flat = [w for w, p in zip(fit.widths, fit.points, strict=True) if not p.located]
        carried = (f" (d_model {', '.join(map(str, flat))} not located: carried as the span it may lie in)"
                   if flat else "")
        out = [f"**Fit**: ln LR* = a − γ ln d_model through the LR*s at d_model {', '.join(map(str, fit.widths))}"
               f"{carried}, each weighted by its SE from the seeds: γ = {fit.gamma:.3f} (90% interval {low:.3f} to "
               f"{high:.3f})."]
    if not fit.resolved:
        takes_in = "; the prediction's interval takes in the widest proxy's LR*" if fit.method != SURFACE else ""
        mup = f": under μP that is the hoped-for result, **{MU_TRANSFER}**." if parametrization == "mup" else "."
        out.append(f"**{NOT_RESOLVED}** (γ's 90% interval includes 0{takes_in})" + mup)
    elif parametrization == "mup":
        out.append(f"**{MU_FAILED}**: under μP LR* should not move with width, but these widths move it by "
                   f"x{2 ** -fit.gamma:.2f} per doubling (γ's 90% interval excludes 0).")
    else:
        out.append(f"LR* moves by x{2 ** -fit.gamma:.2f} per doubling of the width (γ's 90% interval excludes 0).")
    if law.dof == 0:
        out.append("With two widths any two optima lie on a line: whether the power law fits them cannot be seen.")
    elif law.law_holds is False:
        out.append(f"**The power law does not fit these widths** (lack-of-fit p = {law.lack_of_fit_p:.3g}, χ² = "
                   f"{law.chi2:.2f} on {law.dof} dof; intervals widened {law.scale:.2f}x): the prediction "
                   "extrapolates a law the data reject.")
    else:
        widened = f"; intervals widened {law.scale:.2f}x for scatter" if law.scale > 1 else ""
        out.append(f"The power law holds across these widths (lack-of-fit p = {law.lack_of_fit_p:.2f}, χ² = "
                   f"{law.chi2:.2f} on {law.dof} dof{widened}).")
    return out


def _flops(value: float) -> str:
    """1.94T, 940k: FLOP counts."""
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.3g}"


def _equal(result: WidthResult) -> str:
    equal = result.target_runs_equal
    return "—" if equal is None else f"{equal:.2g}"


def _confirmation_cost(result: WidthResult) -> str:
    share = result.confirmation_flops / result.search_flops if result.search_flops else 0.0
    return f"{_flops(result.confirmation_flops)} training FLOPs, {share:.0%} of the search's"


def cost_sentence(result: WidthResult) -> str:
    """The search's training FLOPs, the confirmation's share, and the search in full runs at the target width."""
    trials = sum(row.point.trials for row in result.widths)
    return (f"**Cost**: {_flops(result.search_flops)} training FLOPs over {trials} runs (each run's tokens trained x "
            f"its own model's FLOPs per token), of which the confirmation at the target "
            f"{_flops(result.confirmation_flops)}: equal to {_equal(result)} full runs at the target width "
            f"({_flops(result.target_run_flops)} FLOPs each).")


def plot_width(path: Path, summary: SweepSummary[WidthResult]) -> Path:
    """Left, val loss against LR at the budget's full token count per width (mean over seeds, sd bars), each
    proxy's located LR* marked; right, each proxy's LR* against width with its 90% interval and its crowned grid
    LR, the fitted power law, the prediction at the target with its interval, and the target runs' best."""
    result = summary.search_result
    rows = result.widths
    fig, (left, right) = plt.subplots(1, 2, figsize=(12.5, 5), gridspec_kw={"wspace": 0.3})
    colors = plt.get_cmap("viridis")
    for i, row in enumerate(rows):
        p = row.point
        is_target = p.value == result.target_width
        color = "black" if is_target else colors(0.85 * i / max(len(rows) - 2, 1))
        ranking = sorted(p.conclusion.ranking, key=lambda r: r.lr)
        if not ranking:
            continue
        left.errorbar([r.lr for r in ranking], [r.mean for r in ranking], capsize=3, fmt="o-", markersize=4,
                      yerr=[r.spread if len(r.losses) > 1 else 0.0 for r in ranking], color=color,
                      label=f"d_model {p.value}" + (" (target: the confirmation)" if is_target else ""))
        if p.located is not None and p.located.located:
            left.axvline(p.located.lr, color=color, linestyle="--", alpha=0.6)
    left.plot([], [], "--", color="gray", label="located LR*")
    if result.fit is not None:
        left.axvline(result.fit.predicted_lr, color="tab:orange", linestyle=":", label="predicted at the target")
    readable_lr_axis(left)
    left.set_xlabel("peak learning rate")
    left.set_ylabel("val loss at the budget's end (nats/token)")
    left.set_title(f"loss against LR at {tokens(summary.compared_at_tokens)} tokens, each width\n(mean over seeds, "
                   "bars: sd)", fontsize=10)
    left.grid(alpha=0.3, which="both")
    left.legend(fontsize=7)
    _plot_fit(right, result)
    return save_figure(fig, path)


def _plot_fit(ax, result: WidthResult) -> None:
    searched = [row.point for row in result.widths if row.point.value != result.target_width
                and row.point.conclusion.best_lr]
    fit, target = result.fit, result.target_width
    curve = None
    if fit is not None:
        xs = np.geomspace(min(fit.widths), target, 50)
        curve = (xs, np.exp(fit.law.intercept) * xs ** -fit.gamma,
                 f"fit: LR* ∝ width^-{fit.gamma:.2f}" + ("" if fit.resolved else " (γ not resolved)"))
    draw_lr_against_axis(ax, LrAgainstAxis(
        [(p.value, p.conclusion.best_lr, p.located) for p in searched], "proxy", target, curve,
        (fit.predicted_lr, fit.predicted_lr_interval, interval_words(WIDTH_HELD_OUT_COVERAGE, "predicted"))
        if fit is not None else None, result.confirmed.best_lr,
        {"mfc": "none", "color": "black", "markersize": 16}, [row.point.value for row in result.widths],
        ScalarFormatter(), "d_model (width)", "the best LR against the model's width"))


SECTION = WidthSection()
