"""The sweep on real Ray: the quick sweep end to end, a two-node cluster, the Ray Jobs service path, and data
shipped to a node without it. (A trial retried from its checkpoint, fractional GPUs and W&B: test_faults.py's
fault sweep, one sweep for them and its other faults.)

Every Ray process here is started by the test itself (a local instance per CLI run, a
ray.cluster_utils.Cluster, or a `ray start --head` in its own session) and stopped by its ids.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pandas as pd
import pytest
from conftest import (
    disk_sweep,
    kill_session,
    png_width,
    run_lmtune,
    run_printout,
    tensorboard_scalars,
    trial_dirs,
    wait_until,
    write_grid_space,
)

from lmtune.report.figures import plot_instability
from lmtune.report.reader import load_sweep
from lmtune.sweep.record import asha_state_path, ledger_path, read_outcomes
from lmtune.training.metric_registry import instability_panels, metric_of

# The sweep tests' trials: the tiny trial at batch 4 with a 2-step warm-up.
SWEEP_TRIAL = {"batch_size": 4, "warmup_steps": 2}
TERMINAL = {"completed", "diverged", "stopped_early", "too_slow"}


def run_tiny_sweep(tmp_path: Path, name: str, data: Path, lrs: list[float], steps: int, *flags: str,
                   env: dict[str, str] | None = None) -> tuple[Path, str]:
    """A tiny grid without ASHA run to the end by python -m lmtune.run; (its sweep folder, its stdout)."""
    space = write_grid_space(tmp_path / f"{name}.yaml", lrs, steps=steps, **SWEEP_TRIAL)
    results = tmp_path / "results"
    proc = run_lmtune("run", "--space", str(space), "--name", name, "--results", str(results), "--data", str(data),
                      "--quiet", *flags, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return results / name, proc.stdout


def result_rows(trial_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (trial_dir / "result.json").read_text().splitlines() if line.strip()]


def tree_snapshot(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in [root, *root.rglob("*")]}


# ---------------------------------------------------------------------------------------------
# 1. The quick sweep end to end


@pytest.mark.slow
def test_each_layers_relative_update_size_reaches_metrics_csv_tensorboard_tune_and_the_instability_figure(
        quick_sweep: Path, tmp_path: Path):
    records = load_sweep(quick_sweep)[1]
    best = min((r for r in records if r.outcome == "completed"), key=lambda r: r.curve["val_loss"].min())
    folder = trial_dirs(quick_sweep)[best.trial_id]
    layers = json.loads((quick_sweep / "sweep.json").read_text())["base_config"]["model"]["n_layers"]
    columns = ["update_ratio_max", *(f"update_ratio_l{i}" for i in range(layers))]
    logged = pd.read_csv(folder / "metrics.csv")  # the trial's own file
    assert all(logged[c].notna().all() and (logged[c] > 0).all() for c in columns), logged.columns
    assert set(columns) <= set(tensorboard_scalars(folder / "tensorboard"))
    tune_results = [json.loads(line) for line in (folder / "result.json").read_text().splitlines()]
    assert all(math.isfinite(r["update_ratio_max"]) for r in tune_results), tune_results[0].keys()
    panel = metric_of("update_ratio_max")
    assert panel in instability_panels()
    figure = plot_instability(records, best, tmp_path / "instability.png")  # as analyze draws it
    # a panel each, 5 inches wide (tight bounding box at about 100 dpi): wider than one panel fewer would be
    assert png_width(figure) > (len(instability_panels()) - 0.5) * 5 * 90


@pytest.mark.slow
def test_quick_sweep_end_to_end(quick_sweep: Path):
    ids = trial_dirs(quick_sweep)
    trials = list(ids.values())
    assert len(trials) == 6
    outcomes = read_outcomes(quick_sweep)
    for trial_id, folder in ids.items():  # trial.json names the same trial as Tune's own result.json
        assert json.loads((folder / "result.json").read_text().splitlines()[0])["trial_id"] == trial_id
        assert json.loads((folder / "trial.json").read_text())["params"] == json.loads((folder / "params.json")
                                                                                      .read_text())
    assert set(outcomes) == set(ids), (sorted(outcomes), sorted(ids))  # one terminal outcome per trial
    assert all(o["outcome"] in TERMINAL for o in outcomes.values()), outcomes

    budget = json.loads((quick_sweep / "sweep.json").read_text())["base_config"]
    tokens_budget = budget["train"]["batch_size"] * budget["model"]["context_length"] * budget["train"]["steps"]
    diverged = {tid: o for tid, o in outcomes.items() if o["outcome"] == "diverged"}
    assert diverged, outcomes
    high_lr = {tid for tid, path in ids.items() if json.loads((path / "params.json").read_text())["lr"] >= 1.0}
    early = [tid for tid, o in diverged.items() if tid in high_lr and o["tokens"] < tokens_budget / 2]
    assert early, f"no high-LR trial diverged before half its {tokens_budget} tokens: {diverged}"
    assert all(o["reason"].startswith("diverged at step") for o in diverged.values())
    output = (quick_sweep.parent / "quick.log").read_text()  # a stopped trial leaks no traceback to the user
    assert "Traceback" not in output and "SystemExit" not in output, output[-3000:]

    stopped = [o for o in outcomes.values() if o["outcome"] == "stopped_early"]
    assert stopped, outcomes
    assert all(o["reason"].startswith("stopped by ASHA at") and o["tokens"] < tokens_budget for o in stopped)
    assert json.loads(asha_state_path(quick_sweep).read_text())["num_stopped"] >= len(stopped)
    assert any(o["outcome"] == "completed" for o in outcomes.values())

    # Best trial beats the worst trial that trained normally (completed or cut by ASHA).
    best_val = {tid: pd.read_csv(path / "metrics.csv")["val_loss"].dropna() for tid, path in ids.items()}
    best_val = {tid: float(v.min()) for tid, v in best_val.items() if len(v) and math.isfinite(v.min())}
    normal = [tid for tid, o in outcomes.items() if o["outcome"] in ("completed", "stopped_early")]
    best = min(best_val.values())
    worst = max(best_val[tid] for tid in normal)
    assert best < worst - 0.5, best_val
    completed_best = min(best_val[tid] for tid, o in outcomes.items() if o["outcome"] == "completed")
    assert best == completed_best  # the winner ran its whole budget

    # Results reload with Tune's own readers.
    from ray.tune import ExperimentAnalysis, ResultGrid

    analysis = ExperimentAnalysis(str(quick_sweep))
    assert len(analysis.trials) == 6
    grid = ResultGrid(analysis)
    assert len(grid) == 6
    assert {r.config["lr"] for r in grid} == {json.loads((t / "params.json").read_text())["lr"] for t in trials}
    frames = [r.metrics_dataframe for r in grid]
    assert min(f["val_loss"].min() for f in frames if "val_loss" in f) == pytest.approx(best)  # diverged: none

    record = json.loads((quick_sweep / "sweep.json").read_text())
    for key in ("space", "budget", "data", "versions", "hardware", "start_time"):
        assert record.get(key), key
    assert record["space"]["name"] == "quick" and record["budget"] == "quick"
    assert record["data"]["meta"]["content_hash"]
    assert {"lmtune", "torch", "ray", "optuna", "python"} <= set(record["versions"])
    assert ledger_path(quick_sweep).exists()
    grace = round(0.111 * tokens_budget)
    assert record["asha"] == {"max_t": tokens_budget, "grace_period": grace, "reduction_factor": 3}
    for trial in trials:  # TensorBoard files per trial
        assert list(trial.glob("tensorboard/events.out.tfevents.*")), trial


@pytest.mark.slow
def test_trials_of_a_sweep_share_one_compile_cache(quick_sweep: Path):
    from lmtune.sweep.trainable import compile_cache_dir

    folders = trial_dirs(quick_sweep).values()
    assert {compile_cache_dir(p) for p in folders} == {quick_sweep / "compile_cache"}
    assert (quick_sweep / "compile_cache").is_dir()


@pytest.mark.slow
def test_existing_name_without_resume_is_refused_untouched(quick_sweep: Path):
    before = tree_snapshot(quick_sweep)
    proc = run_lmtune("run", "--space", "quick", "--name", quick_sweep.name, "--results", str(quick_sweep.parent),
                      "--no-dashboard", "--quiet", timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: ") and "--resume" in errors[0], proc.stderr
    assert tree_snapshot(quick_sweep) == before


# ---------------------------------------------------------------------------------------------
# 2. A two-node cluster on this machine; data shipped through the object store


@pytest.mark.release  # (a cluster: the release tier)
@pytest.mark.slow
def test_two_node_cluster_places_trials_on_both_nodes(tmp_path: Path, builtin_data: Path):
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        node_ids = {node.node_id for node in cluster.list_all_nodes()}
        assert len(node_ids) == 2
        address = cluster.address
        sweep, _ = run_tiny_sweep(tmp_path, "two", builtin_data, [1e-3, 3e-3], 30, "--address", address)
    finally:
        cluster.shutdown()
    assert json.loads((sweep / "sweep.json").read_text())["address"] == address
    assert {o["outcome"] for o in read_outcomes(sweep).values()} == {"completed"}
    used = {}
    for trial in trial_dirs(sweep).values():
        rows = result_rows(trial)
        ids = {r["node_id"] for r in rows}
        assert len(ids) == 1, ids  # a trial stays on its node
        used[trial.name] = ids.pop()
    assert len(used) == 2
    assert set(used.values()) == node_ids, (used, node_ids)  # one trial on each node (1 CPU each)


def test_shipped_data_materializes_on_a_node_without_it(tmp_path: Path, builtin_data: Path, monkeypatch):
    from lmtune.data.dataset import read_meta
    from lmtune.sweep.trainable import DATA_FILES, ShippedData, trial_data_dir

    shipped = ShippedData.from_dir(builtin_data)
    assert shipped.content_hash == read_meta(builtin_data).content_hash
    cache = tmp_path / "cache"
    monkeypatch.setenv("LMTUNE_DATA_CACHE", str(cache))
    # The driver's path exists here: used in place, nothing written.
    assert trial_data_dir(str(builtin_data), shipped) == builtin_data
    assert not cache.exists()
    # A node without it: the shipped copy is written once under the cache, byte for byte.
    path = trial_data_dir("/nonexistent/dir", shipped)
    assert path == cache / shipped.content_hash
    for name in DATA_FILES:
        if (builtin_data / name).exists():
            assert (path / name).read_bytes() == (builtin_data / name).read_bytes(), name
    assert read_meta(path).content_hash == shipped.content_hash
    assert not list(cache.glob(".staging-*"))
    mtime = (path / "train.bin").stat().st_mtime_ns
    assert trial_data_dir("/nonexistent/dir", shipped) == path  # second trial on the node: reused
    assert (path / "train.bin").stat().st_mtime_ns == mtime
    # Without shipped data the path is taken as given.
    assert trial_data_dir("/nonexistent/dir", None) == Path("/nonexistent/dir")


# ---------------------------------------------------------------------------------------------
# 3. The service path: a Ray head with its dashboard on 127.0.0.1, the sweep as a Ray Job


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop_session(proc: subprocess.Popen) -> None:
    """Stop the head started by this test, and only it: SIGTERM to `ray start --block` (which drains
    and stops its node), then SIGKILL whatever of its session is left."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)  # a clean stop, if it is quick (a full drain takes half a minute)
        except subprocess.TimeoutExpired:
            pass
    kill_session(proc.pid)
    if proc.poll() is None:
        proc.wait(timeout=10)


