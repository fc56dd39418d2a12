"""Where a sweep lives: a folder on a filesystem every node reaches (a local disk on one machine, NFS on a cluster)
or a prefix in object storage (``s3://bucket/prefix``, ``gs://...``; an S3-compatible store by ``AWS_ENDPOINT_URL``
or ``?endpoint_override=HOST:PORT&scheme=http`` in the URI). Everything goes through pyarrow's filesystems, the ones
Ray Tune persists trials through; credentials come from the ordinary AWS/GCS environment and configuration.

With object storage the driver keeps its records (sweep.json, decisions/) in a local folder, ``results/NAME``, and
uploads each one as it is written (lmtune.files.mirrored); the trials' folders are in the bucket only, and
``download`` brings a sweep's records and trial files (not its checkpoints) back for the report or a resume.
"""

from __future__ import annotations

import json
import logging
import posixpath
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pyarrow
import pyarrow.fs as pafs

from lmtune.errors import LmtuneError, first_line
from lmtune.files import atomic_write_bytes

log = logging.getLogger(__name__)

# What a download leaves behind: checkpoints (the report reads none) and what Tune alone needs.
DOWNLOAD_SKIPS = (".pt", ".pt.sha256", ".pkl")


def is_uri(location: str) -> bool:
    return "://" in location


def filesystem_of(location: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem ``location`` (a local path, or an s3:// gs:// URI, a query string allowed) is on,
    and the path within it."""
    if not is_uri(location):
        return pafs.LocalFileSystem(), str(Path(location).resolve())
    try:
        return pafs.FileSystem.from_uri(location)
    except (pyarrow.ArrowInvalid, OSError, ValueError) as err:
        raise LmtuneError(f"--storage {location}: {err}; give s3://BUCKET/PREFIX (an S3-compatible store: "
                          "AWS_ENDPOINT_URL, or ?endpoint_override=HOST:PORT&scheme=http) or gs://...") from None


@dataclass(frozen=True)
class SweepStorage:
    """The storage ``root`` (a path or a URI, a query string allowed) and the sweep ``name`` under it."""

    root: str
    name: str

    @property
    def remote(self) -> bool:
        return is_uri(self.root)

    @property
    def uri(self) -> str:
        """The sweep's own location, in the form Tune's restore takes (a URI's query after the sweep's name)."""
        base, _, query = self.root.partition("?")
        joined = f"{base.rstrip('/')}/{self.name}"
        return f"{joined}?{query}" if query else joined

    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        """The filesystem and the sweep's path in it."""
        return filesystem_of(self.uri)

    @classmethod
    def of_uri(cls, uri: str) -> SweepStorage:
        """The storage of the sweep at ``uri`` (s3://bucket/prefix/NAME, a query string allowed)."""
        base, _, query = uri.partition("?")
        root, _, name = base.rstrip("/").rpartition("/")
        if not name or root.endswith(":/"):
            raise LmtuneError(f"{uri}: name a sweep in the bucket, e.g. s3://BUCKET/PREFIX/NAME")
        return cls(f"{root}?{query}" if query else root, name)

    def fetch(self, results: Path) -> Path:
        """The sweep copied (records and trial files, no checkpoints) into results/NAME, for the report; a folder
        there that holds another sweep of the same name is refused, not overwritten."""
        local = Path(results) / self.name
        mine = local / "sweep.json"
        if mine.exists():
            fs, remote = self.filesystem()
            with fs.open_input_stream(posixpath.join(remote, "sweep.json")) as source:
                theirs = source.read()
            if _start_time(mine.read_bytes()) != _start_time(theirs):
                raise LmtuneError(f"{local} holds another sweep named {self.name} (another start time); move it, "
                                  f"or run from another directory to copy {self.uri} there")
        return self.download(local)

    def upload(self, local_root: Path, path: Path) -> None:
        """Copy ``path`` (a file under ``local_root``) to the same place under the sweep in storage (a signal stops
        the driver meanwhile: lmtune.sweep.storage)."""
        try:
            interruptible(lambda: self._upload(local_root, path), f"uploading {path.name} to {self.uri}")
        except OSError as err:  # (pyarrow's: a bucket gone, credentials expired, the store down)
            raise LmtuneError(f"{self.uri}: cannot upload {path.name} ({first_line(err)}); check the bucket and the "
                              f"credentials, then resume the sweep") from None

    def _upload(self, local_root: Path, path: Path) -> None:
        fs, remote = self.filesystem()
        target = posixpath.join(remote, Path(path).relative_to(local_root).as_posix())
        fs.create_dir(posixpath.dirname(target), recursive=True)
        with fs.open_output_stream(target) as out:
            out.write(Path(path).read_bytes())

    def exists(self, relative: str) -> bool:
        def look() -> bool:
            fs, remote = self.filesystem()
            return fs.get_file_info(posixpath.join(remote, relative)).type != pafs.FileType.NotFound

        return interruptible(look, f"looking for {relative} in {self.uri}")

    def download(self, local_dir: Path, records_only: bool = False) -> Path:
        """The sweep's files (no checkpoints) copied into ``local_dir``; with ``records_only``, its top-level files
        and decisions/ (what a resume needs). Files already there are replaced by storage's (storage holds the
        sweep; the local folder is its copy). Returns ``local_dir``. A signal stops the driver meanwhile."""
        return interruptible(lambda: self._download(local_dir, records_only), f"downloading {self.uri}")

    def _download(self, local_dir: Path, records_only: bool) -> Path:
        fs, remote = self.filesystem()
        try:
            infos = fs.get_file_info(pafs.FileSelector(remote, recursive=not records_only))
            if records_only:
                decisions = posixpath.join(remote, "decisions")
                infos += fs.get_file_info(pafs.FileSelector(decisions, allow_not_found=True))
        except (FileNotFoundError, OSError) as err:
            raise LmtuneError(f"{self.uri}: cannot list the sweep ({err}); check the name, the bucket and the "
                              "credentials (AWS_* or GOOGLE_* in the environment)") from None
        count = 0
        for info in infos:
            if info.type != pafs.FileType.File or info.path.endswith(DOWNLOAD_SKIPS):
                continue
            relative = posixpath.relpath(info.path, remote)
            if any(part.startswith("checkpoint_") for part in relative.split("/")):
                continue
            with fs.open_input_stream(info.path) as source:
                atomic_write_bytes(Path(local_dir) / relative, source.read(), mirror=False)  # (storage's own)
            count += 1
        log.info("downloaded %d files of %s to %s", count, self.uri, local_dir)
        return Path(local_dir)


def _start_time(record: bytes) -> str | None:
    try:
        return json.loads(record).get("start_time")
    except (ValueError, AttributeError):
        return None


# Waiting on a call that may block in a network client: in a thread of its own, the driver's main thread waiting
# in short slices, so that SIGINT and SIGTERM still stop the sweep (Python runs signal handlers in the main thread
# only, between bytecodes: never while it sits in a blocked C call).
T = TypeVar("T")


def interruptible(call: Callable[[], T], what: str) -> T:
    """``call()`` in a thread of its own (named ``what``), waited for in short slices, so that SIGINT and SIGTERM
    reach this thread meanwhile, even while ``call`` blocks in a network client; its value, or its exception."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread
            box["error"] = err

    worker = threading.Thread(target=run, daemon=True, name=f"lmtune: {what}")
    worker.start()
    while worker.is_alive():
        worker.join(0.1)
    if "error" in box:
        raise box["error"]
    return box.get("value")
