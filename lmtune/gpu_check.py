"""``python -m lmtune.gpu_check`` (``bash scripts/gpu_check.sh``): measure what lmtune does on this machine's
GPU and write it all into one JSON file to attach to a bug report.

It runs from a plain checkout with whatever torch the machine has (``PYTHONPATH=. python3 -m lmtune.gpu_check`` or
``bash scripts/gpu_check.sh --system``: a rented GPU box as it comes needs only torch, numpy and pyyaml). On a CUDA
GPU, in order, each step under a time cap so that the whole check ends within 14 minutes: the environment and
``diagnose``; the CUDA checks (lmtune.tools.cuda_checks); ``bench`` of the default 17M model at batch 128 (bf16,
compile, fused AdamW) against the naive loop, MFU against the GPU's measured bf16 matmul peak (``--record``: appended
to benchmarks/results.jsonl too); ``bench --concurrency 1,2,4`` and ``--fuse 1,2,4,7``; and, where Ray is installed,
a shortened ``lr_grid`` sweep at four trials per GPU. Without a GPU, each step that needs CUDA is skipped with its
reason and the others run as a smoke test on a tiny model (what CI runs): the file then says so, and none of its
figures is a GPU's. A step whose packages are not installed is skipped, naming them, in the output and the file.
``--only sweep`` (or ``--only bench,fuse``, of the steps named in STEPS) runs only those steps; the others are listed
as left out.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

try:  # a GPU box as it comes may lack even these: one line naming what is missing and how to install it
    import numpy  # noqa: F401
    import torch
    import yaml  # noqa: F401
except ModuleNotFoundError:
    _lacks = [pip for module, pip in (("torch", "torch"), ("numpy", "numpy"), ("yaml", "pyyaml"))
              if importlib.util.find_spec(module) is None]
    if not _lacks:  # (one of their own dependencies is missing: its traceback names it)
        raise
    print(f"error: {sys.executable} has no {', '.join(_lacks)} (lmtune needs torch, numpy and pyyaml); install "
          f"{'it' if len(_lacks) == 1 else 'them'}: {sys.executable} -m pip install {' '.join(_lacks)} (torch for "
          "this GPU's CUDA: https://pytorch.org/get-started/locally/), or run bash scripts/gpu_check.sh without "
          "--system to set up .venv", file=sys.stderr)
    sys.exit(2)

from lmtune.cli import command_parser
from lmtune.errors import LmtuneError, cli_entry
from lmtune.files import atomic_write_text, check_destination
from lmtune.training.device import device_name, resolve_device

# The CPU smoke test's model and schedule: every step in seconds.
TINY = ["--set", "d_model=32", "--set", "d_ff=64", "--set", "n_layers=1", "--set", "n_heads=2",
        "--set", "context_length=32"]
SMOKE_BENCH = ["--config", "quick", "--batch-size", "4", "--steps", "2", "--repeats", "1", "--warmup", "1",
               "--no-naive", "--no-eval", "--json", *TINY]
# What a sweep imports besides torch, numpy and pyyaml (Ray Tune; the report's tables and figures; the built-in
# corpus's tokenizer). lmtune's other optional packages (tensorboardX, optuna) a sweep of a grid does without.
SWEEP_PACKAGES = ("ray", "pandas", "matplotlib", "tokenizers")
# The packages lmtune runs with, as they are imported (a bare GPU box may lack all but torch, numpy and yaml).
PACKAGES = ("torch", "numpy", "yaml", "tensorboardX", "optuna", "pandas", "matplotlib", "tokenizers", "ray")
# On a GPU each step's time cap (seconds); they add up to 13.5 minutes. Measured on an H200 (torch 2.11, cold
# compile caches): the CUDA checks 47 s, bench 31 s, concurrency 1,2,4 past 75 s (done within 170), fuse 1,2 within
# 130 (1,2,4,7 past 170 while the fused compile failed); diagnose past 40 s.
GPU_CAPS = {"diagnose": 120, "cuda": 60, "bench": 120, "concurrency": 150, "fuse": 240, "sweep": 120}
# The steps, by the names --only takes: in order on a GPU.
STEPS = tuple(GPU_CAPS)


@dataclass(frozen=True)
class Outcome:
    """What one step did, as the report file keeps it (a field left None is absent from the file)."""

    command: str
    """The step's command line."""
    ran: bool
    """False: it was skipped."""
    skipped: str | None = None
    """Why it was skipped."""
    ok: bool | None = None
    """It exited 0 within its time."""
    returncode: int | None = None
    """Its exit status (None: it timed out)."""
    seconds: float | None = None
    """Its wall time."""
    error: str | None = None
    """Why it failed without an exit status (a timeout)."""
    output: object = None
    """The JSON object it printed last (a step with JSON output that succeeded)."""
    output_tail: list[str] | None = None
    """Its last lines of output and errors, otherwise."""

    def to_json(self) -> dict[str, object]:
        return {key: value for key, value in asdict(self).items() if value is not None}


