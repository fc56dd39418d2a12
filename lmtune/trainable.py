"""The Ray Tune trainable: one trial = one run of lmtune's training loop.

It reports to Tune at every log interval with ``tokens`` (restored from checkpoints, so monotonic
across restarts) as the schedulers' time attribute, attaches a tune.Checkpoint at every checkpoint
interval, and resumes from the newest checkpoint when Tune restarts it (retry or Tuner.restore).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lmtune import checkpoint as ckpt
from lmtune.compile_cache import enable_shared_compile_cache
from lmtune.config import RunConfig, apply_overrides
from lmtune.sweep_files import is_sweep_dir

log = logging.getLogger(__name__)

DATA_FILES = ("train.bin", "val.bin", "meta.json", "tokenizer.json")


@dataclass
class ShippedData:
    """A prepared data dir's files, put in Ray's object store once by the driver so that trials on
    nodes without the data (or without a shared filesystem) can still run."""

    content_hash: str
    files: dict[str, np.ndarray]  # file name -> raw bytes as uint8 (zero-copy from the object store)

    @classmethod
    def from_dir(cls, data_dir: Path) -> ShippedData:
        from lmtune.data import read_meta

        files = {name: np.fromfile(data_dir / name, dtype=np.uint8) for name in DATA_FILES
                 if (data_dir / name).exists()}
        return cls(read_meta(data_dir).content_hash, files)

    def materialize(self, cache_root: Path) -> Path:
        """Write the files once per node under cache_root/HASH (atomic: temp dir + rename)."""
        target = cache_root / self.content_hash
        if (target / "meta.json").exists():
            return target
        cache_root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=cache_root))
        for name, data in self.files.items():
            data.tofile(staging / name)
        try:
            os.rename(staging, target)
        except OSError:  # another trial on this node won the race; its copy is identical
            shutil.rmtree(staging, ignore_errors=True)
        return target


def trial_data_dir(data_dir: str, shipped: ShippedData | None) -> Path:
    """The prepared data on this node: the driver's path when present with the same content,
    else the shipped copy written to a node-local cache."""
    from lmtune.data import read_meta

    local = Path(data_dir)
    if shipped is None:
        return local
    try:
        if (local / "meta.json").exists() and read_meta(local).content_hash == shipped.content_hash:
            return local
    except Exception:  # noqa: BLE001 - an unreadable local copy is replaced by the shipped one
        pass
    cache = Path(os.environ.get("LMTUNE_DATA_CACHE", Path.home() / ".cache" / "lmtune" / "data"))
    path = shipped.materialize(cache)
    log.info("data %s not on this node; using the copy shipped through Ray's object store at %s", local, path)
    return path


def limit_to_assigned_resources(resources: dict[str, float]) -> None:
    """Use the CPUs and the GPU share Ray assigned (Ray sets CUDA_VISIBLE_DEVICES itself)."""
    import torch

    cpus = resources.get("CPU", 1)
    torch.set_num_threads(max(1, int(cpus)))
    gpu = resources.get("GPU", 0)
    if 0 < gpu < 1 and torch.cuda.is_available():
        # A fractional trial must not grow into its neighbours' memory on the same GPU.
        torch.cuda.set_per_process_memory_fraction(gpu, 0)


def trial_output_dir(context) -> Path:
    """Where the run's files go: straight into the trial's folder under the experiment when storage
    is a filesystem path (local or shared across nodes), so nothing depends on a later sync; with
    s3:// or gs:// storage, the trial's working directory, which Ray syncs as artifacts."""
    try:
        import pyarrow.fs
        from ray.train._internal.session import get_storage

        storage = get_storage()
        if isinstance(storage.storage_filesystem, pyarrow.fs.LocalFileSystem):
            return Path(storage.trial_fs_path)
        return Path(storage.trial_working_directory)
    except Exception as err:  # noqa: BLE001 - private Ray API: fall back to the public trial dir
        log.warning("could not locate the trial's storage folder (%s); writing to %s", err, context.get_trial_dir())
        return Path(context.get_trial_dir())


def compile_cache_dir(out_dir: Path) -> Path:
    """One Inductor cache for all trials: the experiment folder's ``compile_cache/`` when the trial
    writes into it (local or shared storage), so later trials reuse the first one's compiled graphs
    and autotuning; else a node-local cache."""
    if is_sweep_dir(out_dir.parent):
        return out_dir.parent / "compile_cache"
    return Path(os.environ.get("LMTUNE_COMPILE_CACHE", Path.home() / ".cache" / "lmtune" / "inductor"))


