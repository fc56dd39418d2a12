"""The report's text and tables: lr_sweep_analysis.md, summary.json and summary.csv."""

from __future__ import annotations

import csv
import io
import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lmtune.files import atomic_write_text
from lmtune.report.headline import interval_line, per_doubling, ratio_range_text
from lmtune.report.stability import (
    AT_EDGE_BAND,
    CONSERVATIVE_ABOVE,
    NEAR_EDGE_BELOW,
    TrialRecord,
    first_growth,
)
from lmtune.sweep.runs import SIGNIFICANCE_SE
from lmtune.training.divergence import Spike, describe_spikes

log = logging.getLogger(__name__)

HEADINGS = (
    "## Trials",
    "## Best learning rate",
    "## Above the best LR: basin, degraded, diverged",
    "## Edge of stability",
    "## Loss against LR at equal token counts",
    "## Convergence speed",
    "## LR sensitivity",
    "## Target",
    "## How the diverged and spiked runs broke",
    "## Search strategy and compute",
    "## Definitions",
)


def _fmt(value: Any, digits: int = 4) -> str:
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


def _tokens(value: Any) -> str:
    if value is None:
        return "—"
    value = float(value)
    if value >= 1e6:
        return f"{value / 1e6:.2f}M"
    if value >= 1e3:
        return f"{value / 1e3:.1f}k"
    return f"{value:.0f}"


def _lr(value: Any, missing: str = "—") -> str:
    return missing if value is None else f"{value:.3g}"


def _rate(value: Any) -> str:
    return "—" if value is None else f"{value:,.0f}"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def _varied_params(summary: dict[str, Any]) -> list[str]:
    names: list[str] = []
    for row in summary["trials"]:
        for key in row["params"]:
            if key != "lr" and key not in names:
                names.append(key)
    return names


def write_markdown(summary: dict[str, Any], records: Sequence[TrialRecord], path: Path,
                   search_description: str, compute: dict[str, Any]) -> Path:
    """lr_sweep_analysis.md: the report's text, one section per heading in HEADINGS (and the range test's)."""
    sections = [
        _overview(summary), _horizon(summary), _trials(summary), _best_lr(summary), _landscape(summary), _edge(summary),
        _equal_tokens(summary),
        _convergence(summary), _sensitivity(summary), _target(summary), _how_runs_broke(summary, records),
        _search_and_compute(summary, search_description, compute), _range_test(summary), _definitions(summary),
    ]
    text = "\n".join(line for section in sections for line in section)
    atomic_write_text(Path(path), text)
    log.info("wrote %s", path)
    return Path(path)


def _overview(summary: dict[str, Any]) -> list[str]:
    rows = summary["trials"]
    counts = ", ".join(f"{n} {s}" for s, n in summary.get("status_counts", {}).items())
    figures = ["lr_sweep_comparison.png", "lr_vs_loss.png"]
    if summary.get("range_test"):
        figures.append("lr_range_test.png")
    if any(r["status"] in ("diverged", "spiked") for r in rows):
        figures.append("instability.png")
    if summary.get("sharpness"):
        figures.append("sharpness.png")
    if "predicted_lr" in summary:
        figures.insert(0, "horizon.png")
    data = f" Data: {summary['data']}." if summary.get("data") else ""
    return ["# Learning-rate sweep: analysis", "",
            f"{len(rows)} trials ({counts}).{data} Figures: {', '.join(f'`{f}`' for f in figures)}.", "",
            *_missing(summary)]


def _missing(summary: dict[str, Any]) -> list[str]:
    """The trials the ledger lists without a folder the report could read: the conclusions are drawn without them."""
    missing = summary.get("missing_trials") or []
    if not missing:
        return []
    named = ", ".join(f"`{m['trial_id']}` ({m['outcome']})" for m in missing)
    return [f"**Warning:** the sweep's ledger lists {len(missing)} trial{'s' * (len(missing) > 1)} whose folder is "
            f"missing or unreadable: {named}. The best LR and every conclusion below were chosen without "
            f"{'them' if len(missing) > 1 else 'it'}, and may differ from what the whole sweep shows.", ""]


