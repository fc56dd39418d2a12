"""The cloud rehearsal's harness (tests/test_cloud_rehearsal.py): the cloud's parts, real but on one machine.

- ``S3Server``: moto's S3 server on 127.0.0.1 (``moto_server`` from the ``dev`` extra), the bucket's stand-in;
  pyarrow (and so Ray Tune) reaches it through the ``AWS_*`` variables or the URI's ``endpoint_override``.
- ``FakeCluster``: a Ray head started with ``ray start --head`` and an autoscaling config for Ray's fake
  multi-node provider, whose autoscaler launches "GPU" worker nodes (raylets on this machine, with a logical
  GPU each) on demand, as ``ray up``'s does EC2 instances. Its ports and temp dir are its own, so it never
  meets another Ray on the machine; ``stop`` kills exactly its processes (never ``ray stop``, which would
  kill every Ray here).
- ``bucket_files``/``read_text``: what the bucket holds, read as a user would, with pyarrow.

Not Ray's ``AutoscalingCluster``: it runs ``ray stop --force`` at start and shutdown, cannot take a port or a
temp dir, and reads an example.yaml the wheel does not ship. Ray 2.60's fake provider needs every key of the
upstream example config (the v1 autoscaler indexes them and fills in no defaults), and the head node type
named ``ray.head.default``.
"""

from __future__ import annotations

import dataclasses
import json
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