@pytest.mark.release  # (a cluster's Jobs service: the release tier)
@pytest.mark.slow
def test_sweep_as_a_ray_job_on_a_local_head(tmp_path: Path, builtin_data: Path):
    from ray._private.authentication.authentication_token_generator import generate_new_authentication_token

    ray_bin = str(Path(sys.executable).parent / "ray")
    gcs_port, dashboard_port = _free_port(), _free_port()
    api = f"http://127.0.0.1:{dashboard_port}"
    # Ray's default token authentication, with a token of this test's own (not ~/.ray/auth_token).
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": generate_new_authentication_token()}
    env.pop("RAY_ADDRESS", None)
    head_log = tmp_path / "ray-start.log"
    # Its own temp dir (short: Ray's socket paths must fit in 107 bytes), so it shares no session files.
    temp_dir = tempfile.mkdtemp(prefix="lmtune-ray-", dir="/tmp")
    head = subprocess.Popen(
        [ray_bin, "start", "--head", "--block", f"--port={gcs_port}", "--node-ip-address=127.0.0.1",
         "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard_port}", "--include-dashboard=true",
         f"--dashboard-agent-listen-port={_free_port()}",  # (Ray's default, 52365, is any other local Ray's too)
         "--num-cpus=2", "--disable-usage-stats", f"--temp-dir={temp_dir}"],
        stdout=head_log.open("w"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
        start_new_session=True)
    job_id = None
    try:
        answer: dict = {}

        def dashboard_answers() -> bool:
            request = urllib.request.Request(f"{api}/api/version",
                                             headers={"Authorization": f"Bearer {env['RAY_AUTH_TOKEN']}"})
            try:
                answer.update(json.loads(urllib.request.urlopen(request, timeout=5).read()))
            except OSError:
                return False
            return True

        wait_until(dashboard_answers, head, 120, f"dashboard at {api}", poll_s=0.5)
        assert answer.get("ray_version")
        # Bound to 127.0.0.1 only: not reachable on the machine's other addresses.
        other = socket.gethostbyname(socket.gethostname())
        if not other.startswith("127."):
            with pytest.raises(OSError), socket.create_connection((other, dashboard_port), timeout=2):
                pass

        space = write_grid_space(tmp_path / "job.yaml", [1e-3, 3e-3], steps=20, **SWEEP_TRIAL)
        results = tmp_path / "results"
        repo = Path(__file__).resolve().parent.parent
        submits: list[subprocess.CompletedProcess] = []

        def submitted() -> bool:
            """A blocking submit: it follows the job's output and exits 0 only if the job succeeded. The head's
            dashboard agent may come up after the dashboard does (a loaded machine): until then the head answers
            "No available agent", and the job is submitted again."""
            nonlocal job_id
            job_id = f"lmtune_test_{os.getpid()}_{int(time.time())}_{len(submits)}"
            submits.append(subprocess.run(
                [ray_bin, "job", "submit", "--address", api, "--submission-id", job_id, "--", sys.executable, "-m",
                 "lmtune.run", "--space", str(space), "--name", "job", "--address", "auto", "--results",
                 str(results), "--data", str(builtin_data), "--no-dashboard", "--quiet"],
                capture_output=True, text=True, timeout=300, cwd=repo, env=env, stdin=subprocess.DEVNULL))
            return "No available agent" not in submits[-1].stdout + submits[-1].stderr

        wait_until(submitted, head, 120, "a dashboard agent to take the job", poll_s=2)
        submit = submits[-1]
        assert submit.returncode == 0, submit.stdout[-3000:] + submit.stderr[-3000:]
        assert re.search(rf"Job '{job_id}' succeeded", submit.stdout + submit.stderr), submit.stdout[-2000:]
        status = subprocess.run([ray_bin, "job", "status", "--address", api, job_id], capture_output=True,
                                text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)
        assert status.returncode == 0 and re.search(r"succeeded", status.stdout + status.stderr, re.I), status
        list_jobs = subprocess.run([ray_bin, "job", "list", "--address", api], capture_output=True, text=True,
                                   timeout=60, env=env, stdin=subprocess.DEVNULL)
        assert "SUCCEEDED" in list_jobs.stdout, list_jobs.stdout[-2000:]
        logs = subprocess.run([ray_bin, "job", "logs", "--address", api, job_id], capture_output=True, text=True,
                              timeout=60, env=env, stdin=subprocess.DEVNULL)
        assert logs.returncode == 0, logs.stderr
        assert "report: python -m lmtune.analyze" in logs.stdout and "2 trials" in logs.stdout, logs.stdout[-3000:]
        job_id = None  # finished: nothing to stop
        assert {o["outcome"] for o in read_outcomes(results / "job").values()} == {"completed"}
        assert len(trial_dirs(results / "job")) == 2
    finally:
        if job_id is not None:
            subprocess.run([ray_bin, "job", "stop", "--address", api, job_id], capture_output=True, timeout=60,
                           env=env, stdin=subprocess.DEVNULL)
        _stop_session(head)
        shutil.rmtree(temp_dir, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# 4. The run's summary: the best trial never errored or diverged


# Budget of the on-disk sweeps below: 30 steps of 500 tokens (15,000), evaluations every 10 steps.
def test_run_never_names_an_errored_or_diverged_trial_best_and_agrees_with_analyze(tmp_path: Path, capsys):
    from lmtune.report.writer import analyze

    sweep_dir = disk_sweep(tmp_path, {
        "dead": (0.002, "error", {10: 1.5}), "nan": (0.004, "diverged", {10: 1.0}),
        "full": (0.001, "completed", {10: 4.0, 30: 2.5}), "cut": (0.0005, "stopped_early", {10: 3.9})})
    code, out = run_printout(sweep_dir, 4, capsys)
    summary = analyze(sweep_dir, out_dir=tmp_path / "report")
    assert code == 0 and summary["best_trial"] == "full" and summary["best_lr"] == 0.001
    assert "best trial: full" in out and "best lr 0.001: val loss 2.5000 (one seed) at 15,000 tokens" in out
    assert json.loads((tmp_path / "report" / "summary.json").read_text())["best_trial"] == "full"


def test_without_a_full_budget_trial_run_and_analyze_say_the_tokens_differ(tmp_path: Path, capsys):
    from lmtune.report.writer import analyze

    sweep_dir = disk_sweep(tmp_path, {"a": (0.001, "stopped_early", {10: 4.0, 20: 2.5}),
                                      "b": (0.01, "stopped_early", {10: 3.9})})
    code, out = run_printout(sweep_dir, 2, capsys)
    summary = analyze(sweep_dir, out_dir=tmp_path / "report")
    assert code == 0 and summary["best_trial"] == "a" and summary["candidate_tokens"] == [5000, 10000]
    assert "not at equal token counts: no trial trained its whole budget (5,000 to 10,000 tokens)" in out
    assert "best trial: a" in out