def train_trial(params: dict[str, Any], base: dict[str, Any], shipped: ShippedData | None = None,
                ended: frozenset[str] = frozenset()) -> None:
    """Ray Tune function trainable. ``params`` are the trial's sampled values (lr, ...); ``base`` is
    the sweep's RunConfig as a dict (budget + --set + the space's fixed settings). ``ended``: ids of
    trials the ledger says already ended (set on --resume): Tune's experiment snapshot can predate
    that decision and resume them, and they return at once instead of training again."""
    import ray
    from ray import tune

    from lmtune.train import train

    context = tune.get_context()
    if context.get_trial_id() in ended:
        log.info("trial %s ended before the driver restart (trial_outcomes.json); not run again",
                 context.get_trial_id())
        return
    out_dir = trial_output_dir(context)
    out_dir.mkdir(parents=True, exist_ok=True)
    resources = context.get_trial_resources().required_resources
    limit_to_assigned_resources(resources)
    enable_shared_compile_cache(compile_cache_dir(out_dir))

    config = RunConfig.from_dict(base)
    config = apply_overrides(config, params, where=f"trial {context.get_trial_id()}")
    config.data_dir = str(trial_data_dir(config.data_dir, shipped))
    if os.environ.get("LMTUNE_FAULT_RAISE_AT_STEP"):  # fault-injection for the failure tests
        only_lr = os.environ.get("LMTUNE_FAULT_LR")
        if not only_lr or math.isclose(config.train.lr, float(only_lr), rel_tol=1e-9):
            _install_fault(int(os.environ["LMTUNE_FAULT_RAISE_AT_STEP"]), out_dir,
                           message=os.environ.get("LMTUNE_FAULT_MESSAGE"),
                           always=os.environ.get("LMTUNE_FAULT_ALWAYS") == "1")
        else:
            _FAULT_HOOK.pop("hook", None)

    restored = tune.get_checkpoint()
    if restored is not None:
        with restored.as_directory() as directory:
            for path in Path(directory).glob("step_*.pt*"):
                target = out_dir / "checkpoints" / path.name
                if not target.exists():
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, target)

    node_id = ray.get_runtime_context().get_node_id()
    uniform_loss = math.log(config.model.vocab_size)  # what a diverged trial is worth to the searcher
    latest_val = {"value": uniform_loss}

    def report(row: dict[str, Any], written: Path | None) -> None:
        metrics = {k: v for k, v in row.items() if v is not None}
        if row.get("val_loss") is not None and math.isfinite(row["val_loss"]):
            latest_val["value"] = row["val_loss"]
        metrics["objective"] = uniform_loss if row.get("diverged") else latest_val["value"]
        metrics["total_tokens"] = config.total_tokens
        metrics["uniform_loss"] = uniform_loss
        metrics["in_warmup"] = row["step"] <= config.train.warmup_steps
        metrics["node_id"] = node_id  # which Ray node ran it (node_ip is shared by raylets on one host)
        if written is None:
            tune.report(metrics)
            return
        with tempfile.TemporaryDirectory(prefix="lmtune-ckpt-") as staging:
            for path in (written, ckpt.checksum_path(written)):
                try:
                    os.link(path, Path(staging) / path.name)  # no copy: Tune persists it from here
                except OSError:
                    shutil.copy2(path, Path(staging) / path.name)
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(staging))

    train(config, out_dir, resume=True, reporter=report, before_step=_FAULT_HOOK.get("hook"))


_FAULT_HOOK: dict[str, Any] = {}


def _install_fault(step: int, out_dir: Path, message: str | None = None, always: bool = False) -> None:
    """Raise at ``step`` once per trial (or on every attempt with ``always``), to test retries from
    checkpoints and error reporting. Env: LMTUNE_FAULT_RAISE_AT_STEP=N, LMTUNE_FAULT_MESSAGE (the
    exception text, e.g. a CUDA out-of-memory message), LMTUNE_FAULT_ALWAYS=1, LMTUNE_FAULT_LR (only
    the trial with this lr). Each firing appends a line to the trial's ``.fault_injected``."""
    marker = out_dir / ".fault_injected"

    def hook(current: int, _model) -> None:
        if current == step and (always or not marker.exists()):
            with open(marker, "a") as handle:
                handle.write(f"{step}\n")
            raise RuntimeError(message or f"injected fault at step {step}")

    _FAULT_HOOK["hook"] = hook
