"""The naive answers' false-pass rates for the truths recorded in benchmarks/README.md whose run folders are gone
(issue 44 item 4): each truth's losses as recorded there (every seed of every LR, to three decimals), put through
``lr_truth.py compare``'s own check (benchmarks/truth.py ``naive_answers``): how often the answer a user could take
without the search — the largest proxy's best LR unchanged, the middle of the first grid — passes "within 2 SE of
the truth's best" against truths redrawn from the truth's curve and noise. Where one passes more than 20% of the
time the truth cannot tell a good answer from a naive one (``cannot_tell``).

    python benchmarks/recorded_truths.py [--jsonl benchmarks/results.jsonl]

A truth still on disk is read by ``lr_truth.py compare TRUTH SWEEP`` itself, which prints the same figures.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import append_row  # noqa: E402
from benchmarks.truth import TruthRun, cannot_tell, excess_in_truth, naive_answers, truth_conclusion  # noqa: E402
from benchmarks.truth_setting import Setting, TruthData  # noqa: E402

TOKENS_PER_STEP = 16 * 64  # every recorded truth: batch 16 x context 64
VOCAB = 3801  # the built-in corpus's


@dataclass(frozen=True)
class RecordedTruth:
    name: str
    where: str
    """Its section of benchmarks/README.md and the commit it was trained at."""
    steps: int
    losses: dict[float, tuple[float, ...]]
    """Each LR's final val loss, seed 0, 1, 2."""
    prediction: float
    """The search's prediction it was checked against."""
    naive: dict[str, float]
    """What a user could take without the search: name -> LR."""


GRID = (0.0015, 0.00225, 0.003375, 0.005063, 0.007594, 0.01139, 0.01709, 0.02563)
TRUTHS = (
    RecordedTruth(
        "horizon, built-in corpus, 648 steps (4x)", "the horizon search against a 3-seed truth at 648 steps, fdd2428",
        648, dict(zip(GRID, zip((1.700, 1.674, 1.672, 1.665, 1.667, 1.677, 1.686, 1.706),
                                (1.699, 1.677, 1.671, 1.673, 1.632, 1.676, 1.690, 1.716),
                                (1.704, 1.681, 1.674, 1.673, 1.670, 1.676, 1.690, 1.705), strict=True), strict=True)),
        0.00688, {"the largest proxy's best LR, unchanged": 0.0101,
                  "the middle of the first grid": math.sqrt(0.003 * 0.05)}),
    RecordedTruth(
        "width SP, built-in corpus, d_model 256 (2x)", "the best LR across widths, 88c435b",
        162, dict(zip(GRID, zip((2.144, 1.956, 1.850, 1.805, 1.842, 2.105, 2.342, 2.542),
                                (2.153, 1.959, 1.863, 1.819, 1.854, 2.022, 2.359, 2.832),
                                (2.143, 1.937, 1.837, 1.819, 1.841, 2.039, 2.432, 2.335), strict=True), strict=True)),
        0.0044, {"the largest proxy's best LR, unchanged": 0.009,
                 "the middle of the first grid": math.sqrt(0.004 * 0.06)}),
    RecordedTruth(
        "width muP, built-in corpus, d_model 256 (2x)", "the best LR across widths, 036e68f",
        162, dict(zip((*GRID, 0.03844), zip((2.884, 2.384, 2.084, 1.915, 1.832, 1.836, 1.865, 2.015, 2.316),
                                            (2.906, 2.388, 2.107, 1.932, 1.861, 1.857, 1.928, 1.994, 2.187),
                                            (2.903, 2.432, 2.100, 1.936, 1.832, 1.825, 1.864, 2.021, 2.157),
                                            strict=True), strict=True)),
        0.0085, {"the largest proxy's best LR, unchanged": 0.009,
                 "the middle of the first grid": math.sqrt(0.004 * 0.06)}),
)


def runs_of(truth: RecordedTruth) -> list[TruthRun]:
    """The truth's runs as lr_truth.py reads a trained grid: only their final losses were recorded."""
    full = truth.steps * TOKENS_PER_STEP
    return [TruthRun(lr, seed, truth.steps, TOKENS_PER_STEP, math.log(VOCAB), {full: loss}, loss, False, False, 0,
                     None, Setting({}, TruthData()))
            for lr, losses in truth.losses.items() for seed, loss in enumerate(losses)]


def study(truth: RecordedTruth) -> dict:
    conclusion = truth_conclusion(runs_of(truth))
    excess, two_se = excess_in_truth(conclusion, truth.prediction)
    answers = naive_answers(conclusion, truth.naive)
    return {"truth": truth.name, "where": truth.where, "best_lr": conclusion["best_lr"],
            "prediction": truth.prediction, "prediction_excess": excess, "two_se": two_se,
            "prediction_passes": None if excess is None else excess <= two_se,
            "naive_answers": [asdict(a) for a in answers], "cannot_tell": cannot_tell(answers)}


def _rate(rate: float | None) -> str:
    return "?" if rate is None else f"{rate:.0%}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jsonl", help="append each row to this file")
    args = parser.parse_args(argv)
    for truth in TRUTHS:
        row = study(truth)
        naive = "; ".join(f"{a['name']} {a['lr']:.3g}: passes {_rate(a['pass_rate'])}" for a in row["naive_answers"])
        print(f"{truth.name}: best {row['best_lr']:.3g}; prediction {truth.prediction:.3g} "
              f"+{row['prediction_excess']:.4f} (2 SE {row['two_se']:.4f}); naive: {naive}; "
              f"{'cannot tell' if row['cannot_tell'] else 'can tell'}", flush=True)
        append_row(args.jsonl, "recorded_truths naive pass rates", row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
