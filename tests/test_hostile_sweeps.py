"""What a hostile tester broke (part five) on the surfaces of a sweep added since part four: where it keeps its
files (--storage), where it runs (--address, --cluster-config, resources), the Python API's searcher and report,
a step hook, a full disk, --fuse and a width space. Each refusal is one line naming the fix, before Ray starts and
before anything is written; each check that waits on the network is bounded by seconds and gives way to a signal.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import ray
from cloud import S3Server, free_port
from conftest import (
    assert_one_line_error,
    assert_refused,
    run_lmtune,
    run_python,
    session_pids,
    start_lmtune,
    trial_dirs,
    wait_until,
    write_grid_space,
)

from lmtune import run as run_cli
from lmtune.errors import LmtuneError
from lmtune.sweep import preflight
from lmtune.sweep.hooks import StepHookError, start_step_hook
from lmtune.sweep.preflight import ANSWER_TIMEOUT_S, check_storage_answers
from lmtune.sweep.record import STAGING_DIR, read_outcomes, sole_writer
from lmtune.sweep.retention import drop_staged_duplicates
from lmtune.sweep.runner import preflight_write_check
from lmtune.sweep.spaces import load_space
from lmtune.sweep.storage import interruptible

HOOKS = Path(__file__).resolve().parent / "user_models"


@pytest.fixture
def silent_server() -> Iterator[str]:
    """HOST:PORT of a server on loopback that accepts connections and never answers (a store or a head that
    hangs: what a firewall that drops packets looks like to a client that has connected)."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join()
    for connection in held:
        connection.close()
    listener.close()


@pytest.fixture
def grid(tmp_path: Path) -> Path:
    return write_grid_space(tmp_path / "grid.yaml", [1e-3, 3e-3])


def _run_args(grid: Path, builtin_data: Path, *more: str) -> list[str]:
    return ["--space", str(grid), "--name", "n", "--data", str(builtin_data), "--no-dashboard", *more]


def _refused_before_ray(grid, builtin_data, tmp_path, capsys, monkeypatch, more: list[str], *fragments: str) -> str:
    """``run`` with ``more`` is refused in one line, with Ray not started and nothing written under tmp_path."""
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    line = assert_refused(run_cli.main, _run_args(grid, builtin_data, *more), capsys, *fragments)
    assert not ray.is_initialized()
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    return line


def _s3(endpoint: str, path: str = "bucket/sweeps") -> str:
    return f"s3://{path}?endpoint_override={endpoint}&scheme=http&region=us-east-1"


# ---------------------------------------------------------------------------------------------
# run --storage: a folder is the sweep's one home (item 1); object storage answers within seconds (item 2);
# a malformed value writes nothing anywhere (item 5)


