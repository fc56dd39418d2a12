"""A student's own package as it is laid out (issue 66 items 1 and 3): a model file inside a package imported under its
package's name, its relative imports working; a package that is not installed, or a missing third-party module, one
line saying where to install what; Ray's workers importing the same lmtune as the driver from any working folder; and a
trial whose failure no retry cures ending the sweep at its first attempt, counted."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import pytest
from conftest import run_command, run_lmtune, write_grid_space
from cs336_repo import write_cs336_repo

from lmtune.errors import LmtuneError, UserCodeError
from lmtune.sweep.runner import INCURABLE
from lmtune.sweep.worker_path import check_workers_import_this_lmtune
from lmtune.usercode.imports import code_path, load, package_of


@pytest.fixture
def isolated_imports(monkeypatch: pytest.MonkeyPatch):
    """sys.path restored, and the packages a test imported forgotten, after it."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("student_pkg_"):
            del sys.modules[name]


def student_repo(root: Path, **kwargs) -> tuple[Path, str]:
    """A CS336-shaped repository under ``root`` whose package has a name of its own (so tests never share it)."""
    package = f"student_pkg_{uuid.uuid4().hex[:8]}"
    return write_cs336_repo(root / "repo", package=package, **kwargs), package


def test_a_model_file_inside_a_package_is_imported_under_its_package_name(tmp_path: Path, isolated_imports):
    repo, package = student_repo(tmp_path, metadata=False)
    model = load(f"{repo}/{package}/model.py:TransformerLM", "--model")
    assert model.__module__ == f"{package}.model"
    assert sys.modules[f"{package}.nn_utils"].__file__ == str(repo / package / "nn_utils.py")  # its relative import


def test_the_trials_get_the_folder_holding_the_package_not_the_files_folder(tmp_path: Path, isolated_imports):
    repo, package = student_repo(tmp_path, metadata=False)
    spec = f"{repo}/{package}/model.py:TransformerLM"
    load(spec, "--model")
    assert code_path([spec]) == [str(repo)]


def test_a_file_outside_any_package_or_a_packages_init_is_placed_by_package_of(tmp_path: Path):
    repo, package = student_repo(tmp_path, metadata=False)
    (tmp_path / "loose.py").write_text("")
    assert package_of(tmp_path / "loose.py") is None
    assert package_of(repo / package / "__init__.py") == (repo, package)
    assert package_of(repo / package / "model.py") == (repo, f"{package}.model")


@pytest.mark.parametrize("form", ["file", "module"])
def test_a_package_reading_its_installed_version_but_not_installed_names_both_ways_to_install(
        form: str, tmp_path: Path, isolated_imports, monkeypatch: pytest.MonkeyPatch):
    repo, package = student_repo(tmp_path)
    monkeypatch.chdir(repo)
    spec = f"{package}/model.py:TransformerLM" if form == "file" else f"{package}.model:TransformerLM"
    with pytest.raises(UserCodeError) as refused:
        load(str(repo / spec) if form == "file" else spec, "--model")
    message = str(refused.value)
    assert "\n" not in message
    assert f"your package '{package}' reads its installed metadata and is not installed in" in message
    assert f"{sys.executable} -m pip install --no-deps -e {repo}" in message and 'uv add "lmtune @ git+URL"' in message
    assert "no module named" not in message.lower()  # (PackageNotFoundError is a ModuleNotFoundError)


def test_a_missing_third_party_module_is_named_with_the_environment_to_install_it_into(tmp_path: Path,
                                                                                       isolated_imports):
    repo, package = student_repo(tmp_path, third_party="einops_absent_here", metadata=False)
    with pytest.raises(UserCodeError) as refused:
        load(f"{repo}/{package}/model.py:TransformerLM", "--model")
    assert f"'einops_absent_here' is not installed in the Python that runs lmtune ({sys.prefix})" in str(refused.value)
    assert f"{sys.executable} -m pip install einops_absent_here" in str(refused.value)


def test_a_package_whose_name_imports_another_copy_first_is_refused(tmp_path: Path, isolated_imports):
    repo, package = student_repo(tmp_path, metadata=False)
    other = write_cs336_repo(tmp_path / "installed_copy", package=package, metadata=False)
    sys.path.insert(0, str(other))  # (a copy installed into site-packages comes before the repo lmtune appends)
    with pytest.raises(UserCodeError) as refused:
        load(f"{repo}/{package}/model.py:TransformerLM", "--model")
    assert f"`import {package}.model` gives {other / package / 'model.py'}, not this file" in str(refused.value)
    assert f"pip install --no-deps -e {repo}" in str(refused.value)


