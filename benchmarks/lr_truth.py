"""The ground truth a search is checked against: a dense log grid of LRs, several seeds each, every run
trained to the full budget with nothing stopping it early (only a non-finite loss ends a run).

    python benchmarks/lr_truth.py train --space quick_edge --lr-min 0.001 --lr-max 8 --ratio 1.5 --seeds 0,1,2
    python benchmarks/lr_truth.py table results/truth-quick_edge
    python benchmarks/lr_truth.py compare results/truth-quick_edge results/quick_edge-NAME

``train`` writes one ordinary run folder per (lr, seed) under results/truth-SPACE/ (``--out`` to choose),
skipping runs that already finished, so an interrupted grid continues where it stopped. ``table`` reads
them back: each run's full-budget loss, how long its loss stayed above ℓ₀ and whether it came back
(the truth about failure needs no window: a run fails when it ends its budget above ℓ₀ or goes
non-finite), what the stopper's rule would have done with it, and the truth's regions (lmtune's own
analysis applied to runs that nothing stopped). ``compare`` checks a sweep's report against them, strictly
(benchmarks.truth: the search's best LR inside the truth's 2-SE basin, its edge bracket overlapping the
truth's, a horizon prediction's loss within 2 SE of the truth's best), and refuses a truth with fewer than 3
seeds at an LR a check reads. Beside a horizon or width search's verdict it puts the answers a user could
take without the search (benchmarks.truth.naive_candidates: the largest proxy's best LR unchanged, the textbook rule
— ÷ the width ratio under SP, × ratio^-0.3 for a horizon —, the middle of the first grid, the direct local search's
answer) to the same check, with the check's false-pass rate for each on truths redrawn from this truth's curve and
noise; the prediction counts as ``validated`` only where it passes and every one of them passes under 20% of the
redrawn truths (else ``cannot_tell`` says why, and what truth would tell). Beside a horizon search it puts the
direct local search at its target (benchmarks.truth.direct_local_search): what that costs, its answer, and whose
answer was closer.

A truth answers for one setting (model, budget, schedule, optimizer, data; its runs differ only in LR and
seed): ``train`` refuses to add runs of another setting to one, and ``compare`` a sweep of another setting.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.truth_setting import Setting  # noqa: E402 (what a truth's runs share)
from lmtune.cli import parse_set_args  # noqa: E402
from lmtune.errors import LmtuneError, cli_entry, shown  # noqa: E402 (lmtune from this checkout)
from lmtune.files import atomic_write_json, check_destination  # noqa: E402
from lmtune.training.config import MAX_LR, MAX_SEED, budget_config  # noqa: E402

GRID_FILE = "grid.json"
# A dense grid is tens of LRs; far more is a typo in --lr-min, --lr-max or --ratio.
MAX_GRID_LRS = 1000


def grid(lr_min: float, lr_max: float, ratio: float) -> list[float]:
    """LRs from lr_min up to the first at or above lr_max, ``ratio`` apart (4 significant digits)."""
    count = math.ceil(math.log(lr_max / lr_min) / math.log(ratio) - 1e-9) + 1
    return [float(f"{lr_min * ratio ** k:.4g}") for k in range(count)]


def run_dir(out: Path, lr: float, seed: int) -> Path:
    return out / f"lr={lr:.4g}_seed={seed}"


def _numbers(text: str, option: str, kind: type) -> list:
    """A comma-separated list of ``kind`` (--lrs, --seeds), refused in one line where an entry is not one or
    two entries name the same run folder."""
    try:
        values = [kind(x) for x in text.split(",")]
    except ValueError:
        example = "0.001,0.01" if kind is float else "0,1"
        raise LmtuneError(f"{option} {shown(text)}: expected comma-separated {kind.__name__}s, e.g. {option} "
                          f"{example}") from None
    names = [f"{v:.4g}" if kind is float else str(v) for v in values]
    if len(set(names)) < len(names):
        raise LmtuneError(f"{option} {shown(text)} names a run twice (its folder keeps 4 significant digits); "
                          "give each value once")
    return values


def grid_lrs(args: argparse.Namespace) -> list[float]:
    """The grid's LRs from --lrs or --lr-min/--lr-max/--ratio, every one an LR a run accepts."""
    ranged = {"--lr-min": args.lr_min, "--lr-max": args.lr_max, "--ratio": args.ratio}
    if args.lrs is not None:
        if given := [k for k, v in ranged.items() if v is not None]:
            raise LmtuneError(f"--lrs and {', '.join(given)} both given; give the LRs or their range, not both")
        lrs = _numbers(args.lrs, "--lrs", float)
    else:
        low = 1e-3 if args.lr_min is None else args.lr_min
        high = 5.0 if args.lr_max is None else args.lr_max
        ratio = 1.5 if args.ratio is None else args.ratio
        if not (math.isfinite(low) and math.isfinite(high) and 0 < low <= high):
            raise LmtuneError(f"--lr-min {low:g} --lr-max {high:g}: need 0 < --lr-min <= --lr-max, both finite, "
                              "e.g. --lr-min 0.001 --lr-max 5")
        if not (math.isfinite(ratio) and ratio > 1):
            raise LmtuneError(f"--ratio {ratio:g}: must be a number above 1 (the step between LRs), e.g. 1.5")
        if math.log(high / low) / math.log(ratio) >= MAX_GRID_LRS:
            raise LmtuneError(f"--lr-min {low:g} to --lr-max {high:g} at --ratio {ratio:g} is over {MAX_GRID_LRS} "
                              "LRs; raise --ratio or narrow the range")
        lrs = grid(low, high, ratio)
    if bad := [lr for lr in lrs if not (math.isfinite(lr) and 0 < lr <= MAX_LR)]:
        raise LmtuneError(f"LR {bad[0]:g}: an LR must be a positive finite number at most {MAX_LR:g}; fix --lrs "
                          "or --lr-min/--lr-max")
    return lrs