def _horizon(summary: dict[str, Any]) -> list[str]:
    """A horizon search: each budget's best LR and edge, the fit, the prediction and the target runs."""
    if "predicted_lr" not in summary:
        return []
    target = summary["target_tokens"]
    lines = ["## The best LR at the target budget, predicted across token horizons", "",
             f"Target: {target:,} tokens. Each budget's LRs are compared at that budget's full token count (its "
             "cosine decays over it); the best LR is crowned on the mean over as many seeds as the LRs it beats; "
             "'may lie in' is between the nearest LRs clearly worse (2 standard errors); the edge is the bracket "
             "between the largest LR that trained through and the smallest that failed to recover.", ""]
    rows = []
    for b in summary["budgets"]:
        losses = b.get("best_lr_seed_losses") or []
        spread = f" ± {b['best_lr_spread']:.4f}" if len(losses) > 1 else ""
        low, high = b.get("best_lr_interval") or (None, None)
        edge = (f"{_lr(b.get('edge_lr_low'), '?')} – {_lr(b['divergence_lr'])}" if b.get("divergence_lr")
                else f"none failed (≤ {_lr(b.get('edge_lr_low'), '?')})")
        rows.append([f"{b['steps']:,}" + (" (target)" if b["tokens"] == target else ""), _tokens(b["tokens"]),
                     str(b["trials"]), _lr(b.get("best_lr")),
                     f"{_fmt(b.get('best_lr_mean_loss'))}{spread} ({len(losses)})" if losses else "—",
                     f"{_lr(low, '?')} – {_lr(high, '?')}", edge])
    lines += _table(["steps", "tokens", "trials", "best lr", "val loss ± sd (seeds)", "best lr may lie in",
                     "edge (trains through – fails)"], rows)
    fit = summary.get("horizon_fit")
    if fit is None:
        return [*lines, "", f"No fit: {summary.get('fit_problem') or 'fewer than two budgets have a best LR'}.", ""]
    (blo, bhi), (plo, phi) = fit["beta_interval"], summary["predicted_lr_interval"]
    lines += ["", f"**Fit**: ln LR* = a − β ln D through the {fit['budgets_fitted']} searched budgets' best LRs: "
              f"β = {fit['beta']:.3f} (90% interval {blo:.3f} to {bhi:.3f}), a = {fit['intercept']:.3f} "
              f"(90% interval {fit['intercept_interval'][0]:.3f} to {fit['intercept_interval'][1]:.3f}). The "
              "intervals are a bootstrap: each resample draws every LR's seeds with replacement and places the best "
              "LR anywhere within half a grid step of the grid point it won (the grid's resolution).", "",
              f"**Predicted best LR at the target**: {summary['predicted_lr']:.3g} (90% interval {plo:.3g} to "
              f"{phi:.3g}): an extrapolation {target / max(b['tokens'] for b in summary['budgets'][:-1]):.0f}x beyond "
              "the largest searched budget, which assumes the power law holds that far.", ""]
    return lines + _confirmed(summary)


def _confirmed(summary: dict[str, Any]) -> list[str]:
    confirmed = summary.get("confirmed") or {}
    if not confirmed.get("losses"):
        return ["**Confirmation**: no run at the target budget has finished yet.", ""]
    predicted = summary["predicted_lr"]
    rows = [[_lr(r["lr"]), f"{r['lr'] / predicted:.2g}x", ", ".join(f"{v:.4f}" for v in r["losses"]),
             _fmt(r["mean"])] for r in confirmed["losses"]]
    lines = ["**Confirmation** at the target budget:", "",
             *_table(["lr", "of the prediction", "val loss per seed", "mean"], rows), ""]
    if confirmed.get("predicted_excess") is None:
        return [*lines, "The predicted LR itself has no finished run at the target budget.", ""]
    se = confirmed.get("predicted_excess_se")
    significance = ("" if not se else f" ± {se:.4f} (standard error of the difference, from {confirmed['se_from']})"
                    + ("; within 2 standard errors: the target runs do not tell the prediction from their best"
                       if confirmed["predicted_excess"] <= 2 * se else "; more than 2 standard errors"))
    best = confirmed["best_lr"]
    lines.append(f"The lowest target loss is at {best:.3g} ({confirmed['best_over_predicted']:.2g}x the prediction); "
                 f"the predicted LR's loss is {confirmed['predicted_excess']:.4f} nats above it{significance}. Three "
                 "LRs a factor apart bound the best only to within that factor.")
    return [*lines, ""]


