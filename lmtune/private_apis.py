"""Every private Ray and torch API lmtune calls, in one place, each with why and what would replace it.

Nothing else in lmtune may touch a name that starts with an underscore in Ray or torch, or import
from ``ray.*._internal`` / ``ray._private``: a Ray or torch upgrade then breaks this file alone,
and its tests say where. Each function says which version forces it and the public API to move to.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any, TypedDict

# ---------------------------------------------------------------------------------------------
# Ray Tune: where a trial's files go


def trial_storage_dir() -> tuple[Path, bool]:
    """(the trial's folder in the experiment's storage, whether it is a local or shared filesystem).

    Why private: since Ray 2.10 (ray-project/ray#43403) ``tune.get_context().get_trial_dir()`` names a
    staging folder under /tmp/ray on the *driver*, not the trial's folder under the storage path, and
    no public API names the latter. lmtune writes its per-trial files (metrics.csv, checkpoints, ...)
    straight into that folder when storage is a filesystem path, so nothing depends on a later sync.
    Public API to move to: ``get_trial_dir()`` once it names the storage folder (ray#30071 asks for it).
    """
    import pyarrow.fs
    from ray.train._internal.session import get_storage

    storage = get_storage()
    if isinstance(storage.storage_filesystem, pyarrow.fs.LocalFileSystem):
        return Path(storage.trial_fs_path), True
    return Path(storage.trial_working_directory), False


def experiment_storage():
    """(pyarrow filesystem, the experiment's path in it) of the running trial's sweep when it lives in object
    storage (s3://, gs://), else None (a local or shared path, file:// too: its trial folders are files here).

    Why private: as for ``trial_storage_dir``; no public API names the experiment's storage either. Public API to
    move to: the same (ray#30071).
    """
    import pyarrow.fs
    from ray.train._internal.session import get_storage

    storage = get_storage()
    if isinstance(storage.storage_filesystem, pyarrow.fs.LocalFileSystem):
        return None
    return storage.storage_filesystem, storage.experiment_fs_path


# ---------------------------------------------------------------------------------------------
# Ray: a local instance on loopback only


def keep_local_ray_on_loopback() -> None:
    """Make the local Ray instance this process is about to start listen on 127.0.0.1 only.

    Why private: on Linux, Ray 2.60 binds its servers (GCS, raylet, object manager, core workers,
    agents, metrics exporters) to the node IP, which it takes from the host's outward interface, and it
    maps a requested 127.0.0.1 back to that address (``services.resolve_ip_for_localhost``). The one
    switch that keeps a single-machine instance on loopback is ``ray_constants.ENABLE_RAY_CLUSTER``
    (environment ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER``, read when Ray is imported; it is what Ray sets
    by itself on macOS and Windows). The environment variable reaches the processes Ray starts; the
    constant, already read in this process, is set to match. Measured with ``ss -ltnup`` during a local
    sweep: 14 listeners on 0.0.0.0, * or the host address without it; with it, 13, all on 127.0.0.1.
    Ray's own work on this (ray-project/ray#55484, #59852) moved servers from 0.0.0.0 to the node IP,
    not to loopback. Public API to move to: a ``ray.init`` option that binds a local instance to
    loopback (none in Ray 2.60).
    """
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False


def ray_processes_in_one_group() -> None:
    """Start the local Ray instance's processes (GCS, raylet, dashboard, and through the raylet every worker
    and agent) in one process group of their own, whose id ``ray_process_group()`` gives once one started.

    Why: ``kill -TERM -PGID`` (systemd, ``docker stop``, Slurm, a terminal hang-up) reaches every process of
    the group the driver runs in, and Ray 2.60 starts its processes in that group on Linux (only on
    Windows does its ``ConsolePopen`` give them a group of their own). Ray's GCS then dies with the driver's
    group, and the driver, which was about to stop Tune and save the experiment, waits 60 s to reconnect
    and exits 1. In a group of their own they receive only what the driver sends them (``ray.shutdown``),
    and :func:`lmtune.sweep.session.ray_session` can end the whole group when the driver dies.
    Why private: ``ray._private.services.ConsolePopen`` is what ``start_ray_process`` spawns with, and no
    ``ray.init`` option sets the group. Public API to move to: none in Ray 2.60 (no Ray issue tracks it).
    """
    if sys.platform == "win32":
        return
    from ray._private import services

    if getattr(services.ConsolePopen, "_lmtune_grouped", False):
        return
    original = services.ConsolePopen

    class GroupedPopen(original):  # type: ignore[misc, valid-type]
        _lmtune_grouped = True

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            # The first process leads a new group; the rest join it (same session, so setpgid is allowed).
            group = _RAY_GROUP[0]
            kwargs["process_group"] = 0 if group is None or not _group_alive(group) else group
            super().__init__(*args, **kwargs)
            if kwargs["process_group"] == 0:
                _RAY_GROUP[0] = self.pid

    services.ConsolePopen = GroupedPopen  # type: ignore[misc]


def stop_printing_worker_output() -> None:
    """Stop echoing Ray workers' stdout/stderr in this driver (their log files under Ray's session folder
    keep everything).

    Why: once a sweep has ended, ``ray.shutdown`` SIGTERMs the idle trial workers, and Ray 2.60's worker
    SIGTERM handler raises SystemExit wherever the worker is; when that is inside a weakref callback of
    interpreter shutdown, the worker prints "Exception ignored ... Traceback ... SystemExit: 1", which the
    driver echoes after the sweep's own last line (seen about one sweep in two on 2 CPUs). Why private: the
    echo is the ``ray_print_logs`` handler ``ray.init(log_to_driver=True)`` adds to
    ``ray._private.worker.global_worker_stdstream_dispatcher``, and only ``ray.shutdown`` removes it, after
    the workers are gone. Public API to move to: none in Ray 2.60 (``log_to_driver`` is fixed at ``init``).
    """
    from ray._private import worker

    worker.global_worker_stdstream_dispatcher.remove_handler("ray_print_logs")


def ray_process_group() -> int | None:
    """The process group of the local Ray instance's processes (None before any started, or on Windows)."""
    return _RAY_GROUP[0]


_RAY_GROUP: list[int | None] = [None]


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):  # gone, or a reused id now owned by someone else
        return False


def auto_cluster_address() -> str | None:
    """The HOST:PORT ``ray.init(address="auto")`` would join (RAY_ADDRESS, else the cluster `ray start` left on
    this machine), or None when there is none, so that the driver refuses --address auto in one line before Ray
    starts instead of Ray's ConnectionError traceback.

    Why private: no public Ray API finds the running cluster without connecting to it (ray-project/ray#28008
    asks for one, open; ray#63771 proposed ``ray.is_cluster_running``, closed unmerged). Public API to move to:
    that one, once there is one.
    """
    from ray._private.services import get_ray_address_from_environment

    try:
        return get_ray_address_from_environment("auto", None)
    except ConnectionError:
        return None


# ---------------------------------------------------------------------------------------------
# Ray Tune: ASHA's rung records, saved as JSON


class RungRecord(TypedDict):
    """One rung of an ASHA bracket, as the sweep's ASHA state file holds it."""

    milestone: float
    """The rung's budget (its time attribute's value)."""
    recorded: dict[str, float]
    """Each trial's metric at the milestone, by trial id."""


class AshaRungs(TypedDict):
    """The rung records of an ASHA scheduler, as JSON."""

    num_stopped: int
    """Trials the scheduler has stopped."""
    brackets: list[list[RungRecord]]
    """Each bracket's rungs."""


def asha_rungs(scheduler: Any) -> AshaRungs:
    """The rung records of a Tune ``AsyncHyperBandScheduler`` as plain JSON data.

    Why private: ``Tuner.restore`` does not restore scheduler state (ray#30838, open in Ray 2.60), and
    the scheduler's own ``save``/``restore`` pickle the whole object, while lmtune never unpickles
    what it reads (SECURITY.md). The records live in ``_brackets[i]._rungs`` as (milestone, {trial_id:
    value}) pairs, with the stop count in ``_num_stopped``. Public API to move to: scheduler state
    restored by ``Tuner.restore`` itself, when ray#30838 is fixed.
    """
    return {
        "num_stopped": scheduler._num_stopped,
        "brackets": [[{"milestone": milestone, "recorded": dict(recorded)} for milestone, recorded in bracket._rungs]
                     for bracket in scheduler._brackets],
    }


def restore_asha_rungs(scheduler: Any, saved: AshaRungs) -> None:
    """Load :func:`asha_rungs` output back into ``scheduler`` (rungs matched by milestone)."""
    for bracket, rungs in zip(scheduler._brackets, saved["brackets"], strict=False):
        for (milestone, recorded), rung in zip(bracket._rungs, rungs, strict=False):
            if math.isclose(milestone, rung["milestone"]):
                recorded.update(rung["recorded"])
    scheduler._num_stopped = saved.get("num_stopped", 0)


def asha_stopped_count(scheduler: Any) -> int:
    return scheduler._num_stopped


# ---------------------------------------------------------------------------------------------
# torch: the attention kernel SDPA picks, and Inductor's cache switches


def sdpa_backend_name(q: Any, k: Any, v: Any) -> str:
    """The backend ``F.scaled_dot_product_attention(q, k, v, is_causal=True)`` dispatches to: flash,
    efficient, cudnn or math (the unfused fallback that materialises the T x T scores).

    Why private: torch (2.4 - 2.13) offers no public way to ask which kernel SDPA will pick;
    ``torch._fused_sdp_choice`` is the dispatcher SDPA itself consults. Public API to move to: none yet;
    ``torch.nn.attention.sdpa_kernel`` can force a backend but not report one.
    """
    import torch
    from torch.nn.attention import SDPBackend

    choice = torch._fused_sdp_choice(q, k, v, is_causal=True)
    backend = SDPBackend(choice) if isinstance(choice, int) else choice
    return backend.name.lower()


def switch_on_inductor_caches() -> None:
    """Turn on Inductor's FX-graph and AOTAutograd caches in a process that already imported them.

    Why private: the switches are read from TORCHINDUCTOR_FX_GRAPH_CACHE / TORCHINDUCTOR_AUTOGRAD_CACHE
    when ``torch._inductor.config`` / ``torch._functorch.config`` are first imported (torch 2.4 - 2.13);
    a Ray worker may have imported them before the trial sets the environment. Public API to move to:
    none yet (the environment variables, set before torch is imported, are the public switch).
    """
    for module, name in (("torch._inductor.config", "fx_graph_cache"),
                         ("torch._functorch.config", "enable_autograd_cache")):
        config = sys.modules.get(module)
        if config is not None and hasattr(config, name):
            setattr(config, name, True)


# ---------------------------------------------------------------------------------------------
# Ray Tune + Weights & Biases: a trial's W&B data on disk before Ray kills its logger


def wandb_logger_callback(**kwargs: Any):
    """Ray Tune's ``WandbLoggerCallback(**kwargs)``, with each trial's W&B run written out before Ray
    kills the actor that logged it.

    Why private: Ray 2.60's WandbLoggerCallback ``ray.kill``s a trial's logging actor as soon as its
    ``run()`` returns from ``wandb.finish()``, and wandb 0.31's ``finish`` returns before its
    wandb-core process has written the run's log: a trial that ends next to another lost its whole
    offline run (seen on 2 CPU cores). Ray's ``_logger_actor_cls`` class hook and its
    ``_WandbLoggingActor`` are private; the subclass adds ``wandb.teardown()``, which waits for
    wandb-core to finish. Public API to move to: the plain WandbLoggerCallback, once it tears wandb
    down before killing its actors.
    """
    from ray.air.integrations.wandb import WandbLoggerCallback, _WandbLoggingActor

    class FlushingWandbLoggingActor(_WandbLoggingActor):
        def run(self) -> None:
            super().run()
            self._wandb.teardown()

    class FlushingWandbLoggerCallback(WandbLoggerCallback):
        _logger_actor_cls = FlushingWandbLoggingActor

    return FlushingWandbLoggerCallback(**kwargs)


# ---------------------------------------------------------------------------------------------
# Ray Tune: where the driver saves the experiment state before copying it into the experiment folder


def experiment_staging_dir(trials: list[Any]) -> Path | None:
    """The driver's folder Tune saves its experiment state into (``save_to_dir``) before its syncer copies it into
    the experiment folder, named by any of the experiment's ``trials`` (None: no trial yet).

    Why private: ``Trial.storage`` is Ray Train's internal StorageContext; no public API names the folder. lmtune
    copies each save from there while it is complete and consistent (lmtune.sweep.ray_state): the experiment
    folder's copy is made file by file in the background, neither atomic nor at one moment. No Ray issue asks for
    an atomic experiment snapshot yet. Public API to move to: none exists; Tune writing its snapshot atomically would
    make the copy unneeded.
    """
    for trial in trials:
        storage = getattr(trial, "storage", None)
        if storage is not None:
            return Path(storage.experiment_driver_staging_path)
    return None