def grid_seeds(text: str) -> list[int]:
    seeds = _numbers(text, "--seeds", int)
    if bad := [s for s in seeds if not 0 <= s <= MAX_SEED]:
        raise LmtuneError(f"--seeds: {bad[0]} is out of range; seeds are whole numbers in [0, 2**32 - 1]")
    return seeds


def grid_settings(args: argparse.Namespace, budget: str, fixed: dict) -> dict:
    """The settings every run of the grid shares (the space's fixed ones, --set on top), checked as a run
    checks them; each run's LR and seed are the grid's."""
    given = parse_set_args(args.set)
    if owned := sorted({"lr", "seed"} & set(given)):
        instead = {"lr": "--lrs or --lr-min/--lr-max", "seed": "--seeds"}[owned[0]]
        raise LmtuneError(f"--set {owned[0]}: the grid sets each run's {owned[0]}; give {instead} instead")
    settings = {**fixed, **given}
    if budget_config(budget, {**settings, "lr": 1e-3, "seed": 0}).train.run_steps:
        raise LmtuneError("--set run_steps: a truth's runs train their whole budget; set steps instead")
    return settings


def read_grid(out: Path) -> dict:
    """grid.json of a truth ({} where it has none)."""
    path = out / GRID_FILE
    if not path.is_file():
        return {}
    try:
        recorded = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise LmtuneError(f"{path} is unreadable ({type(err).__name__}); restore it or train into another --out") \
            from None
    if not isinstance(recorded, dict):
        raise LmtuneError(f"{path} is not a JSON object; restore it or train into another --out")
    return recorded