def _trials(summary: dict[str, Any]) -> list[str]:
    extra = _varied_params(summary)
    staged = any(r.get("stage") not in (None, "grid") for r in summary["trials"])
    seeded = any(r.get("seed") is not None for r in summary["trials"])
    header = [*(["stage"] if staged else []), "trial", "lr", *(["seed"] if seeded else []), *extra, "status",
              "final val", "best val", "tokens", "wall time", "tokens/s", "stop reason", "stop step"]
    table_rows = []
    for r in sorted(summary["trials"], key=_trial_order([s["name"] for s in summary.get("stages") or []])):
        wall = f"{r['wall_time_s']:.0f} s" if r["wall_time_s"] is not None else "—"
        table_rows.append([*([r.get("stage") or "—"] if staged else []), r["trial_id"], f"{r['lr']:.4g}",
                           *([_fmt(r.get("seed"))] if seeded else []), *[_fmt(r["params"].get(k)) for k in extra],
                           r["status"], _fmt(r["final_val_loss"]), _fmt(r["best_val_loss"]), _tokens(r["tokens"]),
                           wall, _rate(r["tokens_per_s"]), r["reason"] or "—", _fmt(r["stop_step"])])
    return ["## Trials", "", "\"final val\": the val loss at the end of the whole budget (empty for a trial that "
            "stopped earlier).", "", *_table(header, table_rows), ""]


def _trial_order(stages: list[str]):
    """Trials by stage (in the order the search ran them), then LR and seed."""
    def key(row: dict[str, Any]) -> tuple:
        stage = row.get("stage")
        return (stages.index(stage) if stage in stages else len(stages)), row["lr"], row.get("seed") or 0

    return key


def _best_lr(summary: dict[str, Any]) -> list[str]:
    lines = ["## Best learning rate", ""]
    if summary["best_lr"] is None:
        return lines + ["No trial that neither diverged nor errored was evaluated, so there is no best LR.", ""]
    if summary.get("candidate_tokens"):
        fewest, most = summary["candidate_tokens"]
        return lines + [
            f"No trial trained its whole budget, so no LR can be compared at equal tokens. The lowest val loss "
            f"at any token count is **{summary['best_val_loss']:.4f}**, by lr {summary['best_lr']:.3g} (trial "
            f"`{summary['best_trial']}`), but the candidates trained {_tokens(fewest)} to {_tokens(most)} tokens: "
            "**not at equal token counts**, and a loss after fewer tokens is higher for reasons other than the LR.", ""]
    losses = summary["best_lr_seed_losses"]
    each = ", ".join(f"{v:.4f}" for v in losses)
    spread = (f" ± {summary['best_lr_spread']:.4f} (standard deviation over {len(losses)} seeds: {each})"
              if len(losses) > 1 else " (one seed: its spread is not measured)")
    below, above = summary["best_lr_interval"]
    sigma = summary.get("seed_spread")
    noise = (f"a mean full-budget loss more than 2 standard errors above the best's (run-to-run standard "
             f"deviation {sigma:.4f}, {_pooled(summary)})" if sigma is not None else
             "any higher full-budget loss (no LR has several seeds, so the run-to-run noise is unknown and "
             "this interval is only as fine as the LRs tried)")
    lines += [f"Best LR **{summary['best_lr']:.3g}**: val loss **{summary['best_val_loss']:.4f}**{spread} at "
              f"{_tokens(summary['compared_at_tokens'])} tokens, the whole budget. Only LRs whose every trial "
              "trained the whole budget without diverging compete, on their mean over seeds; the checkpoint to use "
              f"is trial `{summary['best_trial']}`'s.", "",
              f"{_capital(interval_line(below, above))}. \"Clearly worse\": {noise}.", "",
              *_contenders(summary)]
    return lines


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def _contenders(summary: dict[str, Any]) -> list[str]:
    contenders = summary.get("best_lr_contenders") or []
    if not contenders:
        return []
    return [", ".join(f"lr {c['lr']:.3g} ({len(c['losses'])} seed{'s' * (len(c['losses']) > 1)})" for c in contenders)
            + " beat the best on the seeds they share but did not get as many seeds, so none is crowned over it: "
              "more seeds would settle it.", ""]


