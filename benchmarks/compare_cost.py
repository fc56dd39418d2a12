"""The compare search's tokens against independent ASHA edge searches, one per variant (issue 55 item 3).

    python benchmarks/compare_cost.py --space quick_ablations

First the compare search (``python -m lmtune.run`` then ``python -m lmtune.analyze``, as subprocesses); then, for
each of its variants, an edge search with the settings the compare search gives that variant: a space written from
the compare space (``search: edge``, the same budget and scheduler, ``set:`` the space's set with the variant's on
top, ``edge:`` the compare space's edge section), run and analyzed the same way, one after another.

Tokens are counted as the report counts them: each trial's own tokens (its newest metrics row, less what a
continued run copied from its source: lmtune.findings.stability.tokens_spent) and each range test's (its
range_test.json). The compare search's runs of a later variant at the reference's best LR (stage ``at_reference``)
are counted apart: extra information the compare gives, which no independent search trains. Prints one table,
checks the per-variant sums against each summary.json, and appends one row to benchmarks/results.jsonl.

Every sweep is a fresh process that imports lmtune from this checkout: run it where nothing edits lmtune/ meanwhile
(``git worktree add`` of the commit measured). Sweeps already run under ``--name`` are read back, not run again. Wall
times are the sweeps' on this machine as loaded; the row keeps the load average at the start and the end.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lmtune.findings.stability import TrialRecord, tokens_spent  # noqa: E402
from lmtune.report.reader import load_sweep  # noqa: E402 (lmtune from this checkout)
from lmtune.searches.compare.search import AT_REFERENCE  # noqa: E402
from lmtune.searches.compare.settings import Variant  # noqa: E402
from lmtune.searches.trial_order import RANGE_STAGE  # noqa: E402
from lmtune.sweep.record import trial_folders  # noqa: E402
from lmtune.sweep.spaces import resolve_space_path  # noqa: E402
from lmtune.training.config import budget_config  # noqa: E402
from lmtune.training.lr_range import read_range_test  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results.jsonl"
TIMES_FILE = "compare_cost_times.json"
STARTS = 3
# The compare space's own keys: an edge space has none of them (its edge: section is copied as it is).
COMPARE_KEYS = frozenset({"search", "description", "variants", "per_variant", "start", "params", "set"})
# What a variant's entry may set that this benchmark can give an edge search as its set: (a user's model or its
# arguments per variant, model:/model_set:, have no place in an edge space's set).
VARIANT_SETS = frozenset({"set", "batch_size"})
# The key an edge search's trials are counted under (they name no variant).
NO_VARIANT = ""


def edge_space(compare: Mapping, variant: str) -> dict:
    """The edge space of one variant of the ``compare`` space (its YAML as a dict): its set is the space's with the
    variant's on top (a batch_size variant's step counts scaled to the same tokens, as the compare search scales
    them: Variant.run_settings); budget, scheduler, edge section and every other top-level key as the space has."""
    entry = (compare.get("variants") or {})[variant] or {}
    if extra := sorted(set(entry) - VARIANT_SETS):
        raise SystemExit(f"variants.{variant}: {', '.join(extra)} has no edge-space equivalent in this benchmark; "
                         "it compares variants that set run settings or batch_size")
    given = {**(entry.get("set") or {}), **({"batch_size": entry["batch_size"]} if "batch_size" in entry else {})}
    base_set = dict(compare.get("set") or {})
    settings = Variant(variant, given).run_settings(budget_config(compare.get("budget", "low-resource"), base_set))
    space = {"description": f"variant {variant} of a compare space as an independent edge search "
                            "(benchmarks/compare_cost.py)", "search": "edge"}
    space |= {k: v for k, v in compare.items() if k not in COMPARE_KEYS}
    return {**space, "set": {**base_set, **settings}}


@dataclass
class Cost:
    """One variant's tokens in one sweep, by stage (the range test under RANGE_STAGE)."""

    stages: dict[str, int] = field(default_factory=dict)

    @property
    def at_reference(self) -> int:
        return self.stages.get(AT_REFERENCE, 0)

    @property
    def search(self) -> int:
        """What its own LR search trained: every stage but the runs at the reference's best LR."""
        return sum(self.stages.values()) - self.at_reference

    @property
    def total(self) -> int:
        return sum(self.stages.values())


