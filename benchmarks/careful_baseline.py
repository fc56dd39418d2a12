"""The edge search against a careful user's ASHA baseline, both measured in one invocation (issue 55 item 1).

    python benchmarks/careful_baseline.py --space quick_edge --num-cpus 2

First the edge search itself (``python -m lmtune.run`` then ``python -m lmtune.analyze``, as subprocesses); then,
with Ray Tune's public API and lmtune's trainable (``lmtune.Sweep``), the baseline the report only estimates
(lmtune/findings/baselines.py ``careful_baseline``), over the LR range the search tried, at its bracket ratio and
with its seed counts:

1. grid: LRs 2x apart from the smallest to the largest the search tried, seed 0, under ASHA on tokens with the
   space's rungs (grace period its first rung, eta the ratio of its first two);
2. continue: the best full-budget grid LR's two neighbours and the grid's failing bracket (the first LR above the
   best that fails, and the one below it) continued from their newest checkpoint to the full budget, again until
   the best's neighbours and a failing bracket confirmed at the full budget are there;
3. bisect: the bracket halved in log LR, each midpoint a full-budget run, until it is as narrow as the search's
   (the best LR's further seeds run beside the first midpoint: the best is known by then);
4. seeds: the bracket's ends get as many seeds as the search's ends have.

Every stage is one Tuner, one after another, all in one experiment folder (a continued trial finds its source's
checkpoint there); each trial's tokens are read from its own reported ``tokens``, less what it continued from.
Prints one table and appends one row to benchmarks/results.jsonl.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results.jsonl"
TIMES_FILE = "careful_baseline_times.json"
GRID_RATIO = 2.0  # the estimate's BASELINE_GRID_RATIO: the usual 1e-4, 2e-4, 4e-4, ...
FULL_LRS = 3  # the best grid LR and its two neighbours end at the full budget (the estimate's CAREFUL_FULL_BUDGET_LRS)


@dataclass(frozen=True)
class Point:
    """One grid LR at seed 0, as far as it has trained."""

    lr: float
    tokens: int
    """The tokens its run (with any continuation) reached."""
    loss: float
    """Its last validation loss (inf: non-finite, or none reported)."""
    rung_loss: float
    """Its validation loss at the first rung (inf: non-finite, or it never got there)."""
    trial_id: str = ""


@dataclass(frozen=True)
class Spec:
    """What the baseline is built for: the search's LR range, bracket ratio and seed counts, and the budget."""

    low: float
    high: float
    resolution: float | None
    best_seeds: int
    edge_seeds: tuple[int, int]
    rungs: tuple[int, ...]
    """Token counts of ASHA's rungs, the last one the full budget."""
    unigram: float
    seed: int = 0


def grid_lrs(low: float, high: float, ratio: float = GRID_RATIO) -> list[float]:
    """LRs ``ratio`` apart from ``low`` until one reaches ``high`` (as many as the estimate counts)."""
    points = math.ceil(math.log(high / low) / math.log(ratio) - 1e-9) + 1
    return [low * ratio**k for k in range(points)]


def trained(point: Point, full: int, unigram: float) -> bool:
    """Trained its whole budget and ended better than the data's unigram baseline."""
    return point.tokens >= full and point.loss < unigram


def fails(point: Point, full: int, unigram: float) -> bool:
    """Judged at the full budget where it got there, else at the first rung (the careful user's best guess)."""
    if point.tokens >= full:
        return not trained(point, full, unigram)
    return not point.rung_loss < unigram


def best_point(points: Sequence[Point], full: int, unigram: float) -> Point:
    """The best full-budget LR (none trained through yet: the best at the first rung)."""
    done = [p for p in points if trained(p, full, unigram)]
    return min(done, key=lambda p: p.loss) if done else min(points, key=lambda p: p.rung_loss)


def bracket(points: Sequence[Point], full: int, unigram: float) -> tuple[Point, Point] | None:
    """The grid's failing bracket: the first LR above the best that fails, and the one below it."""
    ordered = sorted(points, key=lambda p: p.lr)
    best = ordered.index(best_point(points, full, unigram))
    for i in range(best + 1, len(ordered)):
        if fails(ordered[i], full, unigram):
            return ordered[i - 1], ordered[i]
    return None


