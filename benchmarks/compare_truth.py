"""A compare search checked against truths (issue 45 item 5): for each variant a dense grid of LRs, several seeds
each, every run trained to the full budget with nothing stopping it early (benchmarks/lr_truth.py train with the
variant's --set), and the compare sweep's report read beside them. For each variant against the reference it gives
the truths' answer and the search's, by the same rules: the difference of the best means judged at 2 SE of a
difference (lmtune.searches.compare.comparison.difference), whether the variant's basin and the reference's share no
LR span (the optimum moved), and whether the search's best LR lies in the truth's basin. Beside them the naive
answer a user would otherwise take: the variant trained at the reference's best LR (the truths' own runs there),
its difference to the reference's best judged by the same rule, and whether that verdict is the truth's.

    python benchmarks/lr_truth.py train --space quick_ablations --lrs ... --seeds 0,1,2 --out results/truth-ref
    python benchmarks/lr_truth.py train --space quick_ablations --lrs ... --seeds 0,1,2 --set norm=none \\
        --out results/truth-no_norm
    python benchmarks/compare_truth.py results/ablations reference=results/truth-ref no_norm=results/truth-no_norm
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.truth import TruthRun, basin_lrs, read_truth, truth_conclusion  # noqa: E402
from lmtune.analysis.conclusion import Conclusion, conclude  # noqa: E402
from lmtune.analysis.runs import SAME_LR, Budget, Run, same_lr  # noqa: E402
from lmtune.errors import LmtuneError, cli_entry  # noqa: E402
from lmtune.searches.compare.comparison import difference  # noqa: E402
from lmtune.training.divergence import WHOLE_RUN  # noqa: E402


def _as_runs(runs: list[TruthRun]) -> list[Run]:
    """The truth's runs as the compare search's ``difference`` reads runs: every one trained its whole budget (or
    diverged on it). (The compare verdict is lmtune's own rule applied to the truth; benchmarks/truth.py's best LR
    and basin are judged apart, by benchmarks.truth_rules.)"""
    full = runs[0].steps * runs[0].tokens_per_step
    return [Run(r.lr, r.seed, "grid", full, full, "diverged" if r.failed else "completed", full, r.val,
                divergence=WHOLE_RUN, baseline=r.baseline) for r in runs]


def truth_of(folder: Path) -> tuple[Conclusion, dict]:
    """A truth's conclusion (lmtune's analysis of runs nothing stopped) and its summary.json-like keys."""
    runs = read_truth(folder)
    if not runs:
        raise LmtuneError(f"{folder}: no truth runs there; train them with benchmarks/lr_truth.py train")
    first = runs[0]
    full = first.steps * first.tokens_per_step
    return conclude(_as_runs(runs), Budget(first.steps, 0, first.tokens_per_step, 0, (full,))), truth_conclusion(runs)


def in_basin(lr: float | None, basin: dict | None) -> bool | None:
    low, high = basin_lrs(basin)
    if lr is None or low is None:
        return None
    return low / SAME_LR <= lr <= high * SAME_LR


def truth_moved(basin: dict | None, reference: dict | None) -> bool:
    """The compare report's rule on the truths: the two basins share no tried LR span."""
    (low, high), (ref_low, ref_high) = basin_lrs(basin), basin_lrs(reference)
    return high * SAME_LR < ref_low or ref_high * SAME_LR < low


def at_reference_lr(variant: Conclusion, reference: Conclusion) -> str:
    """The naive comparison: the variant's truth runs at the reference's best LR against the reference's best, by
    the rule its own best is judged by ("—": the variant's truth did not train that LR)."""
    there = next((r for r in variant.ranking if same_lr(r.lr, reference.best_lr)), None)
    if there is None:
        return "—"
    told = difference(dataclasses.replace(variant, best=there), reference)
    return f"{told.value:+.4f} ± {told.threshold:.4f}: {told.verdict}"


def _searched_at_reference(row: dict, reference_row: dict) -> str:
    """The naive comparison as the search's own runs give it: the variant's mean loss at the reference's best LR
    (the report's "at the reference's best LR") above the reference's best mean ("—": it has no runs there)."""
    there = row.get("at_reference") or {}
    if there.get("mean") is None or reference_row.get("best_lr_mean_loss") is None:
        return "—"
    return f"{there['mean'] - reference_row['best_lr_mean_loss']:+.4f} ({len(there['losses'])} seeds)"


def rows(sweep: Path, truths: dict[str, Path]) -> list[list[str]]:
    summary = json.loads((sweep / "report" / "summary.json").read_text())
    searched = {row["name"]: row for row in summary.get("compare") or []}
    if not searched:
        raise LmtuneError(f"{sweep}: its report/summary.json has no compare rows; run python -m lmtune.analyze on "
                          "a compare sweep first")
    names = list(truths)
    concluded = {name: truth_of(path) for name, path in truths.items()}
    reference, reference_json = concluded[names[0]]
    out = []
    for name in names[1:]:
        truth, truth_json = concluded[name]
        told = difference(truth, reference)
        if told is None or told.se is None:
            raise LmtuneError(f"{truths[name]}: the truth has no best LR with a seed spread to judge by; train 3 seeds")
        moved = truth_moved(truth_json.get("basin"), reference_json.get("basin"))
        row = searched.get(name) or {}
        verdict = (row.get("difference") or {}).get("verdict")
        out.append([name, f"{truth.best_lr:.3g} vs {reference.best_lr:.3g}",
                    f"{told.value:+.4f} ± {told.threshold:.4f}: {told.verdict}", f"{'yes' if moved else 'no'}",
                    f"{row.get('best_lr', 0):.3g}", f"{(row.get('difference') or {}).get('value', float('nan')):+.4f}: "
                    f"{verdict}", "yes" if row.get("optimum_moved") else "no",
                    "agree" if verdict == told.verdict and bool(row.get("optimum_moved")) == moved else "disagree",
                    "yes" if in_basin(row.get("best_lr"), truth_json.get("basin")) else "no",
                    "yes" if in_basin(searched[names[0]].get("best_lr"), reference_json.get("basin")) else "no",
                    at_reference_lr(truth, reference), _searched_at_reference(row, searched[names[0]])])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep", type=Path, help="the compare sweep's folder (analyzed)")
    parser.add_argument("truths", nargs="+", help="NAME=FOLDER per variant, the reference first")
    args = parser.parse_args(argv)
    truths = dict(item.split("=", 1) for item in args.truths)
    header = ["variant", "truth: best LR vs the reference's", "truth: difference (2 SE)", "truth: optimum moved",
              "search: best LR", "search: difference", "search: optimum moved", "verdicts", "search's best in the "
              "truth's basin", "reference's best in its truth's basin",
              "naive: the variant at the reference's best LR (truth runs), its difference (2 SE)",
              "naive, the search's runs: the variant at the reference's best LR, its difference"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows(args.sweep, {name: Path(path) for name, path in truths.items()}):
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(cli_entry(main)())