def _landscape(summary: dict[str, Any]) -> list[str]:
    lines = ["## Above the best LR: basin, degraded, diverged", ""]
    basin, degraded = summary.get("basin"), summary.get("degraded")
    if basin is None:
        return lines + ["No LR trained its whole budget without diverging, so the loss cannot be compared across "
                        "LRs at the full budget.", ""]
    sigma = basin.get("seed_spread")
    noise = (f"within {SIGNIFICANCE_SE:g} standard errors of the best's mean (run-to-run standard deviation "
             f"{sigma:.4f}, {_pooled(summary)})" if sigma is not None else
             "no worse than the best's (no LR has several seeds: the run-to-run noise is unknown, so the basin is "
             "only as wide as the LRs tried and it says nothing about how flat the optimum is)")
    lines += [f"- **Basin** (full-budget loss {noise}): lr {', '.join(_lr(v) for v in basin['lrs'])}. Its lower end "
              f"lies {_between(*basin['low'])}, its upper end {_between(*basin['high'])}."]
    if degraded:
        worst = degraded["points"][-1]
        at = ", ".join(f"**{excess:+.2f}** at {factor}×" for factor, excess in degraded["excess_at"].items())
        single = all(p["seeds"] == 1 for p in degraded["points"])
        lines += [f"- **Degraded** (trains through its budget without diverging, loss clearly worse): from the basin's "
                  f"upper end to the edge, lr {_lr(degraded['points'][0]['lr'])} … {_lr(worst['lr'])}"
                  + (" (one seed each: every point is uncertain by at least the run-to-run spread above)" if single
                     else "") + f". The full-budget loss over the best's: {at} the best LR (nats, interpolated "
                  f"in log LR between the LRs tried); on average {per_doubling(degraded)} (least squares; the "
                  f"curve is not a straight line), and {worst['excess']:+.3f} nats at {worst['ratio_to_best']:.3g}× "
                  "the best LR, the last LR before the edge."]
    else:
        lines += ["- **Degraded**: no LR between the basin and the edge trained its whole budget, so how fast the loss "
                  "degrades above the basin is not measured."]
    region = summary.get("diverged")
    lines += [f"- **Diverged**: from the edge up; it begins {_between(*region['low'])} (see below)." if region else
              "- **Diverged**: no LR tried diverged."]
    table = _landscape_table(summary)
    return lines + ["", *table, ""] if table else lines + [""]


def _pooled(summary: dict[str, Any]) -> str:
    lrs = (summary.get("basin") or {}).get("spread_lrs") or []
    return f"pooled over the seeds of lr {', '.join(_lr(v) for v in sorted(lrs))}" if lrs else "pooled over seeds"


def _between(low: float | None, high: float | None) -> str:
    if low is not None and high is not None:
        return f"between {low:.3g} and {high:.3g}"
    if low is not None:
        return f"above {low:.3g} (no LR tried beyond it)"
    if high is not None:
        return f"below {high:.3g} (no LR tried beyond it)"
    return "where no LR was tried"


def _landscape_table(summary: dict[str, Any]) -> list[str]:
    ranking = sorted(summary.get("ranking") or [], key=lambda r: r["lr"])
    if len(ranking) < 2 or summary.get("best_lr") is None:
        return []
    best, basin = summary["best_lr"], set((summary.get("basin") or {}).get("lrs") or [])
    best_mean = next(r["mean"] for r in ranking if r["lr"] == best)
    rows = []
    for r in ranking:
        n = len(r["losses"])
        sd = (sum((v - r["mean"]) ** 2 for v in r["losses"]) / (n - 1)) ** 0.5 if n > 1 else None
        region = "best" if r["lr"] == best else "basin" if r["lr"] in basin else \
            "degraded" if r["lr"] > best else "below the basin"
        rows.append([f"{r['lr']:.4g}", f"{r['lr'] / best:.3g}", str(n), f"{r['mean']:.4f}", _fmt(sd, 3),
                     f"{r['mean'] - best_mean:+.4f}", region])
    for lr in sorted({row["lr"] for row in summary["trials"] if row["status"] == "diverged"}):
        rows.append([f"{lr:.4g}", f"{lr / best:.3g}", "—", "—", "—", "—", "diverged"])
    rows.sort(key=lambda row: float(row[0]))
    return ["Full-budget val loss by LR (the mean over seeds; LRs with a diverged run are marked, not ranked):", "",
            *_table(["lr", "× best", "seeds", "mean val loss", "sd", "vs best", "region"], rows)]


