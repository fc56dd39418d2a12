"""The training loop: it learns, it resumes bit-exactly, it stops cleanly on divergence, and its CLI
writes every promised file and refuses bad input with one line."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import shutil
import subprocess

import matplotlib.image
import pytest
import torch
from conftest import (
    TINY,
    assert_refused,
    read_wandb_runs,
    run_lmtune,
    sigkill,
    snapshot,
    start_lmtune,
    user_model,
    wait_until,
)

from lmtune.data.batches import BatchSampler, fixed_val_batches
from lmtune.data.dataset import load_data, read_meta, unigram_entropy
from lmtune.errors import LmtuneError
from lmtune.train import main
from lmtune.training import checkpoint as ckpt
from lmtune.training.config import budget_config
from lmtune.training.loop import resolve_config, train
from lmtune.training.metrics import METRIC_COLUMNS, read_metrics
from lmtune.training.model import TransformerLM
from lmtune.training.schedule import lr_at
from lmtune.training.state import TrainState, build_optimizer
from lmtune.training.step import Runtime, evaluate, train_step
from lmtune.usercode.spec import spec_for

# Columns that measure time or memory, so they differ between otherwise identical runs.
TIMING_COLUMNS = {"tokens_per_s", "mfu", "data_wait_s", "compute_s", "peak_memory_bytes", "elapsed_s"}
PROBE_COLUMNS = ["attn_logit_max", "output_logit_max", "output_logz_mean"]
# The tiny run's settings as --set pairs, but for the intervals and steps each test sets.
TINY_SETS = [f"{k}={v}" for k, v in TINY.items()
             if k not in ("steps", "log_interval", "eval_interval", "checkpoint_interval")]


def _sets(*pairs: str) -> list[str]:
    return [arg for pair in pairs for arg in ("--set", pair)]


def _cli(*args: str) -> subprocess.CompletedProcess:
    proc = run_lmtune("train", *args, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _tensors(value, prefix: str = ""):
    """(name, tensor) for every tensor nested in a checkpoint's dicts and lists."""
    if isinstance(value, torch.Tensor):
        yield prefix, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _tensors(item, f"{prefix}/{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _tensors(item, f"{prefix}/{i}")


def _assert_same_state(a: dict, b: dict) -> None:
    ta, tb = dict(_tensors(a)), dict(_tensors(b))
    assert ta.keys() == tb.keys()
    assert ta, "no tensors compared"
    for name in ta:
        assert torch.equal(ta[name], tb[name]), f"{name} differs"


def _untimed(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING_COLUMNS} for r in rows]


@pytest.fixture(scope="module")
def uninterrupted_run(make_tiny_config, tmp_path_factory):
    """One tiny 30-step run to completion, shared by the tests that only read it."""
    out = tmp_path_factory.mktemp("uninterrupted")
    result = train(make_tiny_config(), out)
    assert result.status == "completed"
    return result


# ---------------------------------------------------------------------------------------------- learning


@pytest.mark.release  # (a test-size truth of the quick budget: the release tier)
@pytest.mark.slow
def test_quick_budget_takes_val_loss_from_uniform_to_far_below_unigram_entropy(builtin_data, tmp_path):
    # The real quick budget (model, batch, context, lr), cut to 60 steps with a 10-step warm-up to stay fast.
    config = budget_config("quick", {"steps": 60, "warmup_steps": 10, "eval_interval": 30, "log_interval": 30,
                                     "checkpoint_interval": 60, "device": "cpu"}, data_dir=str(builtin_data))
    meta = read_meta(builtin_data)
    data = load_data(builtin_data, config.model.context_length)
    entropy = unigram_entropy(data.train, meta.vocab_size)
    val_batches = fixed_val_batches(data.val, config.train.batch_size, config.model.context_length,
                                    config.train.eval_batches)
    initial = {}

    def measure_initial(step, model):
        if step == 1:
            initial["val_loss"] = evaluate(Runtime(torch.device("cpu"), model, None, compiled=False), val_batches)

    result = train(config, tmp_path / "run", before_step=measure_initial)

    assert result.status == "completed"
    assert abs(initial["val_loss"] - math.log(meta.vocab_size)) < 1.0
    final = result.summary["final_val_loss"]
    assert final < entropy - 2.0, f"final val loss {final:.3f} vs unigram entropy {entropy:.3f}"


