"""The cloud sweep rehearsed on one machine with the real parts (tests/cloud.py): S3 is moto's server on loopback,
the cluster a Ray head whose autoscaler launches "GPU" worker nodes through Ray's fake multi-node provider, and
the sweep is submitted with `ray job submit` as the README says, storing everything in the bucket.

One scenario, run once for the module (``rehearsal``), then one test per behaviour:
  1. the sweep is submitted to a cluster with no worker; its trials ask for GPU shares, so the autoscaler
     launches GPU workers (at most its max_workers, 2) and two trials train at once, on different nodes;
  2. once a trial running on a worker has a checkpoint in the bucket, that worker is killed as a preempted
     instance is (its raylet and every process below it SIGKILLed, the trial's node-local working dir deleted);
     the trial continues from the checkpoint on another node and ends as an uninterrupted run would;
  3. with two trials finished, the job is stopped (`ray job stop`: the driver is killed), and the sweep is
     resumed by a new job from the bucket alone (a fresh --results folder on the head);
  4. `lmtune analyze s3://...` reads the sweep from the bucket on "the laptop" (this process's side).
Every trial trains a model of the user's own (tests/user_models/gpt_style.py), its package shipped to the nodes by
the jobs' runtime env (py_modules) and named as a module (--model mymodels.gpt_style:make), as the README says.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cloud import FakeCluster, S3Server, bucket_files, poll, read_text
from conftest import ENV, TINY_TRIAL, USER_MODELS, run_lmtune, write_grid_space

from lmtune.training.metrics import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.release]  # (the autoscaler rehearsal: the release tier)

BUCKET = "lmtune-rehearsal"
NAME = "rehearsal"
SWEEP = f"{BUCKET}/sweeps/{NAME}"  # the sweep's folder in the bucket
LRS = [3e-4, 1e-3, 3e-3, 1e-2]
# TINY_TRIAL's model at batch 64: ~8 s of compute per trial on a quiet 2-core machine (~15 s on a shared one), so
# that a trial still runs when the test sees its first checkpoint in the bucket, and the sweep still has a trial to
# run when the killed node has been replaced (~20 s after the kill) and two trials have finished.
STEPS, CHECKPOINT_INTERVAL, BATCH_SIZE = 120, 20, 64
MAX_WORKERS = 2
TRIAL_FILES = ("trial.json", "metrics.csv", "summary.json")
LEDGER = "decisions/trial_outcomes.json"
PLACEMENT_LINE = re.compile(r"([0-9.]+) CPU \+ ([0-9.]+) GPU per trial, up to (\d+) at once")
RUN_JOB, RESUME_JOB = "rehearsal-run", "rehearsal-resume"
# The user's model, as a package of theirs that the jobs ship to every node (Ray's runtime_env py_modules).
USER_PACKAGE, USER_MODEL = "mymodels", "mymodels.gpt_style:make"


@dataclass
class Rehearsal:
    """What the scenario did and saw, for the tests to judge. ``problem``: why it stopped early (the phase, the
    error and the driver's log), None when it ran through."""

    s3: S3Server
    cluster: FakeCluster
    log_dir: Path
    head_id: str = ""
    workers_at_start: int = -1
    max_workers_alive: int = 0
    worker_ids: set[str] = field(default_factory=set)
    worker_resources: dict[str, dict] = field(default_factory=dict)
    killed_node: str | None = None
    killed_trial: str | None = None
    """The folder (in the bucket) of the trial that ran on the killed node."""
    killed_after: str | None = None
    """The trial's newest checkpoint folder in the bucket when its node was killed."""
    killed_after_step: int = 0
    """The training step of that checkpoint (its step_NNNNNNNN.pt)."""
    replacement_nodes: set[str] = field(default_factory=set)
    stopped_at: float = 0.0
    """When the driver was stopped (time.time())."""
    mtimes_at_stop: dict[str, object] = field(default_factory=dict)
    """Every file in the sweep's folder in the bucket when the driver was stopped -> its mtime there."""
    finished_at_stop: dict[str, tuple[bytes, object]] = field(default_factory=dict)
    """Trial folder -> (metrics.csv, its mtime in the bucket) of the trials finished when the driver was stopped."""
    ledger_at_stop: dict = field(default_factory=dict)
    unfinished_at_stop: int = 0
    run_status: str = ""
    resume_status: str = ""
    finished_count: int = 0
    events: list[tuple[float, str]] = field(default_factory=list)
    """(seconds since the cluster started, what happened): the scenario's phases and what it saw on the way."""
    problem: str | None = None
    watched_at: float = 0.0
    started_at: float = field(default_factory=time.monotonic)

    @property
    def phases(self) -> list[str]:
        return [what.split(" (")[0] for _, what in self.events]

    def event(self, what: str) -> None:
        self.events.append((time.monotonic() - self.started_at, what))

    def timeline(self) -> str:
        return "\n".join(f"  {t:6.1f} s  {what}" for t, what in self.events)

    @property
    def fs(self):
        return self.s3.filesystem()

    def files(self) -> dict:
        return bucket_files(self.fs, SWEEP)

    def read(self, path: str) -> str:
        return read_text(self.fs, f"{SWEEP}/{path}")

    def job_log(self, job: str) -> str:
        path = self.log_dir / f"{job}.log"
        return path.read_text() if path.exists() else ""

    def log_excerpt(self, job: str, lines: int = 40) -> str:
        """The job's last ``lines`` lines, less Ray's autoscaler events and raylet state dumps."""
        kept = [line for line in self.job_log(job).splitlines()
                if line.strip() and "(autoscaler" not in line and "[state-dump]" not in line]
        return f"--- {job}'s driver log, last lines:\n" + "\n".join(kept[-lines:])

    def need(self, phase: str) -> None:
        """Fail the calling test, with the evidence, when the scenario did not get to ``phase``."""
        if phase not in self.phases:
            pytest.fail(f"the rehearsal did not get to '{phase}'; it did:\n{self.timeline()}\n{self.problem}")

    def watch(self, every_s: float = 2.0) -> None:
        """Note the live worker nodes (how many at once, their ids and resources), at most every ``every_s``."""
        if time.monotonic() - self.watched_at < every_s:
            return
        self.watched_at = time.monotonic()
        workers = self.cluster.worker_nodes()
        self.max_workers_alive = max(self.max_workers_alive, len(workers))
        for node in workers:
            self.worker_ids.add(node["node_id"])
            self.worker_resources[node["node_id"]] = node["resources_total"]


def trial_folders(files: dict) -> list[str]:
    """The trial folders in the bucket: those with a trial.json (lmtune's own record of the trial)."""
    return sorted({path.split("/")[0] for path in files if path.count("/") == 1 and path.endswith("/trial.json")})


def finished(files: dict) -> list[str]:
    return [folder for folder in trial_folders(files) if f"{folder}/summary.json" in files]


def trial_id(r: Rehearsal, folder: str) -> str:
    return json.loads(r.read(f"{folder}/trial.json"))["trial_id"]


def read_metrics_text(text: str) -> list[dict]:
    """A metrics.csv's rows (lmtune.training.metrics' reader, on text read from the bucket)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "metrics.csv"
        path.write_text(text)
        return read_metrics(path)


def result_rows(r: Rehearsal, folder: str) -> list[dict]:
    """The trial's Tune results (its result.json in the bucket), each with the node it ran on."""
    return [json.loads(line) for line in r.read(f"{folder}/result.json").splitlines() if line.strip()]


# ---------------------------------------------------------------------------------------------
# The scenario


@pytest.fixture(scope="module")
def rehearsal(builtin_data: Path, tmp_path_factory: pytest.TempPathFactory):
    """The scenario, run once; the cluster is gone when the tests run (they read the bucket, which stays)."""
    if importlib.util.find_spec("moto") is None:
        pytest.fail("moto is not installed: the dev extra has it (pip install -e '.[dev]')")
    log_dir = tmp_path_factory.mktemp("rehearsal")
    s3 = S3Server(log_dir / "moto.log").start()
    try:
        s3.create_bucket(BUCKET)
        cluster = FakeCluster({**ENV, **s3.env}, worker_resources={"CPU": 1, "GPU": 1}, max_workers=MAX_WORKERS)
        r = Rehearsal(s3, cluster, log_dir)
        error = None
        try:
            cluster.start()
            run_scenario(r, builtin_data)
        except AssertionError as err:  # the tests report it, each for its own behaviour
            error = err
        finally:
            shut_down(cluster, log_dir)
        if error is not None:
            r.problem = f"{error}\n" + r.log_excerpt(RESUME_JOB if r.run_status else RUN_JOB)
        print(f"\ncloud rehearsal (logs and the bucket's records: {log_dir}):\n{r.timeline()}")
        yield r
        dump_bucket(r, log_dir / "bucket")
    finally:
        s3.stop()


def shut_down(cluster: FakeCluster, log_dir: Path) -> None:
    """Keep the jobs' logs, the drivers' local records and Ray's logs in ``log_dir``, kill every process of the
    cluster and remove its files; fail if any of its processes survives."""
    for job in (RUN_JOB, RESUME_JOB):
        save_job_log(cluster, job, log_dir)
    cluster.stop()
    left = cluster.pids()
    for results in cluster.root.glob("head_results*"):  # the drivers' local copies of the records
        shutil.copytree(results, log_dir / results.name, ignore=shutil.ignore_patterns("*.pt"), dirs_exist_ok=True)
    for log in cluster.root.glob("session_latest/logs/*"):  # Ray's: the autoscaler's, the GCS's, the workers' output
        if log.is_file() and log.name.startswith(("monitor", "worker-", "gcs_server", "raylet")):
            (log_dir / "ray_logs").mkdir(exist_ok=True)
            shutil.copy(log, log_dir / "ray_logs" / log.name)
    cluster.remove_files()
    assert not left, f"processes of the cluster at {cluster.root} survive: {left}"


def dump_bucket(r: Rehearsal, out: Path) -> None:
    """The sweep's files in the bucket, checkpoints left out, copied to ``out`` (to read after a failure)."""
    for path in r.files():
        if not path.endswith((".pt", ".sha256")):
            target = out / path
            target.parent.mkdir(parents=True, exist_ok=True)
            with r.fs.open_input_stream(f"{SWEEP}/{path}") as stream:
                target.write_bytes(stream.read())


def save_job_log(cluster: FakeCluster, job: str, log_dir: Path) -> str:
    try:
        text = cluster.job_logs(job)
    except Exception:  # noqa: BLE001 - never submitted, or the cluster is gone
        return ""
    (log_dir / f"{job}.log").write_text(text)
    return text


def sweep_command(*args: str) -> list[str]:
    """``python -m lmtune.run ARGS`` as a job's entrypoint, with the venv's python. (The job runs it through the
    head's shell; `ray job submit` quotes its words with shlex.join, so the storage URI's '&' is safe.)"""
    return [sys.executable, "-m", "lmtune.run", *args]


def user_package(root: Path) -> Path:
    """The user's package holding their model (tests/user_models/gpt_style.py), in a folder of its own."""
    package = root / USER_PACKAGE
    package.mkdir(exist_ok=True)
    (package / "__init__.py").write_text("")
    shutil.copy(USER_MODELS / "gpt_style.py", package / "gpt_style.py")
    return package


def run_scenario(r: Rehearsal, data: Path) -> None:
    cluster, storage = r.cluster, r.s3.uri(f"{BUCKET}/sweeps")
    r.head_id = next(n["node_id"] for n in cluster.nodes() if n["is_head_node"])
    r.workers_at_start = len(cluster.worker_nodes())
    r.event("cluster started")
    space = write_grid_space(cluster.root / "space.yaml", LRS, steps=STEPS, checkpoint_interval=CHECKPOINT_INTERVAL,
                             batch_size=BATCH_SIZE)
    package = user_package(cluster.root)
    cluster.submit_job(RUN_JOB, sweep_command(
        "--space", str(space), "--address", "auto", "--storage", storage, "--name", NAME, "--model", USER_MODEL,
        "--cluster-config", str(cluster.config_path), "--results", str(cluster.root / "head_results"),
        "--data", str(data), "--quiet", "--no-dashboard"), env_vars=r.s3.env, py_modules=[str(package)])
    r.event("sweep submitted")

    def job_running(job: str) -> bool:
        status = cluster.job_status(job)
        if status in ("FAILED", "STOPPED", "SUCCEEDED"):
            save_job_log(cluster, job, r.log_dir)
        return status in ("PENDING", "RUNNING")

    # 1. A trial on a worker node with a checkpoint in the bucket, still running: kill its node. The fake nodes
    # share this machine's disk, where a preempted instance's disk is gone with it: the trial's working directory
    # (the node-local copy of its files, which Ray syncs to the bucket) is deleted too.
    def checkpointed_trial_running() -> tuple[str, Path, str, int] | None:
        r.watch()
        files = r.files()
        candidates = {}  # unfinished trial folder -> (its newest checkpoint folder, that checkpoint's step)
        for path in sorted(files):
            match = re.fullmatch(r"([^/]+)/(checkpoint_\d+)/step_(\d+)\.pt", path)
            if match and f"{match[1]}/summary.json" not in files:
                candidates[match[1]] = (match[2], int(match[3]))
        if not candidates:
            return None
        for node_id, cwds in cluster.worker_cwds().items():
            for cwd in cwds:
                if node_id != r.head_id and cwd.name in candidates and taken_in(cwd, candidates[cwd.name][1]):
                    return node_id, cwd, *candidates[cwd.name]
        return None

    def taken_in(cwd: Path, step: int) -> bool:
        """Whether the driver has taken in the result that carried the checkpoint of ``step`` (Tune restores a
        trial only from a checkpoint its driver knows of): the trial has logged two reports past it, and a
        function trainable's next report waits until its previous one was taken."""
        try:
            logged = [row["step"] for row in read_metrics_text((cwd / "metrics.csv").read_text())]
        except OSError:
            return False
        return bool(logged) and max(logged) >= step + 2 * TINY_TRIAL["log_interval"]

    r.killed_node, working_dir, r.killed_after, r.killed_after_step = poll(
        checkpointed_trial_running, 180, "trial running on a worker with a checkpoint in the bucket", poll_s=0.2,
        alive=lambda: job_running(RUN_JOB))
    r.killed_trial = working_dir.name
    before_kill = {n["node_id"] for n in cluster.worker_nodes()}
    cluster.kill_node(r.killed_node)
    shutil.rmtree(working_dir)
    r.event(f"worker killed ({r.killed_node[-5:]}, running {r.killed_trial} with {r.killed_after} in the bucket, "
            f"step {r.killed_after_step})")

    # 2. Two trials finished, and a replacement node up (or only one trial left: then stop before it ends too).
    def stop_now() -> bool:
        r.watch()
        new = {n["node_id"] for n in cluster.worker_nodes()} - before_kill
        if new - r.replacement_nodes:
            r.event(f"replacement node {', '.join(sorted(n[-5:] for n in new - r.replacement_nodes))} up")
            r.replacement_nodes |= new
        done = finished(r.files())
        if len(done) > r.finished_count:
            r.finished_count = len(done)
            r.event(f"{len(done)} trials finished")
        return len(done) >= 2 and (r.replacement_nodes or len(done) >= len(LRS) - 1)

    poll(stop_now, 150, "two finished trials and a replacement node", poll_s=0.5, alive=lambda: job_running(RUN_JOB))
    r.stopped_at = time.time()
    stop = cluster.ray_cli("job", "stop", "--address", cluster.dashboard_url, RUN_JOB)
    assert stop.returncode == 0, stop.stdout[-2000:] + stop.stderr[-2000:]
    r.run_status = cluster.wait_job(RUN_JOB, 60)
    save_job_log(cluster, RUN_JOB, r.log_dir)
    files = r.files()
    r.mtimes_at_stop = {path: info.mtime for path, info in files.items()}
    r.ledger_at_stop = json.loads(r.read(LEDGER)) if LEDGER in files else {}
    # Finished: in lmtune's ledger (a trial can have its summary.json in the bucket and no ledger entry yet: it
    # finished as the driver was stopped; the resume then runs it again from its last checkpoint, as it may).
    recorded = {folder for folder in finished(files)
                if r.ledger_at_stop.get(trial_id(r, folder), {}).get("outcome") not in (None, "error")}
    r.finished_at_stop = {folder: (r.read(f"{folder}/metrics.csv").encode(), files[f"{folder}/metrics.csv"].mtime)
                          for folder in recorded}
    r.unfinished_at_stop = len(LRS) - len(r.finished_at_stop)
    r.event(f"driver stopped ({r.run_status}; {len(finished(files))} trials with a summary.json in the bucket, "
            f"{len(recorded)} of them in the ledger)")

    # 3. The sweep resumed by a new job, from the bucket alone (a results folder the first job never saw).
    cluster.submit_job(RESUME_JOB, sweep_command(
        "--name", NAME, "--resume", "--address", "auto", "--storage", storage,
        "--results", str(cluster.root / "head_results_resume"), "--quiet", "--no-dashboard"), env_vars=r.s3.env,
        py_modules=[str(package)])
    r.event("resume submitted")
    r.resume_status = cluster.wait_job(RESUME_JOB, 240)
    save_job_log(cluster, RESUME_JOB, r.log_dir)
    r.watch(every_s=0)
    r.event(f"resumed sweep ended ({r.resume_status})")  # (its status is judged by the resume's test)


# ---------------------------------------------------------------------------------------------
# The behaviours


def test_the_autoscaler_launches_gpu_workers_for_the_trials_gpu_shares(rehearsal: Rehearsal):
    r = rehearsal
    r.need("worker killed")
    assert r.workers_at_start == 0
    assert 1 <= r.max_workers_alive <= MAX_WORKERS, r.max_workers_alive
    assert all(res.get("GPU") == 1 for res in r.worker_resources.values()), r.worker_resources
    # The trials asked for a GPU share (sweep.json in the bucket), read from the cluster's config by the driver,
    # which saw no GPU and no worker when it started, and said so on its first line.
    record = json.loads(r.read("sweep.json"))
    assert record["resources_per_trial"]["gpu"] > 0, record["resources_per_trial"]
    match = PLACEMENT_LINE.search(r.job_log(RUN_JOB))
    assert match, r.job_log(RUN_JOB)[-3000:]
    gpus, at_once = float(match[2]), int(match[3])
    assert gpus > 0 and at_once >= 2, match[0]


def test_two_trials_train_at_once_on_different_nodes(rehearsal: Rehearsal):
    r = rehearsal
    r.need("driver stopped")
    spans, files = {}, r.files()
    for folder in trial_folders(files):
        if f"{folder}/result.json" not in files:  # (the driver uploads it; a trial that had just started)
            continue
        rows = result_rows(r, folder)
        assert rows and all("node_id" in row for row in rows), folder
        spans[folder] = [(row["timestamp"], row["node_id"]) for row in rows]
    overlapping = [(a, b) for a in spans for b in spans if a < b and _overlap(spans[a], spans[b])]
    assert overlapping, {f: (s[0], s[-1]) for f, s in spans.items()}


def _overlap(a: list[tuple[int, str]], b: list[tuple[int, str]]) -> bool:
    """Two trials had results in the same seconds from different nodes."""
    return any(ta == tb and na != nb for ta, na in a for tb, nb in b)


def test_every_trial_trained_the_users_model_shipped_to_the_worker_nodes(rehearsal: Rehearsal):
    r = rehearsal
    r.need("resumed sweep ended")
    files = r.files()
    for folder in finished(files):
        config, summary = json.loads(r.read(f"{folder}/config.json")), json.loads(r.read(f"{folder}/summary.json"))
        assert config["code"]["model"] == USER_MODEL and summary["model"] == USER_MODEL, (folder, config["code"])
        assert summary["flops_counted"] and summary["status"] == "completed", summary  # FlopCounterMode's count
        nodes = {row["node_id"] for row in result_rows(r, folder)}
        assert nodes and r.head_id not in nodes, (folder, nodes)  # trained on worker nodes only
    assert json.loads(r.read("sweep.json"))["model_fingerprint"]


def test_the_sweeps_records_and_checkpoints_are_in_the_bucket(rehearsal: Rehearsal):
    r = rehearsal
    r.need("worker killed")
    # The kill waited for a checkpoint of the trial in the bucket (Tune's checkpoint_NNNNNN/)...
    assert r.killed_after and r.killed_after.startswith("checkpoint_"), r.killed_after
    r.need("resumed sweep ended")
    files = r.files()
    assert "sweep.json" in files and LEDGER in files, sorted(files)[:40]
    folders = trial_folders(files)
    assert len(folders) == len(LRS), folders
    for folder in folders:
        missing = [name for name in TRIAL_FILES if f"{folder}/{name}" not in files]
        assert not missing, (folder, missing, sorted(p for p in files if p.startswith(folder))[:30])
    # ...and each finished trial keeps its best.pt there (--keep best).
    assert all(f"{folder}/checkpoints/best.pt" in files for folder in folders), \
        sorted(p for p in files if "/checkpoint" in p)
    # (That the ledger holds every trial's outcome is the resume's test.)


def test_a_trial_on_a_killed_worker_resumes_from_its_checkpoint_elsewhere_and_ends_as_an_uninterrupted_run(
        rehearsal: Rehearsal, tmp_path: Path):
    r = rehearsal
    r.need("resumed sweep ended")
    folder = r.killed_trial
    rows = result_rows(r, folder)
    nodes = [row["node_id"] for row in rows]
    assert r.killed_node in nodes, (r.killed_node, set(nodes))
    after = [row for row in rows[nodes.index(r.killed_node):] if row["node_id"] != r.killed_node]
    assert after, f"no result of {folder} from another node than the killed {r.killed_node}"
    # It continued from a checkpoint: its first result elsewhere is past the step of the checkpoint it had in the
    # bucket when its node was killed, not the run's first (step 5).
    assert after[0]["step"] > r.killed_after_step, (after[0]["step"], r.killed_after, r.killed_after_step)
    summary = json.loads(r.read(f"{folder}/summary.json"))
    assert summary["status"] == "completed" and summary["steps"] == STEPS, summary

    # The same config trained locally, uninterrupted: `lmtune train --resume` on a folder holding only the
    # trial's config.json starts it from scratch with that config (same LR, seed, data).
    out = tmp_path / "uninterrupted"
    out.mkdir()
    (out / "config.json").write_text(r.read(f"{folder}/config.json"))
    user_package(tmp_path)  # the user's package, importable here as on the nodes
    # (--trust-code: the copied config.json names the user's package, and no code_files.json vouches for it)
    proc = run_lmtune("train", "--out", str(out), "--resume", "--trust-code", "--quiet", timeout=300,
                      env={"PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    local = json.loads((out / "summary.json").read_text())
    print(f"\nkilled trial {folder}: final val loss {summary['final_val_loss']!r} in the sweep, "
          f"{local['final_val_loss']!r} uninterrupted")
    assert summary["final_val_loss"] == pytest.approx(local["final_val_loss"], rel=1e-6)
    # Its metrics.csv in the bucket is the uninterrupted run's, row for row: the rows before the checkpoint too,
    # which the node that finished it never had on its disk.
    swept = read_metrics_text(r.read(f"{folder}/metrics.csv"))
    direct = read_metrics_text((out / "metrics.csv").read_text())
    assert [row["step"] for row in swept] == [row["step"] for row in direct], \
        f"steps in the bucket's metrics.csv: {[row['step'] for row in swept]}"
    assert [row["train_loss"] for row in swept] == pytest.approx([row["train_loss"] for row in direct], rel=1e-6)


def test_a_stopped_driver_resumed_as_a_new_job_reruns_no_finished_trial(rehearsal: Rehearsal):
    r = rehearsal
    r.need("driver stopped")
    assert r.run_status == "STOPPED", r.run_status
    assert r.unfinished_at_stop >= 1, "every trial had finished before the driver was stopped"
    assert len(r.finished_at_stop) >= 1, (sorted(r.finished_at_stop), r.ledger_at_stop)
    r.need("resumed sweep ended")
    files, problems = r.files(), []
    ledger = json.loads(r.read(LEDGER))
    for folder, (metrics, mtime) in r.finished_at_stop.items():
        # Not trained again: the same metrics.csv, no Tune result after the stop, the same ledger entry...
        if r.read(f"{folder}/metrics.csv").encode() != metrics:
            problems.append(f"{folder}/metrics.csv changed")
        later = [row["step"] for row in result_rows(r, folder) if row["timestamp"] > r.stopped_at + 1]
        if later:
            problems.append(f"{folder} reported results again after the stop (steps {later})")
        trial = trial_id(r, folder)
        if ledger.get(trial) != r.ledger_at_stop[trial]:
            problems.append(f"{trial}'s ledger entry changed: {r.ledger_at_stop[trial]} -> {ledger.get(trial)}")
        # ...nor written again to the bucket.
        if files[f"{folder}/metrics.csv"].mtime != mtime:
            rewritten = [p.split("/", 1)[1] for p, info in files.items() if p.startswith(f"{folder}/")
                         and r.mtimes_at_stop.get(p, info.mtime) != info.mtime]
            problems.append(f"{folder}'s files were uploaded again after the stop (same metrics.csv bytes): "
                            f"{rewritten}")
    # The others were trained: every trial finished, each with its outcome in the bucket's ledger; the job succeeded.
    if len(finished(files)) != len(LRS):
        problems.append(f"only {finished(files)} finished")
    trials = {trial_id(r, folder) for folder in trial_folders(files)}
    if set(ledger) != trials:
        problems.append(f"trials with no outcome in the bucket's {LEDGER}: {sorted(trials - set(ledger))} "
                        f"(it holds {sorted(ledger)})")
    if r.resume_status != "SUCCEEDED":
        problems.append(f"the resumed sweep's job ended {r.resume_status}\n{r.log_excerpt(RESUME_JOB, 8)}")
    assert not problems, "\n".join(problems)


def test_analyze_reads_the_sweep_from_the_bucket_and_names_the_best_lr(rehearsal: Rehearsal, tmp_path: Path):
    r = rehearsal
    r.need("resumed sweep ended")
    losses = {}
    for folder in trial_folders(r.files()):
        lr = json.loads(r.read(f"{folder}/trial.json"))["params"]["lr"]
        losses[lr] = json.loads(r.read(f"{folder}/summary.json"))["final_val_loss"]
    best = min((loss, lr) for lr, loss in losses.items() if loss is not None and math.isfinite(loss))[1]
    start = time.monotonic()
    # (analyze copies the sweep into results/NAME under its working directory, as on a laptop)
    proc = run_lmtune("analyze", r.s3.uri(SWEEP), env=r.s3.env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert f"best lr {best:.3g}" in proc.stdout, (best, proc.stdout[-2000:])
    print(f"\nanalyze s3://{SWEEP}: {time.monotonic() - start:.0f} s")