def existing_truth(out: Path) -> tuple[dict, Setting | None]:
    """What --out holds: its grid.json ({} where new) and the setting of its runs (None where it has none yet);
    refused where it holds something other than a truth."""
    from benchmarks.truth import read_truth

    if not out.is_dir() or not any(out.iterdir()):
        return {}, None
    recorded = read_grid(out)
    if not recorded and not any(out.glob("lr=*_seed=*")):
        raise LmtuneError(f"--out {out} holds files but no truth (no {GRID_FILE}); choose another --out")
    setting = Setting.from_json(recorded["setting"]) if isinstance(recorded.get("setting"), dict) else None
    if setting is None and any((p / "summary.json").is_file() for p in out.iterdir()):
        setting = read_truth(out)[0].setting  # a truth from before grid.json recorded its setting
    return recorded, setting


def _train_one(job: tuple[str, dict, str]) -> tuple[str, str, float]:
    """One run in a worker process (one thread each: the grid's runs share the machine's cores)."""
    import torch

    torch.set_num_threads(1)
    from lmtune.training.loop import train

    budget, overrides, out = job
    folder = Path(out)
    if folder.exists():  # a run an interruption cut short starts again from nothing: the grid is the truth
        import shutil

        shutil.rmtree(folder)
    started = time.perf_counter()
    overrides = dict(overrides)
    result = train(budget_config(budget, overrides, data_dir=overrides.pop("data_dir")), folder)
    return out, result.status, time.perf_counter() - started


class Plan(NamedTuple):
    out: Path
    record: dict
    """grid.json: its LRs and seeds those of every call so far."""
    jobs: list[tuple[str, dict, str]]
    """The runs still to train: (budget, settings, folder)."""
    runs: tuple[int, int]
    """This call's LRs and seeds."""


def plan_grid(args: argparse.Namespace) -> Plan:
    """Every argument checked, and nothing written but the built-in corpus where no --data is given."""
    from benchmarks.truth_setting import data_of, setting_differences, setting_of
    from lmtune.data.dataset import load_data
    from lmtune.data.prepare import ensure_builtin_corpus
    from lmtune.sweep.spaces import load_space
    from lmtune.training.loop import resolve_config

    if args.workers < 1:
        raise LmtuneError(f"--workers {args.workers}: must be at least 1 (the runs trained at once)")
    lrs, seeds = grid_lrs(args), grid_seeds(args.seeds)
    space = load_space(args.space)
    settings = grid_settings(args, space.budget, space.fixed)
    out = Path(args.out or ROOT / "results" / f"truth-{space.name}")
    recorded, theirs = existing_truth(out)
    check_destination(out, "--out")
    data_dir = (args.data or ensure_builtin_corpus(ROOT / "data" / "builtin")).resolve()
    config = resolve_config(budget_config(space.budget, {**settings, "lr": lrs[0], "seed": seeds[0]}), data_dir)
    load_data(data_dir, config.model.context_length, config.model.vocab_size)  # bad data: refused now, not per run
    setting = setting_of(config, data_of(str(data_dir)))
    # One truth of two budgets or models would make one table of both.
    if theirs and (differ := setting_differences(theirs, setting)):
        raise LmtuneError(f"--out {out} is a truth of another setting (its vs this grid's: {differ}); a truth "
                          "holds one setting: train into another --out, or give the settings it was trained with")
    jobs = [(space.budget, {**settings, "lr": lr, "seed": seed, "data_dir": str(data_dir)}, str(run_dir(out, lr, seed)))
            for lr in lrs for seed in seeds if not (run_dir(out, lr, seed) / "summary.json").exists()]
    union = {key: sorted({*(v for v in recorded.get(key) or [] if isinstance(v, (int, float))), *new})
             for key, new in (("lrs", lrs), ("seeds", seeds))}
    record = {"space": space.name, "budget": space.budget, "set": settings, **union, "data": str(data_dir),
              "setting": setting.to_json()}
    return Plan(out, record, jobs, (len(lrs), len(seeds)))