@pytest.mark.release  # (--storage, the cloud sweep's path: the release tier, with the autoscaler rehearsal's S3)
@pytest.mark.slow
def test_a_storage_folder_holds_the_whole_sweep_and_run_and_analyze_read_it(tmp_path, builtin_data, grid):
    shared = tmp_path / "shared"
    proc = run_lmtune("run", *_run_args(grid, builtin_data, "--storage", str(shared), "--quiet", "--num-cpus", "1"),
                      cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    sweep = shared / "n"
    assert (sweep / "sweep.json").is_file() and (sweep / "decisions").is_dir() and len(trial_dirs(sweep)) == 2
    assert "2 trials: 2 completed" in proc.stdout and "report: python -m lmtune.analyze" in proc.stdout
    assert not (tmp_path / "results").exists()
    report = run_lmtune("analyze", str(sweep), cwd=tmp_path)
    assert report.returncode == 0, report.stderr[-3000:]
    assert (sweep / "report" / "summary.json").is_file()


def test_a_storage_folder_and_another_results_folder_are_refused_as_two_homes(
        tmp_path, builtin_data, grid, capsys, monkeypatch):
    _refused_before_ray(grid, builtin_data, tmp_path, capsys, monkeypatch,
                        ["--storage", str(tmp_path / "a"), "--results", str(tmp_path / "b")], "two folders", "one")


@pytest.mark.parametrize(("storage", "fragment"), [
    ("s3://", "no bucket"), ("gs://?endpoint_override=x", "no bucket"), ("file://relative/path", "file:///PATH"),
    ("ftp://host/path", "not ftp://"), ("   ", "give a folder")])
def test_a_malformed_storage_is_refused_and_writes_nothing(tmp_path, builtin_data, grid, capsys, monkeypatch,
                                                           storage, fragment):
    _refused_before_ray(grid, builtin_data, tmp_path, capsys, monkeypatch, ["--storage", storage], "--storage",
                        fragment)


def test_a_file_uri_is_the_folder_it_names(tmp_path, builtin_data, grid):
    options = run_cli.sweep_options(run_cli.build_parser().parse_args(
        _run_args(grid, builtin_data, "--storage", f"file://{tmp_path}/shared")), [])
    assert options.results == tmp_path / "shared" and options.storage is None


def _storage_checks(monkeypatch) -> list[tuple[float | None, str]]:
    """Each child process check_storage_answers runs, as it ends: (the timeout it was given, "cut off" by that
    timeout, or "exit N" when it answered)."""
    runs: list[tuple[float | None, str]] = []
    real = subprocess.run

    def run(*args, **kwargs):
        try:
            answer = real(*args, **kwargs)
        except subprocess.TimeoutExpired:
            runs.append((kwargs.get("timeout"), "cut off"))
            raise
        runs.append((kwargs.get("timeout"), f"exit {answer.returncode}"))
        return answer

    monkeypatch.setattr(preflight, "subprocess", SimpleNamespace(
        run=run, TimeoutExpired=subprocess.TimeoutExpired, DEVNULL=subprocess.DEVNULL))
    return runs


@pytest.mark.slow
def test_object_storage_that_never_answers_is_refused_within_seconds(silent_server, monkeypatch):
    checks = _storage_checks(monkeypatch)
    with pytest.raises(LmtuneError, match=f"no answer within {ANSWER_TIMEOUT_S:.0f} s") as refused:
        check_storage_answers(_s3(silent_server))
    # the refusal is the bound's: the one question asked was cut off at ANSWER_TIMEOUT_S, not answered
    assert checks == [(ANSWER_TIMEOUT_S, "cut off")]
    assert "\n" not in str(refused.value)


@pytest.mark.slow
def test_object_storage_on_a_closed_port_is_refused_within_seconds(monkeypatch):
    checks = _storage_checks(monkeypatch)
    with pytest.raises(LmtuneError, match="--storage") as refused:
        check_storage_answers(_s3(f"127.0.0.1:{free_port()}"))
    assert "\n" not in str(refused.value)
    # one question, bounded by ANSWER_TIMEOUT_S: refused by its answer, or (a client that retries a refused
    # connection, as pyarrow's does without credentials) by that bound, the line saying which
    ((timeout, end),) = checks
    assert timeout == ANSWER_TIMEOUT_S
    assert ("no answer within" in str(refused.value)) is (end == "cut off"), (end, str(refused.value))


@pytest.mark.slow
def test_object_storage_without_the_bucket_is_refused_and_with_it_accepted(tmp_path, monkeypatch):
    s3 = S3Server(tmp_path / "moto.log").start()
    try:
        for key, value in s3.env.items():
            monkeypatch.setenv(key, value)
        s3.create_bucket("there")
        with pytest.raises(LmtuneError, match="no bucket named 'missing'"):
            check_storage_answers(s3.uri("missing/sweeps"))
        check_storage_answers(s3.uri("there/sweeps"))
    finally:
        s3.stop()


@pytest.mark.slow
def test_run_refuses_storage_that_never_answers_in_one_line_writing_nothing(tmp_path, builtin_data, grid,
                                                                              silent_server):
    proc = run_lmtune("run", *_run_args(grid, builtin_data, "--storage", _s3(silent_server)), cwd=tmp_path)
    assert_one_line_error(proc.returncode, proc.stderr, "--storage", "no answer within")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grid.yaml"]


@pytest.mark.slow
def test_sigterm_stops_the_run_while_it_waits_on_storage_and_leaves_no_process(tmp_path, builtin_data, grid,
                                                                               silent_server):
    proc = start_lmtune("run", *_run_args(grid, builtin_data, "--storage", _s3(silent_server)), cwd=tmp_path)
    # (the storage is asked once lmtune's imports are done: wait until the run is connected, then signal)
    wait_until(lambda: any(_connected(pid, silent_server) for pid in session_pids(proc.pid)), proc, 60,
               "the run's connection to the storage")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    # the signal ended the run while it waited: killed by SIGTERM (its default, during the check) with nothing said,
    # not the check's refusal at the end of its wait (exit 2, 'no answer within')
    assert proc.returncode == -signal.SIGTERM and out == "", (proc.returncode, out[-2000:])
    wait_until(lambda: not session_pids(proc.pid), None, ANSWER_TIMEOUT_S + 5, "the storage check's own end")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grid.yaml"]


def _connected(pid: int, address: str) -> bool:
    """Whether process ``pid`` holds a TCP connection to ``address`` (HOST:PORT on loopback), from /proc."""
    port = int(address.rsplit(":", 1)[1])
    try:
        inodes = {os.readlink(fd)[8:-1] for fd in Path(f"/proc/{pid}/fd").iterdir()
                  if os.readlink(fd).startswith("socket:[")}
        rows = Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]
    except OSError:  # (it ended meanwhile)
        return False
    return any(int(row.split()[2].split(":")[1], 16) == port and row.split()[9] in inodes for row in rows)


