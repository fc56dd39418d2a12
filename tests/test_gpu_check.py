"""``bash scripts/gpu_check.sh`` on a machine without a GPU (CI's): every step that needs CUDA says so, the
rest run as a smoke test on a tiny model, and the one JSON file a user would attach holds it all.

Running the check is the release tier's (it installs an environment of its own): the steps that need only torch,
numpy and pyyaml (diagnose, bench, bench concurrency, bench fuse) run once, in an environment holding only those;
the project's environment runs what needs its packages (the sweep, with --only). What --only does, and the plan on
a GPU, are checked on every push, without running a step."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import REPO, assert_refused, run_command

from lmtune import gpu_check

# The steps a machine without a GPU runs, by name: the torch-only ones, then the sweep.
TORCH_ONLY = ["diagnose", "bench (CPU smoke: a tiny model)", "bench concurrency (CPU smoke)", "bench fuse (CPU smoke)"]
SWEEP = "sweep (CPU smoke: quick, 10 steps)"


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    """The check in the project's environment (scripts/gpu_check.sh), only the steps that need its packages: the
    sweep (and the CUDA tests, skipped); the bare environment's test runs the others."""
    out = tmp_path_factory.mktemp("gpu_check") / "not" / "yet" / "report.json"  # its folder made at the end
    proc = run_command(["bash", str(REPO / "scripts" / "gpu_check.sh"), "--only", "cuda,sweep", "--out", str(out)],
                       timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {**json.loads(out.read_text()), "printed": proc.stdout}


def _step(report: dict, prefix: str) -> dict:
    return next(s for s in report["steps"] if s["name"].startswith(prefix))


@pytest.mark.release
@pytest.mark.slow
def test_without_a_gpu_the_report_says_so_and_skips_what_needs_one(report):
    assert report["gpu"] is False and "no figure is a GPU's" in report["note"]
    cuda = _step(report, "cuda tests")
    assert cuda["ran"] is False and cuda["skipped"] == "needs a CUDA GPU: none here"
    assert "cuda tests: needs a CUDA GPU: none here" in report["printed"]


@pytest.mark.release
@pytest.mark.slow
def test_in_the_projects_environment_the_sweep_runs_and_the_torch_only_steps_are_left_out(report):
    """(The torch-only steps' figures: test_a_gpu_box_as_it_comes_runs_the_check_from_a_plain_checkout_...)"""
    assert report["only"] == ["cuda", "sweep"]
    ran = [s for s in report["steps"] if s["ran"]]
    assert [s["name"] for s in ran] == [SWEEP] and ran[0]["ok"]
    assert any("report: python -m lmtune.analyze" in line for line in ran[0]["output_tail"])  # (the sweep's end)
    assert {name: report["skipped"][name] for name in TORCH_ONLY} == dict.fromkeys(
        TORCH_ONLY, "left out (--only cuda,sweep)")


@pytest.mark.release
@pytest.mark.slow
def test_a_gpu_box_as_it_comes_runs_the_check_from_a_plain_checkout_with_only_torch_numpy_and_pyyaml(tmp_path):
    """A virtualenv holding torch (this machine's local wheel), numpy and pyyaml and nothing else; lmtune from the
    checkout on PYTHONPATH: every step that needs no other package runs, and its figures are in the report; the
    others are skipped, named."""
    from test_install import run, venv_with_torch

    venv = venv_with_torch(tmp_path / "bare")
    run(shutil.which("uv") or "uv", "pip", "install", "--python", venv / "bin" / "python", "numpy", "pyyaml",
        cwd=tmp_path)
    out = tmp_path / "gpu.json"
    proc = run_command([str(venv / "bin" / "python"), "-m", "lmtune.gpu_check", "--out", str(out)], timeout=600,
                       cwd=tmp_path, env={"PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert set(report["missing_packages"]) == {"tensorboardX", "optuna", "pandas", "matplotlib", "tokenizers", "ray"}
    assert report["skipped"] == {"cuda tests": "needs a CUDA GPU: none here",
                                 SWEEP: "needs ray, pandas, matplotlib, tokenizers: not installed"}
    ran = [s for s in report["steps"] if s["ran"]]
    assert [s["name"] for s in ran] == TORCH_ONLY and all(s["ok"] for s in ran)
    assert "not installed: tensorboardX, optuna, pandas, matplotlib, tokenizers, ray" in proc.stdout
    # each step's figures
    bench = _step(report, "bench (CPU smoke")["output"]
    assert math.isfinite(bench["tokens_per_s"]) and bench["tokens_per_s"] > 0
    concurrency = _step(report, "bench concurrency")["output"]["concurrency"]
    assert [row["k"] for row in concurrency] == [1, 2]
    for row in concurrency:
        assert row["aggregate_tokens_per_s"] > 0 and len(row["per_process_tokens_per_s"]) == row["k"]
        assert row["per_process_peak_memory_bytes"] > 0
    assert _step(report, "bench fuse")["output"]["kind"] == "fuse"
    assert any(line.startswith("torch.compile:") for line in _step(report, "diagnose")["output_tail"])


# ---------------------------------------------------------------------------------------------
# --only and the GPU's plan, without running a step


@pytest.fixture
def no_gpu_and_no_step_run(monkeypatch) -> list[list[str]]:
    """The check on a machine without a GPU whose steps are not run: each step's command is recorded (the list
    returned) and answers a JSON line."""
    commands: list[list[str]] = []
    really_run = subprocess.run

    def recorded(command, **kwargs):
        if command[:2] != [sys.executable, "-m"]:  # not a step: the machine's description (platform's uname)
            return really_run(command, **kwargs)
        commands.append(command)
        return subprocess.CompletedProcess(command, 0, '{"recorded": true}\n', "")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(gpu_check.subprocess, "run", recorded)
    return commands


def test_only_runs_the_steps_it_names_and_lists_the_others_as_left_out(tmp_path, no_gpu_and_no_step_run, capsys):
    out = tmp_path / "only.json"
    assert gpu_check.main(["--only", "sweep, bench", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["only"] == ["bench", "sweep"]  # in the check's order
    assert [s["name"] for s in report["steps"] if s["ran"]] == ["bench (CPU smoke: a tiny model)", SWEEP]
    assert [command[2] for command in no_gpu_and_no_step_run] == ["lmtune.bench", "lmtune.run"]
    assert report["skipped"] == dict.fromkeys(["cuda tests", *TORCH_ONLY[:1], *TORCH_ONLY[2:]],
                                              "left out (--only bench,sweep)")
    assert "bench fuse (CPU smoke): left out (--only bench,sweep)" in capsys.readouterr().out


def test_without_only_every_step_runs_as_before(tmp_path, no_gpu_and_no_step_run):
    out = tmp_path / "all.json"
    assert gpu_check.main(["--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert "only" not in report and report["skipped"] == {"cuda tests": "needs a CUDA GPU: none here"}
    assert [s["name"] for s in report["steps"] if s["ran"]] == [*TORCH_ONLY, SWEEP]
    assert len(no_gpu_and_no_step_run) == 5


@pytest.mark.parametrize("only, named", [("bench,benchmark", "no step called benchmark"), (",", "names no step")])
def test_only_naming_no_step_is_refused_in_one_line_before_anything_runs(tmp_path, no_gpu_and_no_step_run, capsys,
                                                                          only, named):
    out = tmp_path / "refused.json"
    assert_refused(gpu_check.main, ["--only", only, "--out", str(out)], capsys, named,
                   "the steps are diagnose, cuda, bench, concurrency, fuse, sweep")
    assert not out.exists() and no_gpu_and_no_step_run == []


def test_on_a_gpu_the_steps_time_caps_add_up_to_fourteen_minutes_and_the_bench_measures_its_peak(tmp_path):
    """(Eight minutes until an H200 ran it: cold compiles took diagnose, concurrency and fuse past their caps.)"""
    steps = gpu_check.plan(True, tmp_path)
    assert sum(s.timeout_s for s in steps) <= 14 * 60
    assert [s.key for s in steps] == list(gpu_check.STEPS)  # --only names each step of the GPU's check
    bench = next(s for s in steps if s.name.startswith("bench default"))
    assert {"--measured-peak", "128", "--record"} <= set(bench.command)
    sweep = next(s for s in steps if "sweep" in s.name)
    assert "0.25" in sweep.command and set(sweep.needs) >= {"ray"}