VENV_BIN = Path(sys.executable).parent
REGION = "us-east-1"
KEY = "testing"  # moto accepts any credentials
HEAD_TYPE = "ray.head.default"  # the fake provider's head type (FAKE_HEAD_NODE_TYPE): no other name works
MB = 1000 * 1000


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (from the kernel's ephemeral range, so above Ray's worker ports)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def poll(condition: Callable[[], Any], timeout: float, what: str, poll_s: float = 0.25,
         alive: Callable[[], bool] | None = None) -> Any:
    """``condition()``'s first truthy value, polled every ``poll_s``; AssertionError after ``timeout`` seconds
    or as soon as ``alive()`` (when given) says what should produce it has ended."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert alive is None or alive(), f"ended before {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout:.0f} s"
        time.sleep(poll_s)


# ---------------------------------------------------------------------------------------------
# Processes


def process_table() -> dict[int, tuple[int, str]]:
    """pid -> (ppid, command line) of every live process (zombies left out)."""
    table = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            table[int(stat.parent.name)] = (int(fields[1]), cmdline)
    return table


def with_descendants(pids: set[int], table: dict[int, tuple[int, str]]) -> set[int]:
    """``pids`` and every live process below them."""
    found, changed = set(pids), True
    while changed:
        more = {pid for pid, (ppid, _) in table.items() if ppid in found} - found
        found |= more
        changed = bool(more)
    return found & set(table)


def kill_pids(pids: set[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# ---------------------------------------------------------------------------------------------
# S3


class S3Server:
    """moto's S3 server on 127.0.0.1:``port`` (a free one by default), in a session of its own; its log at
    ``log``. ``env`` is what a process needs to reach it as AWS: endpoint, credentials, region."""

    def __init__(self, log: Path, port: int | None = None):
        self.port = port or free_port()
        self.log = log
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": f"http://{self.endpoint}", "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": KEY,
                "AWS_DEFAULT_REGION": REGION, "AWS_EC2_METADATA_DISABLED": "true"}

    def uri(self, path: str) -> str:
        """``s3://PATH`` with the endpoint in the URI's query (pyarrow's form; credentials come from ``env``)."""
        return f"s3://{path}?endpoint_override={self.endpoint}&scheme=http&region={REGION}"

    def start(self, timeout: float = 60) -> S3Server:
        server = VENV_BIN / "moto_server"
        command = [str(server)] if server.exists() else [sys.executable, "-m", "moto.server"]
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen([*command, "-H", "127.0.0.1", "-p", str(self.port)], stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        poll(self._answers, timeout, f"moto server on {self.endpoint} (log: {self.log})",
             alive=lambda: self.proc.poll() is None)
        return self

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.endpoint}/moto-api/", timeout=2):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        """Kill the server and everything in its session; assert nothing of it is left."""
        if self.proc is None:
            return
        sid = self.proc.pid
        kill_pids({pid for pid in process_table() if _session(pid) == sid} | {sid})
        self.proc.wait(timeout=30)
        poll(lambda: not [p for p in process_table() if _session(p) == sid], 30, "end of the moto server")

    def filesystem(self, allow_bucket_creation: bool = False):
        import pyarrow.fs as pafs

        return pafs.S3FileSystem(endpoint_override=self.endpoint, scheme="http", access_key=KEY, secret_key=KEY,
                                 region=REGION, allow_bucket_creation=allow_bucket_creation)

    def create_bucket(self, name: str) -> None:
        self.filesystem(allow_bucket_creation=True).create_dir(name)


def _session(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3])
    except (OSError, IndexError, ValueError):
        return None


def bucket_files(fs, prefix: str) -> dict[str, Any]:
    """Path (relative to ``prefix``) -> pyarrow FileInfo of every file under ``prefix`` in the bucket."""
    import pyarrow.fs as pafs

    try:
        infos = fs.get_file_info(pafs.FileSelector(prefix, recursive=True, allow_not_found=True))
    except OSError:
        return {}
    return {info.path[len(prefix):].lstrip("/"): info for info in infos if info.type == pafs.FileType.File}


def read_text(fs, path: str) -> str:
    with fs.open_input_stream(path) as stream:
        return stream.read().decode()


# ---------------------------------------------------------------------------------------------
# An autoscaling Ray cluster on one machine


def fake_cluster_config(gcs_address: str, worker_type: str, worker_resources: dict[str, float], max_workers: int,
                        object_store_bytes: int, idle_timeout_minutes: float = 0.5) -> dict[str, Any]:
    """The autoscaling config of a fake multi-node cluster: a head with no CPU (it runs drivers only, as
    cluster.yaml's does not run trials) and ``worker_type`` nodes of ``worker_resources``, 0 to ``max_workers``.
    Every key of Ray's example config is given: the v1 autoscaler reads them without filling in defaults."""
    return {
        "cluster_name": "lmtune_rehearsal",
        "max_workers": max_workers,
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": idle_timeout_minutes,
        "provider": {"type": "fake_multinode", "use_node_id_as_ip": True, "disable_node_updaters": True,
                     "disable_launch_config_check": True,
                     "gcs_address": gcs_address},  # else the provider's nodes look for a GCS on port 6379
        "auth": {},
        "docker": {},
        "available_node_types": {
            HEAD_TYPE: {"resources": {"CPU": 0}, "node_config": {}, "min_workers": 0, "max_workers": 0},
            worker_type: {"resources": {**worker_resources, "object_store_memory": object_store_bytes},
                          "node_config": {}, "min_workers": 0, "max_workers": max_workers},
        },
        "head_node_type": HEAD_TYPE,
        "file_mounts": {}, "cluster_synced_files": [], "file_mounts_sync_continuously": False,
        "rsync_exclude": [], "rsync_filter": [],
        "initialization_commands": [], "setup_commands": [], "head_setup_commands": [], "worker_setup_commands": [],
        "head_start_ray_commands": [], "worker_start_ray_commands": [],
    }


class FakeCluster:
    """A Ray head (``ray start --head``, CPU 0) whose autoscaler launches ``worker_type`` nodes of
    ``worker_resources`` (0 to ``max_workers``) through Ray's fake multi-node provider: each a real raylet with
    its agents and workers, on this machine, with a logical GPU when the type has one.

    Everything of it lives under ``root`` (a short /tmp path: Ray's unix sockets must fit 107 bytes): Ray's temp
    dir, the autoscaling config (``config_path``, the file a ``ray up`` head has as ~/ray_bootstrap_config.yaml),
    and whatever a caller puts there; every process whose command line names ``root``, with the processes below
    it, is the cluster's (``pids``), which ``stop`` kills. ``env`` goes to ``ray start`` and so to every node,
    worker and job driver: say there how to reach the bucket.

    A killed node is replaced by way of the idle timeout: Ray 2.60's v1 autoscaler terminates the dead node as idle
    ``idle_timeout_minutes`` after the GCS marked it dead (its heartbeat check never fires for it: the node's load
    metrics go when it dies), and only then launches another within ``max_workers``. With the defaults here (a
    health check a second, 6 s of idle time), a replacement is up about 12 s after the kill.
    """

    def __init__(self, env: dict[str, str], worker_type: str = "gpu_worker",
                 worker_resources: dict[str, float] | None = None, max_workers: int = 2,
                 object_store_bytes: int = 100 * MB, heartbeat_timeout_s: int = 10, idle_timeout_minutes: float = 0.1,
                 health_check_period_ms: int = 1000):
        self.root = Path(tempfile.mkdtemp(prefix="rr", dir="/tmp"))
        self.port, self.dashboard_port = free_port(), free_port()
        self.client_port, self.agent_port = free_port(), free_port()  # ephemeral ports: all >= 32768
        self.worker_type, self.max_workers = worker_type, max_workers
        self.worker_resources = worker_resources or {"CPU": 1, "GPU": 1}
        self.object_store_bytes = object_store_bytes
        self.idle_timeout_minutes = idle_timeout_minutes
        self.config_path = self.root / "ray_bootstrap_config.yaml"
        path = os.pathsep.join([str(VENV_BIN), os.environ.get("PATH", "")])
        # Token auth off everywhere: with ~/.ray/auth_token present, Ray 2.60 turns it on in `ray start` and in a
        # driver joining with address "auto", and the result would depend on this machine's state.
        # CUDA_VISIBLE_DEVICES left out: a fake node given a GPU fails to start when it names fewer devices.
        self.env = {k: v for k, v in {**os.environ, **env, "PATH": path, "RAY_AUTH_MODE": "disabled",
                                      "RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1",
                                      "AUTOSCALER_HEARTBEAT_TIMEOUT_S": str(heartbeat_timeout_s),
                                      # A killed node is dead for the GCS after 5 missed health checks: 5 s, not 15.
                                      "RAY_health_check_period_ms": str(health_check_period_ms),
                                      "RAY_USAGE_STATS_ENABLED": "0"}.items()
                    if k not in ("CUDA_VISIBLE_DEVICES", "RAY_ADDRESS")}
        self.ip: str | None = None
        self.stopped = False

    # -- start and stop

    def start(self, timeout: float = 120) -> FakeCluster:
        import ray._private.services

        self.ip = ray._private.services.get_node_ip_address()  # the address the head binds and the nodes use
        config = fake_cluster_config(self.gcs_address, self.worker_type, self.worker_resources, self.max_workers,
                                     self.object_store_bytes, self.idle_timeout_minutes)
        self.config_path.write_text(json.dumps(config, indent=1))  # JSON is YAML
        command = [str(VENV_BIN / "ray"), "start", "--head", f"--port={self.port}", f"--temp-dir={self.root}",
                   "--num-cpus=0", "--num-gpus=0", f"--object-store-memory={self.object_store_bytes}",
                   "--dashboard-host=127.0.0.1", f"--dashboard-port={self.dashboard_port}",
                   f"--ray-client-server-port={self.client_port}", f"--dashboard-agent-listen-port={self.agent_port}",
                   "--disable-usage-stats", f"--autoscaling-config={self.config_path}"]
        proc = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, cwd=self.root)
        (self.root / "ray_start.log").write_text(proc.stdout + proc.stderr)
        assert proc.returncode == 0, f"ray start failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        poll(self._dashboard_answers, timeout, "Ray dashboard")
        return self

    def _dashboard_answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.dashboard_url}/api/version", timeout=2):
                return True
        except OSError:
            return False

    def pids(self) -> set[int]:
        """Every live process of this cluster: those whose command line names its root folder (GCS, raylets,
        monitor, dashboard, agents, job drivers given a path under it), and all processes below them."""
        table = process_table()
        mine = re.compile(re.escape(str(self.root)) + r"(?![\w.-])")
        return with_descendants({pid for pid, (_, cmd) in table.items()
                                 if mine.search(cmd) and pid != os.getpid()}, table)

    def stop(self, timeout: float = 30) -> set[int]:
        """SIGKILL every process of this cluster, pid by pid, until none is left; returns those it found.
        (Their parents are gone or reap them: the survivors would be zombies, which ``pids`` leaves out.)"""
        found = set()
        deadline = time.monotonic() + timeout
        while live := self.pids():
            found |= live
            kill_pids(live)
            assert time.monotonic() < deadline, f"processes of the cluster at {self.root} survive SIGKILL: {live}"
            time.sleep(0.3)
        self.stopped = True
        return found

    def remove_files(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    # -- addresses

    @property
    def gcs_address(self) -> str:
        return f"{self.ip}:{self.port}"

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    # -- what it runs

    def nodes(self) -> list[dict[str, Any]]:
        """Every node the cluster has known (Ray's state API through the dashboard): node_id, state ALIVE or
        DEAD, is_head_node, resources_total, labels, ..."""
        from ray.util.state import list_nodes

        return [dataclasses.asdict(n) for n in list_nodes(address=self.dashboard_url, detail=True, limit=1000,
                                                          raise_on_missing_output=False)]

    def worker_nodes(self, alive: bool = True) -> list[dict[str, Any]]:
        """The worker nodes (not the head): live ones, or with ``alive`` False every one it has had."""
        return [n for n in self.nodes() if not n["is_head_node"] and (n["state"] == "ALIVE" or not alive)]

    def cluster_status(self) -> dict[str, Any]:
        """The autoscaler's report (the dashboard's /api/cluster_status: active, pending and failed nodes per
        type, resource demands), or {} before its first."""
        with urllib.request.urlopen(f"{self.dashboard_url}/api/cluster_status", timeout=10) as response:
            data = json.load(response)["data"]
        return data.get("clusterStatus") or data.get("cluster_status") or {}

    def raylets(self) -> dict[str, int]:
        """Node id (hex) -> pid of the raylet of each live node of this cluster, the head's included."""
        table = process_table()
        found = {}
        for pid in self.pids():
            cmd = table.get(pid, (0, ""))[1]
            match = re.search(r"--node_id=([0-9a-f]+)", cmd)
            if match and "/raylet " in cmd.split(" --", 1)[0] + " ":
                found[match.group(1)] = pid
        return found

    def worker_cwds(self) -> dict[str, list[Path]]:
        """Node id -> the working directories of the Ray workers below its raylet (a Tune trial runs in its
        trial's working dir, ``.../working_dirs/<trial folder>``, so this says which trial runs where)."""
        table = process_table()
        found: dict[str, list[Path]] = {}
        for node_id, raylet in self.raylets().items():
            for pid, (ppid, cmd) in table.items():
                if ppid == raylet and cmd.startswith("ray::") and "Agent" not in cmd:
                    try:
                        found.setdefault(node_id, []).append(Path(os.readlink(f"/proc/{pid}/cwd")))
                    except OSError:
                        continue
        return found

    def kill_node(self, node_id: str) -> set[int]:
        """A preempted instance: SIGKILL the raylet of node ``node_id`` and every process below it (its agents and
        workers) at once; returns their pids. (The raylet alone is not enough: a Tune trial's worker talks to the
        driver and to storage directly, and went on training for seconds after its raylet died.)"""
        raylet = self.raylets()[node_id]
        pids = with_descendants({raylet}, process_table())
        kill_pids(pids)
        return pids

    # -- jobs (`ray job ...`, as a user runs them against the dashboard)

    def ray_cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """``ray ARGS`` from the venv, with the cluster's environment (token auth off)."""
        env = {**self.env, "RAY_ADDRESS": self.dashboard_url}
        return subprocess.run([str(VENV_BIN / "ray"), *args], env=env, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def submit_job(self, submission_id: str, entrypoint: list[str], env_vars: dict[str, str],
                   py_modules: list[str] = ()) -> str:
        """``ray job submit --no-wait`` of ``entrypoint`` with ``env_vars`` in its runtime env, and ``py_modules``
        (local package folders Ray ships to every node, as the README tells a user to ship their model's code);
        returns the command's output."""
        runtime_env = {"env_vars": env_vars, **({"py_modules": list(py_modules)} if py_modules else {})}
        proc = self.ray_cli("job", "submit", "--address", self.dashboard_url, "--submission-id", submission_id,
                            "--no-wait", "--runtime-env-json", json.dumps(runtime_env), "--", *entrypoint)
        assert proc.returncode == 0, f"ray job submit failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return proc.stdout + proc.stderr

    def jobs(self):
        from ray.job_submission import JobSubmissionClient

        return JobSubmissionClient(self.dashboard_url)

    def job_status(self, submission_id: str) -> str:
        return str(self.jobs().get_job_status(submission_id).value)

    def job_logs(self, submission_id: str) -> str:
        return self.jobs().get_job_logs(submission_id)

    def wait_job(self, submission_id: str, timeout: float) -> str:
        """The job's final status (SUCCEEDED, FAILED or STOPPED), waiting at most ``timeout`` seconds."""
        return poll(lambda: (s := self.job_status(submission_id)) in ("SUCCEEDED", "FAILED", "STOPPED") and s,
                    timeout, f"end of job {submission_id}", poll_s=1)