def costs(records: Iterable[TrialRecord], range_tokens: Mapping[str | None, int]) -> dict[str, Cost]:
    """Each variant's Cost (NO_VARIANT: an edge search's trials) from its trial records, each counted as the report
    counts it (tokens_spent), and its range test's tokens (``range_tokens``: by variant, None for none)."""
    by: dict[str, Cost] = {}
    for variant, tokens in range_tokens.items():
        stages = by.setdefault(variant or NO_VARIANT, Cost()).stages
        stages[RANGE_STAGE] = stages.get(RANGE_STAGE, 0) + tokens
    for record in records:
        stages = by.setdefault(record.variant or NO_VARIANT, Cost()).stages
        stages[record.stage] = stages.get(record.stage, 0) + tokens_spent(record)
    return by


def sweep_costs(sweep: Path) -> dict[str, Cost]:
    """A sweep folder's Costs: its trials as the report loads them, and every range test (the report's compute
    line counts only the reference's: lmtune.report.writer)."""
    _, records = load_sweep(sweep)
    ranges: dict[str | None, int] = {}
    for folder in trial_folders(sweep):
        if folder.params.get("stage") == RANGE_STAGE and (result := read_range_test(folder.path)) is not None:
            variant = folder.params.get("variant")
            ranges[variant] = ranges.get(variant, 0) + result.tokens
    return costs(records, ranges)


def in_basin(lr: float | None, basin: Mapping | None) -> bool | None:
    """Whether ``lr`` lies within a summary's basin as far as it is bracketed: from the LR below its lowest to the one
    above its highest (None: no LR or no basin)."""
    if lr is None or not basin:
        return None
    low = (basin.get("low") or basin["lrs"])[0]
    high = (basin.get("high") or basin["lrs"])[-1]
    return low / 1.02 <= lr <= high * 1.02  # (lmtune.analysis.runs.SAME_LR: the same LR)


@dataclass
class Sweep:
    """One sweep this benchmark ran: its folder, its report's summary.json, its Costs and its wall times."""

    folder: Path
    summary: dict
    costs: dict[str, Cost]
    run_s: float
    analyze_s: float


def timed(command: list[str], folder: Path | None = None) -> float:
    """Seconds ``command`` took; a run that failed before making its sweep ``folder`` is tried again, up to
    STARTS times (on a loaded machine Ray's raylet misses its fixed 30 s to register, and nothing ran)."""
    for attempt in range(1, STARTS + 1):
        print("+", " ".join(command), flush=True)
        start = time.monotonic()
        done = subprocess.run(command, cwd=ROOT)
        if done.returncode == 0:
            return time.monotonic() - start
        if folder is None or folder.exists() or attempt == STARTS:
            raise subprocess.CalledProcessError(done.returncode, command)
        print(f"failed before its sweep folder was made; starting it again ({attempt} of {STARTS})", flush=True)
    raise AssertionError("unreachable")


def run_sweep(space: str, name: str, results: Path, num_cpus: int) -> Sweep:
    """``python -m lmtune.run`` then ``python -m lmtune.analyze`` of one space, each timed, read back; a sweep this
    benchmark already ran and analyzed under ``name`` (its times file beside its report) is read back, not run again:
    an invocation that failed part-way resumes at the sweep it failed in."""
    folder = results / name
    if (folder / TIMES_FILE).is_file():
        print("reusing", folder, flush=True)
        times = json.loads((folder / TIMES_FILE).read_text())
        summary = json.loads((folder / "report" / "summary.json").read_text())
        return Sweep(folder, summary, sweep_costs(folder), times["run_s"], times["analyze_s"])
    run_s = timed([sys.executable, "-m", "lmtune.run", "--space", space, "--name", name, "--results", str(results),
                   "--num-cpus", str(num_cpus), "--quiet", "--no-dashboard"], folder)
    analyze_s = timed([sys.executable, "-m", "lmtune.analyze", str(folder)])
    (folder / TIMES_FILE).write_text(json.dumps({"run_s": run_s, "analyze_s": analyze_s}))
    summary = json.loads((folder / "report" / "summary.json").read_text())
    return Sweep(folder, summary, sweep_costs(folder), run_s, analyze_s)


