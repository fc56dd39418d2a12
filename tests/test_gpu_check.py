"""``bash scripts/gpu_check.sh`` on a machine without a GPU (CI's): every step that needs CUDA says so, the
rest run as a smoke test on a tiny model, and the one JSON file a user would attach holds it all."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess

import pytest
from conftest import ENV, REPO

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("gpu_check") / "not" / "yet" / "report.json"  # its folder made at the end
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {**json.loads(out.read_text()), "printed": proc.stdout}


def _step(report: dict, prefix: str) -> dict:
    return next(s for s in report["steps"] if s["name"].startswith(prefix))


def test_without_a_gpu_the_report_says_so_and_skips_what_needs_one(report):
    assert report["gpu"] is False and "no figure is a GPU's" in report["note"]
    cuda = _step(report, "cuda tests")
    assert cuda["ran"] is False and cuda["skipped"] == "needs a CUDA GPU: none here"
    assert "cuda tests: needs a CUDA GPU: none here" in report["printed"]


def test_every_other_step_ran_and_its_figures_are_in_the_report(report):
    ran = [s for s in report["steps"] if s["ran"]]
    assert len(ran) == 5 and all(s["ok"] for s in ran)
    bench = _step(report, "bench (CPU smoke")["output"]
    assert math.isfinite(bench["tokens_per_s"]) and bench["tokens_per_s"] > 0
    concurrency = _step(report, "bench concurrency")["output"]["concurrency"]
    assert [row["k"] for row in concurrency] == [1, 2]
    for row in concurrency:
        assert row["aggregate_tokens_per_s"] > 0 and len(row["per_process_tokens_per_s"]) == row["k"]
        assert row["per_process_peak_memory_bytes"] > 0
    assert _step(report, "bench fuse")["output"]["kind"] == "fuse"
    assert any("best trial" in line for line in _step(report, "sweep")["output_tail"])
    assert any(line.startswith("torch.compile:") for line in _step(report, "diagnose")["output_tail"])


def test_a_gpu_box_as_it_comes_runs_the_check_from_a_plain_checkout_with_only_torch_numpy_and_pyyaml(tmp_path):
    """A virtualenv holding torch (this machine's local wheel), numpy and pyyaml and nothing else; lmtune from the
    checkout on PYTHONPATH: every step that needs no other package runs, the others are skipped, named."""
    from test_install import run, venv_with_torch

    venv = venv_with_torch(tmp_path / "bare")
    run(shutil.which("uv") or "uv", "pip", "install", "--python", venv / "bin" / "python", "numpy", "pyyaml",
        cwd=tmp_path)
    out = tmp_path / "gpu.json"
    proc = subprocess.run([str(venv / "bin" / "python"), "-m", "lmtune.gpu_check", "--out", str(out)], cwd=tmp_path,
                          env={**os.environ, **ENV, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert set(report["missing_packages"]) == {"tensorboardX", "optuna", "pandas", "matplotlib", "tokenizers", "ray"}
    assert report["skipped"]["sweep (CPU smoke: quick, 10 steps)"] == \
        "needs ray, pandas, matplotlib, tokenizers: not installed"
    ran = [s for s in report["steps"] if s["ran"]]
    assert [s["name"] for s in ran] == ["diagnose", "bench (CPU smoke: a tiny model)", "bench concurrency (CPU smoke)",
                                        "bench fuse (CPU smoke)"] and all(s["ok"] for s in ran)
    assert "not installed: tensorboardX, optuna, pandas, matplotlib, tokenizers, ray" in proc.stdout


def test_on_a_gpu_the_steps_time_caps_add_up_to_fourteen_minutes_and_the_bench_measures_its_peak(tmp_path):
    """(Eight minutes until an H200 ran it: cold compiles took diagnose, concurrency and fuse past their caps.)"""
    from lmtune.gpu_check import plan

    steps = plan(True, tmp_path)
    assert sum(s.timeout_s for s in steps) <= 14 * 60
    bench = next(s for s in steps if s.name.startswith("bench default"))
    assert {"--measured-peak", "128", "--record"} <= set(bench.command)
    sweep = next(s for s in steps if "sweep" in s.name)
    assert "0.25" in sweep.command and set(sweep.needs) >= {"ray"}