def _edge(summary: dict[str, Any]) -> list[str]:
    lines = ["## Edge of stability", ""]
    if summary["divergence_lr"] is None:
        lines += [f"No run diverged (none went non-finite or stayed above its initial loss for the recovery "
                  f"window): training fails above the largest LR tried ({_lr(summary.get('edge_lr_low'))} trained "
                  "its whole budget). Extend the range upward to locate it.", ""]
    else:
        low = summary.get("edge_lr_low")
        stable = (f"**{low:.3g}**, the largest LR that trained its whole budget without diverging" if low is not None
                  else "an LR not yet located (no LR below it trained its whole budget)")
        ratio = (f": a bracket **{summary['bracket_ratio']:.2f}** wide (the search's resolution, not a property of "
                 "training)" if summary.get("bracket_ratio") else "")
        lines += [f"Training fails between {stable}, and **{summary['divergence_lr']:.3g}**, the smallest LR at "
                  f"which a run diverged{ratio}.", "", *_confirmation(summary), *_seed_dependence(summary)]
        if summary.get("stable_above_divergence"):
            lines += ["", "Not monotone: " + ", ".join(f"{v:.3g}" for v in summary["stable_above_divergence"])
                      + " trained through their budget above the smallest diverged LR (another seed or chance "
                        "decided)."]
        lines += ["", *_edge_ratio(summary)]
    lines += ["", *_spiked(summary), *_logit_growth(summary), *_edge_rule()]
    return lines


def _confirmation(summary: dict[str, Any]) -> list[str]:
    confirmation = summary.get("edge_confirmation") or {}
    ends = confirmation.get("diverged_end") or []
    if not ends:
        return []
    decided = confirmation.get("decided_at_tokens")
    text = (f"The edge was decided at {_tokens(decided)} tokens (where the diverged end's run was judged). "
            if decided else "")
    how = "; ".join(f"seed {e['seed']}: {e['how']} ({e['stage']}, {_tokens(e['tokens'])} tokens)" for e in ends)
    text += f"Diverged end, lr {summary['divergence_lr']:.3g}: {how}."
    if summary.get("edge_lr_low") is not None and confirmation.get("stable_end"):
        text += (f" Stable end, lr {summary['edge_lr_low']:.3g}: trained its whole budget "
                 f"({_tokens(confirmation['stable_end'][0]['tokens'])} tokens) without diverging.")
    if not confirmation.get("confirmed"):
        text += " **Not confirmed by training**: a run that only the stopper's rule judged has not been retrained."
    return [text]


def _seed_dependence(summary: dict[str, Any]) -> list[str]:
    mixed = summary.get("seed_dependent") or []
    if not mixed:
        return []
    return ["", "**The edge moves with the seed**: " + "; ".join(
        f"at lr {m['lr']:.3g} seed{'s' * (len(m['seeds_through']) > 1)} {', '.join(map(str, m['seeds_through']))} "
        f"trained through, seed{'s' * (len(m['seeds_diverged']) > 1)} {', '.join(map(str, m['seeds_diverged']))} "
        "did not" for m in mixed) + ". The bracket is where any seed fails; a single run near it can go either way."]


def _spiked(summary: dict[str, Any]) -> list[str]:
    spiked = summary.get("spiked") or []
    if not spiked:
        return []
    lines = ["Spiked, not diverged (the loss rose far above its running minimum and came back below its initial "
             "loss):", ""]
    for run in sorted(spiked, key=lambda r: (r["lr"], r.get("seed") or 0)):
        lines.append(f"- lr {run['lr']:.3g}" + (f" seed {run['seed']}" if run.get("seed") is not None else "")
                     + ": " + describe_spikes([Spike(**s) for s in run["spikes"]]))
    return lines + [""]


def _edge_ratio(summary: dict[str, Any]) -> list[str]:
    if summary.get("edge_ratio") is None:
        return ["No best LR, so no edge ratio."]
    smallest, largest = summary["edge_ratio_range"]
    text = (f"Edge / best LR: {summary['divergence_lr']:.3g} / {summary['best_lr']:.3g} = "
            f"**{summary['edge_ratio']:.3g}** as a point value; with the bracket and the best LR's interval, it is "
            f"**{ratio_range_text(smallest, largest)}**.")
    reading = summary.get("edge_range_reading")
    if reading:
        return [text + f" The whole range reads: **{reading}**."]
    return [text + " That range spans more than one reading of the rule of thumb below (or is open), so none is "
                   "given: more seeds, or LRs closer to the best, narrow it."]


