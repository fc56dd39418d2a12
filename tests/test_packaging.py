"""lmtune as a user installs it: the wheel (not the editable install the other tests run) ships the search
spaces inside the package and the ``lmtune`` console script, and installed into a fresh virtualenv it runs
a sweep of a shipped space and its report from a directory that is not the repository."""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from conftest import ENV, assert_one_line_error, finish, time_left

from lmtune import cli

REPO = Path(__file__).resolve().parents[1]
# What a build does not read: the folders at the top of the repository that runs and tools write.
NOT_SOURCE = {".git", ".venv", "build", "data", "results", "lmtune.egg-info", ".pytest_cache", ".ruff_cache",
              ".devbundle"}
SHIPPED_SPACES = sorted(p.stem for p in (REPO / "search_spaces").glob("*.yaml"))
# The quick space's six LRs on a one-layer model for 10 steps (gpu_check's CPU smoke test): seconds a trial.
TINY_SWEEP = ["--set", "steps=10", "--set", "eval_interval=5", "--set", "checkpoint_interval=5", "--set",
              "warmup_steps=2", "--set", "d_model=32", "--set", "d_ff=64", "--set", "n_layers=1", "--set", "n_heads=2",
              "--set", "context_length=32"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """lmtune's wheel, built by pip from a copy of the repository (built in place, it would leave build/ in the
    working tree, where another build may be running)."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    shutil.copytree(REPO, source, ignore=lambda folder, names: (NOT_SOURCE if Path(folder) == REPO else set())
                    | {"__pycache__"})
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                           str(root / "dist"), str(source)], capture_output=True, text=True, timeout=time_left(300))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (built,) = (root / "dist").glob("lmtune-*.whl")
    return built


@pytest.mark.release  # (built and installed from a wheel: the release tier)
@pytest.mark.slow
def test_the_wheel_ships_every_search_space_inside_the_package(wheel):
    files = set(zipfile.ZipFile(wheel).namelist())
    assert SHIPPED_SPACES, "no search_spaces/*.yaml in the repository"
    assert [name for name in SHIPPED_SPACES if f"lmtune/search_spaces/{name}.yaml" not in files] == []


@pytest.mark.release  # (built and installed from a wheel: the release tier)
def test_the_wheel_ships_every_module_of_the_package(wheel):
    files = set(zipfile.ZipFile(wheel).namelist())
    modules = {path.relative_to(REPO).as_posix() for path in (REPO / "lmtune").rglob("*.py")}
    assert sorted(modules - files) == [], "a module outside pyproject.toml's package discovery (lmtune*)?"


@pytest.mark.release  # (built and installed from a wheel: the release tier)
def test_the_wheel_declares_the_lmtune_console_script(wheel):
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
        entry_points = configparser.ConfigParser()
        entry_points.read_string(archive.read(name).decode())
    assert entry_points["console_scripts"]["lmtune"].strip() == "lmtune.cli:main"


# ---------------------------------------------------------------------------------------------
# The console script, in this process: a command is its module's main


def test_an_unknown_command_is_refused_in_one_line_naming_the_commands(capsys):
    line = assert_one_line_error(cli.main(["sweep"]), capsys.readouterr().err, "unknown command 'sweep'")
    assert line.endswith("choose one of: " + ", ".join(cli.COMMANDS))


def test_lmtune_alone_lists_the_commands_and_exits_2(capsys):
    assert cli.main([]) == 2
    listing = capsys.readouterr().err
    for command in cli.COMMANDS:
        assert f"\n  {command} " in listing, command


def test_a_command_gets_the_remaining_arguments_and_returns_its_exit_status(capsys):
    assert cli.main(["run", "--list-spaces"]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == SHIPPED_SPACES
    assert_one_line_error(cli.main(["run", "--fuse", "0"]), capsys.readouterr().err, "--fuse must be >= 1")


def test_a_commands_help_is_its_modules_own_and_names_it_lmtune_command(capsys):
    from lmtune import analyze

    with pytest.raises(SystemExit) as exit_:
        cli.main(["analyze", "--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("usage: lmtune analyze ")
    assert analyze.build_parser().prog == "python -m lmtune.analyze"  # called as a module, it says so


# ---------------------------------------------------------------------------------------------
# gpu_check needs nothing the wheel lacks: its CUDA step is a module of the package, not the test suite


def test_gpu_check_runs_the_shipped_cuda_checks_and_nothing_of_the_repository(tmp_path):
    from lmtune.gpu_check import plan

    for cuda in (True, False):
        steps = plan(cuda, tmp_path)
        assert [sys.executable, "-m", "lmtune.tools.cuda_checks"] in [s.command for s in steps]
        assert [s.name for s in steps if {"pytest", "tests"} & set(s.command)] == []


def test_each_cuda_check_prints_ok_or_failed_with_its_reason(monkeypatch, tmp_path, capsys):
    from lmtune.tools import cuda_checks

    def check_this_passes(data_dir, work):
        pass

    def check_this_fails(data_dir, work):
        raise AssertionError("the batch is on cpu, not the GPU")

    monkeypatch.setattr(cuda_checks, "CHECKS", (check_this_passes, check_this_fails))
    assert cuda_checks.run_checks(tmp_path, tmp_path) == ["this fails"]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("this passes: ok (")
    assert lines[1] == "this fails: FAILED: the batch is on cpu, not the GPU"


@pytest.mark.skipif(torch.cuda.is_available(), reason="refuses only without a CUDA GPU")
def test_the_cuda_checks_refuse_in_one_line_without_a_gpu(capsys):
    from lmtune.tools import cuda_checks

    assert_one_line_error(cuda_checks.main([]), capsys.readouterr().err, "no CUDA GPU here")


# ---------------------------------------------------------------------------------------------
# The wheel installed into a fresh virtualenv, used from a directory outside the repository


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv outside the repository holding the wheel, with nothing downloaded: its dependencies
    are this interpreter's, on its path through a .pth file. (A folder a .pth line adds is not scanned for .pth
    files itself, so the repository's editable install does not come with them.)"""
    root = tmp_path_factory.mktemp("venv") / "venv"
    assert not root.is_relative_to(REPO)
    python = root / "bin" / "python"
    for command in ([sys.executable, "-m", "venv", "--without-pip", str(root)],  # pip: this interpreter's
                    [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                     "-q", str(wheel)]):
        proc = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    site_packages = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    (Path(site_packages) / "lmtune_test_dependencies.pth").write_text(f"{Path(torch.__file__).parents[1]}\n")
    return root


def _environment(venv: Path) -> dict[str, str]:
    """The environment of a shell with ``venv`` activated (and nothing pointing at the repository)."""
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, **ENV, "VIRTUAL_ENV": str(venv), "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"}