def run_all(space: str, name: str, results: Path, num_cpus: int) -> tuple[Sweep, dict[str, Sweep]]:
    """The compare search, then each variant's edge search (its space written beside the results)."""
    compare_yaml = yaml.safe_load(resolve_space_path(space).read_text())
    compare = run_sweep(space, f"{name}-compare", results, num_cpus)
    edges = {}
    for variant in compare_yaml["variants"]:
        path = results / f"{name}-edge-{variant}.yaml"
        path.write_text(yaml.safe_dump(edge_space(compare_yaml, variant), sort_keys=False))
        edges[variant] = run_sweep(str(path), f"{name}-edge-{variant}", results, num_cpus)
    return compare, edges


def checks(compare: Sweep, edges: Mapping[str, Sweep]) -> list[str]:
    """Where the counts here differ from what each summary.json says (none: an empty list): a compare row's tokens
    (its runs but its range test), an edge search's compute.tokens_spent (every trial and its range test)."""
    notes = []
    for row in compare.summary.get("compare") or []:
        cost = compare.costs.get(row["name"], Cost())
        mine = cost.total - cost.stages.get(RANGE_STAGE, 0)
        if mine != row["tokens"]:
            notes.append(f"compare {row['name']}: {mine:,} here, {row['tokens']:,} in summary.json")
    for variant, edge in edges.items():
        mine, theirs = edge.costs[NO_VARIANT].total, (edge.summary.get("compute") or {}).get("tokens_spent")
        if mine != theirs:
            notes.append(f"edge {variant}: {mine:,} here, {theirs} in summary.json")
    return notes


def answers(compare: Sweep, edges: Mapping[str, Sweep]) -> dict[str, dict]:
    """Each variant's best LR in both, and whether each lies in the other's basin."""
    rows = {row["name"]: row for row in compare.summary.get("compare") or []}
    out = {}
    for variant, edge in edges.items():
        mine, theirs = rows.get(variant) or {}, edge.summary
        out[variant] = {"compare_best_lr": mine.get("best_lr"), "edge_best_lr": theirs.get("best_lr"),
                        "compare_basin": mine.get("basin"), "edge_basin": theirs.get("basin"),
                        "compare_best_in_edge_basin": in_basin(mine.get("best_lr"), theirs.get("basin")),
                        "edge_best_in_compare_basin": in_basin(theirs.get("best_lr"), mine.get("basin"))}
    return out


def fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.3g}"


def agreement(answer: Mapping) -> str:
    both = (answer["compare_best_in_edge_basin"], answer["edge_best_in_compare_basin"])
    return {(True, True): "yes", (False, False): "NO"}.get(both, f"compare's in edge's basin: {both[0]}; "
                                                                  f"edge's in compare's: {both[1]}")


def table(compare: Sweep, edges: Mapping[str, Sweep]) -> list[str]:
    """Per variant: its part of the compare sweep against its own edge search, the best LR in each; then totals."""
    found = answers(compare, edges)
    lines = ["| variant | compare: its search | compare: at_reference | independent edge search | compare / edge | "
             "best LR (compare) | best LR (edge) | in each other's basin |", "|---|---|---|---|---|---|---|---|"]
    for variant, edge in edges.items():
        mine, theirs, answer = compare.costs.get(variant, Cost()), edge.costs[NO_VARIANT], found[variant]
        lines.append(f"| {variant} | {mine.search:,} | {mine.at_reference:,} | {theirs.total:,} | "
                     f"{100 * mine.search / theirs.total:.0f}% | {fmt(answer['compare_best_lr'])} | "
                     f"{fmt(answer['edge_best_lr'])} | {agreement(answer)} |")
    search = sum(c.search for c in compare.costs.values())
    extra = sum(c.at_reference for c in compare.costs.values())
    independent = sum(e.costs[NO_VARIANT].total for e in edges.values())
    lines += [f"| total | {search:,} | {extra:,} | {independent:,} | {100 * search / independent:.0f}% | | | |", "",
              f"compare / sum of independent edge searches: {100 * search / independent:.1f}% without its "
              f"at_reference runs, {100 * (search + extra) / independent:.1f}% with them "
              f"({search + extra:,} tokens in all)",
              f"wall time: compare {compare.run_s:.0f} s (+ analyze {compare.analyze_s:.0f} s); edge searches "
              + ", ".join(f"{v} {e.run_s:.0f} s" for v, e in edges.items())
              + f" ({sum(e.run_s for e in edges.values()):.0f} s)"]
    return lines


