"""Shared fixtures and helpers: the built-in corpus (built once per session), a tiny training config,
a real quick sweep, and the helpers that start, wait for and kill processes and check refusals."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import struct
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from lmtune.data.prepare import ensure_builtin_corpus
from lmtune.sweep.record import trial_id_in
from lmtune.training.config import RunConfig, budget_config
from lmtune.usercode.config import UserCode

# One intra-op thread: the tests' models are tiny, the CI/dev machines have 2 shared cores, and
# measured on them a quick-budget run took 122 s with 1 thread vs 436 s with 2 (oversubscription).
# Single-threaded CPU math is also deterministic run to run, which the resume tests rely on.
torch.set_num_threads(1)

# The tests' tiny model and run, defined here once: every test file starts from these and says what it changes.
TINY_MODEL = dict(d_model=32, d_ff=64, n_layers=2, n_heads=2, context_length=32)
TINY = dict(**TINY_MODEL, batch_size=8, steps=30, warmup_steps=5, log_interval=5, eval_interval=10, eval_batches=2,
            checkpoint_interval=10, device="cpu", compile="off")
# A sweep's tiny trial (~1 s of compute): one layer and one evaluation batch, as sweeps run many trials.
TINY_TRIAL = {**TINY, "n_layers": 1, "eval_batches": 1}
# The benchmarks' tiny model: one layer, a context of 16 and a vocabulary of 256.
BENCH_MODEL = {**TINY_MODEL, "n_layers": 1, "context_length": 16, "vocab_size": 256}
# ASHA as the tests' grids use it: rungs at a fifth of the budget and then every doubling.
TEST_ASHA = {"name": "asha", "grace_period": 0.2, "reduction_factor": 2}
# Environment of the processes the tests start: one thread each on the 2 shared cores.
ENV = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


# The suite runs on two pytest-xdist workers (scripts/test.sh: -n 2), each test file's tests on one worker so that
# a module's fixtures run once. The files below run one after another on one worker: they share the session's quick
# sweep, open Ray's dashboard, start a cluster with `ray start` (its dashboard agent needs a port to itself), or
# train sweeps large enough that two at once would only take turns on the two cores; every other file runs beside
# them, on the other worker. A sweep whose test asserts nothing of trials running at once runs them one at a time
# (--num-cpus 1): on two cores both busy a second trial only takes turns with the first, and costs trial workers of
# its own (the README's edge command at test size: 60 CPU-s and 8 trial workers at --num-cpus 2, 43 and 1 at 1; the
# same 25 trials and conclusions).
SERIAL_RAY_FILES = frozenset({
    "test_analyze.py", "test_diagnose.py", "test_hostile_inputs.py", "test_retention.py", "test_sweep.py",
    "test_faults.py", "test_cloud_rehearsal.py", "test_hostile_sweeps.py", "test_edge_sweep.py",
    "test_horizon_sweep.py", "test_width_sweep.py", "test_fused_sweep.py", "test_hostile_part6_surfaces.py"})


# Fixtures that run a real sweep (Ray and training): a test using one, directly or through another fixture, is an
# end-to-end test, marked slow wherever its file is (the inner loop, -m "not slow", leaves it to the full suite).
SWEEP_FIXTURES = frozenset({"quick_sweep"})


# The two tiers (docs/contributing.md, "Running the tests"). The per-push tier is every test not marked `release`:
# what the README's test command and CI run on every push, under 15 minutes on 2 cores. `--release`
# (scripts/test.sh --release) adds the release checks: installs into other environments, the autoscaler
# rehearsal, the GPU check's environments, inductor on the CPU, the documentation's commands at their full tiny
# budget, and the test-size ground truths. Each tier's tests have a time limit (pytest-timeout), set here per tier;
# a test that needs more says so beside it (@pytest.mark.timeout(N)), and a process a test runs through the
# helpers below is stopped before its test's limit (time_left).
PER_PUSH_LIMIT_S = 240
RELEASE_LIMIT_S = 900


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--release", action="store_true",
                     help="lmtune: run the release tier too (tests marked release), as scripts/test.sh --release does")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    release = config.getoption("--release")
    kept, left = [], []
    for item in items:
        if SWEEP_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        in_release = item.get_closest_marker("release") is not None
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(RELEASE_LIMIT_S if in_release else PER_PUSH_LIMIT_S))
        (left if in_release and not release else kept).append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept


# When the running test's time limit ends (time.monotonic()); None outside a test.
_DEADLINE: float | None = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    global _DEADLINE
    marker = item.get_closest_marker("timeout")
    limit = marker.args[0] if marker is not None and marker.args else marker.kwargs.get("timeout") if marker else None
    _DEADLINE = time.monotonic() + float(limit) if limit else None
    try:
        yield
    finally:
        _DEADLINE = None


def time_left(asked: float | None = None, margin_s: float = 10) -> float | None:
    """A process's timeout within its test's limit: ``asked`` (None: the rest of the test's time), cut to end
    ``margin_s`` before the test's limit, so that the process is stopped, and says so, before the test is."""
    if _DEADLINE is None:
        return asked
    rest = max(1.0, _DEADLINE - time.monotonic() - margin_s)
    return rest if asked is None else min(asked, rest)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """xdist's scheduler by scope, a scope being a test file or, for SERIAL_RAY_FILES, all of them together (the
    scope with the most tests, which xdist hands out first)."""
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            return "serial-ray" if Path(file).name in SERIAL_RAY_FILES else file

    return FileScheduling(config, log)


@pytest.fixture(scope="session")
def builtin_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built-in story corpus, generated and tokenized once per test session."""
    return ensure_builtin_corpus(tmp_path_factory.mktemp("data") / "builtin")


@pytest.fixture(scope="session")
def make_tiny_config(builtin_data: Path) -> Callable[..., RunConfig]:
    """``make_tiny_config(code=None, **overrides)``: a fresh tiny config on the built-in corpus (usable from any
    scope), training ``code`` (a UserCode: the user's model; None: lmtune's)."""

    def make(code=None, **overrides) -> RunConfig:
        return budget_config("quick", {**TINY, **overrides}, data_dir=str(builtin_data), code=code)

    return make


# The user's models of the tests (tests/user_models/) and lmtune's example (examples/cs336_model.py).
REPO = Path(__file__).resolve().parents[1]
EXAMPLE = f"{REPO / 'examples' / 'cs336_model.py'}:TransformerLM"
USER_MODELS = Path(__file__).resolve().parent / "user_models"


def user_model(name: str, **model_args) -> UserCode:
    """The UserCode of a model of tests/user_models ("file.py:Name"), or of the example ("example")."""
    spec = EXAMPLE if name == "example" else f"{USER_MODELS / name}"
    return UserCode(model=spec, model_args=model_args)


@pytest.fixture
def tiny_config(make_tiny_config: Callable[..., RunConfig]) -> RunConfig:
    """A ~1 s run: d_model 32, 2 layers, context 32, batch 8, 30 steps, checkpoints every 10, CPU, eager."""
    return make_tiny_config()


# The quick sweep's model: the tiny trial's widths and depth, the space's own context and budget (its 6 LRs still
# show slow, good, spiking and diverging runs).
QUICK_SWEEP_MODEL = {k: TINY_TRIAL[k] for k in ("d_model", "d_ff", "n_layers", "n_heads")}


@pytest.fixture(scope="session")
def quick_sweep(tmp_path_factory: pytest.TempPathFactory, builtin_data: Path) -> Path:
    """A real sweep of the shipped `quick` space (Ray Tune on a local cluster, its 6 LRs, its steps, evaluations and
    ASHA), its model shrunk to QUICK_SWEEP_MODEL, run once per test session; --keep last, so each trial keeps its
    newest checkpoint (analyze --sharpness reads them)."""
    results = tmp_path_factory.mktemp("results")
    proc = run_lmtune("run", "--space", "quick", "--name", "quick", "--results", str(results),
                      "--data", str(builtin_data), "--no-dashboard", "--quiet", "--num-cpus", "1", "--keep", "last",
                      *set_args(QUICK_SWEEP_MODEL))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (results / "quick.log").write_text(proc.stdout + proc.stderr)  # what the user saw, beside the sweep
    return results / "quick"


# ---------------------------------------------------------------------------------------------
# Processes


# LMTUNE_TEST_COMMAND_LOG=FILE: each command a test runs through run_lmtune, run_python or start_lmtune, with the
# test that ran it and how long it took (none for a started one), one JSON line each: where the suite's time goes
# command by command, beside pytest's --durations (docs/contributing.md, "Running the tests").
COMMAND_LOG = os.environ.get("LMTUNE_TEST_COMMAND_LOG")


def log_command(argv: list[str], started: float | None) -> None:
    if COMMAND_LOG:
        line = {"test": os.environ.get("PYTEST_CURRENT_TEST", ""), "argv": argv[1:],
                "seconds": None if started is None else round(time.monotonic() - started, 2)}
        with open(COMMAND_LOG, "a") as log:
            log.write(json.dumps(line) + "\n")


def run_command(argv: list[str], timeout: float | None = None, cwd: Path | None = None,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``argv`` (a console script, another environment's python, this one's) with the tests' environment, in a
    session of its own; returns the CompletedProcess. It may run ``timeout`` seconds, and never past its test's limit
    (time_left); then it and every process it started are killed and the test fails, naming the command and the last
    of its output."""
    started, limit = time.monotonic(), time_left(timeout)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
                            env={**os.environ, **ENV, **(env or {})}, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        kill_session(proc.pid)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(map(str, argv[:4]))} ... did not finish within {limit:.0f} s:\n{(out + err)[-4000:]}")
    finally:
        log_command([str(a) for a in argv], started)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def run_lmtune(module: str, *args: str, timeout: float | None = None, cwd: Path | None = None,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m lmtune.MODULE ARGS`` in a subprocess (run_command); returns the CompletedProcess."""
    return run_command([sys.executable, "-m", f"lmtune.{module}", *args], timeout, cwd, env)


def run_space_and_analyze(space_yaml: str, name: str, tmp: Path, data: Path, num_cpus: int = 1,
                          timeout: float | None = None) -> dict:
    """``lmtune run`` of a space written from ``space_yaml`` (sweep ``name``, results under ``tmp``), then ``lmtune
    analyze`` of it: the two CompletedProcesses, the sweep's folder and its report's summary.json ({} when analyze
    failed)."""
    space = tmp / f"{name}.yaml"
    space.write_text(space_yaml)
    run = run_lmtune("run", "--space", str(space), "--name", name, "--results", str(tmp / "results"), "--data",
                     str(data), "--num-cpus", str(num_cpus), "--no-dashboard", "--quiet", timeout=timeout)
    sweep_dir = tmp / "results" / name
    analyze = run_lmtune("analyze", str(sweep_dir), timeout=120)
    summary = json.loads((sweep_dir / "report" / "summary.json").read_text()) if analyze.returncode == 0 else {}
    return {"run": run, "analyze": analyze, "dir": sweep_dir, "summary": summary}


def run_python(*args: str, timeout: float | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``python ARGS`` (this interpreter: a script, or -c CODE) in a subprocess (run_command)."""
    return run_command([sys.executable, *args], timeout, cwd)


def start_lmtune(module: str, *args: str, env: dict[str, str] | None = None, python: str | Path = sys.executable,
                 **popen) -> subprocess.Popen:
    """``python -m lmtune.MODULE ARGS`` started in the background (by ``python``: this interpreter, or another
    environment's), in a session of its own (so a test can kill it and every process it started, Ray's included,
    and nothing else)."""
    argv = [str(python), "-m", f"lmtune.{module}", *args]
    log_command(argv, None)
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, env={**os.environ, **ENV, **(env or {})},
                            start_new_session=True,
                            **{"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True, **popen})


def wait_until(condition: Callable[[], object], proc: subprocess.Popen | None, timeout: float, what: str,
               poll_s: float = 0.01, required: bool = True) -> bool:
    """Poll ``condition`` until it holds; fail if ``proc`` ends first. After ``timeout`` seconds: fail, or
    return False when not ``required`` (the caller goes on without it). It never waits past its test's limit
    (time_left)."""
    timeout = time_left(timeout, margin_s=5)
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc is None or proc.poll() is None, f"the process ended before {what}"
        if time.monotonic() >= deadline:
            assert not required, f"no {what} within {timeout:.0f} s"
            return False
        time.sleep(poll_s)
    return True


def sigkill(proc: subprocess.Popen) -> None:
    """SIGKILL a process that must still be running, and reap it."""
    assert proc.poll() is None, "the process finished before it could be killed; make its run longer"
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL


def session_pids(sid: int) -> list[int]:
    """Live processes of session ``sid`` (a process started with start_new_session=True and every
    process it spawned: Ray's GCS, raylet, dashboard and workers included)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after ")": state, ppid, pgrp, session
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid and fields[0] != "Z" and int(stat.parent.name) != os.getpid():
            pids.append(int(stat.parent.name))
    return pids


def kill_session(sid: int, timeout: float = 30) -> int:
    """SIGKILL every process of our own session ``sid``, pid by pid; returns how many were live."""
    first = session_pids(sid)
    deadline = time.monotonic() + timeout
    while live := session_pids(sid):
        for pid in live:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        assert time.monotonic() < deadline, f"processes of session {sid} survive SIGKILL: {live}"
        time.sleep(0.2)
    return len(first)


def processes_with_env(name: str, value: str) -> set[int]:
    """Live processes whose environment holds ``name=value``: what a process started with it started in turn,
    wherever they went (a new session included). A process that rewrote its title over its environment (Ray's
    agents and dashboard modules do) no longer shows it: look for those by their session too (session_pids)."""
    entry, found = f"{name}={value}".encode(), set()
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if entry in environ.read_bytes().split(b"\0") and int(environ.parent.name) != os.getpid():
                found.add(int(environ.parent.name))
        except OSError:
            continue  # ended meanwhile
    return found


def command_line(pid: int) -> str:
    """A process's command line (its title, for one that set it), or "" once it has ended."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def finish(proc: subprocess.Popen, timeout: float) -> str:
    """Wait for a process started by start_lmtune; on timeout (never past its test's limit: time_left) kill its
    whole session. Returns its output."""
    timeout = time_left(timeout)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_session(proc.pid)
        out, _ = proc.communicate()
        pytest.fail(f"{' '.join(proc.args[2:4])} did not finish within {timeout} s:\n{out[-4000:]}")
    finally:
        kill_session(proc.pid)  # whatever it left behind in its session
    return out


# ---------------------------------------------------------------------------------------------
# Settings, spaces, files and refusals


def set_args(settings: dict) -> list[str]:
    """``settings`` as the CLI's --set key=value pairs."""
    return [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]


def write_grid_space(path: Path, lrs: list[float], scheduler: dict | None = None, **settings) -> Path:
    """A grid space over ``lrs`` on the tiny trial (TINY_TRIAL with ``settings`` on top); without ASHA unless
    a ``scheduler`` is given (e.g. TEST_ASHA)."""
    path.write_text(
        "description: a tiny grid for the tests\nsearch: grid\nbudget: quick\n"
        f"params:\n  lr: {json.dumps([float(lr) for lr in lrs])}\n"
        f"set: {json.dumps({**TINY_TRIAL, **settings})}\n"
        f"scheduler: {json.dumps(scheduler or {'name': 'none'})}\n")
    return path


def write_csv(path: Path, rows: list[dict]) -> Path:
    """``rows`` (dicts with the same keys) as a CSV file with a header: a run log as a user's own loop writes one."""
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def assert_real_picture(path: Path) -> None:
    """A PNG of a real figure: at least 400 x 300 pixels, and not blank (a blank image has a pixel
    standard deviation of 0; curves, text, markers and a colorbar put it far above)."""
    import matplotlib.image as mpimg

    image = mpimg.imread(path)
    assert image.shape[0] > 300 and image.shape[1] > 400, image.shape
    assert image[..., :3].std() > 0.05


def trial_dirs(sweep_dir: Path) -> dict[str, Path]:
    """Trial id -> trial folder of a sweep, by the trial.json each trial writes."""
    found = {}
    for path in sorted(p for p in Path(sweep_dir).iterdir() if p.is_dir()):
        trial_id = trial_id_in(path)
        if trial_id:
            found[trial_id] = path
    return found


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime) of every file and folder under ``root``: equal snapshots mean nothing was written."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def tensorboard_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the TensorBoard event files in ``folder`` (TFRecord framing: length, CRC, event, CRC)."""
    from tensorboardX.proto.event_pb2 import Event

    scalars = defaultdict(list)
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data, pos = path.read_bytes(), 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            event = Event.FromString(data[pos + 12:pos + 12 + length])
            pos += 12 + length + 4
            for value in event.summary.value:
                scalars[value.tag].append((event.step, value.simple_value))
    return dict(scalars)


def png_width(path: Path) -> int:
    """A PNG's width in pixels (its IHDR chunk)."""
    return struct.unpack(">I", path.read_bytes()[16:20])[0]


@contextlib.contextmanager
def read_only(folder: Path):
    """``folder`` made unwritable for the block: chmod 0o555, or (as root, whom permission bits do not stop)
    the immutable attribute; skips the test where the filesystem offers neither."""
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        folder.chmod(0o555)
        undo = ["chmod", "755", str(folder)]
    else:
        made = subprocess.run(["chattr", "+i", str(folder)], capture_output=True)
        if made.returncode != 0:
            pytest.skip(f"cannot make {folder} read-only as root here (chattr: {made.stderr.decode().strip()})")
        undo = ["chattr", "-i", str(folder)]
    try:
        yield folder
    finally:
        subprocess.run(undo, check=True)


def assert_one_line_error(code: int, stderr: str, *fragments: str, status: int = 2, starts: str = "") -> str:
    """A refusal: exit status ``status`` (2; a full disk's is 1) and one ``error: ...`` line (``error: `` then
    ``starts``) holding each fragment, no traceback."""
    lines = stderr.strip().splitlines()
    assert code == status, (code, stderr[-3000:])
    assert len(lines) == 1 and lines[0].startswith(f"error: {starts}"), stderr[-3000:]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def assert_refused(main: Callable[[list[str]], int], argv: list[str], capsys, *fragments: str) -> str:
    """Call a CLI's ``main(argv)`` in this process; it must refuse in one line naming each fragment."""
    code = main(argv)
    return assert_one_line_error(code, capsys.readouterr().err, *fragments)


def _read_wandb_logs(folder: Path) -> list[dict]:
    """The offline W&B runs under ``folder`` (WANDB_MODE=offline writes wandb/offline-run-*/run-*.wandb),
    each as {"history": [rows], "summary": {...}, "config": {...}}, read from wandb's own log.

    The .wandb file is wandb's record log (LevelDB's log format: 32 KiB blocks of records with a
    7-byte header, checksum, length and type) of protobuf Records; wandb >= 0.19 ships no Python reader.

    wandb-core writes the log in a process of its own and may still be writing it when ``run.finish()`` has returned
    (a run's history record came after the read on a loaded machine): each log is read once it holds the run's exit
    record, waited for up to ``EXIT_WAIT_S``.
    """
    import json
    import struct

    from wandb.proto import wandb_internal_pb2

    runs = []
    for path in sorted(Path(folder).glob("wandb/offline-run-*/run-*.wandb")):
        data, pos, pending = path.read_bytes(), 7, b""  # the file starts with a 7-byte ":W&B" header
        run: dict = {"history": [], "summary": {}, "config": {}}
        while pos + 7 <= len(data):
            if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
                pos += 32768 - pos % 32768
                continue
            _checksum, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
            chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
            pending = chunk if kind in (1, 2) else pending + chunk  # 1 full, 2 first, 3 middle, 4 last
            if kind not in (1, 4):
                continue
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            kind_name = record.WhichOneof("record_type")
            if kind_name == "history":
                run["history"].append({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                                       for i in record.history.item})
            elif kind_name == "summary":
                run["summary"].update({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                                       for i in record.summary.update})
            elif kind_name in ("run", "config"):  # the config comes with the run record, updates after it
                config = record.run.config if kind_name == "run" else record.config
                run["config"].update({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                                      for i in config.update})
            run["ended"] = run.get("ended", False) or kind_name == "exit"
        runs.append(run)
    return runs


EXIT_WAIT_S = 60.0


def read_wandb_runs(folder: Path) -> list[dict]:
    """The offline W&B runs under ``folder`` as _read_wandb_logs reads them, once each log holds its exit record."""
    import time

    deadline = time.monotonic() + EXIT_WAIT_S
    while True:
        runs = _read_wandb_logs(folder)
        ended = [run.pop("ended", False) for run in runs]
        if all(ended) or time.monotonic() > deadline:
            return runs
        time.sleep(0.2)


# ---------------------------------------------------------------------------------------------
# A sweep folder written by hand (no Ray): what run and analyze read

DISK_CONFIG = RunConfig()
DISK_CONFIG.model.vocab_size, DISK_CONFIG.model.context_length = 500, 50
DISK_CONFIG.train.steps, DISK_CONFIG.train.batch_size = 30, 10


def grid_sweep_record(name: str, lrs: list[float], base: RunConfig, params: dict | None = None, **where):
    """The sweep.json a sweep of a grid of ``lrs`` (or of ``params``) without ASHA from ``base`` writes, with
    ``where`` (SweepRecord's other fields: its data, ...)."""
    from lmtune.sweep.plan import SweepPlan
    from lmtune.sweep.spaces import parse_space
    from lmtune.sweep.sweep_file import SweepRecord

    space = parse_space({"search": "grid", "params": params or {"lr": lrs}, "scheduler": {"name": "none"}},
                        Path(f"{name}.yaml"))
    return SweepRecord(name=name, plan=SweepPlan.create(space, base), **where)


def disk_sweep(root: Path, trials: dict[str, tuple[float, str, dict[int, float]]]) -> Path:
    """A sweep folder as a sweep leaves it: sweep.json, the ledger, and per trial (id -> lr, ledger outcome,
    {step: val loss}) its trial.json, config.json and metrics.csv (train loss falling from ln 500)."""
    from lmtune.sweep.record import ledger_path, write_trial_file
    from lmtune.training.metrics import write_metrics

    sweep_dir = root / "disk"
    sweep_dir.mkdir()
    grid_sweep_record("disk", sorted({lr for lr, _, _ in trials.values()}), DISK_CONFIG).write(sweep_dir)
    ledger_path(sweep_dir).parent.mkdir()
    ledger_path(sweep_dir).write_text(json.dumps({t: {"outcome": o, "reason": o} for t, (_, o, _) in trials.items()}))
    for trial_id, (lr, _, val) in trials.items():
        folder = sweep_dir / f"{trial_id}_lr={lr}"
        folder.mkdir()
        write_trial_file(folder, trial_id, {"lr": lr})
        config = DISK_CONFIG.to_dict()
        config["train"]["lr"] = lr
        (folder / "config.json").write_text(json.dumps(config))
        write_metrics(folder / "metrics.csv", [{"step": step, "tokens": step * 500, "train_loss": 6.0 - step / 10,
                                                "val_loss": loss} for step, loss in sorted(val.items())])
    return sweep_dir


def run_printout(sweep_dir: Path, trials: int, capsys) -> tuple[int, str]:
    from lmtune.run import print_result
    from lmtune.sweep.options import SweepOptions
    from lmtune.sweep.record import read_outcomes
    from lmtune.sweep.runner import SweepResult

    outcomes = read_outcomes(sweep_dir)
    counts = {o: sum(e["outcome"] == o for e in outcomes.values()) for o in {e["outcome"] for e in outcomes.values()}}
    code = print_result(SweepResult(sweep_dir, trials, counts), SweepOptions(space="grid", name="disk"))
    return code, capsys.readouterr().out


def drive_search(search, sweep, max_trials: int, stop_after: int | None = None,
                 round_trip: Callable | None = None) -> tuple[int, object]:
    """Drive a Ray-free deciding search (edge, horizon) with a simulated sweep: ask for a trial, run it, until the
    search says it has finished, ``stop_after`` trials ran, or ``max_trials``. ``round_trip``: the search is
    rebuilt by it between every two trials (e.g. through its JSON, as a resumed sweep's would be). Returns the
    trials run and the search."""
    from lmtune.searches.deciding import FINISHED, WAIT

    count = len(search.runs)
    while count < max_trials and (stop_after is None or count < stop_after):
        config = search.suggest(f"t{count:03d}")
        if config == FINISHED:
            break
        assert config != WAIT, "a search with no trial running must always have something to do"
        sweep.run(search, f"t{count:03d}", config)
        count += 1
        if round_trip is not None:
            search = round_trip(search)
    return count, search


REPO_ROOT = Path(__file__).resolve().parents[1]
# The user's documentation: the README and the pages of docs/ it links to (their commands and paths are checked).
DOC_FILES = (REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md")))


def docs_text() -> str:
    """The README and every docs/ page, one text."""
    return "\n\n".join(path.read_text() for path in DOC_FILES)


def assert_confirmation_follows_its_rule(confirmed: dict) -> None:
    """A horizon or width search's confirmation at the target reads its excess and standard error by its rule
    (lmtune.searches.axis.report_confirmation): out of the basin exactly when the excess is above 2 SE; in it, or
    undetermined, only within 2 SE (or with no SE: one seed per LR)."""
    verdict, excess, se = confirmed["in_basin"], confirmed["predicted_excess"], confirmed["predicted_excess_se"]
    assert verdict in (True, False, "undetermined") and excess is not None
    if verdict is False:
        assert se is not None and excess > 2 * se, confirmed
    elif se is not None:
        assert excess <= 2 * se, confirmed
    if verdict == "undetermined":
        assert confirmed["verdict"].startswith("undetermined"), confirmed


def assert_coord_check_follows_its_rule(coord: dict) -> None:
    """summary.json's coord_check is flat exactly when every layer's slope is within the tolerance
    (lmtune.training.coord_check.verdict)."""
    from lmtune.training.coord_check import FLAT_TOLERANCE

    slopes = [abs(v) for layer in coord["slopes"].values() for v in layer.values()]
    assert slopes and coord["flat"] is all(v < FLAT_TOLERANCE for v in slopes), coord
