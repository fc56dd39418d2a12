"""Sweeps of the user's own model as a user runs them: real Ray Tune on a local cluster, real training.

- (the release tier) the README's command, the edge search on lmtune's example model (examples/cs336_model.py), at
  test size, stopped with Ctrl-C and resumed, then the report: it names the model, says what is not measured of it,
  estimates its FLOPs, shows the best LR's samples and the learning curves against wall-clock time;
- a model whose builds share a module (a module-level RoPE cache): fusing refused before Ray starts, and each of
  its trials run in a process of its own;
- the width search under SP with a model whose constructor needs a factory: the factory builds every proxy.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
from pathlib import Path

import pytest
from conftest import (
    TINY_TRIAL,
    USER_MODELS,
    assert_one_line_error,
    assert_real_picture,
    finish,
    run_lmtune,
    set_args,
    start_lmtune,
    trial_dirs,
    wait_until,
    write_grid_space,
)

from lmtune.searches.state import read_search_state
from lmtune.sweep.record import read_outcomes

pytestmark = pytest.mark.slow

README = Path(__file__).resolve().parents[1] / "README.md"
# The README's command, at test size: its space's model and batch shrunk, and its 162 steps to 27 with every interval
# a sixth as long (ASHA's rungs, at 1/9, 1/3 and all of the budget, still fall on evaluations and checkpoints); its
# range test and search kept.
TEST_SIZE = {"d_model": 32, "d_ff": 96, "n_layers": 1, "n_heads": 2, "context_length": 32, "batch_size": 8,
             "eval_batches": 2, "steps": 27, "warmup_steps": 3, "log_interval": 3, "eval_interval": 3,
             "checkpoint_interval": 3}


# The README's command as written (at test size): the release tier. Per push, the one edge search on a user's model is
# the CS336 page's, from the student's package (test_cs336_page.py's lr_edge: interrupted, resumed, reported, the
# same report checks as these).
README_COMMAND = pytest.mark.release


def readme_command() -> list[str]:
    """The README's first command of a user's model: lmtune run --space ... --model examples/...:TransformerLM."""
    match = re.search(r"^lmtune (run --space \S+ --model examples/cs336_model\.py:TransformerLM)$", README.read_text(),
                      re.M)
    assert match, "README.md lost its command for a user's model"
    return match.group(1).split()


def common(tmp: Path, data: Path, name: str) -> list[str]:
    return ["--name", name, "--results", str(tmp / "results"), "--data", str(data), "--num-cpus", "1",
            "--no-dashboard", "--quiet"]


@pytest.fixture(scope="module")
def example_edge(builtin_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The README's command (the edge search on the example model) run from a folder holding examples/, at test
    size; Ctrl-C once three trials have ended, resumed to its end, analyzed (naming the model again, as the README
    does: a results folder's code is imported only so)."""
    tmp = tmp_path_factory.mktemp("example_edge")
    shutil.copytree(README.parent / "examples", tmp / "examples")
    command, *args = readme_command()
    sweep_dir = tmp / "results" / "edge"
    proc = start_lmtune(command, *args, *set_args(TEST_SIZE), *common(tmp, builtin_data, "edge"), cwd=tmp)
    wait_until(lambda: len(read_outcomes(sweep_dir)) >= 3, proc, 300, "three ended trials", poll_s=0.05)
    os.killpg(proc.pid, signal.SIGINT)
    interrupted = finish(proc, 120)
    ended = {t: e["outcome"] for t, e in read_outcomes(sweep_dir).items()}
    resumed = run_lmtune("run", "--resume", *common(tmp, builtin_data, "edge")[:4], "--no-dashboard", "--quiet",
                         cwd=tmp)
    analyze = run_lmtune("analyze", str(sweep_dir), "--model", "examples/cs336_model.py:TransformerLM", cwd=tmp)
    model = f"{(tmp / 'examples' / 'cs336_model.py').resolve()}:TransformerLM"
    return {"dir": sweep_dir, "interrupted": (proc.returncode, interrupted), "ended_before": ended,
            "resumed": resumed, "analyze": analyze, "model": model}


@README_COMMAND
def test_the_interrupted_search_on_the_users_model_resumes_and_finishes(example_edge):
    code, out = example_edge["interrupted"]
    assert code == 130 and "resume it with" in out, out[-3000:]
    assert example_edge["resumed"].returncode == 0, example_edge["resumed"].stderr[-3000:]
    sweep_dir = example_edge["dir"]
    assert read_search_state(sweep_dir, "edge")["finished"]
    ledger = read_outcomes(sweep_dir)
    assert all(ledger[t]["outcome"] == o for t, o in example_edge["ended_before"].items())  # decided: not rerun
    for folder in trial_dirs(sweep_dir).values():
        assert json.loads((folder / "config.json").read_text())["code"]["model"] == example_edge["model"]