def _logit_growth(summary: dict[str, Any]) -> list[str]:
    growth = summary.get("logit_growth") or {}
    grown = growth.get("lrs") or []
    if not grown:
        return []
    values = [g["attn_logit_max"] for g in grown]
    best = f" (the best trial's: {growth['best']:.3g})" if growth.get("best") else ""
    where = ", ".join(f"{g['lr']:.3g}" for g in grown)
    return [f"**Early warning, attention-logit growth**: at lr {where}, which "
            f"did not diverge, the largest attention logit reached {min(values):.2g} to {max(values):.2g}, above "
            f"{growth['threshold']:.0e}{best}. Wortsman et al. (2023) find this growth ahead of the "
            "instabilities that qk-layernorm removes (``--set qk_norm=true``): at a longer budget or a larger "
            "model these LRs may break.", ""]


def _edge_rule() -> list[str]:
    return [
        f"Reading of the ratio (a practitioners' rule of thumb, not a law): > {CONSERVATIVE_ABOVE:g} the best LR "
        f"is conservative; {NEAR_EDGE_BELOW:g}–{CONSERVATIVE_ABOVE:g} moderately below the edge; < "
        f"{NEAR_EDGE_BELOW:g} near the edge; within [{AT_EDGE_BAND[0]:g}, {AT_EDGE_BAND[1]:g}] at the edge. For "
        "Adam, Cohen et al. (2022) find the preconditioned sharpness hovering near (2 + 2β₁)/((1 − β₁)η) = 38/η "
        "for β₁ = 0.9; for full-batch GD, Cohen et al. (2021) find the sharpness at about 2/η.", ""]


def _equal_tokens(summary: dict[str, Any]) -> list[str]:
    table = summary.get("equal_token_trials") or {}
    rungs = [t for t in sorted(table, key=int) if table[t]]
    lines = ["## Loss against LR at equal token counts", ""]
    if not rungs:
        return lines + ["No trial was evaluated at a comparison point yet.", ""]
    lrs = sorted({float(lr) for t in rungs for lr in table[t]})
    diverged = {r["lr"] for r in summary["trials"] if r["status"] == "diverged"}
    rows = []
    for lr in lrs:
        cells = []
        for t in rungs:
            losses = table[t].get(f"{lr:.4g}")
            cells.append("—" if not losses else f"{sum(losses) / len(losses):.4f}"
                         + (f" ({len(losses)})" if len(losses) > 1 else ""))
        rows.append([f"{lr:.4g}" + (" (diverged in a trial)" if lr in diverged else ""), *cells])
    header = ["lr", *[f"{_tokens(int(t))} tokens" + (" (full)" if int(t) == summary.get("compared_at_tokens")
                                                      else "") for t in rungs]]
    return lines + [
        "Each trial's val loss at exactly each comparison point (ASHA's rungs and the whole budget; linear "
        "interpolation between its evaluations), the mean where several seeds reached it (their number in "
        "brackets). A trial ASHA stopped appears only at the points it reached; a diverged trial at none. "
        "`lr_vs_loss.png` draws one curve per column.", "", *_table(header, rows), ""]


def _convergence(summary: dict[str, Any]) -> list[str]:
    conv = summary.get("convergence") or {}
    if conv.get("level") is None:
        return ["## Convergence speed", "",
                "No trial trained its whole budget without diverging, so there is no common loss level to compare.",
                ""]
    lines = ["## Convergence speed", "",
             f"Tokens each trial that trained its whole budget ({_tokens(conv.get('budget_tokens'))} tokens) needed to "
             f"reach val loss {conv['level']:.4f} (the worst final loss among the basin's runs, so each of them "
             "reaches it; linear interpolation between evaluations). Trials stopped earlier are left out: they cannot "
             "be compared.", ""]
    lines += _table(["trial", "lr", "seed", "status", "tokens to reach"],
                    [[c["trial_id"], f"{c['lr']:.4g}", _fmt(c["seed"]), c["status"],
                      _tokens(c["tokens"]) if c["tokens"] is not None else "never"] for c in conv["rows"]])
    reached = [c for c in conv["rows"] if c["tokens"] is not None]
    if reached:
        fastest = min(reached, key=lambda c: c["tokens"])
        lines += ["", f"Fastest: lr {fastest['lr']:.4g} ({_tokens(fastest['tokens'])} tokens)."]
    return lines + [""]


