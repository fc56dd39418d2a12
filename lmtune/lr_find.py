"""``python -m lmtune.lr_find``: the LR range test alone (lmtune.training.lr_range).

One short run with the LR rising exponentially; prints where the loss fell fastest, where it blew up,
and the coarse grid an edge search (``search: edge``) would start from. Writes range_test.csv,
range_test.json and lr_range_test.png into --out.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path

from lmtune.cli import command_parser, parse_set_args, set_names
from lmtune.data.prepare import ensure_builtin_corpus
from lmtune.errors import LmtuneError, cli_entry, setup_cli_logging
from lmtune.files import check_destination
from lmtune.searches.edge.settings import EdgeSettings, coarse_lrs
from lmtune.tools.terminal_progress import bar
from lmtune.training.config import BUDGETS, budget_config
from lmtune.training.handout import handout_name
from lmtune.training.loop import resolve_config
from lmtune.training.lr_range import MAX_RANGE_STEPS, RANGE_FIGURE, RangeRow, RangeTestConfig, lr_range_test
from lmtune.usercode.checks import check_code
from lmtune.usercode.config import add_code_arguments, code_from_arguments
from lmtune.usercode.spec import spec_for

DEFAULTS = RangeTestConfig()


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("lr_find", description="LR range test: where the loss falls fastest and where it blows up.")
    parser.add_argument("--data", type=Path, help="prepared data dir (default: the built-in corpus)")
    parser.add_argument("--budget", default="quick", choices=list(BUDGETS),
                        help="named budget whose model and batch are tested (default: quick)")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", default=[],
                        help="override a model/training field, e.g. --set batch_size=64 (repeatable)")
    parser.add_argument("--min-lr", type=float, default=DEFAULTS.min_lr, help=f"first LR (default {DEFAULTS.min_lr:g})")
    parser.add_argument("--max-lr", type=float, default=DEFAULTS.max_lr, help=f"last LR (default {DEFAULTS.max_lr:g})")
    parser.add_argument("--steps", type=int, default=DEFAULTS.steps,
                        help=f"steps from --min-lr to --max-lr, 10 to {MAX_RANGE_STEPS:,} (default {DEFAULTS.steps})")
    add_code_arguments(parser)
    parser.add_argument("--out", type=Path, help="output dir (default: results/lr_find-BUDGET-TIMESTAMP)")
    parser.add_argument("--quiet", action="store_true", help="only warnings and the result")
    return parser


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_cli_logging(logging.WARNING if args.quiet else logging.INFO)
    settings = RangeTestConfig(min_lr=args.min_lr, max_lr=args.max_lr, steps=args.steps)
    settings.validate("lr_find")
    overrides = parse_set_args(args.set)
    if "lr" in overrides:
        raise LmtuneError(f"lr_find: --set {handout_name('lr', set_names(args.set))} has no effect (the test ramps "
                          "the LR itself); use --min-lr / --max-lr")
    if args.schedule:
        raise LmtuneError(f"lr_find: --schedule {args.schedule} has no effect (the test ramps the LR itself, "
                          "exponentially from --min-lr to --max-lr, whatever the schedule); drop --schedule")
    out = args.out or Path("results") / f"lr_find-{args.budget}-{time.strftime('%Y%m%d-%H%M%S')}"
    check_destination(out, "--out")
    if out.exists() and any(out.iterdir()):
        raise LmtuneError(f"{out} already exists and is not an empty folder; choose another --out")
    config = budget_config(args.budget, overrides, code=code_from_arguments(args))
    config.data_dir = str(args.data if args.data is not None else ensure_builtin_corpus())  # last: every refusal first
    check_code(resolve_config(config, Path(config.data_dir)))
    with bar(settings.steps, "lr_find", "step") as shown:  # on a terminal: a bar with an ETA, the LR and loss
        def report(row: RangeRow) -> None:
            shown.update(row["step"] - shown.n)
            shown.set_postfix(lr=f"{row['lr']:.3g}", loss=f"{row['smoothed_loss']:.4f}", refresh=False)

        result = lr_range_test(config, settings, out, report=report, report_every=1, spec=spec_for(config))
    print(f"{result.summary_line()} ({len(result.lrs)} steps, {result.tokens:,} tokens)")
    print(f"stopped: {result.stopped_because}")
    if result.steepest_lr or result.blowup_lr:
        edge = EdgeSettings(range_min_lr=settings.min_lr, range_max_lr=settings.max_lr)
        lrs, _ = coarse_lrs(result.steepest_lr, result.blowup_lr, edge)
        print("an edge search would start its coarse grid at lr " + ", ".join(f"{lr:.3g}" for lr in sorted(lrs)))
    print(f"figure: {out / RANGE_FIGURE}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
