"""Where a sweep's trials run: the CPUs and GPU share of each, how many trials share one GPU (from their
memory, and from ``python -m lmtune.bench --concurrency`` measurements when given).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from lmtune.errors import LmtuneError
from lmtune.training.config import RunConfig
from lmtune.training.memory import CUDA_CONTEXT_BYTES, MEMORY_HEADROOM, run_memory_bytes
from lmtune.usercode.spec import spec_for

log = logging.getLogger(__name__)

# (CUDA_CONTEXT_BYTES and MEMORY_HEADROOM: lmtune.training.memory, where the largest batch that fits uses them too)
# A higher K must beat the best smaller K by this much to be worth its slower individual trials.
PACKING_MIN_GAIN = 0.05
# Without measurements, pack at most this many trials per GPU (time-slicing gains flatten out).
UNMEASURED_MAX_TRIALS = 4
# A GPU of this size is assumed when the driver sees none (a cluster of GPU workers and a CPU head).
ASSUMED_GPU_BYTES = 80 * 2**30


def trial_memory_bytes(config: RunConfig, members: int = 1) -> int:
    """Device memory of one trial of ``config`` (bf16 activations): a fused trial holds ``members`` models,
    their optimizer states and their activations."""
    return run_memory_bytes(config, amp=True, members=members, spec=spec_for(config))


def trial_resources(base: RunConfig, cpus_per_trial: float, gpus_per_trial: float | None,
                    cluster_gpus: float, gpu_memory_bytes: int | None, members: int = 1) -> dict[str, float]:
    """CPUs and GPU share per trial: as asked, else (on a cluster with GPUs) 1 / the packing rule's K for
    a trial of ``base`` (the space's largest: ``SweepPlan.largest_trial``) training ``members`` fused models.
    A trial
    that does not fit one whole GPU is refused, in one line."""
    if gpus_per_trial is None:
        gpus_per_trial = 0.0
        if cluster_gpus > 0:
            need = trial_memory_bytes(base, members)
            gpu_bytes = gpu_memory_bytes or ASSUMED_GPU_BYTES
            if need + CUDA_CONTEXT_BYTES > (1 - MEMORY_HEADROOM) * gpu_bytes:
                models = f"{members} fused model{'s' * (members > 1)}"
                raise LmtuneError(
                    f"one trial needs about {need / 2**30:.1f} GiB ({models} at batch {base.train.batch_size}), more "
                    f"than the {gpu_bytes / 2**30:.0f} GiB GPU holds; lower --fuse, or split each batch with --set "
                    "grad_accum_steps=N")
            gpus_per_trial = 1.0 / recommend_trials_per_gpu(need, gpu_bytes)
    return {"cpu": cpus_per_trial, "gpu": gpus_per_trial}


def max_concurrent_trials(asked: int | None, cluster_cpus: float, cpus_per_trial: float,
                          cluster_gpus: float = 0.0, gpus_per_trial: float = 0.0) -> int:
    """As asked, else as many as the cluster's CPUs hold, and (trials given GPU shares) its GPUs."""
    if asked:
        return asked
    fit = int(cluster_cpus // cpus_per_trial)
    if gpus_per_trial > 0:
        fit = min(fit, int(round(cluster_gpus / gpus_per_trial, 6)))
    return max(1, fit)


@dataclass(frozen=True)
class ClusterCapacity:
    """What an autoscaling cluster holds at full scale: its head's resources and every worker type's times its
    max_workers (capped by the cluster's max_workers), from the autoscaler's cluster config (``ray up``'s
    ~/ray_bootstrap_config.yaml on the head, or the file the autoscaler was started with)."""

    cpus: float
    gpus: float
    workers: int

    @classmethod
    def from_config(cls, config: dict, path: str) -> ClusterCapacity:
        types = config.get("available_node_types")
        head = config.get("head_node_type")
        if not isinstance(types, dict) or head not in types:
            raise LmtuneError(f"--cluster-config {path}: no available_node_types with its head_node_type; give the "
                              "autoscaler's cluster config (the one `ray up` or `ray start --autoscaling-config` read)")
        cpus = float((types[head].get("resources") or {}).get("CPU", 0))
        gpus, workers = 0.0, 0
        budget = _count(config.get("max_workers", 10**6), "max_workers", path)
        for name, spec in sorted(types.items(), key=lambda item: -float((item[1].get("resources") or {})
                                                                         .get("GPU", 0))):
            if name == head:
                continue
            count = min(_count(spec.get("max_workers", 0), f"available_node_types.{name}.max_workers", path),
                        budget - workers)
            resources = spec.get("resources") or {}
            cpus += count * float(resources.get("CPU", 0))
            gpus += count * float(resources.get("GPU", 0))
            workers += count
        return cls(cpus, gpus, workers)


def _count(value: object, key: str, path: str) -> int:
    """A cluster config's count of workers: a whole number >= 0, else one line."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise LmtuneError(f"--cluster-config {path}: {key} is {value!r}; give a whole number of workers >= 0")
    return value


@dataclass(frozen=True)
class Placement:
    """Where a sweep's trials run: each trial's resources, and how many run at once."""

    cpu: float
    gpu: float
    """The GPU share of one trial (0: none; 0.25: four trials share a GPU)."""
    max_concurrent: int
    why: str = ""
    """Where the capacity came from, when not from the nodes up now (e.g. "; the cluster scales to ...")."""

    @property
    def resources(self) -> dict[str, float]:
        return {"cpu": self.cpu, "gpu": self.gpu}


def place_trials(largest: RunConfig, members: int, cpus_per_trial: float, gpus_per_trial: float | None,
                 max_concurrent: int | None, cluster_cpus: float, cluster_gpus: float,
                 gpu_memory_bytes: int | None, why: str = "") -> Placement:
    """The placement of trials as large as ``largest`` (``members`` fused models each) on a cluster of
    ``cluster_cpus`` CPUs and ``cluster_gpus`` GPUs of ``gpu_memory_bytes`` each (None: unknown here)."""
    resources = trial_resources(largest, cpus_per_trial, gpus_per_trial, cluster_gpus, gpu_memory_bytes, members)
    return Placement(resources["cpu"], resources["gpu"],
                     max_concurrent_trials(max_concurrent, cluster_cpus, resources["cpu"], cluster_gpus,
                                           resources["gpu"]), why)


def recommend_trials_per_gpu(memory_per_trial_bytes: int, gpu_memory_bytes: int,
                             measured: dict[int, float] | None = None) -> int:
    """Trials to run at once on one GPU.

    Memory bound: K trials fit when K * (trial memory + CUDA context) <= 90% of the GPU. With
    ``measured`` (K -> aggregate tokens/s from ``python -m lmtune.bench --concurrency``), take the K
    that fits with the highest aggregate, except that a larger K must beat the best smaller one by 5%:
    more trials at once make each trial slower, which delays ASHA's early decisions for little gain.
    Without measurements, the memory bound capped at 4.
    """
    per_trial = memory_per_trial_bytes + CUDA_CONTEXT_BYTES
    fits = max(1, int((1 - MEMORY_HEADROOM) * gpu_memory_bytes // per_trial))
    if not measured:
        return min(fits, UNMEASURED_MAX_TRIALS)
    candidates = sorted(k for k in measured if 1 <= k <= fits)
    if not candidates:
        return 1
    choice = candidates[0]
    for k in candidates[1:]:
        if measured[k] > (1 + PACKING_MIN_GAIN) * measured[choice]:
            choice = k
    return choice
