"""lmtune installed where its users already are: into an environment that has its own torch (pip and uv keep it),
into a uv project that requires torch, and by the main job's setup (lmtune and what it runs with, no test tool).

Each test builds a real environment (pip and uv resolve and install the dependencies, from their caches or the
package index); the torch they start from is this machine's local CPU wheel, found where pip's configuration
points (find-links), as a user's environment has a torch of its own before lmtune arrives.
"""

from __future__ import annotations

import configparser
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ENV, REPO, TINY_TRIAL, time_left
from cs336_repo import PACKAGE, write_cs336_repo
from test_cs336_page import page_lines as cs336_page_lines
from test_packaging import NOT_SOURCE

pytestmark = [pytest.mark.slow, pytest.mark.release]  # (installs into other environments: the release tier)

# A train short enough for an install test: the tiny model for 10 steps on the built-in corpus.
SHORT_TRAIN = ["train", "--set", "steps=10", "--set", "warmup_steps=2", "--set", "d_model=32", "--set", "d_ff=64",
               "--set", "n_layers=1", "--set", "n_heads=2", "--set", "context_length=32", "--quiet"]


def local_torch_wheel() -> Path:
    """The wheel of this interpreter's torch in pip's find-links (the machine's local CPU build); a test that needs
    it fails in CI without it and is skipped elsewhere."""
    folders = os.environ.get("PIP_FIND_LINKS", "").split()
    for config in (Path("/etc/xdg/pip/pip.conf"), Path("/etc/pip.conf"), Path.home() / ".config/pip/pip.conf"):
        parser = configparser.ConfigParser()
        if config.is_file():
            parser.read(config)
            folders += parser.get("global", "find-links", fallback="").split()
    for folder in folders:
        found = sorted(Path(folder.removeprefix("file://")).glob(f"torch-{torch.__version__}-*.whl"))
        if found:
            return found[0]
    if os.environ.get("CI"):
        pytest.fail(f"no wheel of torch {torch.__version__} in pip's find-links ({folders}): CI installs it from one")
    pytest.skip(f"no local wheel of torch {torch.__version__} to start an environment from")


def checkout_copy(into: Path) -> Path:
    """The working tree as a fresh clone would have it (what runs and tools write left out)."""
    shutil.copytree(REPO, into, ignore=lambda folder, names: (NOT_SOURCE if Path(folder) == REPO else set())
                    | {"__pycache__"})
    return into


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """lmtune's wheel, built from a copy of the checkout."""
    root = tmp_path_factory.mktemp("install_wheel")
    source = checkout_copy(root / "source")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(root / "dist"), str(source)], check=True, timeout=time_left(300))
    return next((root / "dist").glob("lmtune-*.whl"))


def environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, **ENV, **extra}


