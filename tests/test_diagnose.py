"""diagnose runs on CPU and prints its verdict; sweep progress from hand-built trial dirs."""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace

import pytest
from conftest import BENCH_MODEL, grid_sweep_record

from lmtune import diagnose
from lmtune.sweep.record import read_outcomes
from lmtune.tools import environment, progress
from lmtune.tools.environment import NvmlSample
from lmtune.tools.throughput import benchmark
from lmtune.tools.throughput.results import BenchResult
from lmtune.training.config import RunConfig
from lmtune.training.metrics import METRIC_COLUMNS

TINY_SETS = ["--steps", "2", "--repeats", "1", "--device", "cpu", "--batch-size", "2"]


@pytest.mark.slow
def test_diagnose_environment_on_cpu(capsys, monkeypatch):
    real = benchmark.bench_config

    def tiny_config(name, batch_size=None, overrides=None, device="auto", compile_choice="auto"):
        overrides = {**(overrides or {}), **BENCH_MODEL}
        return real(name, batch_size, overrides, device, compile_choice)

    monkeypatch.setattr(benchmark, "bench_config", tiny_config)
    assert diagnose.main(TINY_SETS) == 0
    out = capsys.readouterr().out
    for needle in ("device:", "torch:", "CUDA: n/a (no CUDA device)", "bf16: n/a (no CUDA device)",
                   "TF32: n/a (no CUDA device)", "torch.compile:", "free host memory:", "benchmark (quick",
                   "tokens/s", "MFU", "data wait", "GPU clocks/temperature/power: n/a (no CUDA device)",
                   "data loading:", "verdict:"):
        assert needle in out, needle


# A healthy CUDA benchmark: compiled, bf16, in the expected MFU range, no data stall.
HEALTHY = BenchResult(
    config="default", device="NVIDIA H100 80GB HBM3", device_type="cuda", torch="2.13", commit="abc1234",
    batch_size=64, context_length=256, params_non_embedding=17_600_000, steps=10, repeats=3, warmup=3,
    tokens_per_s=2.6e6, mfu=0.4, flops_per_token=112e6, peak_flops=989e12, peak_flops_source="data-sheet dense bf16",
    optimized_variant="compiled", compile_mode="default", precision="bfloat16", attention_kernel="flash",
    host_syncs_per_step=0, step_s=0.006, data_wait_s=0.000006, compute_s=0.005994, data_wait_fraction=0.001,
    peak_memory_bytes=2**33, peak_memory_kind="cuda max_memory_allocated", peak_reserved_bytes=2**33,
    warmup_s={"compiled": 30.0}, timed_tokens=3 * 10 * 64 * 256, load_avg_1m=1.0, eval_s=None, eval_fraction=None,
    repeat_tokens_per_s={"compiled": [2.6e6] * 3}, variant_tokens_per_s={"compiled": 2.6e6}, compile=None,
    naive=None, timed_span=None)


def test_verdict_flags_stall_and_throttling():
    result = replace(HEALTHY, mfu=0.05, data_wait_fraction=0.10, precision="float32", optimized_variant="eager")
    nvml = environment.summarize_nvml(
        [NvmlSample(sm_clock_mhz=1200, temperature_c=91, power_w=690.0, reasons=0x40 | 0x4, utilization=99)],
        1980, 700.0)
    ok, advice = environment.verdict(result, "cuda", nvml, compile_ok=False)
    text = "\n".join(advice)
    assert not ok
    for needle in ("data-loader stall", "THERMAL THROTTLING", "POWER THROTTLING", "bf16", "compile"):
        assert needle in text, needle
    ok, advice = environment.verdict(HEALTHY, "cuda", None, compile_ok=True)
    assert ok and not advice


def _trial(root, name, lr, steps_done, total_steps, rate, summary=None, age_s=0.0):
    d = root / name
    d.mkdir(parents=True)
    config = RunConfig()
    config.train.lr, config.train.steps, config.train.batch_size, config.model.context_length = lr, total_steps, 4, 8
    (d / "config.json").write_text(json.dumps(config.to_dict()))
    lines = [",".join(METRIC_COLUMNS)]
    for step in range(10, steps_done + 1, 10):
        row = {c: "" for c in METRIC_COLUMNS}
        row.update(step=step, tokens=step * 32, train_loss=3.0, tokens_per_s=rate)
        lines.append(",".join(str(row[c]) for c in METRIC_COLUMNS))
    (d / "metrics.csv").write_text("\n".join(lines) + "\n")
    if age_s:
        old = time.time() - age_s
        os.utime(d / "metrics.csv", (old, old))
    if summary is not None:
        (d / "summary.json").write_text(json.dumps(summary))


def test_diagnose_sweep_dir(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    grid_sweep_record("sweep", [1e-4, 1e-3, 1e-2, 1e-1], RunConfig()).write(sweep)  # 4 trials planned
    _trial(sweep, "trials/lr_1e-4", 1e-4, 100, 100, 500.0,
           summary={"status": "completed", "steps": 100, "tokens": 3200, "tokens_per_s": 480.0, "wall_time_s": 6.7})
    _trial(sweep, "trials/lr_1e-3", 1e-3, 50, 100, 400.0)  # running: half done
    _trial(sweep, "lr_1e-2", 1e-2, 20, 100, 300.0, age_s=3600)  # no summary, stale: stopped
    assert diagnose.main([str(sweep)]) == 0
    out = capsys.readouterr().out
    assert "trials/lr_1e-4" in out and "completed" in out and "100.0%" in out
    assert "running" in out and "50.0%" in out
    assert "stopped" in out and "20.0%" in out
    # Running trial: 1600 tokens left at 400 tokens/s = 4 s; plus one trial not started (3200 tokens).
    assert "4s" in out
    assert "sweep ETA: 12s" in out and "1 trials not started" in out

    trials, record = progress.sweep_status(sweep)
    eta, remaining, pending = progress.sweep_eta(trials, record)
    assert (remaining, pending) == (1600 + 3200, 1) and eta == 12.0


def test_diagnose_not_a_sweep_dir(tmp_path, capsys):
    (tmp_path / "stuff.txt").write_text("x")
    assert diagnose.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "not a sweep dir" in err and len(err.splitlines()) == 1
    assert diagnose.main([str(tmp_path / "missing")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


@pytest.mark.slow
def test_diagnose_a_real_sweep_shows_each_trials_outcome_from_the_ledger(quick_sweep):
    trials, record = progress.sweep_status(quick_sweep)
    assert record.num_trials == len(trials) == 6
    outcomes = read_outcomes(quick_sweep)
    for trial in trials:
        (entry,) = [e for trial_id, e in outcomes.items() if trial.name.startswith(f"{trial_id}_")]
        assert trial.status == entry["outcome"]
    # every trial ended and none is left to start: nothing remains, so the ETA is 0 s, said as done
    assert progress.sweep_eta(trials, record) == (0.0, 0, 0)
    assert progress.format_sweep(quick_sweep, trials, record).splitlines()[-1] == \
        "sweep ETA: done (no trial running or pending)"