@dataclass
class Step:
    key: str
    """Its short name (one of STEPS: what --only names)."""
    name: str
    command: list[str]
    needs_cuda: bool = False
    needs: tuple[str, ...] = ()
    """Packages (import names) it needs besides torch, numpy and pyyaml."""
    timeout_s: float = 3600.0
    json_output: bool = True
    outcome: Outcome | None = None
    """What running it did (None: not run yet)."""


def missing_packages(names: tuple[str, ...] = PACKAGES) -> list[str]:
    """Which of ``names`` are not installed (looked up, not imported)."""
    return [name for name in names if importlib.util.find_spec(name) is None]


def plan(cuda: bool, work: Path) -> list[Step]:
    """The steps, for a CUDA GPU or (without one) as the CPU smoke test."""
    py = [sys.executable, "-m"]
    if cuda:
        bench = [*py, "lmtune.bench", "--json", "--config", "default", "--batch-size", "128"]
        short = ["--steps", "5", "--repeats", "2", "--warmup", "2"]
        return [
            Step("diagnose", "environment and diagnose", [*py, "lmtune.diagnose"], json_output=False,
                 timeout_s=GPU_CAPS["diagnose"]),
            Step("cuda", "cuda tests", [*py, "lmtune.tools.cuda_checks"], needs_cuda=True, json_output=False,
                 timeout_s=GPU_CAPS["cuda"]),
            Step("bench", "bench default, batch 128, against the naive loop",
                 [*bench, "--steps", "10", "--repeats", "3", "--warmup", "3", "--no-eval", "--measured-peak",
                  "--record"], timeout_s=GPU_CAPS["bench"]),
            Step("concurrency", "bench concurrency 1,2,4", [*bench, *short, "--concurrency", "1,2,4"],
                 timeout_s=GPU_CAPS["concurrency"]),
            Step("fuse", "bench fuse 1,2,4,7", [*bench, *short, "--fuse", "1,2,4,7"], timeout_s=GPU_CAPS["fuse"]),
            Step("sweep", "lr_grid sweep, 200 steps, 4 trials per GPU", [
                *py, "lmtune.run", "--space", "lr_grid", "--set", "steps=200", "--set", "warmup_steps=20",
                "--set", "eval_interval=100", "--set", "checkpoint_interval=100", "--gpus-per-trial", "0.25",
                "--name", "gpu-check", "--results", str(work), "--quiet", "--no-dashboard"],
                needs=SWEEP_PACKAGES, json_output=False, timeout_s=GPU_CAPS["sweep"]),
        ]
    return [
        Step("cuda", "cuda tests", [*py, "lmtune.tools.cuda_checks"], needs_cuda=True, json_output=False),
        Step("diagnose", "diagnose", [*py, "lmtune.diagnose", "--config", "quick", "--batch-size", "4", "--steps", "2",
                                      "--repeats", "1"], json_output=False),
        Step("bench", "bench (CPU smoke: a tiny model)", [*py, "lmtune.bench", *SMOKE_BENCH]),
        Step("concurrency", "bench concurrency (CPU smoke)",
             [*py, "lmtune.bench", *SMOKE_BENCH, "--concurrency", "1,2"]),
        Step("fuse", "bench fuse (CPU smoke)", [*py, "lmtune.bench", *SMOKE_BENCH, "--fuse", "1,2"]),
        Step("sweep", "sweep (CPU smoke: quick, 10 steps)", [
            *py, "lmtune.run", "--space", "quick", "--set", "steps=10", "--set", "eval_interval=5", "--set",
            "checkpoint_interval=5", "--set", "warmup_steps=2", *TINY, "--name", "gpu-check", "--results", str(work),
            "--quiet", "--no-dashboard", "--num-cpus", "2"], needs=SWEEP_PACKAGES, json_output=False),
    ]


