"""Every truth recorded in benchmarks/README.md's power table, judged against the answers a careful user would take
without the search (issue 44 item 4; issue 55 item 4): each truth's losses as recorded there (every seed of every LR,
to three decimals; the run folders are gone), put through ``lr_truth.py compare``'s own check (benchmarks/truth.py
``naive_candidates`` and ``naive_answers``): how often each candidate — the largest proxy's best LR unchanged (μP's
rule), the textbook rule (÷ the width ratio under SP; × ratio^-0.3 for a horizon), the middle of the first grid, the
direct local search's answer at the target — passes "within 2 SE of the truth's best" against truths redrawn from
the truth's curve and noise. The prediction counts as validated only where it passes and every candidate passes
under 20% of the redrawn truths (``cannot_tell``).

    python benchmarks/recorded_truths.py [--jsonl benchmarks/results.jsonl]

A truth still on disk is read by ``lr_truth.py compare TRUTH SWEEP`` itself, which prints the same figures.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from dataclasses import asdict, dataclass
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import append_row  # noqa: E402
from benchmarks.truth import (  # noqa: E402
    TruthRun,
    cannot_tell,
    direct_centre,
    direct_local_search,
    excess_in_truth,
    naive_answers,
    naive_candidates,
    textbook_rule,
    truth_conclusion,
)
from benchmarks.truth_setting import Setting, TruthData  # noqa: E402
from lmtune.searches.textbook import agrees  # noqa: E402

TOKENS_PER_STEP = 16 * 64  # every recorded truth: batch 16 x context 64
BUILTIN_VOCAB, REAL_TEXT_VOCAB = 3801, 4000  # the built-in corpus's; the real-text BPE's (benchmarks/real_text.py)
# Every recorded search confirmed at 3 LRs x 2 seeds at its target: the direct local search's 6 runs.
CONFIRMED = {"losses": [{"seeds": [0, 1]}] * 3}


@dataclass(frozen=True)
class RecordedTruth:
    name: str
    where: str
    """Its section of benchmarks/README.md and the commit it was trained at."""
    steps: int
    losses: dict[float, tuple[float, ...]]
    """Each LR's final val loss, seed 0, 1, 2."""
    prediction: float
    """The search's prediction it was checked against ..."""
    interval: tuple[float, float]
    """... and that prediction's 90% interval (results.jsonl)."""
    summary: dict
    """What naive_candidates reads of the search's summary.json: the target, the largest proxy's crowned LR, the
    parametrization, the runs at the target."""
    first_grid: tuple[float, float]
    """The search's lr_min and lr_max."""
    vocab: int = BUILTIN_VOCAB


def horizon(target_steps: int, proxy_steps: int, crowned: float) -> dict:
    return {"horizon_target_tokens": target_steps * TOKENS_PER_STEP, "confirmed": CONFIRMED,
            "budgets": [{"tokens": proxy_steps * TOKENS_PER_STEP, "crowned_lr": crowned}]}


def width(target: int, widest: int, crowned: float, parametrization: str) -> dict:
    return {"target_width": target, "parametrization": parametrization, "confirmed": CONFIRMED,
            "widths": [{"d_model": widest, "crowned_lr": crowned}]}


def table(lrs: tuple[float, ...], *seeds: tuple[float, ...]) -> dict[float, tuple[float, ...]]:
    """A README table (one row per seed) as each LR's losses."""
    return dict(zip(lrs, zip(*seeds, strict=True), strict=True))


