"""``python -m lmtune.analyze results/NAME``: the edge-of-stability report of a sweep (lmtune.report); ``--runs
PATH``: the same report of runs lmtune did not make (lmtune.report.runs_report, docs/analyze-runs.md).

A sweep's folder is data: the report's samples (and --sharpness) of a user's model import its code only with
``--trust-code``, or build the user's own copy named by ``--model`` (lmtune.usercode.consent); without either, the
report is written without them and says why, on the command line too."""

from __future__ import annotations

import argparse
import logging
import math
from pathlib import Path

from lmtune.cli import command_parser
from lmtune.errors import LmtuneError, cli_entry, setup_cli_logging, shown
from lmtune.findings.summary import SweepFacts
from lmtune.report.headline import best_trial_lines, marked_unfinished, summary_lines, unfinished_mark
from lmtune.report.reader import resolve_sweep
from lmtune.report.writer import WrittenReport, write_report
from lmtune.sweep.storage import SweepStorage, is_uri
from lmtune.usercode.consent import REFUSED_NOTE, add_consent_arguments, consent_from_arguments

SAMPLES = 2  # (--samples' default: texts the best LR's model writes into a sweep's report)


def parse_vocab_size(text: str | None) -> int | None:
    """--vocab-size: a whole number from 2 (None: not given)."""
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 2:
        raise LmtuneError(f"--vocab-size must be the runs' vocabulary size, a whole number from 2, e.g. --vocab-size "
                          f"10000 (got {shown(text)})")
    return value


