"""``python -m lmtune.train``: train one model (the loop itself is lmtune.training.loop)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path

from lmtune.cli import prog
from lmtune.data.prepare import ensure_builtin_corpus
from lmtune.errors import LmtuneError, cli_entry, setup_cli_logging
from lmtune.files import LOCK_FILE
from lmtune.training.config import BUDGETS, RunConfig, apply_overrides, budget_config, parse_set_args
from lmtune.training.loop import train


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog("train"), description="Train one language model.")
    parser.add_argument("--data", type=Path, help="prepared data dir (default: the built-in corpus)")
    parser.add_argument("--budget", default="quick", choices=list(BUDGETS), help="named budget (default: quick)")
    parser.add_argument("--lr", type=float, help="peak learning rate")
    parser.add_argument("--out", type=Path, help="output dir (default: results/train-BUDGET-TIMESTAMP)")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", default=[],
                        help="override any model/training field, e.g. --set batch_size=64 (repeatable)")
    parser.add_argument("--wandb", metavar="PROJECT",
                        help="also log to Weights & Biases project PROJECT (needs pip install -e '.[wandb]')")
    parser.add_argument("--quiet", action="store_true", help="only warnings and the final summary")
    return parser


def run_config(args: argparse.Namespace) -> tuple[RunConfig, Path]:
    """The run's config and output folder, every refusal checked before anything is written."""
    overrides = parse_set_args(args.set)
    if args.lr is not None:
        overrides["lr"] = args.lr
    data_dir = args.data if args.data is not None else ensure_builtin_corpus()
    config = budget_config(args.budget, overrides, data_dir=str(data_dir))
    out = args.out or Path("results") / f"train-{args.budget}-{time.strftime('%Y%m%d-%H%M%S')}"
    if args.resume and not (out / "config.json").exists():
        raise LmtuneError(f"--resume: {out} holds no training run (no config.json); drop --resume to start one")
    if not args.resume and out.exists() and any(p.name != LOCK_FILE for p in out.iterdir()):
        raise LmtuneError(f"{out} already holds files; pass --resume to continue it or choose another --out")
    if args.resume:
        saved = RunConfig.from_dict(json.loads((out / "config.json").read_text()))
        config = apply_overrides(saved, overrides) if overrides else saved
    return config, out


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_cli_logging(logging.WARNING if args.quiet else logging.INFO)
    config, out = run_config(args)
    sinks = []
    if args.wandb:
        from lmtune.training.wandb_sink import WandbSink

        sinks.append(WandbSink(args.wandb, config, out))
    result = train(config, out, resume=args.resume, sinks=sinks)
    s = result.summary
    best = f"{s['best_val_loss']:.4f}" if s["best_val_loss"] is not None else "n/a"
    print(f"{result.status}: {s['steps']} steps, {s['tokens']:,} tokens, best val loss {best}, "
          f"{s['tokens_per_s'] or 0:,.0f} tokens/s, {s['wall_time_s']:.1f} s -> {out}")
    return 0 if result.status in ("completed", "stopped") else 1


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