@README_COMMAND
def test_the_report_of_the_users_model_names_it_and_says_what_is_estimated_and_not_measured(example_edge):
    assert example_edge["analyze"].returncode == 0, example_edge["analyze"].stderr[-3000:]
    report = example_edge["dir"] / "report"
    summary = json.loads((report / "summary.json").read_text())
    assert summary["model"]["name"] == example_edge["model"] and summary["model"]["flops_counted"]
    assert not summary["model"]["attention_logits_measured"]
    text = (report / "lr_sweep_analysis.md").read_text()
    assert f"your `{example_edge['model']}`" in text and "Its attention logits are not measured for this model" in text
    assert "counted by torch's FlopCounterMode" in text


@README_COMMAND
def test_the_report_shows_the_best_lrs_samples_and_curves_against_wall_clock_time(example_edge):
    report = example_edge["dir"] / "report"
    summary = json.loads((report / "summary.json").read_text())
    assert [s["seed"] for s in summary["samples"]] == [0, 1], summary["samples_note"]
    assert all(s["prompt"] == "Once upon a time" and s["tokens"] > 0 for s in summary["samples"])
    text = (report / "lr_sweep_analysis.md").read_text()
    assert "## Samples from the best LR's model" in text and "> Once upon a time" in text
    assert_real_picture(report / "lr_sweep_comparison_wall.png")
    assert "`lr_sweep_comparison_wall.png`" in text


# A grid of the example model, fused: test_fused_sweep.py's ASHA sweep (--fuse 3 --model the example).


SHARED = str(USER_MODELS / "shared_rope.py:CachedRopeLM")


def test_fusing_a_model_whose_builds_share_a_module_is_refused_before_ray_starts(builtin_data, tmp_path):
    space = write_grid_space(tmp_path / "grid.yaml", [1e-3, 3e-3])
    proc = run_lmtune("run", "--space", str(space), "--fuse", "2", "--model", SHARED,
                      *common(tmp_path, builtin_data, "shared"))
    assert_one_line_error(proc.returncode, proc.stderr, "--fuse 2", "module-level cache", "--fuse 1")
    assert not (tmp_path / "results" / "shared").exists()


def test_each_trial_of_a_model_sharing_a_module_runs_in_a_process_of_its_own(builtin_data, tmp_path):
    space = write_grid_space(tmp_path / "grid.yaml", [1e-3, 3e-3, 1e-2], steps=10)
    proc = run_lmtune("run", "--space", str(space), "--model", SHARED, "--max-concurrent", "1",
                      "--step-hook", "hooks:record_pid", *common(tmp_path, builtin_data, "shared"),
                      env={"PYTHONPATH": str(USER_MODELS)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    pids = [(d / "pid.txt").read_text() for d in trial_dirs(tmp_path / "results" / "shared").values()]
    assert len(pids) == 3 and len(set(pids)) == 3, pids


# The width search at test size (tests/test_width_sweep.py's, under SP, one seed): the target d_model 64, the
# proxies 16 and 32, each built by the user's factory.
TINY_WIDTH = {"search": "width", "budget": "quick",
              "set": {**TINY_TRIAL, "d_model": 64, "d_ff": 128, "n_heads": 4, "steps": 24, "warmup_steps": 4,
                      "eval_interval": 12, "checkpoint_interval": 24},
              "scheduler": {"name": "none"},
              "width": {"widths": [16, 32], "lr_min": 0.004, "lr_max": 0.032, "ratio": 2, "below": 1, "above": 1,
                        "max_extensions": 2, "seeds": 1, "walls": 1, "edge_probes": 0, "confirm_seeds": 1}}


@pytest.fixture(scope="module")
def width_factory(builtin_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("width_factory")
    (tmp / "width.yaml").write_text(json.dumps(TINY_WIDTH))
    run = run_lmtune("run", "--space", str(tmp / "width.yaml"), "--model", str(USER_MODELS / "gpt_style.py:make"),
                     *common(tmp, builtin_data, "w"))
    return {"run": run, "dir": tmp / "results" / "w"}


def test_the_width_search_under_sp_builds_every_proxy_with_the_users_factory(width_factory):
    assert width_factory["run"].returncode == 0, width_factory["run"].stderr[-3000:]
    assert read_search_state(width_factory["dir"], "width")["finished"]
    sizes = {}
    for folder in trial_dirs(width_factory["dir"]).values():
        d_model = json.loads((folder / "config.json").read_text())["model"]["d_model"]
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["model"].endswith("gpt_style.py:make") and summary["flops_counted"]
        sizes.setdefault(d_model, set()).add(summary["params_non_embedding"])
    assert sorted(sizes) == [16, 32, 64]
    # one model per width, each its own size: the factory built every width's
    assert all(len(found) == 1 for found in sizes.values())
    assert min(sizes[16]) < min(sizes[32]) < min(sizes[64])


def test_the_width_search_refuses_mup_for_a_users_model(builtin_data, tmp_path):
    proc = run_lmtune("run", "--space", "quick_width_mup", "--model", str(USER_MODELS / "gpt_style.py:make"),
                      *common(tmp_path, builtin_data, "mup"))
    assert_one_line_error(proc.returncode, proc.stderr, "parametrization='mup' is a switch of lmtune's model")
    assert not (tmp_path / "results").exists()
