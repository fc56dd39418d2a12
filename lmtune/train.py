"""The training loop: one model, fast, checkpointed, resumable. Also ``python -m lmtune.train``.

``train()`` is what both the CLI and the Ray Tune trainable call. Per run it writes into ``out_dir``:
config.json, metrics.csv, summary.json, training.log, checkpoints/, TensorBoard events,
loss_curves.png and lr_schedule.png.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from lmtune import checkpoint as ckpt
from lmtune.config import BUDGETS, RunConfig, apply_overrides, budget_config, parse_set_args
from lmtune.data import BatchSampler, DeviceBatches, fixed_val_batches, load_data
from lmtune.errors import LmtuneError, cli_entry, setup_cli_logging
from lmtune.hardware import peak_flops, resolve_device
from lmtune.model import TransformerLM, count_parameters, flops_per_token
from lmtune.schedule import lr_at

# Not __name__: under `python -m lmtune.train` that is "__main__", outside the "lmtune" logger training.log hangs on.
log = logging.getLogger("lmtune.train")

METRIC_COLUMNS = [
    "step", "tokens", "train_loss", "val_loss", "lr", "grad_norm", "tokens_per_s", "mfu",
    "data_wait_s", "compute_s", "peak_memory_bytes", "attn_logit_max", "output_logit_max",
    "output_logz_mean", "elapsed_s",
]

# Called at every log interval with the metrics row and, when one was just written, the checkpoint.
CPU_COMPILE_MIN_FLOPS_PER_TOKEN = 50e6

Reporter = Callable[[dict[str, Any], Path | None], None]
# Called before each optimizer step with the 1-based step number and the model (instrumentation, fault tests).
StepHook = Callable[[int, nn.Module], None]


@dataclass
class RunResult:
    status: str  # completed | diverged | stopped
    summary: dict[str, Any]
    out_dir: Path
    history: list[dict[str, Any]] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# Set-up pieces


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state(device: torch.device) -> dict[str, Any]:
    np_state = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "python": _tuples_to_lists(random.getstate()),
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    random.setstate(_lists_to_tuples(state["python"]))
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def _tuples_to_lists(value):
    return [_tuples_to_lists(v) for v in value] if isinstance(value, (tuple, list)) else value


def _lists_to_tuples(value):
    return tuple(_lists_to_tuples(v) for v in value) if isinstance(value, list) else value


def build_optimizer(model: nn.Module, config: RunConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on RMSNorm gains); fused kernels on CUDA."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    t = config.train
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": t.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=t.lr, betas=(t.beta1, t.beta2), eps=t.eps, fused=device.type == "cuda",
    )


def configure_backend(device: torch.device) -> None:
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.set_float32_matmul_precision("high")


def autocast_dtype(config: RunConfig, device: torch.device) -> torch.dtype | None:
    precision = config.train.precision
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None


def should_compile(config: RunConfig, device: torch.device) -> bool:
    choice = config.train.compile
    if choice == "on":
        return True
    if choice == "off":
        return False
    if device.type in ("cuda", "mps"):
        return True
    # CPU, measured (benchmarks/README.md): compile made the default model (112 MFLOP/token) 1.4-1.8x
    # faster, while for small models like quick (10.6 MFLOP/token) its ~65 s cold start and Inductor's
    # CPU code lose to eager ATen over a minutes-long run.
    return flops_per_token(config.model) >= CPU_COMPILE_MIN_FLOPS_PER_TOKEN


def compile_model(model: nn.Module, device: torch.device) -> nn.Module:
    """torch.compile with a log line saying so; a failure falls back to eager with a visible warning."""
    backend = "aot_eager" if device.type == "mps" else "inductor"
    try:
        compiled = torch.compile(model, backend=backend)
        log.info("torch.compile active (backend=%s)", backend)
        return compiled
    except Exception as err:  # noqa: BLE001 - any compile failure must degrade, loudly, to eager
        log.warning("torch.compile FAILED (%s): training in eager mode, expect lower throughput", err)
        print(f"WARNING: torch.compile failed ({err}); running eager (slower)", file=sys.stderr)
        return model


# ---------------------------------------------------------------------------------------------
# Output files


class RunLogger:
    """metrics.csv + TensorBoard + training.log for one run; resumable at a given step."""

    def __init__(self, out_dir: Path, resume_step: int):
        self.out_dir = out_dir
        self.csv_path = out_dir / "metrics.csv"
        self.rows = self._read_rows(resume_step)
        self._rewrite_csv()
        self._csv_file = open(self.csv_path, "a", newline="")
        self._csv = csv.DictWriter(self._csv_file, fieldnames=METRIC_COLUMNS, extrasaction="ignore")
        from tensorboardX import SummaryWriter

        self.tb = SummaryWriter(str(out_dir / "tensorboard"), purge_step=resume_step or None)
        self.file_handler = logging.FileHandler(out_dir / "training.log")
        self.file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logging.getLogger("lmtune").addHandler(self.file_handler)
        if logging.getLogger("lmtune").getEffectiveLevel() > logging.INFO:
            logging.getLogger("lmtune").setLevel(logging.INFO)

    def _read_rows(self, resume_step: int) -> list[dict[str, Any]]:
        """Rows already logged up to the checkpoint we resume from (later ones are redone)."""
        if not resume_step or not self.csv_path.exists():
            return []
        with open(self.csv_path, newline="") as handle:
            rows = [_parse_row(r) for r in csv.DictReader(handle)]
        return [r for r in rows if r["step"] <= resume_step]

    def _rewrite_csv(self) -> None:
        import io

        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=METRIC_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(self.rows)
        ckpt.atomic_write_text(self.csv_path, buffer.getvalue())

    def write(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        self._csv.writerow(row)
        self._csv_file.flush()
        for key, value in row.items():
            if key not in ("step",) and isinstance(value, (int, float)) and math.isfinite(value):
                self.tb.add_scalar(key, value, row["step"])
        self.tb.flush()

    def close(self) -> None:
        self._csv_file.close()
        writers = list((self.tb.all_writers or {}).values())
        self.tb.close()
        for writer in writers:  # tensorboardX's atexit hook would close them again and print a traceback
            writer.event_writer.close = lambda: None
        logging.getLogger("lmtune").removeHandler(self.file_handler)
        self.file_handler.close()


def _parse_row(raw: dict[str, str]) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for key, value in raw.items():
        if value in ("", None):
            row[key] = None
        elif key in ("step", "tokens", "peak_memory_bytes"):
            row[key] = int(float(value))
        else:
            row[key] = float(value)
    return row


def read_metrics(path: Path) -> list[dict[str, Any]]:
    with open(path, newline="") as handle:
        return [_parse_row(r) for r in csv.DictReader(handle)]


# ---------------------------------------------------------------------------------------------
# The loop


def resolve_config(config: RunConfig, data_dir: Path) -> RunConfig:
    """Take vocab_size from the data's meta.json unless it was set explicitly."""
    from lmtune.data import read_meta

    meta = read_meta(data_dir)
    config = apply_overrides(config, {}, where="config")
    if config.vocab_from_data:
        config.model.vocab_size = meta.vocab_size
    config.data_dir = str(data_dir)
    return config


