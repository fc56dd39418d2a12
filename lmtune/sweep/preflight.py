"""Where a sweep runs and where it keeps its files, checked before Ray starts and before anything is written, each
problem one line naming the fix, each check that talks to the network bounded by a short timeout:

- the storage: a local or shared path (made absolute), ``file:///PATH``, ``s3://BUCKET/PREFIX`` or
  ``gs://BUCKET/PREFIX``; object storage must answer within seconds (an unreachable endpoint, or a client retrying
  without credentials, would otherwise hang the sweep after Ray started);
- the cluster: ``--address`` is ``auto`` or HOST:PORT, and something listens there; ``--cluster-config`` is the
  autoscaler's readable YAML, given with ``--address``;
- the resources: on this machine, no trial asks for more CPUs or GPUs than it has (Ray would wait for them forever);
- the dashboard: on this machine, ``--dashboard-host`` is an address it can listen on (Ray would wait 60 s for a
  dashboard that cannot start there, then print its traceback).
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow.fs as pafs
import yaml

from lmtune.errors import LmtuneError, first_line, shown
from lmtune.files import yaml_error_line

# How long a storage endpoint or a cluster address may take to answer before the sweep is refused.
ANSWER_TIMEOUT_S = 5.0
OBJECT_STORES = ("s3", "gs")
# Schemes a --storage value without "://" may have meant (s3:/bucket, gs:bucket, file:/path): refused, not taken for
# a folder of that name under the current directory.
URI_SCHEMES = (*OBJECT_STORES, "gcs", "file", "hdfs", "abfs", "abfss", "az", "http", "https", "ftp", "sftp")


def checked_storage(text: str) -> str:
    """``--storage`` in the form the sweep uses: an absolute path for a local or shared folder (``file:///PATH``
    too), the URI itself for object storage; one line for any other form."""
    value = text.strip()
    if not value:
        raise LmtuneError("--storage '': give a folder (local, or shared by all nodes) or s3://BUCKET/PREFIX")
    _check_scheme(text, value)
    if value.startswith("file://"):
        path = value[len("file://"):]
        if not path.startswith("/"):
            raise LmtuneError(f"--storage {shown(text)}: a file URI names an absolute path, file:///PATH; or give "
                              "the path itself")
        value = path
    if "://" not in value:
        return str(Path(value).expanduser().resolve())
    scheme, _, rest = value.partition("://")
    if scheme not in OBJECT_STORES:
        raise LmtuneError(f"--storage {shown(text)}: lmtune stores sweeps in a folder, s3:// or gs://, not "
                          f"{scheme}://; give one of those")
    if not rest.partition("?")[0].split("/")[0]:
        raise LmtuneError(f"--storage {shown(text)}: no bucket; give {scheme}://BUCKET/PREFIX")
    return value


def _check_scheme(text: str, value: str) -> None:
    """A URI's scheme as lmtune reads it: lower case and followed by "//" (``s3:/x``, ``gs:x`` and ``S3://x`` are
    refused in one line, not run into a folder ./s3:/x or refused as an unknown store)."""
    scheme, colon, rest = value.partition(":")
    if not colon or "/" in scheme or scheme.lower() not in URI_SCHEMES:
        return
    if not rest.startswith("//"):
        fix = "file:///PATH or the path itself" if scheme.lower() == "file" else f"{scheme.lower()}://BUCKET/PREFIX"
        raise LmtuneError(f"--storage {shown(text)}: '{scheme}:' without '//' is not a URI; give {fix} (a folder of "
                          f"that name: ./{value})")
    if scheme != scheme.lower() and scheme.lower() in (*OBJECT_STORES, "file"):
        raise LmtuneError(f"--storage {shown(text)}: a URI's scheme is lower case; give "
                          f"{scheme.lower()}:{rest}")


def check_outside_sweeps(folder: Path, flag: str, given: str) -> None:
    """A new sweep's folder goes in ``folder`` (``given`` as ``flag``), which must lie inside no other sweep: the
    outer sweep's readers (analyze, diagnose) would take the new sweep's trials for its own. One line otherwise."""
    from lmtune.sweep.record import is_sweep_dir

    for above in (folder, *folder.parents):
        if is_sweep_dir(above):
            raise LmtuneError(f"{flag} {given}: a sweep there would be inside the sweep {above} (it holds sweep.json), "
                              "whose report and diagnose would read it as trials of their own; give a folder outside "
                              f"any sweep, e.g. {above.parent}")


def check_storage_answers(root: str, timeout_s: float = ANSWER_TIMEOUT_S) -> None:
    """Object storage ``root`` answers within ``timeout_s`` that its bucket exists; one line when it fails, stays
    silent or has no such bucket. A local path is checked by writing to it (elsewhere).

    The question is asked by a child process, killed when the time is up: a storage client that does not answer
    cannot be interrupted in this one, and pyarrow's S3 client waits for its requests at the interpreter's exit."""
    if "://" not in root:
        return
    try:
        answer = subprocess.run([sys.executable, "-m", "lmtune.sweep.preflight", root, str(timeout_s)],
                                capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise LmtuneError(f"--storage {root}: no answer within {timeout_s:.0f} s (an endpoint that does not answer, "
                          "no route to it, or a client retrying without credentials); check the endpoint, the "
                          "network and the credentials (AWS_* or GOOGLE_* in the environment)") from None
    lines = answer.stdout.strip().splitlines()
    found = json.loads(lines[-1]) if answer.returncode == 0 and lines else {"error": _last_line(answer.stderr)}
    if "error" in found:
        raise LmtuneError(f"--storage {root}: {found['error']}; check the bucket, the endpoint and the credentials "
                          "(AWS_* or GOOGLE_* in the environment)")
    if not found["bucket"]:  # (lmtune makes no buckets: a sweep would fail at its first upload, after Ray started)
        bucket = root.partition("?")[0].partition("://")[2].split("/")[0]
        raise LmtuneError(f"--storage {root}: no bucket named {bucket!r} there; create it first, or name a bucket "
                          "these credentials can write")


def _bucket_answer(root: str) -> dict:
    """What storage ``root`` says of its bucket: {"bucket": whether it exists} or {"error": one line}."""
    from lmtune.sweep.storage import filesystem_of

    try:
        fs, path = filesystem_of(root)
        return {"bucket": fs.get_file_info(path.split("/")[0]).type != pafs.FileType.NotFound}
    except Exception as err:  # noqa: BLE001 - whatever the store's client raises: said in one line
        return {"error": first_line(err)}


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1][:300] if lines else "the storage check ended without an answer"


_HOST_PORT = re.compile(r"(?:ray://)?(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.-]+):(\d{1,5})")


def checked_address(text: str) -> str:
    """``--address``: ``auto`` or HOST:PORT (``ray://HOST:PORT`` too), else one line."""
    value = text.strip()
    if value == "auto":
        return value
    match = _HOST_PORT.fullmatch(value)
    if not match or not 0 < int(match.group(2)) < 65536:
        raise LmtuneError(f"--address {shown(text)}: give auto (the cluster this machine belongs to) or HOST:PORT of "
                          "its head, e.g. 10.0.0.5:6379")
    return value


def check_address_answers(address: str, timeout_s: float = ANSWER_TIMEOUT_S) -> None:
    """Something accepts connections at ``address`` (HOST:PORT; ``auto``: the cluster Ray would join, RAY_ADDRESS
    or `ray start`'s on this machine) within ``timeout_s``; one line when there is none."""
    if address == "auto":
        from lmtune.private_apis import auto_cluster_address

        found = auto_cluster_address()
        if found is None or not _HOST_PORT.fullmatch(found):
            raise LmtuneError("--address auto: no Ray cluster to join (RAY_ADDRESS is unset and `ray start` runs "
                              "none on this machine); start one (ray start --head), or give HOST:PORT of its head")
    match = _HOST_PORT.fullmatch(found if address == "auto" else address)
    host, port = match.group(1).strip("[]"), int(match.group(2))
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return
    except OSError as err:
        why = "no answer" if isinstance(err, TimeoutError | socket.timeout) else (err.strerror or first_line(err))
        raise LmtuneError(f"--address {address}: {why} at {host}:{port} within {timeout_s:.0f} s; start the cluster's "
                          "head there (ray start --head), or give the address `ray status` shows") from None


def read_cluster_config(path: Path) -> dict:
    """The autoscaler's cluster config at ``path``: a YAML mapping, else one line."""
    try:
        config = yaml.safe_load(Path(path).expanduser().read_text())
    except OSError as err:
        raise LmtuneError(f"--cluster-config {path}: cannot read it ({err.strerror or err}); give the autoscaler's "
                          "cluster config file") from None
    except yaml.YAMLError as err:
        line = yaml_error_line(err)
        where = f" (line {line})" if line is not None else ""
        raise LmtuneError(f"--cluster-config {path}: not YAML{where}; give the autoscaler's cluster config (the one "
                          "`ray up` read)") from None
    if not isinstance(config, dict):
        raise LmtuneError(f"--cluster-config {path}: not a cluster config (a YAML mapping)")
    return config


def check_local_resources(cpus_per_trial: float, gpus_per_trial: float | None, num_cpus: int | None,
                          num_gpus: float | None, gpus_here: int) -> None:
    """On this machine (no --address): a trial asking for more CPUs or GPUs than the local Ray instance has would
    wait for them forever; refused in one line."""
    cpus = num_cpus if num_cpus is not None else (os.cpu_count() or 1)
    gpus = num_gpus if num_gpus is not None else gpus_here
    if cpus_per_trial > cpus:
        raise LmtuneError(f"--cpus-per-trial {cpus_per_trial:g}: this machine has {cpus} CPUs (--num-cpus), so no "
                          f"trial would ever start; give at most {cpus}")
    if gpus_per_trial is not None and gpus_per_trial > gpus:
        raise LmtuneError(f"--gpus-per-trial {gpus_per_trial:g}: this machine has {gpus:g} GPUs, so no trial would "
                          f"ever start; give at most {gpus:g}" + (" (or leave it out: it trains on the CPU)"
                                                                  if gpus == 0 else ""))


DASHBOARD_FIX = "give 127.0.0.1 (this machine only), 0.0.0.0 (every interface) or one of this machine's addresses"


def check_dashboard_host(text: str, timeout_s: float = ANSWER_TIMEOUT_S) -> None:
    """``--dashboard-host`` names an address this machine can listen on: an IP address, or a name that resolves
    (within ``timeout_s``) to one, where a socket binds; one line when it is none of these."""
    host = text.strip()
    looks_numeric = bool(re.fullmatch(r"[0-9.]+|\[?[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*\]?", host))
    try:
        address = str(ipaddress.ip_address(host.strip("[]"))) if looks_numeric else _resolved(host, timeout_s)
    except ValueError:
        raise LmtuneError(f"--dashboard-host {shown(text)}: not an IP address; {DASHBOARD_FIX}") from None
    except OSError as err:
        why = "no answer" if isinstance(err, TimeoutError) else (err.strerror or first_line(err))
        raise LmtuneError(f"--dashboard-host {shown(text)}: not an address, nor a name that resolves to one ({why}); "
                          f"{DASHBOARD_FIX}") from None
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((address, 0))
    except OSError as err:
        raise LmtuneError(f"--dashboard-host {shown(text)}: this machine cannot listen on {address} "
                          f"({err.strerror or first_line(err)}); {DASHBOARD_FIX}") from None


def _resolved(name: str, timeout_s: float) -> str:
    """The first address ``name`` resolves to; OSError when it resolves to none, TimeoutError when the resolver does
    not answer within ``timeout_s`` (asked from a thread: ``getaddrinfo`` cannot be interrupted)."""
    if not name:
        raise OSError(0, "an empty name")
    found: list[str | OSError] = []

    def ask() -> None:
        try:
            found.append(str(socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)[0][4][0]))
        except OSError as err:
            found.append(err)

    asking = threading.Thread(target=ask, daemon=True)
    asking.start()
    asking.join(timeout_s)
    if not found:
        raise TimeoutError
    if isinstance(found[0], OSError):
        raise found[0]
    return found[0]


if __name__ == "__main__":  # (check_storage_answers's child: the answer as one JSON line)
    signal.alarm(math.ceil(float(sys.argv[2])) + 1)  # (it ends by itself, should its parent be gone)
    print(json.dumps(_bucket_answer(sys.argv[1])), flush=True)