def run_step(step: Step, cuda: bool, only: list[str] | None = None) -> None:
    """Run one step (or say why not: left out of ``only``, the steps asked for) and keep what it printed: its JSON,
    else the last lines."""
    command = shlex.join(step.command)
    if only is not None and step.key not in only:
        step.outcome = Outcome(command, ran=False, skipped=f"left out (--only {','.join(only)})")
        return
    if step.needs_cuda and not cuda:
        step.outcome = Outcome(command, ran=False, skipped="needs a CUDA GPU: none here")
        return
    if missing := missing_packages(step.needs):
        step.outcome = Outcome(command, ran=False, skipped=f"needs {', '.join(missing)}: not installed")
        return
    started = time.perf_counter()
    try:
        proc = subprocess.run(step.command, capture_output=True, text=True, timeout=step.timeout_s)
    except subprocess.TimeoutExpired:
        step.outcome = Outcome(command, ran=True, ok=False, seconds=step.timeout_s,
                               error=f"timed out after {step.timeout_s:.0f} s")
        return
    finished = Outcome(command, ran=True, ok=proc.returncode == 0, returncode=proc.returncode,
                       seconds=round(time.perf_counter() - started, 1))
    output = proc.stdout.strip()
    if step.json_output and proc.returncode == 0:
        try:
            step.outcome = replace(finished, output=json.loads(output.splitlines()[-1]))
            return
        except (ValueError, IndexError):
            pass
    step.outcome = replace(finished, output_tail=(output + "\n" + proc.stderr.strip()).strip().splitlines()[-40:])


@dataclass(frozen=True)
class Machine:
    """The machine the check ran on."""

    device: str
    """The device lmtune picks (auto)."""
    device_type: str
    """cuda, cpu or mps."""
    torch: str
    """torch's version."""
    cuda: str | None
    """The CUDA version torch was built with (None: a CPU build)."""
    python: str
    """Python's version."""
    platform: str
    """The operating system."""
    cpu_count: int | None
    """Logical CPU cores."""
    gpus: list[str]
    """Every CUDA GPU's name."""


def machine() -> Machine:
    device = resolve_device("auto")
    return Machine(device=device_name(device), device_type=device.type, torch=torch.__version__,
                   cuda=torch.version.cuda, python=platform.python_version(), platform=platform.platform(),
                   cpu_count=os.cpu_count(),
                   gpus=[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])


def parse_only(value: str | None) -> list[str] | None:
    """--only's steps, in STEPS's order (None: every step); a name not in STEPS is refused in one line."""
    if value is None:
        return None
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in STEPS]
    if unknown or not names:
        what = f"no step called {', '.join(unknown)}" if unknown else "names no step"
        raise LmtuneError(f"--only {what}; the steps are {', '.join(STEPS)}")
    return [key for key in STEPS if key in names]


@cli_entry
def main(argv: list[str] | None = None) -> int:
    parser = command_parser("gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="the JSON file (default: gpu_check-HOST-TIME.json)")
    parser.add_argument("--only", metavar="STEP[,STEP...]",
                        help=f"run only these steps, of {', '.join(STEPS)} (default: every step); the others are "
                             "listed as left out")
    args = parser.parse_args(argv)
    only = parse_only(args.only)
    out = args.out or Path(f"gpu_check-{platform.node()}-{time.strftime('%Y%m%d-%H%M%S')}.json")
    check_destination(out, "--out", kind="file")  # before the run: on a GPU it takes minutes
    if out.exists():
        raise LmtuneError(f"{out} already exists; give another --out")
    cuda = torch.cuda.is_available()
    report = {"machine": asdict(machine()), "gpu": cuda, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "missing_packages": missing_packages(),
              "note": "measured on a CUDA GPU" if cuda else
              "no CUDA GPU here: a smoke test of the CPU paths on a tiny model; no figure is a GPU's"}
    if only is not None:
        report["only"] = only
    if report["missing_packages"]:
        print(f"not installed: {', '.join(report['missing_packages'])} (the steps that need them are skipped)")
    with tempfile.TemporaryDirectory(prefix="lmtune-gpu-check-") as work:
        steps = plan(cuda, Path(work))
        for step in steps:
            print(f"{step.name}: ", end="", flush=True)
            run_step(step, cuda, only)
            r = step.outcome
            print(r.skipped or ("ok" if r.ok else f"FAILED (exit {r.returncode})")
                  + (f", {r.seconds} s" if r.seconds is not None else ""), flush=True)
    report["steps"] = [{"name": s.name, **s.outcome.to_json()} for s in steps]
    report["skipped"] = {s.name: s.outcome.skipped for s in steps if not s.outcome.ran}
    atomic_write_text(out, json.dumps(report, indent=1, sort_keys=True) + "\n")
    failed = [s.name for s in steps if s.outcome.ran and not s.outcome.ok]
    print(f"wrote {out}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