def run(*command: str | Path, cwd: Path, timeout: float | None = None, **env: str) -> str:
    """``command`` in the tests' environment without this venv's; its output. It may run ``timeout`` seconds (None: the
    rest of its test's time), never past its test's limit (conftest.time_left)."""
    proc = subprocess.run([str(c) for c in command], cwd=cwd, capture_output=True, text=True,
                          timeout=time_left(timeout), env=environment(**env), stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"{command}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def venv_with_torch(root: Path) -> Path:
    """A fresh virtualenv holding pip and the local torch wheel and nothing else: a user's environment before
    lmtune. (Made by uv, which links torch from its cache: pip would unpack the 200 MB wheel again for each test;
    what is tested is how lmtune then goes in.)"""
    uv = shutil.which("uv") or "uv"
    run(uv, "venv", "--seed", "--python", sys.executable, root, cwd=root.parent, UV_NO_PROGRESS="1")
    run(uv, "pip", "install", "--python", root / "bin" / "python", local_torch_wheel(), cwd=root.parent)
    return root


def torch_of(python: Path, cwd: Path) -> dict[str, str]:
    """The torch a python imports: its version and where it lies."""
    code = "import json, torch; print(json.dumps({'version': torch.__version__, 'file': torch.__file__}))"
    return json.loads(run(python, "-c", code, cwd=cwd).strip().splitlines()[-1])


def test_pip_installs_the_wheel_with_its_dependencies_and_keeps_the_torch_already_there(wheel, tmp_path):
    venv = venv_with_torch(tmp_path / "env")
    before = torch_of(venv / "bin" / "python", tmp_path)
    run(venv / "bin" / "python", "-m", "pip", "install", "-q", wheel, cwd=tmp_path)
    assert torch_of(venv / "bin" / "python", tmp_path) == before
    listed = json.loads(run(venv / "bin" / "python", "-m", "pip", "list", "--format", "json", cwd=tmp_path))
    assert {p["name"]: p["version"] for p in listed}["torch"] == torch.__version__
    assert "quick_edge" in run(venv / "bin" / "lmtune", "run", "--list-spaces", cwd=tmp_path)


def test_uv_pip_installs_the_wheel_into_an_environment_with_torch_and_trains(wheel, tmp_path):
    venv = venv_with_torch(tmp_path / "env")
    before = torch_of(venv / "bin" / "python", tmp_path)
    run(shutil.which("uv") or "uv", "pip", "install", "--python", venv / "bin" / "python", wheel, cwd=tmp_path)
    assert torch_of(venv / "bin" / "python", tmp_path) == before
    assert "quick_edge" in run(venv / "bin" / "lmtune", "run", "--list-spaces", cwd=tmp_path)
    assert "completed: 10 steps" in run(venv / "bin" / "lmtune", *SHORT_TRAIN, "--out", tmp_path / "run",
                                        cwd=tmp_path)


def test_uv_add_puts_lmtune_into_a_cs336_repository_and_uv_run_sweeps_reports_and_samples_its_model(wheel, tmp_path):
    """docs/cs336.md's way (a): lmtune added to the assignment's own uv project (here its wheel stands for the git URL),
    then the page's `uv run lmtune run --space quick_edge --model cs336_basics/model.py:TransformerLM` (the tiny model
    on top), `analyze` and `sample` of that sweep: the package, whose __init__ reads its installed version and whose
    model imports its neighbours relatively, imports in the project's environment (uv installs it editable), its torch
    the project's own."""
    project = write_cs336_repo(tmp_path / "assignment1-basics")
    pyproject = (project / "pyproject.toml").read_text()
    # The project's own torch requirement (the handout's: ~=2.6; here the local CPU wheel, as its source).
    pyproject = pyproject.replace('dependencies = ["numpy"]', 'dependencies = ["numpy", "torch>=2.6"]')
    sources = f'[tool.uv.sources]\ntorch = {{ path = "{local_torch_wheel()}" }}\n'
    (project / "pyproject.toml").write_text(f"{pyproject}\n{sources}")
    uv = shutil.which("uv") or "uv"
    env = {"UV_PYTHON": sys.executable, "UV_NO_PROGRESS": "1"}
    run(uv, "add", wheel, cwd=project, **env)
    assert torch_of(project / ".venv" / "bin" / "python", project)["version"] == torch.__version__
    page = next(line for line in cs336_page_lines() if line[:3] == ["uv", "run", "lmtune"])
    tiny = [f"--set={k}={v}" for k, v in {**TINY_TRIAL, "steps": 24, "warmup_steps": 4, "eval_interval": 4,
                                           "log_interval": 4, "checkpoint_interval": 4}.items()]
    run(*page, "--name", "quick", *tiny, "--num-cpus", "2", "--no-dashboard", "--quiet", cwd=project, **env)
    model = ["--model", f"{PACKAGE}/model.py:TransformerLM"]
    assert "best trial:" in run(uv, "run", "lmtune", "analyze", "results/quick", *model, cwd=project, **env)
    assert run(uv, "run", "lmtune", "sample", "results/quick", *model, "--max-tokens", "8", cwd=project, **env).strip()


def test_the_main_jobs_setup_installs_lmtune_and_what_it_runs_with_but_no_test_tool(tmp_path):
    clone = checkout_copy(tmp_path / "clone")
    listed = run("bash", "-c", "source scripts/setup.sh runtime >/dev/null && pip list --format json", cwd=clone)
    names = {p["name"].lower(): p["version"] for p in json.loads(listed.strip().splitlines()[-1])}
    assert names["torch"] == torch.__version__ and "lmtune" in names and "ray" in names
    assert not {"pytest", "ruff", "moto", "uv", "wandb"} & set(names), sorted(names)
