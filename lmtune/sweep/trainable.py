"""The Ray Tune trainable: one trial = one run of lmtune's training loop (``train_trial``).

The run's rows go to Tune through ``TuneSink`` at every log interval, with ``tokens`` (restored from
checkpoints, so monotonic across restarts) as the schedulers' time attribute and a tune.Checkpoint at
every checkpoint interval; a restarted trial (retry or --resume) continues from its newest checkpoint.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import os
import posixpath
import shutil
import tempfile
import time
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.fs as pafs
import torch
from ray import tune

from lmtune.analysis.rungs import Rungs
from lmtune.data.dataset import read_meta
from lmtune.errors import LmtuneError
from lmtune.files import atomic_write_bytes, atomic_write_json, atomic_write_text, link_or_copy
from lmtune.private_apis import experiment_storage, trial_storage_dir
from lmtune.searches.trial_order import TrialOrder, TuneParams
from lmtune.sweep.fused_trial import train_group_trial
from lmtune.sweep.hooks import StepHookError, start_step_hook
from lmtune.sweep.plan import TrialSetup
from lmtune.sweep.record import STAGING_DIR, TRIAL_FILE, TrialFolder, is_sweep_dir, trial_folders, write_trial_file
from lmtune.sweep.reporting import TuneSink, restore_tune_checkpoint
from lmtune.training.checkpoint import (
    STABLE_NAME,
    checkpoint_step,
    checksum_path,
    load_checkpoint,
    load_newest,
    periodic_checkpoints,
    periodic_path,
)
from lmtune.training.compile import enable_shared_compile_cache
from lmtune.training.config import RunConfig
from lmtune.training.fork import check_forkable
from lmtune.training.loop import train
from lmtune.training.lr_range import RangeTestConfig, lr_range_test
from lmtune.training.metrics import METRICS_FILE, Row, read_metrics, write_metrics
from lmtune.usercode.spec import spec_for

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


def limit_to_assigned_resources(resources: dict[str, float], cuda: types.ModuleType = torch.cuda) -> str | None:
    """Use the CPUs and the GPU share Ray assigned. Ray sets CUDA_VISIBLE_DEVICES for a trial given GPUs,
    but Ray 2.60 leaves it alone for one given none (ray-project/ray#54868): such a trial would see every GPU of
    its node, and torch's device "auto" would train on one with no memory cap. It is hidden here, before
    anything initialises CUDA. A trial given a GPU share where torch sees no CUDA device (a CPU build of torch,
    a missing driver) trains on the CPU rather than fail, and says so: the line returned goes to its log and its
    summary.json. (``cuda``: a stand-in in the tests.)"""
    cpus = resources.get("CPU", 1)
    torch.set_num_threads(max(1, int(cpus)))
    gpu = resources.get("GPU", 0)
    if gpu <= 0:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    elif not cuda.is_available():
        note = (f"given {gpu:g} GPU by Ray, but torch {torch.__version__} on this node sees no CUDA device "
                f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')!r}): training on the CPU")
        log.warning("%s", note)
        return note
    elif gpu < 1:
        # A fractional trial must not grow into its neighbours' memory on the same GPU.
        cuda.set_per_process_memory_fraction(gpu, 0)
    return None


def trial_output_dir() -> Path:
    """Where the run's files go: straight into the trial's folder under the experiment when storage
    is a filesystem path (local or shared across nodes), so nothing depends on a later sync; with
    s3:// or gs:// storage, the trial's working directory, which Ray syncs as artifacts."""
    try:
        return trial_storage_dir()[0]
    except Exception as err:  # noqa: BLE001 - private Ray API: fall back to the public trial dir
        fallback = Path(tune.get_context().get_trial_dir())
        log.warning("could not locate the trial's storage folder (%s); writing to %s", err, fallback)
        return fallback


def compile_cache_dir(out_dir: Path) -> Path:
    """One Inductor cache for all trials: the experiment folder's ``compile_cache/`` when the trial
    writes into it (local or shared storage), so later trials reuse the first one's compiled graphs
    and autotuning; else a node-local cache."""
    if is_sweep_dir(out_dir.parent):
        return out_dir.parent / "compile_cache"
    return Path(os.environ.get("LMTUNE_COMPILE_CACHE", Path.home() / ".cache" / "lmtune" / "inductor"))


def train_trial(params: TuneParams, setup: TrialSetup, shipped: ShippedData | None = None,
                ended: frozenset[str] = frozenset(), step_hook: str | None = None) -> None:
    """Ray Tune function trainable. ``params``: the trial's order as Tune carries it, read here once as a
    TrialOrder (lmtune.searches.trial_order); ``setup`` what the sweep's trials share. ``ended``: ids of trials the
    ledger says already ended (set on --resume): Tune's experiment snapshot can predate that decision and resume
    them, and they return at once instead of training again. A fused order trains its members as one group
    (lmtune.sweep.fused_trial); a range-test order runs the LR range test; an order with a source (continued or
    forked) starts from that trial's checkpoint; one without early stopping runs without the stopper's
    divergence rule. ``step_hook``: MODULE:FUNCTION, run in a single-model trial's process (lmtune.sweep.hooks)."""
    # Ray Train logs every checkpoint at INFO; with a checkpoint every few steps that floods the
    # driver's output (workers' logs are forwarded to it), while lmtune's own table says what matters.
    logging.getLogger("ray.train").setLevel(logging.WARNING)
    context = tune.get_context()
    trial_id = context.get_trial_id()
    setup.import_user_code()
    order = TrialOrder.from_tune(params)
    if trial_id in ended:
        log.info("trial %s ended before the driver restart (trial_outcomes.json); not run again", trial_id)
        return
    out_dir = trial_output_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    restore_trial_folder(out_dir)
    gpu_note = limit_to_assigned_resources(context.get_trial_resources().required_resources)
    if gpu_note:
        with open(out_dir / "training.log", "a") as handle:  # the run's own log (train appends to it)
            handle.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} WARNING {gpu_note}\n")
    enable_shared_compile_cache(compile_cache_dir(out_dir))
    torch.compiler.reset()  # a reused worker: the last trial's compiled graphs guard on its own model
    base = copy.deepcopy(setup.base)  # (a reused worker keeps the setup: each trial gets its own copy)
    base.data_dir = str(trial_data_dir(base.data_dir, shipped))
    if order.members is not None:
        asha = setup.asha  # (a fused group cuts its members at the rungs Tune's ASHA cuts trials at)
        rungs = Rungs.of(asha.grace_period, asha.reduction_factor, asha.max_t) if asha else None
        train_group_trial(order, params, base, trial_id, out_dir, rungs, setup)
        return
    write_trial_file(out_dir, trial_id, params)  # (the record keeps the order as Tune handed it)
    config = order.run_config(base, f"trial {trial_id}", checked=setup.space_checked)
    if order.is_range_test and setup.range_test is not None:
        run_range_test(config, setup.range_test, out_dir)
        return
    staging = staging_dir(out_dir)
    restore_tune_checkpoint(staging)
    if order.source:
        step = continue_run(out_dir.parent, order.source, out_dir, staging,
                            fork=config if order.fork_from else None)
        if step:
            write_trial_file(out_dir, trial_id, params, continued_from_tokens=step * config.tokens_per_step)
    sink = TuneSink(config, early_stop=order.early_stop)
    try:
        before_step = start_step_hook(step_hook, config, out_dir) if step_hook else None
    except StepHookError as err:  # (it fails the same way on every attempt: said once, not retried)
        atomic_write_text(out_dir / "config.json", config.to_json())
        sink.refuse(str(err))
        return
    result = train(config, out_dir, resume=True, sinks=[sink], before_step=before_step, divergence=setup.divergence,
                   periodic_dir=staging, spec=spec_for(config), figures=setup.trial_figures)
    if gpu_note:  # (the loop's own log line went to training.log; the summary says it too)
        atomic_write_json(out_dir / "summary.json", {**result.summary, "gpu_share_unused": gpu_note})
    with contextlib.suppress(OSError):  # every checkpoint was handed to Tune: the empty staging folders go
        staging.rmdir()
        staging.parent.rmdir()