def to_continue(points: Sequence[Point], full: int, unigram: float) -> list[Point]:
    """Grid LRs to continue to the full budget: the best's neighbours and the failing bracket's ends, those not
    there yet. Called again after each round: a bracket end that the full budget contradicts moves the bracket."""
    ordered = sorted(points, key=lambda p: p.lr)
    best = ordered.index(best_point(points, full, unigram))
    wanted = {p.lr: p for p in ordered[max(0, best - (FULL_LRS - 1) // 2): best + FULL_LRS // 2 + 1]}
    ends = bracket(points, full, unigram)
    wanted.update({p.lr: p for p in ends or ()})
    return [p for lr, p in sorted(wanted.items()) if p.tokens < full]


def bisections(stable: float, failing: float, resolution: float | None) -> int:
    """Midpoints halving (stable, failing] in log LR until it is as narrow as ``resolution``."""
    if resolution is None or resolution <= 1:
        return 0
    return max(0, math.ceil(math.log2(math.log(failing / stable) / math.log(resolution)) - 1e-9))


def seed_orders(lrs_counts: Sequence[tuple[float, int]], base_seed: int) -> list[tuple[float, int]]:
    """(LR, seed) of the further seeds: ``count`` seeds in all at each LR, seed ``base_seed`` already run."""
    return [(lr, base_seed + k) for lr, count in lrs_counts for k in range(1, count)]


@dataclass
class Run:
    """One trial of the baseline, as its own metrics say."""

    stage: str
    lr: float
    seed: int
    trial_id: str
    tokens: int
    """Tokens this trial trained (its last reported tokens, less those it continued from)."""
    reached: int
    loss: float
    rung_loss: float


@dataclass
class Baseline:
    runs: list[Run] = field(default_factory=list)
    wall_s: float = 0.0
    best_lr: float | None = None
    best_losses: list[float] = field(default_factory=list)
    bracket: tuple[float, float] | None = None
    divergence_lr: float | None = None

    @property
    def tokens(self) -> int:
        return sum(r.tokens for r in self.runs)

    def stage_tokens(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.runs:
            out[r.stage] = out.get(r.stage, 0) + r.tokens
        return out


@dataclass(frozen=True)
class Order:
    """One trial a stage asks for."""

    stage: str
    lr: float
    seed: int
    continue_from: str | None = None


class Runner:
    """Stages as Tuners one after another, over lmtune's trainable, in one experiment folder."""

    def __init__(self, sweep, spec: Spec, storage: Path, name: str, cpus_per_trial: float):
        self.sweep, self.spec, self.storage, self.name = sweep, spec, storage, name
        self.cpus_per_trial = cpus_per_trial

    @property
    def full(self) -> int:
        return self.spec.rungs[-1]

    def stage(self, orders: Sequence[Order], asha: bool = False) -> list[Run]:
        """One Tuner running ``orders`` (grid_search over their labels; each label's LR, seed and source looked up
        by Tune's sample_from), under ASHA on tokens with the space's rungs when ``asha``."""
        from ray import tune
        from ray.tune.schedulers import ASHAScheduler

        table = {f"{o.stage}-{i}": o for i, o in enumerate(orders)}
        space = {"stage": tune.grid_search(list(table)),
                 "lr": tune.sample_from(lambda config: table[config["stage"]].lr),
                 "seed": tune.sample_from(lambda config: table[config["stage"]].seed)}
        if any(o.continue_from for o in orders):
            space["continue_from"] = tune.sample_from(lambda config: table[config["stage"]].continue_from)
        rungs = self.spec.rungs
        scheduler = ASHAScheduler(time_attr="tokens", max_t=self.full, grace_period=rungs[0],
                                  reduction_factor=rungs[1] / rungs[0]) if asha else None
        tuner = tune.Tuner(
            tune.with_resources(self.sweep.trainable(), {"cpu": self.cpus_per_trial}), param_space=space,
            tune_config=tune.TuneConfig(metric="val_loss", mode="min", scheduler=scheduler,
                                        reuse_actors=self.sweep.reuse_actors),
            run_config=tune.RunConfig(name=self.name, storage_path=str(self.storage), stop=self.sweep.stopper(),
                                      verbose=0))
        results = tuner.fit()
        return [self.run_of(result, table) for result in results]

    def run_of(self, result, table: dict[str, Order]) -> Run:
        """The trial's own reported tokens and losses (tokens it continued from taken off)."""
        from lmtune.sweep.record import trial_folders

        if result.error is not None:  # (a trial that could not train is a broken benchmark, not a measured run)
            raise RuntimeError(f"trial {result.path} failed: {result.error}; the baseline is not measured")
        order = table[result.config["stage"]]
        folder = next((f for f in trial_folders(self.storage / self.name) if f.path == Path(result.path)), None)
        frame = result.metrics_dataframe
        rows = [] if frame is None else frame.to_dict("records")
        reached = int(max((r.get("tokens") or 0 for r in rows), default=0))
        losses = [(int(r["tokens"]), float(r["val_loss"])) for r in rows
                  if r.get("val_loss") is not None and not _nan(r.get("val_loss"))]
        loss = losses[-1][1] if losses else math.inf
        rung = next((v for t, v in losses if t >= self.spec.rungs[0]), math.inf)
        since = folder.continued_from_tokens if folder else 0
        return Run(order.stage, order.lr, order.seed, folder.trial_id if folder else "", reached - since, reached,
                   loss if math.isfinite(loss) else math.inf, rung if math.isfinite(rung) else math.inf)


def _nan(value) -> bool:
    return isinstance(value, float) and math.isnan(value)


def point_of(run: Run, full: int, rung_loss: float | None = None, ended: bool = False) -> Point:
    """The grid point a run leaves; ``ended``: a run ASHA could not cut (the stopper ended it early: it diverged,
    judged as failed at the full budget and never continued again)."""
    tokens, loss = run.reached, run.loss
    if ended and tokens < full:
        tokens, loss = full, math.inf
    return Point(run.lr, tokens, loss, run.rung_loss if rung_loss is None else rung_loss, run.trial_id)


def grid_and_continue(runner: Runner, baseline: Baseline) -> list[Point]:
    """Stages 1 and 2: the 2x grid under ASHA, then its best's neighbours and failing bracket to the full budget."""
    spec, full = runner.spec, runner.full
    grid = runner.stage([Order("grid", lr, spec.seed) for lr in grid_lrs(spec.low, spec.high)], asha=True)
    baseline.runs += grid
    points = {r.lr: point_of(r, full) for r in grid}
    for _ in range(len(points)):  # (each round moves the bracket or the best by at least one grid LR)
        wanted = to_continue(list(points.values()), full, spec.unigram)
        if not wanted:
            break
        runs = runner.stage([Order("continue", p.lr, spec.seed, p.trial_id) for p in wanted])
        baseline.runs += runs
        points.update({r.lr: point_of(r, full, points[r.lr].rung_loss, ended=True) for r in runs})
    return sorted(points.values(), key=lambda p: p.lr)


def bisect_and_seed(runner: Runner, baseline: Baseline, points: list[Point]) -> None:
    """Stages 3 and 4: bisect the failing bracket to the search's ratio (the best's seeds beside the first
    midpoint), then the bracket ends' seeds."""
    spec, full = runner.spec, runner.full
    best = best_point(points, full, spec.unigram)
    baseline.best_lr = best.lr
    best_seeds = [Order("seeds", lr, s) for lr, s in seed_orders([(best.lr, spec.best_seeds)], spec.seed)]
    ends = bracket(points, full, spec.unigram)
    if ends is None:
        baseline.runs += runner.stage(best_seeds) if best_seeds else []
        return
    stable, failing = ends[0].lr, ends[1].lr
    for _ in range(bisections(stable, failing, spec.resolution)):
        mid = math.sqrt(stable * failing)
        runs = runner.stage([Order("bisect", mid, spec.seed), *best_seeds])
        best_seeds = []
        baseline.runs += runs
        run = next(r for r in runs if r.stage == "bisect")
        if trained(point_of(run, full, ended=True), full, spec.unigram):
            stable = mid
        else:
            failing = mid
    counts = [(stable, spec.edge_seeds[0]), (failing, spec.edge_seeds[1])]
    orders = best_seeds + [Order("seeds", lr, s) for lr, s in seed_orders(counts, spec.seed)]
    baseline.runs += runner.stage(orders) if orders else []
    baseline.bracket = (stable, failing)


def answers(baseline: Baseline, full: int) -> None:
    """The best LR's losses over its seeds, and the divergence LR: the smallest LR at which a run not cut by ASHA
    ended before the full budget (lmtune's stopper: non-finite, or not back below the initial loss)."""
    at_best = [r.loss for r in baseline.runs if r.lr == baseline.best_lr and r.reached >= full]
    baseline.best_losses = at_best
    diverged = [r.lr for r in baseline.runs if r.stage != "grid" and r.reached < full]
    diverged += [r.lr for r in baseline.runs if r.stage == "grid" and not math.isfinite(r.loss)]
    baseline.divergence_lr = min(diverged, default=None)


def run_baseline(spec: Spec, space: str, sets: Sequence[str], storage: Path, name: str, num_cpus: int,
                 cpus_per_trial: float) -> Baseline:
    import ray

    import lmtune

    start = time.monotonic()
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    try:
        runner = Runner(lmtune.Sweep(space, **overrides(sets)), spec, storage, name, cpus_per_trial)
        baseline = Baseline()
        points = grid_and_continue(runner, baseline)
        bisect_and_seed(runner, baseline, points)
        answers(baseline, runner.full)
    finally:
        ray.shutdown()
    baseline.wall_s = time.monotonic() - start
    return baseline


@dataclass
class Search:
    """The edge search's run, as its summary.json reports it."""

    folder: Path
    summary: dict
    run_s: float | None
    analyze_s: float | None

    @property
    def tokens(self) -> int:
        return sum(int(stage["tokens"]) for stage in self.summary["stages"])

    def lrs(self) -> list[float]:
        """The LRs it tried (its range test's sweep of LRs left out, as the estimate leaves it out)."""
        return [t["lr"] for t in self.summary["trials"] if t.get("stage") != "range" and t.get("lr")]

    def spec(self) -> Spec:
        s = self.summary
        confirmation = s.get("edge_confirmation") or {}
        edge_seeds = (len(confirmation.get("stable_end", ())), len(confirmation.get("diverged_end", ())))
        return Spec(min(self.lrs()), max(self.lrs()), s.get("bracket_ratio"), max(1, len(s["best_lr_seeds"])),
                    edge_seeds, tuple(s["rungs"]), s["unigram_loss"])


def timed(command: list[str]) -> float:
    print("+", " ".join(command), flush=True)
    start = time.monotonic()
    subprocess.run(command, check=True, cwd=ROOT)
    return time.monotonic() - start


def run_search(space: str, name: str, results: Path, num_cpus: int, sets: Sequence[str]) -> Search:
    """``python -m lmtune.run`` then ``python -m lmtune.analyze``, each timed."""
    folder = results / name
    extra = [arg for kv in sets for arg in ("--set", kv)]
    run_s = timed([sys.executable, "-m", "lmtune.run", "--space", space, "--name", name, "--results", str(results),
                   "--num-cpus", str(num_cpus), *extra])
    analyze_s = timed([sys.executable, "-m", "lmtune.analyze", str(folder)])
    # (kept beside the search: a rerun with --search-dir, after the baseline failed, still has its times)
    (folder / TIMES_FILE).write_text(json.dumps({"run_s": run_s, "analyze_s": analyze_s}))
    return Search(folder, read_summary(folder), run_s, analyze_s)


def read_summary(folder: Path) -> dict:
    return json.loads((folder / "report" / "summary.json").read_text())


def searched(folder: Path) -> Search:
    """An edge search this benchmark ran before (--search-dir), with its times where it wrote them."""
    times = json.loads((folder / TIMES_FILE).read_text()) if (folder / TIMES_FILE).is_file() else {}
    return Search(folder, read_summary(folder), times.get("run_s"), times.get("analyze_s"))


def overrides(sets: Sequence[str]) -> dict:
    import yaml

    return {key: yaml.safe_load(value) for key, value in (kv.split("=", 1) for kv in sets)}


def fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.3g}"


def table(search: Search, baseline: Baseline, estimate: int | None, load: tuple[float, ...]) -> list[str]:
    """The one table: tokens and wall time of each, the ratio, and each one's answers."""
    s, b = search.summary, baseline
    ratio = search.tokens / b.tokens
    losses = ", ".join(f"{x:.3f}" for x in b.best_losses)
    lines = [
        "| | edge search | careful ASHA baseline (measured) |", "|---|---|---|",
        f"| tokens | {search.tokens:,} | {b.tokens:,} (estimate in the report: {estimate:,}) |"
        if estimate else f"| tokens | {search.tokens:,} | {b.tokens:,} |",
        f"| wall time | {search.run_s or 0:.0f} s (+ analyze {search.analyze_s or 0:.0f} s) | {b.wall_s:.0f} s |",
        f"| search / baseline tokens | {100 * ratio:.0f}% | |",
        f"| best LR | {fmt(s.get('best_lr'))} ({', '.join(f'{x:.3f}' for x in s.get('best_lr_seed_losses', []))}) "
        f"| {fmt(b.best_lr)} ({losses}) |",
        f"| failing bracket | ({fmt(s.get('failing_lr_low'))}, {fmt(s.get('failing_lr'))}] "
        f"| ({fmt(b.bracket[0] if b.bracket else None)}, {fmt(b.bracket[1] if b.bracket else None)}] |",
        f"| divergence LR | {fmt(s.get('divergence_lr'))} | {fmt(b.divergence_lr)} (smallest LR a run diverged at) |",
        f"| runs | {len(s['trials'])} trials | {len(b.runs)} trials ({stage_text(b)}) |"]
    return [*lines, f"load average (1, 5, 15 min) at the end: {', '.join(f'{x:.1f}' for x in load)}"]


def stage_text(baseline: Baseline) -> str:
    return ", ".join(f"{stage} {tokens:,}" for stage, tokens in baseline.stage_tokens().items())


def row(args: argparse.Namespace, search: Search, baseline: Baseline, spec: Spec,
        loads: dict[str, tuple[float, ...]]) -> dict:
    s = search.summary
    return {"benchmark": "careful_baseline", "commit": args.commit, "device": f"{os.cpu_count()}-core CPU "
            "(this machine, other agents' work beside it)", "date": datetime.date.today().isoformat(),
            "command": " ".join(["python", "benchmarks/careful_baseline.py", *sys.argv[1:]]),
            "space": args.space, "sets": list(args.set), "num_cpus": args.num_cpus, "load_average": loads,
            "search": {"folder": str(search.folder), "tokens": search.tokens, "run_s": search.run_s,
                       "analyze_s": search.analyze_s, "best_lr": s.get("best_lr"),
                       "best_lr_seed_losses": s.get("best_lr_seed_losses"), "failing_lr_low": s.get("failing_lr_low"),
                       "failing_lr": s.get("failing_lr"), "divergence_lr": s.get("divergence_lr"),
                       "careful_baseline_estimate": (s.get("careful_baseline") or {}).get("tokens")},
            "baseline": {"tokens": baseline.tokens, "wall_s": baseline.wall_s, "best_lr": baseline.best_lr,
                         "best_lr_seed_losses": baseline.best_losses, "bracket": baseline.bracket,
                         "divergence_lr": baseline.divergence_lr, "stage_tokens": baseline.stage_tokens(),
                         "runs": [asdict(r) for r in baseline.runs], "spec": asdict(spec)},
            "search_over_baseline": search.tokens / baseline.tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--space", default="quick_edge")
    parser.add_argument("--set", action="append", default=[], help="KEY=VALUE on both (as lmtune.run --set)")
    parser.add_argument("--results", type=Path, default=ROOT / "results")
    parser.add_argument("--name", default=f"careful-{datetime.datetime.now():%Y%m%d-%H%M%S}")
    parser.add_argument("--num-cpus", type=int, default=2)
    parser.add_argument("--cpus-per-trial", type=float, default=1.0, help="as lmtune.run's default")
    parser.add_argument("--search-dir", type=Path, help="an edge search already run and analyzed: not run again")
    parser.add_argument("--no-row", action="store_true", help="write no results.jsonl row (a smoke test)")
    parser.add_argument("--commit", help="the code's commit (default: git's HEAD here; give it for a snapshot of "
                        "the code run outside the checkout)")
    args = parser.parse_args()
    args.commit = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                                text=True, cwd=ROOT).stdout.strip()
    loads = {"start": os.getloadavg()}
    search = (searched(args.search_dir) if args.search_dir else
              run_search(args.space, f"{args.name}-search", args.results, args.num_cpus, args.set))
    loads["after_search"] = os.getloadavg()
    spec = search.spec()
    print("baseline for", spec, flush=True)
    baseline = run_baseline(spec, args.space, args.set, args.results.resolve(), f"{args.name}-baseline",
                            args.num_cpus, args.cpus_per_trial)
    loads["end"] = os.getloadavg()
    estimate = (search.summary.get("careful_baseline") or {}).get("tokens")
    print("\n".join(table(search, baseline, estimate, loads["end"])))
    print("load average (1, 5, 15 min) at the start:", loads["start"], "after the search:", loads["after_search"])
    if not args.no_row:
        with RESULTS.open("a") as handle:
            handle.write(json.dumps(row(args, search, baseline, spec, loads)) + "\n")


if __name__ == "__main__":
    main()
