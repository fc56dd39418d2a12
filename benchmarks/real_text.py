"""A horizon or width search checked on real text, at an extrapolation ratio that matters (issue 44 item 5).

    python benchmarks/real_text.py --text war_and_peace.txt moby_dick.txt pride_and_prejudice.txt --ratio 8
    python benchmarks/real_text.py --text war_and_peace.txt moby_dick.txt pride_and_prejudice.txt --search width \
        --widths 16,32,64 --head-dim 16

Public-domain English of a few MB, from wherever the user keeps it (nothing of it is committed; Shakespeare is
kept apart for an independent check). In order, each step skipped where its output is already there:
1. ``lmtune.prepare`` of the texts (a BPE of ``--vocab-size``; one whole text, chosen by hash, held out for
   validation: with War and Peace, Moby-Dick and Pride and Prejudice, Moby-Dick);
2. the truth: the target's model and settings (quick_horizon at ``--target-steps``; quick_width's d_model 256 with
   ``--head-dim``), a grid of LRs 1.5x apart, 3 seeds, every run trained to its end (``lr_truth.py train``);
3. the search (quick_horizon with its largest proxy ``1/ratio`` of the target; quick_width with ``--widths`` as its
   proxies, the widest 1/4 of the target at 16,32,64) and ``analyze``;
4. ``lr_truth.py compare``: the search's prediction against the truth, the naive answers' false-pass rates, and
   the direct local search at the target (as many runs as the search trained there, around the largest proxy's
   best scaled by ratio^-0.3 for a horizon, by the width ratio^-1 under SP for width), one per truth seed: its cost
   beside the search's and whose answer was closer.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SPACES = ROOT / "lmtune" / "search_spaces"
TRUTH_LRS = "0.0015,0.00225,0.003375,0.005063,0.007594,0.01139,0.01709"
WIDTH_TRUTH_LRS = "0.0015,0.00225,0.003375,0.005063,0.007594,0.01139,0.01709,0.02563"


def run(*command: str) -> None:
    print("+", " ".join(command), flush=True)
    subprocess.run([sys.executable, *command], check=True, cwd=ROOT)


def horizon_space(out: Path, target_steps: int, ratio: float) -> Path:
    """quick_horizon at ``target_steps``, its largest proxy 1/ratio of it (its other settings unchanged)."""
    space = yaml.safe_load((SPACES / "quick_horizon.yaml").read_text())
    space["description"] = f"quick_horizon at {target_steps} steps predicted from proxies up to 1/{ratio:g} of it"
    space["set"]["steps"] = target_steps
    space["horizon"]["largest_fraction"] = 1 / ratio
    path = out / f"horizon-{target_steps}-{ratio:g}x.yaml"
    path.write_text(yaml.safe_dump(space, sort_keys=False))
    return path


def width_space(out: Path, widths: list[int], head_dim: int, lr_max: float) -> Path:
    """quick_width (its target d_model 256) with ``widths`` as its proxies and heads of ``head_dim``."""
    space = yaml.safe_load((SPACES / "quick_width.yaml").read_text())
    target = space["set"]["d_model"]
    space["description"] = (f"quick_width: d_model {target} predicted from {widths} (the widest 1/"
                            f"{target / max(widths):g} of it), heads of {head_dim}")
    space["set"]["n_heads"] = target // head_dim
    space["width"].update(widths=widths, lr_max=lr_max)
    path = out / f"width-{'-'.join(map(str, widths))}-h{head_dim}.yaml"
    path.write_text(yaml.safe_dump(space, sort_keys=False))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--text", nargs="+", required=True, type=Path, help="UTF-8 text files (public domain)")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "real_text")
    parser.add_argument("--vocab-size", type=int, default=4000)
    parser.add_argument("--search", choices=("horizon", "width"), default="horizon")
    parser.add_argument("--target-steps", type=int, default=1296, help="horizon: the target budget")
    parser.add_argument("--ratio", type=float, default=8.0, help="horizon: target / the largest proxy budget")
    parser.add_argument("--widths", default="16,32,64", help="width: the proxies' d_model (the target: 256)")
    parser.add_argument("--head-dim", type=int, default=16, help="width: every model's head dimension")
    parser.add_argument("--width-lr-max", type=float, default=0.12, help="width: the proxies' grid's top LR")
    parser.add_argument("--lrs", help="the truth's LRs")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    data = args.out / "data"
    if not (data / "meta.json").is_file():
        run("-m", "lmtune.prepare", "--input", *map(str, args.text), "--out", str(data),
            "--vocab-size", str(args.vocab_size))
    if args.search == "horizon":
        truth, name = args.out / f"truth-{args.target_steps}-3s", f"horizon-{args.target_steps}-{args.ratio:g}x"
        run("benchmarks/lr_truth.py", "train", "--space", "quick_horizon", "--data", str(data), "--lrs",
            args.lrs or TRUTH_LRS, "--seeds", "0,1,2", "--set", f"steps={args.target_steps}", "--out", str(truth),
            "--workers", "2")
        space = horizon_space(args.out, args.target_steps, args.ratio)
    else:
        widths = [int(w) for w in args.widths.split(",")]
        truth, name = args.out / f"truth-w256-h{args.head_dim}-3s", f"width-{'-'.join(map(str, widths))}"
        run("benchmarks/lr_truth.py", "train", "--space", "quick_width", "--data", str(data), "--lrs",
            args.lrs or WIDTH_TRUTH_LRS, "--seeds", "0,1,2", "--set", f"n_heads={256 // args.head_dim}", "--out",
            str(truth), "--workers", "2")
        space = width_space(args.out, widths, args.head_dim, args.width_lr_max)
    if not (args.out / name / "report" / "summary.json").is_file():
        run("-m", "lmtune.run", "--space", str(space), "--data", str(data), "--name", name, "--results",
            str(args.out), "--no-dashboard", "--num-cpus", "2")
        run("-m", "lmtune.analyze", str(args.out / name))
    run("benchmarks/lr_truth.py", "compare", str(truth), str(args.out / name))


if __name__ == "__main__":
    main()