def parse_target(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise LmtuneError(f"--target must be a positive loss in nats/token, e.g. --target 3.5 (got {shown(text)})")
    return value


def headline(written: WrittenReport) -> list[str]:
    """The few lines the CLI prints."""
    summary, facts = written.report.summary, written.report.facts
    counts = ", ".join(f"{n} {s}" for s, n in summary.status_counts.items())
    range_test = " and the LR range test" if facts.range_test else ""
    unfinished = unfinished_mark(summary)  # (a sweep read while trials ran: every verdict may still change)
    mark = f"{unfinished}: " if unfinished else ""
    lines = [f"sweep {facts.sweep}: {mark}{len(summary.trials)} trials ({counts}){range_test}",
             *missing_lines(facts), *summary_lines(summary), *marked_unfinished(summary, best_trial_lines(facts)),
             *refused_samples_lines(facts)]
    if summary.target.target is not None:
        lines.append(f"target {summary.target.target:g}: {'met' if summary.target.met else 'not met'}")
    lines.append(f"report: {written.markdown}")
    if mark:
        lines.append("note: every verdict above may change before the sweep ends; analyze it again then (the new "
                     "report replaces this one)")
    return lines


def missing_lines(facts: SweepFacts) -> list[str]:
    """A warning line when the ledger lists trials the report has no folder for: what it concludes, it concludes
    without them."""
    missing = facts.missing_trials
    if not missing:
        return []
    named = ", ".join(f"{m.trial_id} ({m.outcome})" for m in missing[:5]) + (" ..." if len(missing) > 5 else "")
    return [f"warning: the ledger lists {len(missing)} trial{'s' * (len(missing) > 1)} with no readable folder: "
            f"{named}; the best LR was chosen without {'them' if len(missing) > 1 else 'it'}"]


def refused_samples_lines(facts: SweepFacts) -> list[str]:
    """The line saying the report holds no samples for want of consent to the sweep's code (else none)."""
    return [f"samples {facts.samples_note}"] if facts.samples_note.startswith(REFUSED_NOTE) else []


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("analyze", description="Write the edge-of-stability report of a sweep (or, with --runs, "
                                                 "of runs lmtune did not make).")
    parser.add_argument("sweep", nargs="?", help="results/NAME (a sweep), results/ (reports the newest sweep in it), "
                                                 "or a sweep in object storage: s3://BUCKET/PREFIX/NAME (copied to "
                                                 "results/NAME first)")
    parser.add_argument("--runs", default=None, metavar="PATH",
                        help="report on runs lmtune did not make instead: a CSV/JSONL log (lr, seed, step or tokens, "
                             "train_loss and/or val_loss, wall_time), a folder of them, a Tune experiment folder or "
                             "a W&B CSV export (docs/analyze-runs.md; report: PATH_report/ or PATH/report/)")
    parser.add_argument("--lr-of", action="append", default=None, metavar="NAME=LR",
                        help="with --runs: the LR of a named run (a W&B export's), repeated once per run")
    parser.add_argument("--vocab-size", default=None, metavar="N",
                        help="with --runs: the runs' vocabulary size (else their vocab_size column), so that ℓ₀ = "
                             "ln(vocab) and each run is judged diverged, unconfirmed or spiked as a sweep's are "
                             "(without either, ℓ₀ is estimated and only a non-finite loss counts as diverged)")
    parser.add_argument("--out", default=None, help="report folder (default: results/NAME/report; with --runs, "
                                                    "PATH_report/ beside a file, PATH/report/ in a folder)")
    parser.add_argument("--target", default=None, help="target val loss (nats/token): was it met, and by which trial")
    parser.add_argument("--sharpness", action="store_true",
                        help="estimate the Hessian's top eigenvalue at saved checkpoints of the best trial and "
                             "the largest non-diverged LR (slow: minutes on CPU)")
    parser.add_argument("--samples", type=int, default=None,
                        help=f"texts the best LR's model writes into the report (default {SAMPLES}; 0: none)")
    parser.add_argument("--x", choices=("tokens", "wall", "both"), default="both",
                        help="the learning curves' x axis: tokens, wall-clock time, or both figures (default both)")
    add_consent_arguments(parser)
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress")
    return parser


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_cli_logging(logging.INFO if args.verbose else logging.WARNING)
    target = parse_target(args.target)
    if args.runs is not None:
        refuse_checkpoint_flags(args)
    consent = consent_from_arguments(args)
    if args.runs is None and args.sweep is None:
        raise LmtuneError("give a sweep (results/NAME), or --runs PATH for runs lmtune did not make")
    if args.runs is not None and args.sweep is not None:
        raise LmtuneError(f"give a sweep ({args.sweep}) or --runs PATH, not both")
    if args.vocab_size is not None and args.runs is None:
        raise LmtuneError("--vocab-size is for --runs (a sweep's report reads its vocabulary from the sweep); drop it")
    if args.runs is not None:
        return analyze_runs(args, target)
    if is_uri(args.sweep):  # a sweep in object storage: its files (no checkpoints) copied to results/NAME first
        local = SweepStorage.of_uri(args.sweep).fetch(Path("results"))
        print(f"copied {args.sweep} (records and trial files, no checkpoints) to {local}")
        args.sweep = str(local)
    sweep_dir, others = resolve_sweep(Path(args.sweep))
    if others or sweep_dir != Path(args.sweep):
        print(f"reporting the newest sweep: {sweep_dir}")
        if others:
            print(f"other sweeps in {args.sweep}: {', '.join(p.name for p in others)}")
    samples = SAMPLES if args.samples is None else args.samples
    if not 0 <= samples <= 20:
        raise LmtuneError(f"--samples must be from 0 to 20 (got {samples})")
    report = write_report(sweep_dir, out_dir=Path(args.out) if args.out else None, target=target,
                          sharpness=args.sharpness, samples=samples, x=args.x, consent=consent)
    print("\n".join(headline(report)))
    return 0


def refuse_checkpoint_flags(args: argparse.Namespace) -> None:
    """With --runs, refuse the flags that load a sweep's checkpoints: runs lmtune did not make leave none, so each
    would do nothing (said, not ignored)."""
    given = [flag for flag, used in (("--model", args.model is not None), ("--trust-code", args.trust_code),
                                     ("--samples", args.samples is not None), ("--sharpness", args.sharpness)) if used]
    if given:
        flag = given[0]
        raise LmtuneError(f"{flag} does nothing with --runs: runs lmtune did not make leave no checkpoint lmtune can "
                          f"load (no samples, no sharpness, no model code); drop {flag}")


def analyze_runs(args: argparse.Namespace, target: float | None) -> int:
    """``--runs PATH``: the report of runs lmtune did not make (lmtune.report.runs_report)."""
    from lmtune.report.external_runs import parse_lr_of
    from lmtune.report.runs_report import steps_for_tokens, write_runs_report

    report, out = write_runs_report(Path(args.runs), Path(args.out) if args.out else None, target,
                                    parse_lr_of(args.lr_of), args.x, parse_vocab_size(args.vocab_size))
    summary = report.summary
    lines = summary_lines(summary) if report.x == "tokens" else steps_for_tokens(summary_lines(summary))
    notes = [f"note: {m.line()}" for m in report.missing if m.column in ("val_loss", "tokens")]
    met = [f"target {target:g}: {'met' if summary.target.met else 'not met'}"] if target is not None else []
    points = sum(len(run.points) for run in report.runs.runs)
    print("\n".join([f"runs {args.runs}: {len(summary.trials)} runs read ({points:,} logged points), compared on "
                      f"{report.judged_on} at equal {report.x.removesuffix('s')}s", *lines, *notes, *met,
                      f"report: {out / 'lr_sweep_analysis.md'}"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
