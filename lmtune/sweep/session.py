"""Ray for the length of a sweep, and the signals that end one: a local Ray instance of this process (or the
cluster at --address), its logging and output settings, and SIGTERM turned into Tune's own Ctrl-C stop."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Callable, Iterator
from typing import Any

import ray

from lmtune.private_apis import keep_local_ray_on_loopback
from lmtune.sweep.options import SweepOptions

Echo = Callable[[str], None]


class Interruptions:
    """SIGTERM (a job scheduler, ``timeout``) stops a sweep the way Ctrl-C does: it is turned into
    SIGINT, which Tune answers by saving the experiment and stopping the trials (its checkpoints
    kept for --resume), instead of Ray's core killing the driver with a stack dump."""

    sigterm = False

    @classmethod
    @contextlib.contextmanager
    def caught(cls) -> Iterator[None]:
        """SIGTERM handled so while the block runs (the previous handler back afterwards)."""
        cls.sigterm = False
        previous = signal.signal(signal.SIGTERM, cls._on_sigterm)
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, previous)

    @classmethod
    def install(cls) -> None:
        signal.signal(signal.SIGTERM, cls._on_sigterm)

    @classmethod
    def _on_sigterm(cls, signum: int, frame: Any) -> None:
        cls.sigterm = True
        signal.raise_signal(signal.SIGINT)


class _WithoutRaysRestoreHint(logging.Filter):
    """lmtune names its own resume command; Tune's "Resume experiment with: Tuner.restore(...)" would mislead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Tuner.restore(" not in record.getMessage()


@contextlib.contextmanager
def ray_session(options: SweepOptions, echo: Echo) -> Iterator[None]:
    """Ray for the length of a sweep: a local instance of this process, or the cluster at --address."""
    kwargs: dict[str, Any] = {"logging_level": logging.WARNING, "configure_logging": True}
    if options.address:
        kwargs["address"] = options.address
    else:
        # "local": a new instance even when a `ray start` cluster runs on this machine (ray.init()
        # without an address would join that one, and refuse num_cpus/num_gpus). It serves nothing
        # beyond this machine: every listener on loopback (SECURITY.md).
        keep_local_ray_on_loopback()
        kwargs.update(address="local", num_cpus=options.num_cpus, num_gpus=options.num_gpus,
                      include_dashboard=options.dashboard)
        if options.dashboard:
            kwargs["dashboard_host"] = options.dashboard_host
    url = getattr(ray.init(**kwargs), "dashboard_url", None)
    Interruptions.install()  # again: Ray's core installed its own SIGTERM handler in ray.init
    hint_filter = _WithoutRaysRestoreHint()
    logging.getLogger("ray.tune.tune").addFilter(hint_filter)
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
        yield
    finally:
        logging.getLogger("ray.tune.tune").removeFilter(hint_filter)
        ray.shutdown()
