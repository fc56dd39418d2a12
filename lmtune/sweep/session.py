"""Ray for the length of a sweep, and the signals that end one: a local Ray instance of this process (or the
cluster at --address), its logging and output settings, and SIGTERM turned into Tune's own Ctrl-C stop."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from types import FrameType

import ray

from lmtune.errors import LmtuneError
from lmtune.private_apis import (
    keep_local_ray_on_loopback,
    ray_process_group,
    ray_processes_in_one_group,
    stop_printing_worker_output,
)
from lmtune.sweep.options import SweepOptions
from lmtune.sweep.worker_path import (
    check_workers_import_this_lmtune,
    own_ray_folder,
    working_folder,
)

log = logging.getLogger(__name__)

Echo = Callable[[str], None]


def signal_exit_code(name: str) -> int:
    """128 + the signal's number (SIGINT 130, SIGTERM 143, SIGHUP 129), as a shell reports a process it killed."""
    return 128 + int(getattr(signal, name))


class Interruptions:
    """SIGTERM (a job scheduler, ``timeout``, ``docker stop``) and SIGHUP (a closed terminal) stop a sweep the
    way Ctrl-C does: each is turned into SIGINT, which Tune answers by saving the experiment and stopping
    the trials (their checkpoints kept for --resume), instead of Ray's core killing the driver with a
    stack dump. ``by`` names the signal that stopped the sweep, ``tuning`` whether Tune had started."""

    by: str | None = None
    tuning = False
    HANDLED = (signal.SIGTERM, signal.SIGHUP)
    STOPPING = (signal.SIGINT, *HANDLED)
    """Every signal that stops a sweep: Ctrl-C's and those turned into it."""

    @classmethod
    @contextlib.contextmanager
    def caught(cls) -> Iterator[None]:
        """SIGTERM and SIGHUP handled so while the block runs (the previous handlers back afterwards)."""
        cls.by, cls.tuning = None, False
        with _handled(cls.HANDLED, cls._on_signal):
            yield

    @classmethod
    def install(cls) -> None:
        for signum in cls.HANDLED:
            signal.signal(signum, cls._on_signal)

    @classmethod
    def name(cls) -> str:
        return cls.by or "SIGINT"

    @classmethod
    def exit_code(cls) -> int:
        return signal_exit_code(cls.name())

    @classmethod
    @contextlib.contextmanager
    def held(cls) -> Iterator[None]:
        """SIGINT, SIGTERM and SIGHUP noted, not acted on, while the block runs: Ray shutting down, which takes a
        second or two and must not be cut short (a further Ctrl-C there ended the driver by SIGINT, or with status
        1, instead of 130). What stopped the sweep is already on its way; a finished sweep has nothing to stop."""

        def note(signum: int, frame: FrameType | None) -> None:
            if signum != signal.SIGINT and cls.by is None:
                cls.by = signal.Signals(signum).name

        with _handled(cls.STOPPING, note):
            yield

    @classmethod
    def ignore_further(cls) -> None:
        """The sweep has stopped or finished and the command only says so and exits: a further Ctrl-C or SIGTERM
        (a second one from an impatient user, or the rest of a process group's) must not turn its exit status into
        a death by signal or cut Python's exit short."""
        for signum in cls.STOPPING:
            signal.signal(signum, signal.SIG_IGN)

    @classmethod
    def _on_signal(cls, signum: int, frame: FrameType | None) -> None:
        cls.by = signal.Signals(signum).name
        signal.raise_signal(signal.SIGINT)


@contextlib.contextmanager
def _handled(signums: Iterable[int], handler: Callable[[int, FrameType | None], None]) -> Iterator[None]:
    """``handler`` for ``signums`` while the block runs; the previous handlers back afterwards."""
    previous = {signum: signal.signal(signum, handler) for signum in signums}
    try:
        yield
    finally:
        for signum, before in previous.items():
            signal.signal(signum, before)


class _WithoutRaysRestoreHint(logging.Filter):
    """lmtune names its own resume command; Tune's "Resume experiment with: Tuner.restore(...)" would mislead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Tuner.restore(" not in record.getMessage()


# Ray's words when its raylet does not register within its fixed 30 s (ray._private.node), as on a busy 2-core
# machine: the start is tried again, then refused in one line.
RAY_STARTUP_TIMEOUT = "timed out during startup"
LOCAL_RAY_ATTEMPTS = 2


def _init_ray(options: SweepOptions, folder: str) -> object:
    """ray.init for a sweep, started from ``folder`` (lmtune.sweep.worker_path: what Ray's workers put first on their
    sys.path): the cluster at --address, or a local instance of this process; Ray's context."""
    with working_folder(folder):
        check_workers_import_this_lmtune()
        return _init_ray_here(options)


