"""The ground truth a search is checked against: a dense log grid of LRs, several seeds each, every run
trained to the full budget with nothing stopping it early (only a non-finite loss ends a run).

    python benchmarks/lr_truth.py train --space quick_edge --lr-min 0.001 --lr-max 8 --ratio 1.5 --seeds 0,1
    python benchmarks/lr_truth.py table results/truth-quick_edge
    python benchmarks/lr_truth.py compare results/truth-quick_edge results/quick_edge-NAME

``train`` writes one ordinary run folder per (lr, seed) under results/truth-SPACE/ (``--out`` to choose),
skipping runs that already finished, so an interrupted grid continues where it stopped. ``table`` reads
them back: each run's full-budget loss, how long its loss stayed above ℓ₀ and whether it came back
(the truth about failure needs no window: a run fails when it ends its budget above ℓ₀ or goes
non-finite), what the stopper's rule would have done with it, and the truth's regions (lmtune's own
analysis applied to runs that nothing stopped). ``compare`` checks a sweep's report against them.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def grid(lr_min: float, lr_max: float, ratio: float) -> list[float]:
    """LRs from lr_min up to the first at or above lr_max, ``ratio`` apart (4 significant digits)."""
    count = math.ceil(math.log(lr_max / lr_min) / math.log(ratio) - 1e-9) + 1
    return [float(f"{lr_min * ratio ** k:.4g}") for k in range(count)]


def run_dir(out: Path, lr: float, seed: int) -> Path:
    return out / f"lr={lr:.4g}_seed={seed}"


def _train_one(job: tuple[str, dict, str]) -> tuple[str, str, float]:
    """One run in a worker process (one thread each: the grid's runs share the machine's cores)."""
    import torch

    torch.set_num_threads(1)
    from lmtune.training.config import budget_config
    from lmtune.training.loop import train

    budget, overrides, out = job
    folder = Path(out)
    if folder.exists():  # a run an interruption cut short starts again from nothing: the grid is the truth
        import shutil

        shutil.rmtree(folder)
    started = time.perf_counter()
    result = train(budget_config(budget, overrides, data_dir=overrides.pop("data_dir")), folder)
    return out, result.status, time.perf_counter() - started


def train_grid(args: argparse.Namespace) -> None:
    from lmtune.data.prepare import ensure_builtin_corpus
    from lmtune.sweep.spaces import load_space
    from lmtune.training.config import parse_set_args

    space = load_space(args.space)
    data_dir = str((args.data or ensure_builtin_corpus(ROOT / "data" / "builtin")).resolve())
    out = Path(args.out or ROOT / "results" / f"truth-{space.name}")
    out.mkdir(parents=True, exist_ok=True)
    lrs = [float(x) for x in args.lrs.split(",")] if args.lrs else grid(args.lr_min, args.lr_max, args.ratio)
    seeds = [int(s) for s in args.seeds.split(",")]
    fixed = {**space.fixed, **parse_set_args(args.set)}
    jobs = []
    for lr in lrs:
        for seed in seeds:
            folder = run_dir(out, lr, seed)
            if (folder / "summary.json").exists():
                continue
            jobs.append((space.budget, {**fixed, "lr": lr, "seed": seed, "data_dir": data_dir}, str(folder)))
    (out / "grid.json").write_text(json.dumps({"space": space.name, "budget": space.budget, "set": fixed,
                                               "lrs": lrs, "seeds": seeds}, indent=2))
    print(f"{len(jobs)} runs to train ({len(lrs)} LRs x {len(seeds)} seeds, {len(lrs) * len(seeds) - len(jobs)} "
          f"done) into {out} with {args.workers} workers", flush=True)
    with multiprocessing.get_context("spawn").Pool(args.workers, maxtasksperchild=4) as pool:
        for folder, status, seconds in pool.imap_unordered(_train_one, jobs):
            print(f"{Path(folder).name}: {status} in {seconds:.0f} s", flush=True)


# ---------------------------------------------------------------------------------------------
# Reading the truth back


def print_table(args: argparse.Namespace) -> None:
    from lmtune.report.truth import read_truth, truth_conclusion
    from lmtune.training.divergence import DivergenceRule

    rule = DivergenceRule(recovery_window=args.window)
    runs = read_truth(args.truth, rule)
    print(f"| lr | seed | val loss at the full budget | steps above ℓ₀ (longest) | recovered | stopped early by the "
          f"rule (window {args.window:g}) at step |")
    print("|---|---|---|---|---|---|")
    early = [r for r in runs if r.rule_stops_at is not None and r.rule_stops_at < r.steps]
    for r in runs:
        end = "non-finite" if r.non_finite else f"{r.end_val:.3f}" if r.end_val is not None else "—"
        stop = "non-finite" if r.non_finite else r.rule_stops_at if r in early else "—"
        print(f"| {r.lr:.4g} | {r.seed} | {end} | {r.longest_above} | {'no' if r.failed else 'yes'} | {stop} |")
    recovered = [r.longest_above for r in runs if not r.failed]
    wrong = [r for r in early if not r.failed]
    print(f"\nlongest stretch above ℓ₀ of a run that recovered: {max(recovered, default=0)} steps of "
          f"{runs[0].steps}; a recovery window of {rule.window_steps(runs[0].steps)} steps ends {len(early)} finite "
          f"runs early, {len(wrong)} of which would have recovered; {sum(r.non_finite for r in runs)} runs went "
          "non-finite")
    c = truth_conclusion(runs)
    print(json.dumps({k: c[k] for k in ("best_lr", "best_lr_seed_losses", "basin", "degraded", "edge_lr_low",
                                        "divergence_lr", "seed_dependent")}, indent=1))


def print_comparison(args: argparse.Namespace) -> None:
    from lmtune.report.truth import compare, compare_horizon, read_truth, truth_conclusion

    runs = read_truth(args.truth)
    truth = truth_conclusion(runs)
    summary = json.loads((args.sweep / "report" / "summary.json").read_text())
    if "predicted_lr" in summary:  # a horizon search: its prediction against the truth at its target budget
        tokens = sum(r.steps * r.tokens_per_step for r in runs)
        print(json.dumps(compare_horizon(truth, summary, tokens), indent=1))
        return
    print(json.dumps(compare(truth, summary), indent=1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="train the grid (resumable)")
    train.add_argument("--space", default="quick_edge", help="the space whose budget and fixed settings to use")
    train.add_argument("--data", type=Path, help="prepared data dir (default: the built-in corpus)")
    train.add_argument("--lrs", help="comma-separated LRs (instead of --lr-min/--lr-max/--ratio)")
    train.add_argument("--lr-min", type=float, default=1e-3)
    train.add_argument("--lr-max", type=float, default=5.0)
    train.add_argument("--ratio", type=float, default=1.5)
    train.add_argument("--seeds", default="0,1")
    train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    train.add_argument("--out", type=Path)
    train.add_argument("--workers", type=int, default=2)
    table = commands.add_parser("table", help="the truth's table, the stopper's rule against it, its regions")
    table.add_argument("truth", type=Path)
    table.add_argument("--window", type=float, default=1.0, help="the recovery window to check")
    versus = commands.add_parser("compare", help="a sweep's report (run analyze first) against the truth")
    versus.add_argument("truth", type=Path)
    versus.add_argument("sweep", type=Path)
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.command == "train":
        train_grid(args)
    elif args.command == "table":
        print_table(args)
    elif args.command == "compare":
        print_comparison(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