GRID = (0.0015, 0.00225, 0.003375, 0.005063, 0.007594, 0.01139, 0.01709, 0.02563)
QUICK_HORIZON_GRID, QUICK_WIDTH_GRID = (0.003, 0.05), (0.004, 0.06)
TRUTHS = (
    RecordedTruth(
        "horizon, built-in corpus, 648 steps (4x)", "the horizon search against a 3-seed truth at 648 steps, fdd2428",
        648, table(GRID, (1.700, 1.674, 1.672, 1.665, 1.667, 1.677, 1.686, 1.706),
                   (1.699, 1.677, 1.671, 1.673, 1.632, 1.676, 1.690, 1.716),
                   (1.704, 1.681, 1.674, 1.673, 1.670, 1.676, 1.690, 1.705)),
        0.00688, (0.001612, 0.02935), horizon(648, 162, 0.0101), QUICK_HORIZON_GRID),
    RecordedTruth(
        "horizon WSD, built-in corpus, 648 steps (4x)", "WSD forks against a WSD truth at 648 steps, 92fd42c",
        648, table((0.001, 0.0015, 0.00225, 0.003375, 0.005063, 0.007594, 0.01139, 0.01709),
                   (1.701, 1.679, 1.672, 1.673, 1.668, 1.684, 1.690, 1.707),
                   (1.698, 1.678, 1.676, 1.677, 1.682, 1.656, 1.686, 1.713),
                   (1.701, 1.683, 1.681, 1.681, 1.678, 1.684, 1.690, 1.712)),
        0.003939, (0.002948, 0.005263), horizon(648, 162, 0.00675), QUICK_HORIZON_GRID),
    RecordedTruth(
        "horizon, real text, 1296 steps (8x)", "Real text at 8x, 5cfb443",
        1296, table((0.000667, 0.001, *GRID[:7]),
                    (6.630, 6.488, 6.291, 6.178, 6.191, 6.184, 6.261, 6.333, 6.368),
                    (6.401, 6.274, 6.186, 6.166, 6.173, 6.179, 6.291, 6.296, 6.366),
                    (6.408, 6.303, 6.190, 6.183, 6.227, 6.216, 6.376, 6.336, 6.379)),
        0.002437, (0.00157, 0.00378), horizon(1296, 162, 0.005511), QUICK_HORIZON_GRID, REAL_TEXT_VOCAB),
    RecordedTruth(
        "width SP, built-in corpus, d_model 256 (2x)", "the best LR across widths, 88c435b",
        162, table(GRID, (2.144, 1.956, 1.850, 1.805, 1.842, 2.105, 2.342, 2.542),
                   (2.153, 1.959, 1.863, 1.819, 1.854, 2.022, 2.359, 2.832),
                   (2.143, 1.937, 1.837, 1.819, 1.841, 2.039, 2.432, 2.335)),
        0.004429, (0.002696, 0.007275), width(256, 128, 0.009, "sp"), QUICK_WIDTH_GRID),
    RecordedTruth(
        "width muP, built-in corpus, d_model 256 (2x)", "the best LR across widths, 036e68f",
        162, table((*GRID, 0.03844), (2.884, 2.384, 2.084, 1.915, 1.832, 1.836, 1.865, 2.015, 2.316),
                   (2.906, 2.388, 2.107, 1.932, 1.861, 1.857, 1.928, 1.994, 2.187),
                   (2.903, 2.432, 2.100, 1.936, 1.832, 1.825, 1.864, 2.021, 2.157)),
        0.008507, (0.00697, 0.010384), width(256, 128, 0.009, "mup"), QUICK_WIDTH_GRID),
    RecordedTruth(
        "width SP, real text, d_model 256 (4x)", "Real text, width at 4x, e23d668",
        162, table(GRID, (5.770, 5.704, 5.696, 5.756, 5.801, 5.905, 5.954, 6.143),
                   (5.753, 5.677, 5.656, 5.726, 5.772, 5.930, 5.986, 6.076),
                   (5.729, 5.660, 5.660, 5.699, 5.813, 5.881, 5.957, 6.121)),
        0.06838, (0.00105, 4.447), width(256, 64, 0.03037, "sp"), (0.004, 0.12), REAL_TEXT_VOCAB),
)


def runs_of(truth: RecordedTruth) -> list[TruthRun]:
    """The truth's runs as lr_truth.py reads a trained grid: only their final losses were recorded."""
    full = truth.steps * TOKENS_PER_STEP
    return [TruthRun(lr, seed, truth.steps, TOKENS_PER_STEP, math.log(truth.vocab), {full: loss}, loss, False, False,
                     0, None, Setting({}, TruthData()))
            for lr, losses in truth.losses.items() for seed, loss in enumerate(losses)]


def study(truth: RecordedTruth) -> dict:
    """The truth's check of the prediction, each candidate's pass rate on redrawn truths, and the verdict."""
    runs = runs_of(truth)
    conclusion = truth_conclusion(runs)
    excess, two_se = excess_in_truth(conclusion, truth.prediction)
    passes = None if excess is None else excess <= two_se
    centre, count = direct_centre(truth.summary)
    direct = [direct_local_search(runs, centre, count, truth.prediction, seed)
              for seed in sorted({r.seed for r in runs})]
    answers = naive_answers(conclusion, naive_candidates(truth.summary, truth.first_grid, direct))
    why = cannot_tell(answers)
    rule = textbook_rule(truth.summary)
    return {"truth": truth.name, "where": truth.where, "best_lr": conclusion["best_lr"],
            "prediction": truth.prediction, "prediction_interval": list(truth.interval),
            "prediction_excess": excess, "two_se": two_se, "prediction_passes": passes,
            "textbook_rule_lr": rule.lr, "textbook_rule_in_interval": agrees(rule, truth.interval),
            "textbook_rule_excess": excess_in_truth(conclusion, rule.lr)[0],
            "naive_answers": [asdict(a) for a in answers], "cannot_tell": why,
            "validated": bool(passes) and why is None}


def _rate(rate: float | None) -> str:
    return "?" if rate is None else f"{rate:.0%}"


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jsonl", help="append each row to this file")
    args = parser.parse_args(argv)
    stamp = {"commit": _commit(), "device": "2-core CPU (this machine)", "date": date.today().isoformat(),
             "command": "python benchmarks/recorded_truths.py"}
    for truth in TRUTHS:
        row = study(truth)
        excess = ("beyond the truth's LRs" if row["prediction_excess"] is None
                  else f"+{row['prediction_excess']:.4f} (2 SE {row['two_se']:.4f})")
        naive = "; ".join(f"{a['name']} {a['lr']:.3g}: passes {_rate(a['pass_rate'])}" for a in row["naive_answers"])
        print(f"{truth.name}: best {row['best_lr']:.3g}; prediction {truth.prediction:.3g} {excess}; textbook rule "
              f"{row['textbook_rule_lr']:.3g} "
              f"({'inside' if row['textbook_rule_in_interval'] else 'outside'} the prediction's interval); {naive}; "
              f"{'validated' if row['validated'] else 'cannot tell'}", flush=True)
        append_row(args.jsonl, "recorded_truths textbook rules and naive pass rates", {**stamp, **row})
    return 0


if __name__ == "__main__":
    sys.exit(main())