def _init_ray_here(options: SweepOptions) -> object:
    if options.address:
        try:
            return ray.init(address=options.address, logging_level=logging.WARNING, configure_logging=True)
        except ConnectionError as err:  # (something answered there, but no Ray cluster's head)
            raise LmtuneError(f"--address {options.address}: {err}; give the address `ray status` shows on the "
                              "cluster's head") from None
    # "local": a new instance even when a `ray start` cluster runs on this machine (ray.init()
    # without an address would join that one, and refuse num_cpus/num_gpus). It serves nothing
    # beyond this machine: every listener on loopback (SECURITY.md).
    keep_local_ray_on_loopback()
    ray_processes_in_one_group()
    dashboard = {"dashboard_host": options.dashboard_host} if options.dashboard else {}
    for attempt in range(LOCAL_RAY_ATTEMPTS):
        try:
            return ray.init(address="local", num_cpus=options.num_cpus, num_gpus=options.num_gpus,
                            include_dashboard=options.dashboard, logging_level=logging.WARNING,
                            configure_logging=True, **dashboard)
        except Exception as err:  # noqa: BLE001 - Ray raises a bare Exception when its raylet misses its wait
            if RAY_STARTUP_TIMEOUT not in str(err):
                raise
            ray.shutdown()  # (what the failed start left running)
            log.warning("Ray's local instance did not start in time (attempt %d of %d)", attempt + 1,
                        LOCAL_RAY_ATTEMPTS)
    load = os.getloadavg()[0]
    raise LmtuneError(f"Ray's local instance did not start: its raylet missed Ray's fixed 30 s to register, "
                      f"{LOCAL_RAY_ATTEMPTS} times (load average {load:.1f} on {os.cpu_count()} CPUs); run again "
                      "when the machine is less busy, or start Ray once (`ray start --head`) and pass --address auto")


@contextlib.contextmanager
def ray_session(options: SweepOptions, echo: Echo) -> Iterator[None]:
    """Ray for the length of a sweep: a local instance of this process, or the cluster at --address."""
    with own_ray_folder() as folder:
        url = getattr(_init_ray(options, folder), "dashboard_url", None)
        yield from _held_session(options, echo, url)


def _held_session(options: SweepOptions, echo: Echo, url: str | None) -> Iterator[None]:
    Interruptions.install()  # again: Ray's core installed its own SIGTERM handler in ray.init
    hint_filter = _WithoutRaysRestoreHint()
    logging.getLogger("ray.tune.tune").addFilter(hint_filter)
    reaper = None if options.address else RayReaper.start()
    try:
        if url:
            echo(f"Ray dashboard: {url}" if "://" in url else f"Ray dashboard: http://{url}")
        # The classic progress table (the new output engine ignores metric_columns), and no error for
        # results without val_loss (it comes every eval_interval; ASHA and Optuna skip results without it).
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
        os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
        # Short trials checkpoint often, and CheckpointConfig(num_to_keep) forces an experiment snapshot
        # each time (wanted: resume loses nothing); Tune's warning about that is noise here.
        os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
        # One TensorBoard stream per trial, lmtune's own (tensorboard/ in each trial folder, by step); Tune's
        # CSV and JSON loggers are added by name (lmtune.sweep.experiment.build_tuner).
        os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
        yield
    finally:
        logging.getLogger("ray.tune.tune").removeFilter(hint_filter)
        stop_printing_worker_output()  # the sweep has said its last line: workers dying say nothing after it
        with Interruptions.held():
            ray.shutdown()
            if reaper is not None:
                reaper.release()


# The reaper: blocks reading its stdin (a pipe only the driver holds) and, when the pipe closes without the
# word "done" (the driver was killed), kills the Ray instance's process group. It ignores the signals that
# end the driver, so a group SIGTERM or a hang-up does not end it first.
_REAPER = """
import os, signal, sys
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
if sys.stdin.buffer.read() != b"done":
    try:
        os.killpg(int(sys.argv[1]), signal.SIGKILL)
    except OSError:
        pass
"""


class RayReaper:
    """Ends the local Ray instance's processes when the driver dies without shutting Ray down (``kill -9``):
    Ray's GCS and raylet die with the driver (they are started to), but its dashboard and runtime-env agents
    poll for the raylet and kept listening for about two minutes. A released reaper exits doing nothing."""

    def __init__(self, process: subprocess.Popen):
        self.process = process

    @classmethod
    def start(cls) -> RayReaper | None:
        group = ray_process_group()
        if group is None:
            return None
        return cls(subprocess.Popen([sys.executable, "-c", _REAPER, str(group)], stdin=subprocess.PIPE,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))

    def release(self) -> None:
        """Ray was shut down: tell the reaper to leave the (now empty) group alone."""
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            self.process.communicate(b"done", timeout=10)