def train_grid(args: argparse.Namespace) -> None:
    plan = plan_grid(args)
    atomic_write_json(plan.out / GRID_FILE, plan.record)
    (lrs, seeds), jobs = plan.runs, plan.jobs
    print(f"{len(jobs)} runs to train ({lrs} LRs x {seeds} seeds, {lrs * seeds - len(jobs)} done) into {plan.out} "
          f"with {args.workers} workers", flush=True)
    workers = min(args.workers, len(jobs))
    # One worker: the runs train in this process, with no pool to start.
    pool = multiprocessing.get_context("spawn").Pool(workers, maxtasksperchild=4) if workers > 1 else None
    with pool or contextlib.nullcontext():
        for folder, status, seconds in (pool.imap_unordered(_train_one, jobs) if pool else map(_train_one, jobs)):
            print(f"{Path(folder).name}: {status} in {seconds:.0f} s", flush=True)


# ---------------------------------------------------------------------------------------------
# Reading the truth back


def print_table(args: argparse.Namespace) -> None:
    from benchmarks.truth import read_truth, truth_conclusion
    from lmtune.training.divergence import DivergenceRule

    if not 0 < args.window <= 1:  # (NaN fails this too)
        raise LmtuneError(f"--window {args.window:g}: must be a fraction of the budget's steps in (0, 1], e.g. 1")
    rule = DivergenceRule(recovery_window=args.window)
    runs = read_truth(args.truth, stopper_of(rule))
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
    print(json.dumps({k: c[k] for k in ("best_lr", "best_lr_seed_losses", "basin", "degraded", "failing_lr_low",
                                        "failing_lr", "seed_dependent")}, indent=1))


def stopper_of(rule):
    """lmtune's stopper rule (lmtune.training.divergence.judge) as the table puts it to the truth: where it would
    end each run and the spikes it names. The product under test, not the truth's judge (benchmarks.truth_rules)."""
    from lmtune.training.divergence import judge

    def stops(rows: list, ell0: float, steps: int) -> tuple[int | None, list[str]]:
        watch = judge([(r["step"], r["train_loss"]) for r in rows], ell0, steps, steps, rule)
        return (watch.verdict.step if watch.verdict.stop else None), [s.describe() for s in watch.all_spikes()]
    return stops


def truth_located_lr(truth: dict, tokens: int):
    """The truth's own LR* located between its grid points by the search's rule (lmtune.analysis.locate: a weighted
    quadratic in ln LR around its best, Fieller's 90% interval) from the truth's ranking and edge as
    benchmarks.truth_rules judged them: what a prediction's interval is checked against, rather than the grid's best
    LR, whose precision is the grid's gap. The search's estimator applied to the truth, so not in benchmarks/truth.py;
    None: no LR ran its budget."""
    from lmtune.analysis.bracket import Bracket
    from lmtune.analysis.locate import locate_best_lr
    from lmtune.analysis.runs import LrResult

    ranking = [LrResult(r["lr"], tuple(r["losses"]), (), tuple(r["seeds"])) for r in truth.get("ranking") or []]
    return locate_best_lr(ranking, tokens, Bracket(truth.get("failing_lr_low"), truth.get("failing_lr")))


def read_report(sweep: Path) -> dict:
    """A sweep's report/summary.json (lmtune analyze writes it)."""
    path = sweep / "report" / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except FileNotFoundError:
        raise LmtuneError(f"{path} is missing; run lmtune analyze {sweep} first") from None
    except (OSError, ValueError) as err:
        raise LmtuneError(f"{path} is unreadable ({type(err).__name__}); run lmtune analyze {sweep} again") from None
    if not isinstance(summary, dict):
        raise LmtuneError(f"{path} is not a JSON object; run lmtune analyze {sweep} again")
    return summary