def _sensitivity(summary: dict[str, Any]) -> list[str]:
    if summary["lr_sensitivity"] is None:
        return ["## LR sensitivity", "", "Not computable: no trial trained its whole budget.", ""]
    return ["## LR sensitivity", "",
            f"LR sensitivity (Wortsman et al. 2023) = **{summary['lr_sensitivity']:.4f}** nats over "
            f"{summary['lr_sensitivity_lrs']} LRs at {_tokens(summary['lr_sensitivity_tokens'])} tokens (the whole "
            f"budget; diverged LRs count as ℓ₀ = {_fmt(summary.get('initial_loss'))}, the loss at initialization; "
            "LRs whose trials all stopped earlier are left out). Lower means the loss degrades less away from "
            "the best LR.", ""]


def _target(summary: dict[str, Any]) -> list[str]:
    if summary.get("target") is None:
        return ["## Target", "", "No target loss was given.", ""]
    if summary["target_met"]:
        at = f" after {_tokens(summary['target_tokens'])} tokens" if summary.get("target_tokens") else ""
        return ["## Target", "", f"Target val loss {summary['target']:g}: **met** by trial `{summary['target_trial']}` "
                f"(val loss {summary['best_val_loss']:.4f}{at}).", ""]
    return ["## Target", "", f"Target val loss {summary['target']:g}: **not met** (best val loss "
            f"{_fmt(summary['best_val_loss'])}).", ""]


def _how_runs_broke(summary: dict[str, Any], records: Sequence[TrialRecord]) -> list[str]:
    by_id = {r.trial_id: r for r in records}
    best_record = by_id.get(summary.get("best_trial"))
    broken = [by_id[r["trial_id"]] for r in summary["trials"]
              if r["status"] in ("diverged", "spiked") and r["trial_id"] in by_id]
    if not broken:
        return ["## How the diverged and spiked runs broke", "", "No run diverged or spiked.", ""]
    return ["## How the diverged and spiked runs broke", "",
            "Which stability probe first exceeded 2× the best trial's value at the same step (attention-logit "
            "growth is what qk-layernorm fixes, output-logit divergence what z-loss fixes; Wortsman et al. 2023):",
            "", *[f"- {first_growth(r, best_record)}" for r in broken], ""]


def _search_and_compute(summary: dict[str, Any], search_description: str, compute: dict[str, Any]) -> list[str]:
    rows = summary["trials"]
    spent = compute.get("tokens_spent")
    if spent is None:
        spent = sum(r["tokens"] or 0 for r in rows)
    lines = ["## Search strategy and compute", "", search_description.strip() or "(no description given)", ""]
    stages = summary.get("stages") or []
    if len(stages) > 1 or (stages and stages[0]["name"] != "grid"):
        lines += _table(["stage", "LRs", "trials", "tokens", "why"],
                        [[s["name"], ", ".join(f"{lr:.3g}" for lr in s["lrs"]) or "—", str(s["trials"]),
                          _tokens(s["tokens"]), " → ".join(s["why"]) or "—"] for s in stages]) + [""]
    lines += [f"- tokens trained: {_tokens(spent)}"]
    full = compute.get("full_grid_tokens")
    if full and not stages or (stages and stages[0]["name"] == "grid" and full):
        lines += [f"- a full grid without early stopping: {_tokens(full)} tokens",
                  f"- saving: {100.0 * (1.0 - spent / full):.1f}%"]
    grid = summary.get("same_resolution_grid")
    if grid and stages and stages[0]["name"] != "grid":
        lines += [f"- a grid resolving the edge as finely (LRs {grid['low']:.3g} to {grid['high']:.3g}, "
                  f"{grid['ratio']:.2f}x apart: {grid['points']} LRs, each trained to the full budget once, no "
                  f"seeds) would train {_tokens(grid['tokens'])} tokens; saving: "
                  f"{100.0 * (1.0 - spent / grid['tokens']):.1f}%"]
    lines += [f"- {key.replace('_', ' ')}: {_fmt(value)}" for key, value in compute.items()
              if key not in ("tokens_spent", "full_grid_tokens")]
    return lines + [""]


