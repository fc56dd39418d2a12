"""Each command, as a user runs it (python -m lmtune.X in a process of its own), refuses bad input with
one ``error:`` line and exit status 2, no traceback, and writes nothing. The refusals themselves are
specified in-process next to each component; this is the smoke test of the seven entry points."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import assert_one_line_error, run_lmtune

import lmtune
from lmtune.cli import COMMANDS

REFUSALS = {
    "prepare": (["--input", "missing.txt", "--out", "prepared"], "missing.txt"),
    "train": (["--lr", "nan", "--out", "run"], "lr"),
    "run": (["--space", "no_such_space", "--name", "sweep"], "unknown search space 'no_such_space'"),
    "analyze": (["no-such-sweep"], "no-such-sweep does not exist"),
    "bench": (["--config", "quick", "--concurrency", "0"], "--concurrency"),
    "diagnose": (["no-such-sweep"], "not a directory"),
    "lr_find": (["--min-lr", "1e-3", "--max-lr", "1e-4", "--out", "lrf"], "max_lr must be a number above min_lr"),
}


@pytest.mark.slow
@pytest.mark.parametrize("command", list(REFUSALS))
def test_the_command_refuses_bad_input_in_one_line_and_writes_nothing(command: str, builtin_data: Path,
                                                                      tmp_path: Path):
    argv, fragment = REFUSALS[command]
    data = ["--data", str(builtin_data)] if command in ("train", "run") else []
    proc = run_lmtune(command, *argv, *data, cwd=tmp_path, timeout=180)
    assert_one_line_error(proc.returncode, proc.stderr, fragment)
    assert "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == [], sorted(tmp_path.rglob("*"))


def test_a_command_whose_reader_leaves_early_ends_quietly_with_sigpipes_status():
    import subprocess
    import sys

    # (a million lines cannot fit the pipe's buffer: the writer must meet the closed pipe)
    script = ("from lmtune.errors import cli_entry\n"
              "main = cli_entry(lambda: [print('x' * 80) for _ in range(10**6)] and 0)\n"
              "raise SystemExit(main())")
    proc = subprocess.run(["bash", "-c", f'{sys.executable} -c "$0" | head -c 1 >/dev/null; '
                                         'echo "status ${PIPESTATUS[0]}" >&2', script],
                          capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stderr and "status 141" in proc.stderr, proc.stderr[-2000:]


def test_python_m_lmtune_lists_the_commands_as_the_console_script_does():
    proc = subprocess.run([sys.executable, "-m", "lmtune", "--help"], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: lmtune COMMAND")
    assert all(f"  {command}" in proc.stdout for command in COMMANDS)


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_the_version_flag_prints_lmtunes_version(flag: str):
    proc = subprocess.run([sys.executable, "-m", "lmtune", flag], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0 and proc.stdout == f"lmtune {lmtune.__version__}\n"