def test_overfitting_one_batch_drives_loss_near_zero(tiny_config, builtin_data):
    config = resolve_config(budget_config("quick", {"lr": 1e-2, "weight_decay": 0.0}, data_dir=str(builtin_data)),
                            builtin_data)
    config.model = tiny_config.model
    config.model.vocab_size = read_meta(builtin_data).vocab_size
    torch.manual_seed(0)
    model = TransformerLM(config.model)
    state = TrainState(model, build_optimizer(model, config, torch.device("cpu")))
    runtime = Runtime(torch.device("cpu"), model, None, compiled=False)
    data = load_data(builtin_data, config.model.context_length)
    x, y = BatchSampler(data.train, 8, config.model.context_length, seed=0).batch(0)
    losses = []
    for _ in range(300):
        result = train_step(state, runtime, x, y, config.train.lr, config.train)
        losses.append(result.loss.item())
        if losses[-1] < 0.1:
            break
    assert losses[0] > 7.0
    assert losses[-1] < 0.1, f"loss still {losses[-1]:.3f} after {len(losses)} steps"


# ---------------------------------------------------------------------------------------------- resume


@pytest.mark.slow
def test_kill_and_resume_equals_an_uninterrupted_run_bit_exactly(uninterrupted_run, tiny_config, tmp_path):
    def crash_at_17(step, model):
        if step == 17:
            raise RuntimeError("simulated crash")

    handlers_before = list(logging.getLogger("lmtune").handlers)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(tiny_config, tmp_path, before_step=crash_at_17)
    assert logging.getLogger("lmtune").handlers == handlers_before  # the crashed run let go of training.log
    assert [p.name for p in ckpt.periodic_checkpoints(tmp_path / "checkpoints")] == ["step_00000010.pt"]

    resumed = train(tiny_config, tmp_path, resume=True)

    a_dir = uninterrupted_run.out_dir
    assert resumed.status == "completed"
    assert resumed.summary["final_val_loss"] == uninterrupted_run.summary["final_val_loss"]
    _assert_same_state(ckpt.load_checkpoint(a_dir / "checkpoints" / "step_00000030.pt")["model"],
                       ckpt.load_checkpoint(tmp_path / "checkpoints" / "step_00000030.pt")["model"])
    _assert_same_state(ckpt.load_checkpoint(a_dir / "checkpoints" / "step_00000030.pt")["optimizer"],
                       ckpt.load_checkpoint(tmp_path / "checkpoints" / "step_00000030.pt")["optimizer"])
    rows_a, rows_b = read_metrics(a_dir / "metrics.csv"), read_metrics(tmp_path / "metrics.csv")
    steps_b = [r["step"] for r in rows_b]
    assert len(steps_b) == len(set(steps_b))
    assert _untimed(rows_b) == _untimed(rows_a)