def _range_test(summary: dict[str, Any]) -> list[str]:
    found = summary.get("range_test")
    if not found:
        return []
    return ["## LR range test", "",
            f"One run of {found['steps']} steps ({_tokens(found['tokens'])} tokens) with the LR rising exponentially "
            f"(Smith 2017): steepest descent at lr **{_lr(found['steepest_lr'])}**, lowest loss at "
            f"{_lr(found['min_loss_lr'])}, blow-up at **{_lr(found['blowup_lr'], 'none')}** "
            f"({found['stopped_because']}). Each LR is held for one step only, so this blow-up is not the edge of a "
            "full run; the search placed its coarse grid with it. Figure: `lr_range_test.png`.", ""]


def _definitions(summary: dict[str, Any]) -> list[str]:
    rule = summary.get("divergence_rule") or {}
    window, threshold = rule.get("recovery_window"), rule.get("spike_threshold")
    return ["## Definitions", "",
            f"- **ℓ₀**: the loss at initialisation, ln(vocab) = {_fmt(summary.get('initial_loss'))} (a fresh model "
            "predicts near-uniformly).",
            f"- **Diverged**: the run's loss went non-finite, or went above ℓ₀ and did not come back below it within "
            f"the recovery window ({_fmt(window)} of the budget's steps), or its budget ended with the loss above ℓ₀. "
            "The stopper ends a run early only on that evidence (a non-finite value, or the loss above ℓ₀ for the "
            "whole window); a run it ended at the bracket's edge is retrained without early stopping to confirm it.",
            f"- **Spiked**: not diverged, and the train loss (averaged over a log interval) rose more than "
            f"{100 * (threshold or 0):.0f}% above its running minimum (ℓ₀ included) at least once; each spike is "
            "given with its step, its height over the running minimum before it, and the steps until the loss was "
            "back within that margin.",
            "- **Equal token counts**: losses compared at one token count, each interpolated linearly between a "
            "trial's evaluations; the best LR is decided at the whole budget, on the mean over its seeds, and only "
            "an LR with as many seeds as any other can be crowned (one that beats it seed for seed with fewer seeds "
            "is a contender, given the seeds before the crown is settled).",
            f"- **Basin**: the LRs whose mean full-budget loss is within {SIGNIFICANCE_SE:g} standard errors of the "
            "best's. **Degraded**: above the basin, trained through without diverging, clearly worse. Each region's "
            "ends lie between two LRs tried: that interval is its uncertainty.",
            "- **LR sensitivity** (Wortsman et al. 2023): S = (1/|H|) Σ_{η∈H} [min(ℓ(η), ℓ₀) − ℓ*], where H is the "
            "set of LRs with a full-budget loss or a divergence, ℓ(η) the mean full-budget val loss at η (ℓ₀ if a "
            "trial diverged), ℓ* = min_η ℓ(η).",
            "- **Edge ratio**: smallest diverging LR / best LR; its range: largest LR trained through / the best LR's "
            "upper bound, to smallest diverging LR / its lower bound.",
            ""]


CSV_COLUMNS = ["trial_id", "lr", "status", "final_val_loss", "best_val_loss", "tokens", "wall_time_s",
               "tokens_per_s", "max_spike_height", "stop_step", "reason"]


def write_tables(summary: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    """summary.json (the whole summary) and summary.csv (one row per trial, params flattened)."""
    out_dir = Path(out_dir)
    json_path, csv_path = out_dir / "summary.json", out_dir / "summary.csv"
    atomic_write_text(json_path, json.dumps(summary, indent=2, allow_nan=False) + "\n")
    extra = _varied_params(summary)
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(CSV_COLUMNS[:2] + extra + CSV_COLUMNS[2:])
    for row in summary["trials"]:
        values = [row[c] for c in CSV_COLUMNS]
        values = values[:2] + [row["params"].get(k) for k in extra] + values[2:]
        writer.writerow(["" if v is None else v for v in values])
    atomic_write_text(csv_path, buffer.getvalue())
    return json_path, csv_path