def test_a_blocked_network_call_gives_way_to_a_signal(silent_server):
    host, port = silent_server.rsplit(":", 1)
    ran_in, reading, returned = [], threading.Event(), threading.Event()

    def read_forever() -> bytes:
        ran_in.append(threading.current_thread().name)
        with socket.create_connection((host, int(port))) as connection:
            connection.settimeout(60)  # (a bound, should the signal not get through: the wait then ends in an error)
            reading.set()
            # (the signal comes once the call is about to block; SIGUSR1, as SIGALRM is the tests' time limit's)
            threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGUSR1)).start()
            answer = connection.recv(1)  # (the server never sends)
            returned.set()
            return answer

    class Stopped(Exception):
        pass

    def stop(*_):
        raise Stopped

    previous = signal.signal(signal.SIGUSR1, stop)
    try:
        with pytest.raises(Stopped):
            interruptible(read_forever, "reading")
        # the signal stopped the wait while the call, in a thread of its own, was blocked and had not returned
        assert ran_in == ["lmtune: reading"] and reading.is_set() and not returned.is_set()
    finally:
        signal.signal(signal.SIGUSR1, previous)


# ---------------------------------------------------------------------------------------------
# run --address, --cluster-config and resources (items 4, 11, 12)


def test_an_address_where_nothing_listens_is_refused_at_once(tmp_path, builtin_data, grid, capsys, monkeypatch):
    _refused_before_ray(grid, builtin_data, tmp_path, capsys, monkeypatch,
                        ["--address", f"127.0.0.1:{free_port()}"], "--address", "ray start --head")


def test_address_auto_is_refused_when_the_cluster_it_finds_is_gone(tmp_path, builtin_data, grid, capsys,
                                                                   monkeypatch):
    # (RAY_ADDRESS is where auto looks first; a stale one is what a machine whose cluster stopped leaves)
    port = free_port()
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    _refused_before_ray(grid, builtin_data, tmp_path, capsys, monkeypatch, ["--address", "auto"],
                        "--address auto", f"at 127.0.0.1:{port}")


@pytest.mark.parametrize("address", ["not:an:address", "host:99999", "http://head:6379", ""])
def test_an_address_of_another_form_is_refused(tmp_path, builtin_data, grid, capsys, monkeypatch, address):
    _refused_before_ray(grid, builtin_data, tmp_path, capsys, monkeypatch, ["--address", address], "HOST:PORT")


def test_a_cluster_config_without_an_address_is_refused(tmp_path, builtin_data, grid, capsys, monkeypatch):
    config = tmp_path / "cluster.yaml"
    config.write_text("max_workers: 2\n")
    _refused_before_ray(grid, builtin_data, tmp_path, capsys, monkeypatch, ["--cluster-config", str(config)],
                        "--cluster-config", "--address")


@pytest.mark.parametrize(("text", "fragment"), [
    (None, "cannot read it"), ("a: [unclosed\n", "not YAML (line"), ("- a list\n", "not a cluster config"),
    ("max_workers: -3\nhead_node_type: h\navailable_node_types: {h: {resources: {CPU: 2}}}\n", "max_workers is -3"),
    ("head_node_type: h\navailable_node_types: {h: {}, w: {max_workers: 1.5}}\n", "w.max_workers is 1.5")])
def test_a_cluster_config_that_is_not_one_is_refused_in_one_line(tmp_path, builtin_data, grid, capsys, monkeypatch,
                                                                 silent_server, text, fragment):
    config = tmp_path / "cluster.yaml"
    if text is not None:
        config.write_text(text)
    _refused_before_ray(grid, builtin_data, tmp_path, capsys, monkeypatch,
                        ["--address", silent_server, "--cluster-config", str(config)], "--cluster-config", fragment)


