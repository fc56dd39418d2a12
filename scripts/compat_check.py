"""Run lmtune on another torch and other dependency versions than CI's, and record the outcome.

    bash scripts/compat_check.sh oldest     # torch and every dependency at the lower bound pyproject.toml declares
    bash scripts/compat_check.sh newest     # the newest torch the package index serves, the newest of the rest
    bash scripts/compat_check.sh 2.11.0     # that torch, the newest of the rest

In a fresh virtualenv of its own (under --work, default a temporary folder) it installs, with uv, that torch and
lmtune's wheel with its dependencies straight from the package index (PyPI's torch is a CUDA build: a download of
several GB; "oldest" takes each dependency's lowest release in its declared range), then runs, outside the checkout
so that the installed wheel is what runs: the training core's tests, a grid sweep and an Optuna sweep on the
built-in corpus, the report, and training lmtune's example model. It appends one
JSON object to benchmarks/results.jsonl: the device, every version, and pass/fail with the time of each step.
Developers run it once per change of pyproject.toml's ranges; CI keeps to the one torch it installs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results.jsonl"
# The tests of the training core: the loop, the model, fused groups, schedules and the user's model.
CORE_TESTS = ["tests/test_train.py", "tests/test_model.py", "tests/test_fused.py", "tests/test_schedule.py",
              "tests/test_user_model.py", "tests/test_sample.py"]
TINY = ["--set", "d_model=32", "--set", "d_ff=64", "--set", "n_layers=1", "--set", "n_heads=2", "--set",
        "context_length=32", "--set", "batch_size=8", "--set", "eval_batches=2"]
# Every installed distribution whose version the record keeps.
RECORDED = ("torch", "numpy", "ray", "optuna", "pandas", "matplotlib", "tensorboardX", "tokenizers", "PyYAML",
            "tqdm", "pyarrow", "pytest")


def declared() -> list[str]:
    """pyproject.toml's dependencies, as declared."""
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]


def uv() -> str:
    found = shutil.which("uv")
    if found is None:
        sys.exit("error: compat_check needs uv (its --resolution lowest-direct installs each dependency's lower "
                 "bound): pip install uv")
    return found


def set_up(which: str, work: Path, log: Path) -> Path:
    """A virtualenv holding the torch ``which`` names, lmtune's wheel with its dependencies, and pytest, installed by
    uv from the package index (not this machine's pip configuration, its constraints or local wheels): for "oldest"
    each of lmtune's dependencies at the lowest release its declared range admits (uv's lowest-direct resolution)."""
    dist = work / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "-q", "-w", str(dist)], check=True)
    wheel = next(dist.glob("lmtune-*.whl"))
    venv = work / "venv"
    subprocess.run([uv(), "venv", "--python", sys.executable, str(venv)], check=True, capture_output=True)
    install = [uv(), "pip", "install", "--python", str(venv / "bin" / "python")]
    if which == "oldest":  # (lmtune's requirements as direct ones, so that lowest-direct applies to them)
        command = [*install, "--resolution", "lowest-direct", *declared(), str(wheel), "pytest>=8"]
    else:
        command = [*install, "torch" if which == "newest" else f"torch=={which}", str(wheel), "pytest"]
    with open(log, "a") as out:
        subprocess.run(command, check=True, stdout=out, stderr=subprocess.STDOUT)
    return venv


def versions(venv: Path) -> dict[str, str | None]:
    code = (f"import importlib.metadata as m, json\nout = {{}}\nfor n in {RECORDED!r}:\n"
            "    try: out[n] = m.version(n)\n    except m.PackageNotFoundError: out[n] = None\nprint(json.dumps(out))")
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True)
    return json.loads(proc.stdout)