def checkout() -> dict:
    """The commit, and whether lmtune/ differs from it (other work in this checkout: the sweeps ran that code)."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    dirty = subprocess.run(["git", "status", "--porcelain", "lmtune"], capture_output=True, text=True, cwd=ROOT)
    return {"commit": commit.stdout.strip(), "lmtune_uncommitted_changes": bool(dirty.stdout.strip())}


def row(args: argparse.Namespace, compare: Sweep, edges: Mapping[str, Sweep], loads: dict, start: dict) -> dict:
    search = sum(c.search for c in compare.costs.values())
    extra = sum(c.at_reference for c in compare.costs.values())
    independent = sum(e.costs[NO_VARIANT].total for e in edges.values())
    return {"benchmark": "compare_cost", **checkout(), "at_start": start,
            "device": f"{os.cpu_count()}-core CPU (this machine, other agents' work beside it)",
            "date": datetime.date.today().isoformat(),
            "command": " ".join(["python", "benchmarks/compare_cost.py", *sys.argv[1:]]),
            "space": args.space, "num_cpus": args.num_cpus, "load_average": loads,
            "compare": {"folder": str(compare.folder), "run_s": compare.run_s, "analyze_s": compare.analyze_s,
                        "stage_tokens": {v: c.stages for v, c in compare.costs.items()}},
            "edge": {v: {"folder": str(e.folder), "run_s": e.run_s, "analyze_s": e.analyze_s,
                         "stage_tokens": e.costs[NO_VARIANT].stages} for v, e in edges.items()},
            "answers": answers(compare, edges), "compare_search_tokens": search, "at_reference_tokens": extra,
            "independent_tokens": independent, "compare_over_independent": search / independent,
            "compare_with_at_reference_over_independent": (search + extra) / independent,
            "summary_mismatches": checks(compare, edges)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--space", default="quick_ablations", help="a compare space: a shipped one or a YAML path")
    parser.add_argument("--results", type=Path, default=ROOT / "results")
    parser.add_argument("--name", default=f"compare-cost-{datetime.datetime.now():%Y%m%d-%H%M%S}",
                        help="sweeps NAME-compare, NAME-edge-VARIANT; those already run under it are read back")
    parser.add_argument("--num-cpus", type=int, default=2)
    parser.add_argument("--no-row", action="store_true", help="write no results.jsonl row (a smoke test)")
    args = parser.parse_args(argv)
    loads, start = {"start": os.getloadavg()}, checkout()
    compare, edges = run_all(args.space, args.name, args.results.resolve(), args.num_cpus)
    loads["end"] = os.getloadavg()
    print("\n".join(table(compare, edges)))
    for variant, sweep in [("compare", compare), *edges.items()]:
        print(f"{variant} tokens by stage:", {v: c.stages for v, c in sweep.costs.items()})
    print("summary.json disagrees:" if (notes := checks(compare, edges)) else "every sum matches summary.json", *notes)
    print("load average (1, 5, 15 min) at the start:", loads["start"], "at the end:", loads["end"])
    if not args.no_row:
        with RESULTS.open("a") as handle:
            handle.write(json.dumps(row(args, compare, edges, loads, start)) + "\n")


if __name__ == "__main__":
    main()