def print_comparison(args: argparse.Namespace) -> None:
    from benchmarks.truth import (
        cannot_tell,
        compare,
        compare_horizon,
        direct_centre,
        direct_local_search,
        naive_answers,
        naive_candidates,
        read_truth,
        truth_conclusion,
    )
    from benchmarks.truth_setting import check_comparable
    from lmtune.sweep.sweep_file import SweepRecord

    runs = read_truth(args.truth)
    record = SweepRecord.read(args.sweep)
    check_comparable(args.truth, runs[0].setting, args.sweep, record)
    summary = read_report(args.sweep)
    truth = truth_conclusion(runs)
    if "predicted_lr" in summary:  # a horizon or width search: its prediction against the truth at its target
        tokens = sum(r.steps * r.tokens_per_step for r in runs)
        comparison = compare_horizon(truth, summary, tokens).to_json()
        located = truth_located_lr(truth, runs[0].steps * runs[0].tokens_per_step)
        low, high = summary.get("predicted_lr_interval") or (None, None)
        if located is not None and located.usable:  # the truth's LR* between its grid points, by the search's rule
            comparison.update(truth_located_lr=located.lr, truth_located_lr_interval=list(located.interval()),
                              interval_holds_truth_located_lr=bool(low and high and low <= located.lr <= high))
        if summary.get("search_flops"):  # a width search's runs differ in width: they compare by FLOPs, not tokens
            per_token = summary["target_run_flops"] / (runs[0].steps * runs[0].tokens_per_step)
            comparison.update(search_flops=summary["search_flops"], truth_flops=tokens * per_token,
                              search_over_truth_flops=summary["search_flops"] / (tokens * per_token))
        found = []
        if (direct := direct_centre(summary)) is not None:  # the direct search at the target, from the truth's runs
            found = [direct_local_search(runs, *direct, predicted=summary.get("predicted_lr"), seed=seed)
                     for seed in sorted({r.seed for r in runs})]
            comparison.update(direct_local_search=[{**asdict(f), "closer": _closer(f)} for f in found],
                              search_tokens=summary["compute"]["tokens_spent"])
        answers = naive_answers(truth, naive_candidates(summary, first_grid(record), found))
        comparison.update(naive_answers=[asdict(a) for a in answers], cannot_tell=cannot_tell(answers))
        comparison["validated"] = comparison["predicted_lr_in_truth_basin"] and comparison["cannot_tell"] is None
        print(json.dumps(comparison, indent=1))
        return
    print(json.dumps(compare(truth, summary).to_json(), indent=1))


def _closer(found) -> str:
    """Whose answer lies lower on the truth's held-out curve: the search's prediction or the direct search's."""
    if found.answer_excess is None or found.prediction_excess is None:
        return "cannot say: an answer lies outside the truth's LRs"
    if abs(found.answer_excess - found.prediction_excess) < 1e-9:
        return "the same"
    return "the search's" if found.prediction_excess < found.answer_excess else "the direct search's"


def first_grid(record) -> tuple[float, float] | None:
    """The search's first grid, (lr_min, lr_max) of its settings (None: its plan names none)."""
    settings = getattr(record.plan.space.strategy, "settings", None) if record.plan else None
    if settings is not None and getattr(settings, "lr_min", None) and getattr(settings, "lr_max", None):
        return settings.lr_min, settings.lr_max
    return None


@cli_entry
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="train the grid (resumable)")
    train.add_argument("--space", default="quick_edge", help="the space whose budget and fixed settings to use")
    train.add_argument("--data", type=Path, help="prepared data dir (default: the built-in corpus)")
    train.add_argument("--lrs", help="comma-separated LRs (instead of --lr-min/--lr-max/--ratio)")
    train.add_argument("--lr-min", type=float, help="the grid's lowest LR (default 0.001)")
    train.add_argument("--lr-max", type=float, help="the grid ends at the first LR at or above it (default 5)")
    train.add_argument("--ratio", type=float, help="the step between LRs (default 1.5)")
    train.add_argument("--seeds", default="0,1,2", help="the seeds of every LR (default 0,1,2: a check needs 3)")
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