def staging_dir(out_dir: Path) -> Path:
    """Where a trial writes a periodic checkpoint before handing it to Tune (lmtune.sweep.reporting): the
    sweep's ``.staging/<trial folder>``, on the results' own disk and outside every trial folder, so that no
    sync of the trial's folder uploads it a second time. The sweep's end removes it."""
    return out_dir.parent / STAGING_DIR / out_dir.name


def continue_run(sweep_dir: Path, source_id: str, out_dir: Path, periodic_dir: Path,
                 fork: RunConfig | None = None) -> int | None:
    """Start ``out_dir``'s run where trial ``source_id`` stopped: from its newest verified checkpoint (a run ASHA
    cut), or with ``fork`` (this run's config, a WSD run of another budget) from its stable.pt, where its stable
    phase ended; the checkpoint is linked into ``periodic_dir`` (where the run resumes from) and its metrics.csv
    rows up to there are copied (never moved: the source keeps its files). Returns the step it continues from
    (None: nothing taken, it trains from the start). A run that already has checkpoints of its own (a retry, a
    resume) is left to continue from those."""
    if periodic_checkpoints(periodic_dir):
        return None
    source = fetch_source(source_id, periodic_dir.parent / f".source-{source_id}") if experiment_storage() else \
        next((f for f in trial_folders(sweep_dir) if f.trial_id == source_id), None)
    found = source_checkpoint(source, fork) if source is not None else None
    if found is None:
        log.warning("trial %s has no usable checkpoint to continue from; training from the start", source_id)
        return None
    step, checkpoint = found
    link_or_copy(checkpoint, periodic_path(periodic_dir, step))
    link_or_copy(checksum_path(checkpoint), checksum_path(periodic_path(periodic_dir, step)))
    rows = [row for row in read_metrics(source.path / METRICS_FILE) if row["step"] <= step]
    write_metrics(out_dir / METRICS_FILE, rows)
    log.info("continuing trial %s's run from its step-%d checkpoint%s", source_id, step, " (a fork)" if fork else "")
    return step