def test_a_tuner_whose_workers_would_import_another_lmtune_is_refused_in_one_line(tmp_path: Path):
    (tmp_path / "lmtune").mkdir()
    (tmp_path / "lmtune" / "__init__.py").write_text("")
    with pytest.raises(LmtuneError) as refused:
        check_workers_import_this_lmtune([str(tmp_path)])
    assert f"Ray's workers would import lmtune from {tmp_path / 'lmtune'}" in str(refused.value)
    check_workers_import_this_lmtune([str(tmp_path / "lmtune")])  # (a folder holding none: accepted)


@pytest.mark.slow
def test_a_sweep_from_the_folder_holding_a_clone_named_lmtune_trains_every_trial(tmp_path: Path, builtin_data: Path):
    """The clone's top folder (no __init__.py) with the built-in corpus's data/ in it, as the README's set-up leaves
    it, run by the `lmtune` command of the clone's .venv: Ray puts the working folder first on its workers' sys.path,
    where it hid lmtune.data from every trial. (``python -m lmtune`` there imports the folder itself: Python puts the
    working folder first for -m, before any of lmtune runs.)"""
    (tmp_path / "lmtune" / "data" / "builtin").mkdir(parents=True)
    (tmp_path / "data").mkdir()
    space = write_grid_space(tmp_path / "grid.yaml", [1e-3, 1e-2])
    proc = run_command([str(Path(sys.executable).with_name("lmtune")), "run", "--space", str(space), "--name",
                        "beside_clone", "--data", str(builtin_data), "--num-cpus", "1", "--no-dashboard", "--quiet"],
                       cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "2 trials: 2 completed" in proc.stdout
    ended = json.loads((tmp_path / "results" / "beside_clone" / "sweep.json").read_text())["ended"]
    assert ended == {"outcomes": {"completed": 2}, "unfinished": 0}


WORKERS_ONLY_FAILURE = """
import os  # noqa: E402

import ray  # noqa: E402

if ray.is_initialized():  # a trial's process: its environment lacks a module the driver's has
    with open(os.environ["ATTEMPTS"], "a") as attempts:
        attempts.write("1\\n")
    import einops_absent_in_the_workers  # noqa: F401
"""


@pytest.mark.slow
def test_a_model_that_fails_to_import_in_the_trials_stops_the_sweep_at_its_first_attempt(
        tmp_path: Path, builtin_data: Path):
    """No retries (each the same error) and no further trials: one line naming the trial and the error, the errored
    trial counted though it wrote no records of its own, and the resume command."""
    repo, package = student_repo(tmp_path, metadata=False)
    with open(repo / package / "model.py", "a") as model:
        model.write(WORKERS_ONLY_FAILURE)
    space = write_grid_space(tmp_path / "grid.yaml", [1e-3, 3e-3, 1e-2])
    attempts = tmp_path / "attempts"
    proc = run_lmtune("run", "--space", str(space), "--name", "fails", "--data", str(builtin_data), "--num-cpus", "1",
                      "--no-dashboard", "--quiet", "--model", f"{package}/model.py:TransformerLM", cwd=repo,
                      env={"ATTEMPTS": str(attempts)})
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert attempts.read_text().count("1") == 1
    assert "3 trials: 1 error; 2 not started" in proc.stdout
    stopped = next(line for line in proc.stdout.splitlines() if line.startswith("sweep stopped: trial "))
    assert "No module named 'einops_absent_in_the_workers'" in stopped and "is not installed in" in stopped
    assert "no retry cures it; fix it, then resume with: python -m lmtune.run --name fails --resume" in proc.stdout
    ledger = json.loads((repo / "results" / "fails" / "decisions" / "trial_outcomes.json").read_text())
    assert [entry["outcome"] for entry in ledger.values()] == ["error"]
    ended = json.loads((repo / "results" / "fails" / "sweep.json").read_text())["ended"]
    assert ended["outcomes"] == {"error": 1} and ended["unfinished"] == 2 and ended["stopped_by"] == INCURABLE
    assert ended["note"] == stopped.removeprefix("sweep stopped: ")