def steps(venv: Path, work: Path) -> list[tuple[str, list[str], float]]:
    """(name, command, time cap in seconds) of each check, run in ``work`` (a copy of the tests and the example)."""
    py = [str(venv / "bin" / "python")]
    results = str(work / "results")
    grid = [*py, "-m", "lmtune.run", "--space", "quick", *TINY, "--set", "steps=40", "--set", "warmup_steps=4",
            "--name", "grid", "--results", results, "--num-cpus", "2", "--no-dashboard", "--quiet"]
    optuna = [*py, "-m", "lmtune.run", "--space", "lr_optuna", "--budget", "quick", *TINY, "--set", "steps=20",
              "--set", "warmup_steps=2", "--set", "eval_interval=10", "--set", "checkpoint_interval=10",
              "--name", "optuna", "--results", results, "--num-cpus", "2", "--no-dashboard", "--quiet"]
    return [
        ("import lmtune and list its spaces", [*py, "-m", "lmtune.run", "--list-spaces"], 120),
        ("training core tests", [*py, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-k", "not wandb",
                                 *CORE_TESTS], 1800),  # (W&B is an optional extra: not installed here)
        ("a grid sweep (quick, tiny)", grid, 900),
        ("an Optuna sweep (lr_optuna, tiny)", optuna, 900),
        ("the report", [*py, "-m", "lmtune.analyze", str(work / "results" / "grid")], 600),
        ("the example model trained", [*py, "-m", "lmtune.train", "--model", "examples/cs336_model.py:TransformerLM",
                                       *TINY, "--set", "steps=20", "--set", "warmup_steps=2", "--out",
                                       str(work / "results" / "example"), "--quiet"], 600),
    ]


def run(name: str, command: list[str], cap: float, cwd: Path, log: Path) -> dict[str, object]:
    started = time.monotonic()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("PYTHONPATH", None)
    try:
        proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=cap, env=env)
        ok, tail = proc.returncode == 0, (proc.stdout + proc.stderr).strip().splitlines()[-8:]
    except subprocess.TimeoutExpired:
        ok, tail = False, [f"timed out after {cap:.0f} s"]
    seconds = round(time.monotonic() - started, 1)
    with open(log, "a") as out:
        out.write(f"\n=== {name}: {'ok' if ok else 'FAILED'} ({seconds} s)\n" + "\n".join(tail) + "\n")
    print(f"{name}: {'ok' if ok else 'FAILED'} ({seconds} s)", flush=True)
    return {"name": name, "ok": ok, "seconds": seconds, **({} if ok else {"tail": tail})}


def device() -> str:
    try:
        name = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        name = platform.processor() or platform.machine()
    return f"{name} ({platform.machine()}, {os.cpu_count()} threads)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("which", help="oldest, newest, or a torch version (e.g. 2.11.0)")
    parser.add_argument("--work", type=Path, help="the folder of the virtualenv and the runs (default: a new temp)")
    parser.add_argument("--no-record", action="store_true", help=f"print the result, do not append it to {RESULTS}")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="lmtune-compat-"))
    work.mkdir(parents=True, exist_ok=True)
    log = work / "compat.log"
    print(f"compat check ({args.which}) in {work}; its log: {log}", flush=True)
    venv = set_up(args.which, work, log)
    for folder in ("tests", "examples"):  # outside the checkout: the installed wheel is what the steps import
        shutil.copytree(REPO / folder, work / folder, dirs_exist_ok=True)
    found = versions(venv)
    print("versions: " + ", ".join(f"{k} {v}" for k, v in found.items() if v), flush=True)
    outcomes = [run(name, command, cap, work, log) for name, command, cap in steps(venv, work)]
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "unknown"
    record = {"kind": "compat", "which": args.which, "date": time.strftime("%Y-%m-%d"), "commit": commit,
              "device": device(), "python": platform.python_version(), "versions": found, "steps": outcomes,
              "passed": all(o["ok"] for o in outcomes),
              "command": f"bash scripts/compat_check.sh {args.which}"}
    if not args.no_record:
        with open(RESULTS, "a") as out:
            out.write(json.dumps(record, sort_keys=True) + "\n")
        print(f"recorded to {RESULTS}")
    print(json.dumps({k: record[k] for k in ("which", "passed")}))
    return 0 if record["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