def _installed(venv: Path, program: str, *args: str, cwd: Path, timeout: float = 120) -> tuple[int, str]:
    """``venv/bin/PROGRAM ARGS`` run in ``cwd``, in a session of its own (killed whole on a timeout);
    (its exit status, its stdout and stderr)."""
    proc = subprocess.Popen([str(venv / "bin" / program), *args], cwd=cwd, env=_environment(venv),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    output = finish(proc, timeout)
    return proc.returncode, output


@pytest.mark.release  # (built and installed from a wheel: the release tier)
@pytest.mark.slow
def test_the_virtualenv_imports_lmtune_and_its_spaces_from_the_wheel_not_the_repository(venv, tmp_path):
    code, output = _installed(venv, "python", "-c", "import lmtune, lmtune.sweep.spaces as s; print(lmtune.__file__);"
                              " print(s.shipped_spaces())", cwd=tmp_path)
    assert code == 0, output
    module, spaces = output.split()
    assert Path(module).is_relative_to(venv) and Path(spaces).is_relative_to(venv), output


@pytest.mark.release  # (built and installed from a wheel: the release tier)
@pytest.mark.slow
def test_lmtune_help_lists_the_commands_from_any_directory(venv, tmp_path):
    code, output = _installed(venv, "lmtune", "--help", cwd=tmp_path)
    assert code == 0, output
    for command in cli.COMMANDS:
        assert f"\n  {command} " in output, (command, output)


@pytest.mark.release  # (built and installed from a wheel: the release tier)
@pytest.mark.slow
def test_the_script_and_the_module_list_every_shipped_space_from_any_directory(venv, tmp_path):
    for command in (["lmtune", "run"], ["python", "-m", "lmtune.run"]):
        code, output = _installed(venv, *command, "--list-spaces", cwd=tmp_path)
        assert code == 0, output
        assert [line.split()[0] for line in output.splitlines()] == SHIPPED_SPACES, (command, output)


@pytest.mark.release  # (built and installed from a wheel: the release tier)
@pytest.mark.slow
def test_a_sweep_of_a_shipped_space_runs_and_is_analyzed_from_any_directory(venv, tmp_path):
    code, output = _installed(venv, "lmtune", "run", "--space", "quick", "--name", "tiny", "--results", "results",
                              "--no-dashboard", "--quiet", "--num-cpus", "1", *TINY_SWEEP, cwd=tmp_path, timeout=300)
    assert code == 0, output[-4000:]
    assert "report: python -m lmtune.analyze" in output, output[-4000:]  # (its conclusion said, then its report)
    # Without --data the installed package generated its built-in corpus in the working directory.
    assert (tmp_path / "data" / "builtin" / "meta.json").is_file()
    code, output = _installed(venv, "lmtune", "analyze", "results/tiny", cwd=tmp_path)
    assert code == 0, output[-4000:]
    assert (tmp_path / "results" / "tiny" / "report" / "lr_sweep_analysis.md").is_file()
    assert (tmp_path / "results" / "tiny" / "report" / "summary.json").is_file()