def restore_trial_folder(out_dir: Path) -> None:
    """A trial restored on a node without its folder (its first node is gone; the sweep is in object storage):
    the folder's files (metrics.csv, training.log, best.pt, ...) fetched from storage first, so the run continues
    them instead of starting new ones that would replace the stored ones at the next sync."""
    found = experiment_storage()
    if found is None or (out_dir / METRICS_FILE).exists():
        return
    fs, experiment = found
    remote = posixpath.join(experiment, out_dir.name)
    for info in fs.get_file_info(pafs.FileSelector(remote, recursive=True, allow_not_found=True)):
        relative = posixpath.relpath(info.path, remote)
        if info.type != pafs.FileType.File or relative.startswith("checkpoint_"):
            continue
        with fs.open_input_stream(info.path) as stream:
            atomic_write_bytes(out_dir / relative, stream.read())
    log.info("restored trial folder %s from %s", out_dir.name, remote)


def fetch_source(source_id: str, into: Path) -> TrialFolder | None:
    """Trial ``source_id``'s folder from the sweep's object storage, as much of it as a continuation needs: its
    trial.json, metrics.csv, stable.pt and newest checkpoint (None: no such trial there)."""
    fs, experiment = experiment_storage()
    folders = [i for i in fs.get_file_info(pafs.FileSelector(experiment)) if i.type == pafs.FileType.Directory
               and f"_{source_id}_" in f"_{i.base_name}_"]  # (lmtune names it ID_params; a Tuner, train_trial_ID_...)
    if not folders:
        return None
    remote = folders[0].path
    tune_dirs = sorted(i.path for i in fs.get_file_info(pafs.FileSelector(remote))
                       if i.type == pafs.FileType.Directory and i.base_name.startswith("checkpoint_"))
    wanted = [f"{remote}/{name}" for name in (TRIAL_FILE, METRICS_FILE, f"checkpoints/{STABLE_NAME}",
                                              f"checkpoints/{STABLE_NAME}.sha256")]
    if tune_dirs:
        wanted += [i.path for i in fs.get_file_info(pafs.FileSelector(tune_dirs[-1])) if i.type == pafs.FileType.File]
    for path in wanted:
        if fs.get_file_info(path).type == pafs.FileType.File:
            with fs.open_input_stream(path) as stream:
                atomic_write_bytes(into / posixpath.relpath(path, remote), stream.read())
    return TrialFolder(into, source_id, {})


def source_checkpoint(source: TrialFolder, fork: RunConfig | None) -> tuple[int, Path] | None:
    """(step, file) of the checkpoint to continue from: the newest periodic one (Tune's), or for a fork stable.pt
    when this run trained from it is the same run as from scratch (lmtune.training.fork.check_forkable)."""
    if fork is None:
        newest = load_newest(source.periodic_checkpoints())
        return (checkpoint_step(newest[1]), newest[1]) if newest else None
    path = source.path / "checkpoints" / STABLE_NAME
    try:
        saved = load_checkpoint(path)
        check_forkable(RunConfig.from_dict(saved["config"]), fork, int(saved["step"]), path, spec_for(fork))
    except (OSError, ValueError, KeyError, LmtuneError) as err:
        log.warning("not forking from %s (%s)", path, err)
        return None
    return int(saved["step"]), path


def run_range_test(config: RunConfig, settings: RangeTestConfig, out_dir: Path) -> None:
    """The edge search's LR range test as a trial: its rows reported to Tune (marked ``range_test``,
    which the stopper and ASHA leave alone), the last one with what it found."""
    # (val_loss: a fresh model's, ln vocab: it evaluates nothing, and Tune expects the metric in every result)
    unevaluated = {"val_loss": math.log(config.model.vocab_size), "val_step": 0, "range_test": True}

    def report(row: Row) -> None:
        tune.report({**row, **unevaluated})

    atomic_write_text(out_dir / "config.json", config.to_json())
    found = lr_range_test(config, settings, out_dir, report=report, spec=spec_for(config))
    tune.report({**unevaluated, "tokens": found.tokens, "steepest_lr": found.steepest_lr,
                 "min_loss_lr": found.min_loss_lr, "blowup_lr": found.blowup_lr,
                 "range_summary": f"LR range test: {found.summary_line()}"})