def forward_backward(run_model: nn.Module, params: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                     amp_dtype: torch.dtype | None, grad_clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Loss and (clipped) gradient norm of one batch, both left on the device (no host sync).
    The optimizer step follows separately so a non-finite step can be refused before it lands."""
    with torch.autocast(x.device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
        loss = run_model(x, y)
    loss.backward()
    if grad_clip > 0:
        grad_norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
    else:
        grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    return loss.detach(), grad_norm


@torch.no_grad()
def evaluate(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], device: torch.device,
             amp_dtype: torch.dtype | None) -> float:
    model.eval()
    total = torch.zeros((), device=device)
    for x, y in batches:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            total += model(x, y).float()
    model.train()
    return (total / len(batches)).item()


def train(
    config: RunConfig,
    out_dir: Path,
    *,
    resume: bool = False,
    resume_from: Path | None = None,
    reporter: Reporter | None = None,
    before_step: StepHook | None = None,
) -> RunResult:
    """Train one model as ``config`` says, writing everything to ``out_dir``.

    ``resume`` continues from the newest verified checkpoint in out_dir/checkpoints (a fresh start
    if there is none); ``resume_from`` names a checkpoint file explicitly (Ray Tune's restore).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    data_dir = Path(config.data_dir)
    config = resolve_config(config, data_dir)
    m, t = config.model, config.train
    data = load_data(data_dir, m.context_length, m.vocab_size)
    device = resolve_device(t.device)
    configure_backend(device)
    amp_dtype = autocast_dtype(config, device)
    seed_everything(t.seed)

    model = TransformerLM(m).to(device)
    optimizer = build_optimizer(model, config, device)
    ckpt_dir = out_dir / "checkpoints"

    state, resumed_path = None, resume_from
    if resume_from is not None:
        state = ckpt.load_checkpoint(resume_from)
    elif resume:
        found = ckpt.load_latest(ckpt_dir)
        state = found[0] if found else None
        resumed_path = found[1] if found else None
    start_step, best_val, elapsed_before = 0, math.inf, 0.0
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_step, best_val = state["step"], state["best_val_loss"]
        elapsed_before = state.get("elapsed_s", 0.0)
        restore_rng_state(state["rng"], device)
    ckpt.atomic_write_text(out_dir / "config.json", config.to_json())

    logger = RunLogger(out_dir, start_step)
    if state is not None:  # after RunLogger: it attaches training.log, which must record every resume
        log.info("resuming from %s (step %d)", resumed_path, start_step)
    counts = count_parameters(m)
    flops_tok = flops_per_token(m)
    peak = peak_flops(device)
    log.info("device=%s params: non-embedding %.2fM, total %.2fM; %.1f MFLOP/token; %d steps x %d tokens",
             device, counts["non_embedding"] / 1e6, counts["total"] / 1e6, flops_tok / 1e6, t.steps,
             config.tokens_per_step)
    run_model = compile_model(model, device) if should_compile(config, device) else model
    if run_model is model:
        why = "CPU default for small models: eager measured faster" if t.compile == "auto" else "compile=off"
        log.info("torch.compile off (%s)", why)

    sampler = BatchSampler(data.train, t.batch_size, m.context_length, t.seed)
    val_batches = fixed_val_batches(data.val, t.batch_size, m.context_length, t.eval_batches, seed=t.seed + 1)
    batches = DeviceBatches(sampler, device, start_step=start_step)
    params = [p for p in model.parameters()]
    check_every_step = device.type == "cpu"  # a host sync is free on CPU; on GPU check at log intervals

    status, diverged_step, reason = "completed", None, ""
    last_val = next((r["val_loss"] for r in reversed(logger.rows) if r.get("val_loss") is not None), None)
    loss_sum = torch.zeros((), device=device)
    first_bad = torch.full((), -1, dtype=torch.long, device=device)
    interval_steps, interval_wait = 0, 0.0
    interval_start = time.perf_counter()
    run_start = time.perf_counter()
    step = start_step
    grad_norm = torch.zeros((), device=device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    def checkpoint_state(at_step: int) -> dict[str, Any]:
        return {
            "model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": at_step,
            "best_val_loss": best_val, "rng": rng_state(device), "sampler": {"seed": t.seed, "next_step": at_step},
            "elapsed_s": elapsed_before + time.perf_counter() - run_start,
            "history": [dict(r) for r in logger.rows], "config": config.to_dict(),
        }

    try:
        for step_index in range(start_step, t.steps):
            step = step_index + 1
            lr = lr_at(step_index, t.lr, t.min_lr_ratio, t.warmup_steps, t.steps)
            for group in optimizer.param_groups:
                group["lr"] = lr
            if before_step is not None:
                before_step(step, model)
            x, y = batches.next()
            interval_wait += batches.last_wait_s
            loss, grad_norm = forward_backward(run_model, params, x, y, amp_dtype, t.grad_clip)
            bad = ~(torch.isfinite(loss) & torch.isfinite(grad_norm))
            if check_every_step and bad.item():
                status, diverged_step = "diverged", step
                reason = f"non-finite {'loss' if not math.isfinite(loss.item()) else 'gradient norm'} at step {step}"
                break
            first_bad = torch.where(bad & (first_bad < 0), torch.full_like(first_bad, step), first_bad)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            loss_sum += loss.float()
            interval_steps += 1

            is_last = step == t.steps
            do_eval = step % t.eval_interval == 0 or is_last
            do_ckpt = step % t.checkpoint_interval == 0 or is_last
            if not (step % t.log_interval == 0 or do_eval or do_ckpt):
                continue

            # ---- log interval: the only host syncs of the loop ----
            bad_step = int(first_bad.item())
            if bad_step >= 0:
                status, diverged_step = "diverged", bad_step
                reason = f"non-finite loss or gradient norm at step {bad_step}"
                break
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            now = time.perf_counter()
            wall = now - interval_start
            tokens_per_s = interval_steps * config.tokens_per_step / wall
            val_loss = None
            if do_eval:
                val_loss = evaluate(run_model, val_batches, device, amp_dtype)
                last_val = val_loss
                if not math.isfinite(val_loss):
                    status, diverged_step, reason = "diverged", step, f"non-finite validation loss at step {step}"
                    break
            probes = model.stability_probes(x[:2])
            row = {
                "step": step, "tokens": step * config.tokens_per_step,
                "train_loss": (loss_sum / interval_steps).item(), "val_loss": val_loss, "lr": lr,
                "grad_norm": float(grad_norm), "tokens_per_s": tokens_per_s,
                "mfu": tokens_per_s * flops_tok / peak if peak else None,
                "data_wait_s": interval_wait / interval_steps,
                "compute_s": (wall - interval_wait) / interval_steps,
                "peak_memory_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
                "elapsed_s": elapsed_before + now - run_start, **probes,
            }
            logger.write(row)
            log.info("step %d/%d loss %.4f%s lr %.3g gnorm %.3g %.0f tok/s", step, t.steps, row["train_loss"],
                     f" val {val_loss:.4f}" if val_loss is not None else "", lr, row["grad_norm"], tokens_per_s)
            written = None
            if val_loss is not None and val_loss < best_val:
                best_val = val_loss
                ckpt.save_checkpoint({"model": model.state_dict(), "step": step, "val_loss": val_loss,
                                      "config": config.to_dict()}, ckpt_dir / ckpt.BEST_NAME)
            if do_ckpt:
                written = ckpt.save_checkpoint(checkpoint_state(step), ckpt.periodic_path(ckpt_dir, step))
                ckpt.rotate(ckpt_dir, t.keep_checkpoints)
            if reporter is not None:
                reporter(row, written)
            loss_sum.zero_()
            interval_steps, interval_wait = 0, 0.0
            interval_start = time.perf_counter()
    except KeyboardInterrupt:
        status, reason = "stopped", f"interrupted at step {step}"
        log.warning("interrupted: the newest checkpoint is kept; continue with --resume")
    except BaseException:
        logger.close()  # else training.log stays attached to the "lmtune" logger and metrics.csv open
        raise
    finally:
        batches.close()

    wall_time = elapsed_before + time.perf_counter() - run_start
    completed_steps = step if status == "completed" else (diverged_step - 1 if diverged_step else step)
    summary = {
        "status": status, "reason": reason, "best_val_loss": best_val if math.isfinite(best_val) else None,
        "final_val_loss": last_val if status == "completed" else None, "last_val_loss": last_val,
        "steps": completed_steps, "tokens": completed_steps * config.tokens_per_step, "wall_time_s": wall_time,
        "tokens_per_s": completed_steps * config.tokens_per_step / wall_time if wall_time > 0 else None,
        "diverged_step": diverged_step, "budget": config.budget, "lr": t.lr,
        "params_non_embedding": counts["non_embedding"], "flops_per_token": flops_tok,
    }
    ckpt.atomic_write_text(out_dir / "summary.json", json.dumps(summary, indent=2))
    write_run_plots(out_dir, logger.rows, config)
    logger.close()
    if status == "diverged":
        log.warning("run diverged: %s", reason)
        if reporter is not None:  # last: a sweep may end this process as soon as it sees the divergence
            reporter({"step": diverged_step, "tokens": diverged_step * config.tokens_per_step,
                      "train_loss": float("nan"), "lr": lr_at(diverged_step - 1, t.lr, t.min_lr_ratio,
                                                                t.warmup_steps, t.steps),
                      "diverged": True, "diverged_step": diverged_step}, None)
    log.info("%s: %s", status, json.dumps({k: summary[k] for k in ("best_val_loss", "steps", "tokens_per_s")}))
    return RunResult(status, summary, out_dir, logger.rows)


def write_run_plots(out_dir: Path, rows: list[dict[str, Any]], config: RunConfig) -> None:
    from lmtune.plots import plot_loss_curves, plot_lr_schedule

    t = config.train
    plot_loss_curves(rows, out_dir / "loss_curves.png", title=f"lr={t.lr:g} ({config.budget})")
    stride = max(1, t.steps // 500)
    steps = list(range(0, t.steps, stride)) + [t.steps - 1]
    plot_lr_schedule([s + 1 for s in steps], [lr_at(s, t.lr, t.min_lr_ratio, t.warmup_steps, t.steps) for s in steps],
                     out_dir / "lr_schedule.png")


# ---------------------------------------------------------------------------------------------
# CLI


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lmtune.train", description="Train one language model.")
    parser.add_argument("--data", type=Path, help="prepared data dir (default: the built-in corpus)")
    parser.add_argument("--budget", default="quick", choices=list(BUDGETS), help="named budget (default: quick)")
    parser.add_argument("--lr", type=float, help="peak learning rate")
    parser.add_argument("--out", type=Path, help="output dir (default: results/train-BUDGET-TIMESTAMP)")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", default=[],
                        help="override any model/training field, e.g. --set batch_size=64 (repeatable)")
    parser.add_argument("--quiet", action="store_true", help="only warnings and the final summary")
    return parser


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_cli_logging(logging.WARNING if args.quiet else logging.INFO)
    overrides = parse_set_args(args.set)
    if args.lr is not None:
        overrides["lr"] = args.lr
    if args.data is None:
        from lmtune.prepare import ensure_builtin_corpus

        data_dir = ensure_builtin_corpus()
    else:
        data_dir = args.data
    config = budget_config(args.budget, overrides, data_dir=str(data_dir))
    out = args.out or Path("results") / f"train-{args.budget}-{time.strftime('%Y%m%d-%H%M%S')}"
    if args.resume and not (out / "config.json").exists():
        raise LmtuneError(f"--resume: {out} holds no training run (no config.json); drop --resume to start one")
    if not args.resume and out.exists() and any(out.iterdir()):
        raise LmtuneError(f"{out} already holds files; pass --resume to continue it or choose another --out")
    if args.resume:
        saved = RunConfig.from_dict(json.loads((out / "config.json").read_text()))
        config = apply_overrides(saved, overrides) if overrides else saved
    result = train(config, out, resume=args.resume)
    s = result.summary
    best = f"{s['best_val_loss']:.4f}" if s["best_val_loss"] is not None else "n/a"
    print(f"{result.status}: {s['steps']} steps, {s['tokens']:,} tokens, best val loss {best}, "
          f"{s['tokens_per_s'] or 0:,.0f} tokens/s, {s['wall_time_s']:.1f} s -> {out}")
    return 0 if result.status in ("completed", "stopped") else 1


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