@pytest.mark.parametrize(("flags", "fragment"), [
    (["--gpus-per-trial", "1e9"], "no trial would ever start"), (["--cpus-per-trial", "64", "--num-cpus", "2"],
                                                                 "give at most 2")])
def test_a_trial_larger_than_this_machine_is_refused(tmp_path, builtin_data, grid, capsys, monkeypatch, flags,
                                                     fragment):
    _refused_before_ray(grid, builtin_data, tmp_path, capsys, monkeypatch, flags, fragment)


@pytest.mark.parametrize(("flags", "fragment"), [
    (["--ship-data-mb", "-1"], "--ship-data-mb must be >= 0"), (["--wandb", ""], "--wandb: give the name"),
    (["--wandb", "   "], "--wandb: give the name")])
def test_an_option_value_that_means_nothing_is_refused(tmp_path, builtin_data, grid, capsys, monkeypatch, flags,
                                                       fragment):
    _refused_before_ray(grid, builtin_data, tmp_path, capsys, monkeypatch, flags, fragment)


def test_a_start_that_fails_leaves_no_folder_behind(tmp_path):
    sweep = tmp_path / "results" / "n"
    with pytest.raises(LmtuneError), sole_writer(sweep, new=True):
        raise LmtuneError("refused during set-up")
    assert list(tmp_path.iterdir()) == []
    with sole_writer(sweep, new=True) as started:
        started.set()
    assert sweep.is_dir()


def test_the_write_check_makes_no_folder(tmp_path):
    preflight_write_check(tmp_path / "results" / "deeper")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# The Python API in a user's Tuner (items 3, 10)