@pytest.mark.slow
def test_sigkilled_cli_run_resumes_to_the_same_result_as_an_uninterrupted_one(builtin_data, tmp_path):
    sets = _sets(*TINY_SETS, "steps=120", "log_interval=10", "eval_interval=40", "checkpoint_interval=10")
    common = ["--data", str(builtin_data), "--quiet", *sets]
    killed = tmp_path / "killed"
    proc = start_lmtune("train", "--out", str(killed), *common, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: list((killed / "checkpoints").glob("step_*.pt.sha256")), proc, 120, "first checkpoint")
        sigkill(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not (killed / "summary.json").exists()

    _cli("--out", str(killed), "--resume", *common)
    _cli("--out", str(tmp_path / "straight"), *common)

    resumed = json.loads((killed / "summary.json").read_text())
    straight = json.loads((tmp_path / "straight" / "summary.json").read_text())
    assert resumed["status"] == "completed" and resumed["steps"] == 120
    assert resumed["final_val_loss"] == straight["final_val_loss"]
    steps = [r["step"] for r in read_metrics(killed / "metrics.csv")]
    assert steps == sorted(set(steps)) and steps[-1] == 120


def test_corrupted_newest_checkpoint_is_skipped_for_the_previous_good_one(uninterrupted_run, tmp_path, caplog,
                                                                          tiny_config):
    out = tmp_path / "run"
    shutil.copytree(uninterrupted_run.out_dir, out)
    newest = out / "checkpoints" / "step_00000030.pt"
    with open(newest, "r+b") as handle:
        handle.truncate(newest.stat().st_size // 2)
    caplog.set_level(logging.INFO, logger="lmtune")

    result = train(tiny_config, out, resume=True)

    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("step_00000030.pt" in w and "skipping" in w for w in warnings), warnings
    assert any("resuming from" in r.getMessage() and "step_00000020.pt" in r.getMessage() for r in caplog.records)
    assert result.status == "completed"
    assert result.summary["final_val_loss"] == uninterrupted_run.summary["final_val_loss"]
    ckpt.load_checkpoint(newest)  # rewritten whole by the resumed run


# ---------------------------------------------------------------------------------------------- divergence


def test_injected_nan_ends_the_run_as_diverged_with_no_poisoned_checkpoint(make_tiny_config, tmp_path):
    def poison_at_7(step, model):
        if step == 7:
            with torch.no_grad():
                model.blocks[0].ffn.up.weight.fill_(float("nan"))

    result = train(make_tiny_config(checkpoint_interval=5), tmp_path, before_step=poison_at_7)

    assert result.status == "diverged"
    assert result.summary["diverged_step"] == 7
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "diverged"
    files = sorted((tmp_path / "checkpoints").glob("*.pt"))
    assert [p.name for p in files] == ["step_00000005.pt"]
    for path in files:
        state = ckpt.load_checkpoint(path)
        assert state["step"] < 7
        for name, tensor in _tensors(state):
            if tensor.is_floating_point():
                assert torch.isfinite(tensor).all(), f"{path.name}: {name} is not finite"


# ---------------------------------------------------------------------------------------------- out of memory

# What torch's CUDA allocator raises (its message goes on with the allocator's state: several lines).
CUDA_OOM = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 39.39 GiB of which 1.20 GiB "
            "is free.\nOf the allocated memory 35.12 GiB is allocated by PyTorch, and 1.03 GiB is reserved by PyTorch "
            "but unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")


@pytest.mark.parametrize("code", [None, user_model("example")], ids=["lmtunes_model", "users_model"])
def test_a_step_that_runs_out_of_device_memory_is_one_line_naming_the_fix(make_tiny_config, tmp_path, code):
    """torch.cuda.OutOfMemoryError raised by the model's forward inside step 3 (armed by the step hook, as a
    model that keeps more than the memory estimate showed fails on a GPU), on the CPU."""
    config = make_tiny_config(code=code, batch_size=8, grad_accum_steps=2)

    def out_of_memory_at_3(step, model):
        if step == 3:
            def forward(*args, **kwargs):
                raise torch.cuda.OutOfMemoryError(CUDA_OOM)

            model.forward = forward

    with pytest.raises(LmtuneError) as ended:
        train(config, tmp_path / "run", before_step=out_of_memory_at_3, spec=spec_for(config))
    assert str(ended.value) == ("step 3: out of device memory (batch 4 x 32 per forward pass); lower batch_size, "
                                "raise grad_accum_steps, or use a smaller model")
    assert type(ended.value) is LmtuneError and ended.value.__suppress_context__  # (not the allocator's dump)


# ---------------------------------------------------------------------------------------------- outputs and CLI


def test_metrics_rows_hold_finite_grad_norm_scheduled_lr_token_counts_and_probes(uninterrupted_run, tiny_config):
    t, m = tiny_config.train, tiny_config.model
    rows = read_metrics(uninterrupted_run.out_dir / "metrics.csv")
    assert [r["step"] for r in rows] == list(range(5, 31, 5))
    for row in rows:
        step = row["step"]
        assert math.isfinite(row["grad_norm"]) and row["grad_norm"] > 0
        assert row["lr"] == pytest.approx(lr_at(step - 1, t.lr, t.min_lr_ratio, t.warmup_steps, t.steps), rel=1e-12)
        assert row["tokens"] == step * t.batch_size * m.context_length
        assert math.isfinite(row["train_loss"])
        assert (row["val_loss"] is not None) == (step % t.eval_interval == 0)
        for column in PROBE_COLUMNS:
            assert math.isfinite(row[column]), column
        assert row["output_logit_max"] > 0


def test_a_metrics_row_cut_mid_write_is_left_out(uninterrupted_run, tmp_path, caplog):
    path = tmp_path / "metrics.csv"
    text = (uninterrupted_run.out_dir / "metrics.csv").read_text()
    last = text.rstrip("\n").split("\n")[-1].split(",")
    last[METRIC_COLUMNS.index("val_loss")] = "0.5"  # a torn row can parse as numbers it never held
    path.write_text(text + ",".join(last)[:-2])  # cut in its last field, no newline
    rows = read_metrics(path)
    assert rows == read_metrics(uninterrupted_run.out_dir / "metrics.csv")
    assert min(r["val_loss"] for r in rows if r["val_loss"] is not None) > 0.5
    assert "ends mid-row" in caplog.text


@pytest.mark.slow
def test_cli_writes_every_promised_output(builtin_data, tmp_path):
    out = tmp_path / "out"
    proc = _cli("--data", str(builtin_data), "--budget", "quick", "--out", str(out),
                *_sets(*TINY_SETS, "steps=20", "log_interval=5", "eval_interval=10", "checkpoint_interval=10"))

    assert proc.returncode == 0
    assert json.loads((out / "config.json").read_text())["train"]["steps"] == 20
    with open(out / "metrics.csv") as handle:
        # every registered column, then the relative update size of each of the tiny model's 2 layers
        assert handle.readline().strip().split(",") == [*METRIC_COLUMNS, "update_ratio_l0", "update_ratio_l1"]
    assert [r["step"] for r in read_metrics(out / "metrics.csv")] == [5, 10, 15, 20]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert math.isfinite(summary["best_val_loss"])
    assert "step 20/20" in (out / "training.log").read_text()
    checkpoints = out / "checkpoints"
    assert (checkpoints / "best.pt").is_file() and (checkpoints / "best.pt.sha256").is_file()
    assert ckpt.load_checkpoint(checkpoints / "step_00000020.pt")["step"] == 20
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    for name in ("loss_curves.png", "lr_schedule.png"):
        image = matplotlib.image.imread(out / name)
        assert image.shape[0] >= 100 and image.shape[1] >= 100, name
        assert float(image[..., :3].std()) > 0.01, f"{name} is blank"


def test_cli_refuses_bad_out_dirs_and_bad_settings_with_one_line(builtin_data, tmp_path, capsys):
    data = ["--data", str(builtin_data)]
    used = tmp_path / "used"
    used.mkdir()
    (used / "notes.txt").write_text("mine\n")
    before = snapshot(used)
    assert_refused(main, [*data, "--out", str(used)], capsys, "--resume", str(used))
    assert snapshot(used) == before

    assert_refused(main, [*data, "--out", str(used), "--resume"], capsys, "config.json")
    assert snapshot(used) == before

    fresh = tmp_path / "fresh"
    for pair, key in (("nosuchkey=1", "nosuchkey"), ("lr=-1", "lr"), ("batch_size=0", "batch_size"),
                      ("grad_accum_steps=3", "divisible by grad_accum_steps")):
        assert_refused(main, [*data, "--out", str(fresh), "--set", pair], capsys, key)
    assert not fresh.exists()


# ---------------------------------------------------------------------------------------------- the step


def test_gradient_accumulation_over_k_micro_batches_gives_the_update_of_one_k_times_larger_batch(
        make_tiny_config, builtin_data):
    config = resolve_config(make_tiny_config(batch_size=8, weight_decay=0.1), builtin_data)
    data = load_data(builtin_data, config.model.context_length)
    x, y = BatchSampler(data.train, 8, config.model.context_length, seed=0).batch(0)
    cpu = torch.device("cpu")

    def one_step(micro_batches: int):
        torch.manual_seed(0)
        model = TransformerLM(config.model).double()
        state = TrainState(model, build_optimizer(model, config, cpu))
        settings = dataclasses.replace(config.train, grad_accum_steps=micro_batches)
        result = train_step(state, Runtime(cpu, model, None, compiled=False), x, y, 1e-2, settings)
        return result, {name: p.detach().clone() for name, p in model.named_parameters()}

    whole, after_whole = one_step(1)
    accumulated, after_accumulated = one_step(4)

    assert accumulated.loss.item() == pytest.approx(whole.loss.item(), rel=1e-12)
    assert accumulated.grad_norm.item() == pytest.approx(whole.grad_norm.item(), rel=1e-10)
    for name, value in after_whole.items():
        torch.testing.assert_close(after_accumulated[name], value, rtol=1e-10, atol=1e-12, msg=name)


@pytest.mark.slow
def test_wandb_gets_every_metrics_row_and_the_summary_offline(builtin_data, tmp_path):
    out = tmp_path / "run"
    proc = run_lmtune("train", "--data", str(builtin_data), "--out", str(out), "--wandb", "lmtune-tests",
                      *_sets(*TINY_SETS, "steps=20", "log_interval=5", "eval_interval=10", "checkpoint_interval=10"),
                      env={"WANDB_MODE": "offline", "WANDB_SILENT": "true"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]

    (run,) = read_wandb_runs(out)
    rows = read_metrics(out / "metrics.csv")
    assert [h["_step"] for h in run["history"]] == [r["step"] for r in rows] == [5, 10, 15, 20]
    for logged, row in zip(run["history"], rows, strict=True):
        assert logged["train_loss"] == pytest.approx(row["train_loss"])
        assert ("val_loss" in logged) == (row["val_loss"] is not None)
    assert run["summary"]["status"] == "completed"
    assert run["summary"]["best_val_loss"] == pytest.approx(json.loads((out / "summary.json").read_text())
                                                            ["best_val_loss"])
    assert run["config"]["train"]["steps"] == 20


def test_a_run_resumed_in_a_folder_whose_metrics_lag_its_checkpoint_takes_the_rows_from_the_checkpoint(
        make_tiny_config, tmp_path):
    # A folder copied from storage before its last rows reached it (a node lost between a checkpoint's upload and
    # the sync of its folder): metrics.csv has fewer rows than the checkpoint it resumes from carries.
    config = make_tiny_config(steps=20, checkpoint_interval=10, keep_checkpoints=5)
    whole = tmp_path / "whole"
    train(config, whole)
    lagging = tmp_path / "lagging"
    (lagging / "checkpoints").mkdir(parents=True)
    for name in ("step_00000010.pt", "step_00000010.pt.sha256"):
        shutil.copy(whole / "checkpoints" / name, lagging / "checkpoints" / name)
    rows = (whole / "metrics.csv").read_text().splitlines()
    (lagging / "metrics.csv").write_text("\n".join(rows[:2]) + "\n")  # the header and step 5 only
    train(config, lagging, resume=True)
    assert [r["step"] for r in read_metrics(lagging / "metrics.csv")] == \
        [r["step"] for r in read_metrics(whole / "metrics.csv")] == [5, 10, 15, 20]
    assert [r["train_loss"] for r in read_metrics(lagging / "metrics.csv")] == \
        [r["train_loss"] for r in read_metrics(whole / "metrics.csv")]
