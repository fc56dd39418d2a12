"""Disk a sweep's checkpoints take: real checkpoint files of the CS336 17M model measured against
lmtune.sweep.disk's estimate, then a sweep's bytes under the old retention rule and the new one.

    python benchmarks/disk_usage.py --trials 24 --held-by-search 12
    python benchmarks/disk_usage.py --budget full --wsd --trials 40 --held-by-search 40 --json

Measured: one full periodic checkpoint (through the real Checkpointer: TrainState after one AdamW step, a
history of the run's-end length) and best.pt, at vocabulary 10,000 (CS336's TinyStories tokenizer) and
3,801 (the built-in corpus's). Computed from those bytes:

- before (the old rule): every trial keeps keep_checkpoints periodic checkpoints and best.pt in its
  checkpoints/ folder, Ray Tune 2 more copies of periodic checkpoints, nothing pruned when it ends
  (+ stable.pt for a WSD run): per sweep, trials x that.
- after (lmtune.sweep.disk.disk_need): the peak under --keep, with the search's held checkpoints.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lmtune.sweep.disk import CheckpointBytes, Keep, disk_need, format_bytes, history_rows  # noqa: E402
from lmtune.training.checkpoint import Checkpointer  # noqa: E402
from lmtune.training.config import RunConfig, budget_config  # noqa: E402
from lmtune.training.metrics import METRIC_COLUMNS  # noqa: E402
from lmtune.training.state import TrainState  # noqa: E402

VOCABS = (10_000, 3_801)
# Ray Tune's CheckpointConfig(num_to_keep=2) under the old rule: two more copies of periodic checkpoints.
TUNE_COPIES = 2


def run_end_history(config: RunConfig) -> list[dict]:
    """A history as long as the run's at its end, in the loop's row shape on a CPU (mfu and peak memory None,
    val_loss only where it evaluates)."""
    t, rows = config.train, []
    for step in (s for s in range(1, t.stop_step + 1) if t.logs_at(s)):
        row = {c: 1.0 + step / 7 for c in METRIC_COLUMNS}
        row.update(step=step, tokens=step * config.tokens_per_step, mfu=None, peak_memory_bytes=None,
                   above_init_steps=0, spikes=0, val_loss=row["val_loss"] if t.evaluates_at(step) else None)
        rows.append(row)
    assert len(rows) == history_rows(t)
    return rows


def measure(config: RunConfig, folder: Path) -> CheckpointBytes:
    """Bytes of a real full checkpoint and best.pt of ``config`` (both deleted once measured)."""
    state = TrainState.create(config, torch.device("cpu"))
    for p in state.model.parameters():  # one AdamW step: its moments and step tensors exist, as in any checkpoint
        p.grad = torch.full_like(p, 1e-3)
    state.optimizer.step()
    state.step = config.train.stop_step
    checkpointer = Checkpointer(folder, keep=config.train.keep_checkpoints)
    full = checkpointer.save(state, config, run_end_history(config))
    best = checkpointer.save_best(state, config, val_loss=3.0)
    size = CheckpointBytes(full=full.stat().st_size, best=best.stat().st_size)
    for path in folder.iterdir():
        path.unlink()
    return size


def sweep_bytes(config: RunConfig, size: CheckpointBytes, args: argparse.Namespace) -> dict[str, int]:
    """Per-trial and per-sweep bytes before (old rule) and after (disk_need) from measured checkpoint sizes."""
    stable = size.full if config.train.fork_step is not None else 0
    before = (config.train.keep_checkpoints + TUNE_COPIES) * size.full + size.best + stable
    after = disk_need(config, args.trials, args.max_concurrent, Keep(args.keep), args.held_by_search, size=size)
    return {"before_per_trial": before, "before_sweep": args.trials * before,
            "after_per_running_trial": after.per_running_trial, "after_per_ended_trial": after.per_ended_trial,
            "after_held_by_search": after.held_by_search, "after_sweep": after.total}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", default="low-resource", help="the named budget (lr_edge: low-resource, "
                        "lr_horizon: full); its steps set the history's length")
    parser.add_argument("--trials", type=int, default=24)
    parser.add_argument("--max-concurrent", type=int, default=1)
    parser.add_argument("--keep", choices=[k.value for k in Keep], default=Keep.BEST.value)
    parser.add_argument("--held-by-search", type=int, default=0, help="full checkpoints a deciding search holds")
    parser.add_argument("--wsd", action="store_true", help="schedule=wsd: every run also writes stable.pt")
    parser.add_argument("--json", action="store_true", help="also print one JSON line of every figure")
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="lmtune-disk-") as tmp:
        for vocab in VOCABS:
            overrides = {"vocab_size": vocab, "device": "cpu", **({"schedule": "wsd"} if args.wsd else {})}
            config = budget_config(args.budget, overrides)
            size, estimate = measure(config, Path(tmp)), CheckpointBytes.of(config)
            results.append({"vocab_size": vocab, "full": size.full, "best": size.best,
                            "estimate_full": estimate.full, "estimate_best": estimate.best,
                            **sweep_bytes(config, size, args)})
    print_tables(results, args)
    if args.json:
        print(json.dumps({"settings": vars(args), "results": results}))
    return 0


def print_tables(results: list[dict], args: argparse.Namespace) -> None:
    print(f"checkpoint files, budget {args.budget}{' (wsd)' if args.wsd else ''}: measured vs estimate")
    print("| vocab | full (measured) | full (estimate) | error | best.pt (measured) | best.pt (estimate) | error |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        err_full = (r["estimate_full"] - r["full"]) / r["full"]
        err_best = (r["estimate_best"] - r["best"]) / r["best"]
        print(f"| {r['vocab_size']:,} | {r['full']:,} | {r['estimate_full']:,} | {err_full:+.4%} | {r['best']:,} "
              f"| {r['estimate_best']:,} | {err_best:+.4%} |")
    print(f"\nsweep of {args.trials} trials, max-concurrent {args.max_concurrent}, keep {args.keep}, "
          f"held by search {args.held_by_search} (computed from the measured bytes)")
    print("| vocab | before: per trial | before: sweep | after: per running trial | after: per ended trial "
          "| after: held by search | after: sweep | after / before |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['vocab_size']:,} | {format_bytes(r['before_per_trial'])} | {format_bytes(r['before_sweep'])} "
              f"| {format_bytes(r['after_per_running_trial'])} | {format_bytes(r['after_per_ended_trial'])} "
              f"| {format_bytes(r['after_held_by_search'])} | {format_bytes(r['after_sweep'])} "
              f"| {r['after_sweep'] / r['before_sweep']:.2f} |")


if __name__ == "__main__":
    sys.exit(main())