_USERS_TUNER = """
import json, sys
import ray
from ray import tune
import lmtune
from lmtune.errors import LmtuneError

ray.init(address="local", num_cpus=1, include_dashboard=False)  # (a new one: never a stray cluster)
data, storage = sys.argv[1], sys.argv[2]
found = {}
sweep = lmtune.Sweep("quick_edge", data=data, steps=30)
try:
    tune.Tuner(sweep.trainable(), param_space=sweep.param_space(),
               tune_config=tune.TuneConfig(metric="val_loss", mode="max", search_alg=sweep.searcher(),
                                           scheduler=sweep.scheduler(), num_samples=sweep.num_samples),
               run_config=tune.RunConfig(name="inverted", storage_path=storage)).fit()
    found["mode_max"] = "fit"
except Exception as err:
    found["mode_max"] = f"{type(err).__name__}: {err}"
try:  # lmtune's edge searcher alone, no lmtune scheduler (issue 64 item 19)
    tune.Tuner(sweep.trainable(), param_space=sweep.param_space(),
               tune_config=tune.TuneConfig(metric="val_loss", mode="max", search_alg=sweep.searcher(),
                                           num_samples=sweep.num_samples),
               run_config=tune.RunConfig(name="alone", storage_path=storage)).fit()
    found["searcher_alone"] = "fit"
except Exception as err:
    found["searcher_alone"] = f"{type(err).__name__}: {err}"
grid = lmtune.Sweep("quick", data=data, steps=30, warmup_steps=5)
results = tune.Tuner(grid.trainable(), param_space={"lr": tune.grid_search([-1.0])},
                     tune_config=tune.TuneConfig(metric="val_loss", mode="min"),
                     run_config=tune.RunConfig(name="errored", storage_path=storage)).fit()
try:
    grid.report(results)
    found["report"] = "written"
except LmtuneError as err:
    found["report"] = str(err)
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def users_tuner(tmp_path_factory, builtin_data) -> tuple[dict[str, str], Path]:
    """What a user's own Tuner script met (one Ray instance for all): the edge search under mode="max", with lmtune's
    scheduler and with its searcher alone, and the report of a sweep whose every trial errored."""
    folder = tmp_path_factory.mktemp("tuner")
    script = folder / "tuner.py"
    script.write_text(_USERS_TUNER)
    proc = run_python(str(script), str(builtin_data), str(folder / "results"), cwd=folder)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), folder / "results"


@pytest.mark.slow
def test_the_edge_search_in_a_users_tuner_refuses_mode_max_before_training(users_tuner):
    found, results = users_tuner
    assert found["mode_max"].startswith("ValueError") and "mode='min'" in found["mode_max"]
    assert not list((results / "inverted").glob("*/metrics.csv"))


@pytest.mark.slow
def test_the_edge_searcher_alone_in_a_users_tuner_refuses_mode_max_before_training(users_tuner):
    found, results = users_tuner
    alone = found["searcher_alone"]
    assert alone.startswith("ValueError") and "mode='min'" in alone and "mode='max'" in alone, alone
    assert not list((results / "alone").rglob("metrics.csv"))  # no trial trained


@pytest.mark.slow
def test_the_report_of_a_sweep_whose_every_trial_errored_says_so_and_writes_nothing(users_tuner):
    found, results = users_tuner
    assert "no trial trained a step" in found["report"] and "raised an error" in found["report"]
    assert "\n" not in found["report"]
    assert not (results / "errored" / "sweep.json").exists() and not (results / "errored" / "decisions").exists()


# ---------------------------------------------------------------------------------------------
# --step-hook (item 9)


@pytest.fixture
def hook_path(tmp_path, monkeypatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "myhooks", raising=False)
    return tmp_path


def test_a_hook_that_raises_is_refused_in_one_line_naming_it(hook_path, tiny_config):
    (hook_path / "myhooks.py").write_text("def for_trial(config, out_dir):\n    raise KeyError('no such thing')\n")
    with pytest.raises(StepHookError, match="--step-hook 'myhooks:for_trial' raised KeyError") as refused:
        start_step_hook("myhooks:for_trial", tiny_config, hook_path)
    assert "\n" not in str(refused.value)


def test_a_hook_that_returns_no_function_is_refused_in_one_line(hook_path, tiny_config):
    (hook_path / "myhooks.py").write_text("def for_trial(config, out_dir):\n    return 42\n")
    with pytest.raises(StepHookError, match="returned int 42; return a function of"):
        start_step_hook("myhooks:for_trial", tiny_config, hook_path)


@pytest.mark.slow
def test_a_sweep_whose_hook_raises_ends_each_trial_once_as_an_error_saying_why(tmp_path, builtin_data, grid):
    (tmp_path / "myhooks.py").write_text(
        "from pathlib import Path\n"
        "def for_trial(config, out_dir):\n"
        "    with open(Path(out_dir) / 'attempts', 'a') as f:\n"
        "        f.write('1')\n"
        "    raise ValueError('my hook is broken')\n")
    proc = run_lmtune("run", *_run_args(grid, builtin_data, "--step-hook", "myhooks:for_trial", "--quiet",
                                        "--num-cpus", "1"), cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "2 trials: 2 error" in proc.stdout
    assert "2 trials: error: --step-hook 'myhooks:for_trial' raised ValueError: my hook is broken" in proc.stdout
    sweep = tmp_path / "results" / "n"
    assert [(folder / "attempts").read_text() for folder in trial_dirs(sweep).values()] == ["1", "1"]  # no retry
    assert {entry["outcome"] for entry in read_outcomes(sweep).values()} == {"error"}


# ---------------------------------------------------------------------------------------------
# A full disk (item 6), --fuse (item 7), a width space (item 8)


def test_a_stopped_sweep_keeps_one_copy_of_each_staged_checkpoint(tmp_path):
    trial = tmp_path / "t1_lr=0.001"
    (trial / "checkpoint_000001").mkdir(parents=True)
    (trial / "checkpoint_000001" / "step_10.pt").write_bytes(b"x" * 1000)
    staging = tmp_path / STAGING_DIR / trial.name
    staging.mkdir(parents=True)
    (staging / "step_10.pt").write_bytes(b"x" * 1000)  # handed to Tune: a second copy
    (staging / "step_20.pt").write_bytes(b"y" * 1000)  # not yet handed over: the only copy
    assert drop_staged_duplicates(tmp_path) == 1000
    assert sorted(p.name for p in staging.iterdir()) == ["step_20.pt"]


def test_the_disk_floor_says_force_does_not_lower_it(tmp_path):
    with pytest.raises(LmtuneError, match="a floor --force does not lower"):
        preflight_write_check(tmp_path, min_free=2**60)


def test_fusing_more_lrs_than_a_grid_has_fuses_the_grid(grid):
    assert load_space(str(grid)).fused(1000, LmtuneError).fuse == 2


def test_a_mup_base_width_above_every_width_is_refused(tmp_path, builtin_data, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert_refused(run_cli.main, ["--space", "quick_width_mup", "--data", str(builtin_data), "--no-dashboard",
                                  "--set", "mup_base_width=1024"], capsys,
                   "mup_base_width 1024 is above every width", "set mup_base_width to one of the widths")
    assert not ray.is_initialized() and list(tmp_path.iterdir()) == []
