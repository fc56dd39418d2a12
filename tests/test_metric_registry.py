"""The metric registry: a per-step metric is defined once and every sink, reader and report figure takes it
from there; a row key no metric names is refused. The per-layer relative update size proves it end to end."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from conftest import png_width, read_wandb_runs, run_python, tensorboard_scalars

from lmtune.findings.comparison import first_growth
from lmtune.findings.stability import TrialRecord
from lmtune.fused.loop import train_fused
from lmtune.report.figures import plot_instability
from lmtune.sweep.reporting import TuneSink
from lmtune.training.loop import RunResult, resolve_config, train
from lmtune.training.metric_registry import (
    Metric,
    UnregisteredMetric,
    instability_panels,
    probe_labels,
    register,
    unregister,
)
from lmtune.training.metrics import (
    METRICS_FILE,
    CsvSink,
    TensorBoardSink,
    read_metrics,
    read_metrics_frame,
    write_metrics,
)
from lmtune.training.wandb_sink import WandbSink

ROW = {"step": 5, "tokens": 1280, "train_loss": 4.5, "val_loss": None, "lr": 1e-3, "grad_norm": 0.7}
# metrics.csv as runs wrote it before the relative update size was logged.
OLD_HEADER = ("step,tokens,train_loss,val_loss,lr,grad_norm,tokens_per_s,mfu,data_wait_s,compute_s,peak_memory_bytes,"
              "attn_logit_max,output_logit_max,output_logz_mean,elapsed_s,loss_over_min,above_init_steps")
UPDATE_COLUMNS = ["update_ratio_max", "update_ratio_l0", "update_ratio_l1"]  # the tiny model has 2 layers


@pytest.fixture
def sharpness():
    """A metric the test registers (a panel of the instability figure and a stability probe), unregistered after."""
    metric = register(Metric("test_sharpness", "A metric only the tests register.", label="test sharpness",
                             instability_panel=True, probe=True))
    yield metric
    unregister(metric.name)


def records(curve_extra: dict[str, list[float]]) -> tuple[TrialRecord, TrialRecord]:
    """A best trial and a diverged one at 4x its LR, whose curves hold ``curve_extra`` (diverged: 10x the best's)."""
    steps = [5, 10, 15]
    base = {"step": steps, "tokens": [s * 256 for s in steps], "train_loss": [4.0, 3.5, 3.0],
            "grad_norm": [1.0, 1.0, 1.0], "attn_logit_max": [2.0, 2.0, 2.0], "output_logit_max": [3.0, 3.0, 3.0]}
    best = TrialRecord("best", 1e-3, {"lr": 1e-3}, "completed", curve=pd.DataFrame({**base, **curve_extra}))
    grown = {k: [10 * v for v in values] for k, values in curve_extra.items()}
    broken = TrialRecord("broken", 4e-3, {"lr": 4e-3}, "diverged", curve=pd.DataFrame({**base, **grown}))
    return best, broken


# ---------------------------------------------------------------------------------------------- refused


def test_metrics_csv_refuses_a_row_key_no_metric_is_registered_for_and_names_it(tmp_path):
    with CsvSink(tmp_path) as sink, pytest.raises(UnregisteredMetric, match=r"'mystery_norm'.*register"):
        sink.write({**ROW, "mystery_norm": 2.0})
    assert read_metrics(tmp_path / METRICS_FILE) == []


def test_tensorboard_tune_and_wandb_sinks_refuse_an_unregistered_key_too(tiny_config, tmp_path):
    with TensorBoardSink(tmp_path) as tensorboard, pytest.raises(UnregisteredMetric, match="mystery_norm"):
        tensorboard.write({**ROW, "mystery_norm": 2.0})
    with pytest.raises(UnregisteredMetric, match="mystery_norm"):
        TuneSink(tiny_config).write({**ROW, "mystery_norm": 2.0}, None)
    with pytest.raises(UnregisteredMetric, match="mystery_norm"):
        WandbSink("lmtune-tests", tiny_config, tmp_path).write({**ROW, "mystery_norm": 2.0})


# ---------------------------------------------------------------------------------------------- one definition


def test_a_registered_metric_becomes_a_metrics_csv_column(sharpness, tmp_path):
    with CsvSink(tmp_path) as sink:
        sink.write({**ROW, "test_sharpness": 37.5})
    assert "test_sharpness" in (tmp_path / METRICS_FILE).read_text().splitlines()[0].split(",")
    assert read_metrics(tmp_path / METRICS_FILE)[0]["test_sharpness"] == 37.5


def test_a_registered_metric_becomes_a_tensorboard_scalar(sharpness, tmp_path):
    with TensorBoardSink(tmp_path) as sink:
        sink.write({**ROW, "test_sharpness": 37.5})
    assert tensorboard_scalars(tmp_path / "tensorboard")["test_sharpness"] == [(5, 37.5)]


# A trial's thread closing its sink while the process exits (Ray ending the worker), in the one order that printed
# tensorboardX's "flush of closed file" traceback: the thread inside its writer's close, the event file closed but
# the writer not yet marked closed, when tensorboardX's own close at exit checks that mark. The thread is held
# there until the exiting main thread reaches for the sinks' lock, which only the fix's close at exit does (it runs
# before tensorboardX's, and waits on that lock for the thread's close to end); without it the thread is still held
# when tensorboardX's check runs. The other sinks are closed by the exit alone.
RACE_AT_EXIT = """
import sys, threading
from pathlib import Path
from lmtune.training.metrics import TensorBoardSink

sinks = [TensorBoardSink(Path(sys.argv[1]) / str(i)) for i in range(4)]
for sink in sinks:
    sink.write({"step": 5, "tokens": 1280, "train_loss": 4.5, "val_loss": None, "lr": 1e-3, "grad_norm": 0.7})
held, exiting = threading.Event(), threading.Event()


class SaysWhenTheExitReachesIt:
    def __init__(self, lock):
        self.lock = lock

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            exiting.set()
        self.lock.acquire()

    def __exit__(self, *exc):
        self.lock.release()


TensorBoardSink.lock = SaysWhenTheExitReachesIt(getattr(TensorBoardSink, "lock", None) or threading.Lock())
event_file = sinks[0].writer.file_writer.event_writer._ev_writer  # (tensorboardX's EventsWriter)
close_file = event_file.close


def close_then_hold():
    closed = close_file()
    held.set()
    exiting.wait(timeout=60)
    return closed


event_file.close = close_then_hold
threading.Thread(target=sinks[0].close, daemon=True).start()  # as a sweep's trial thread: a daemon
if not held.wait(timeout=60):
    sys.exit("the thread never reached its writer's close")
"""


@pytest.mark.slow
def test_tensorboard_sinks_closing_while_their_process_exits_print_nothing_and_keep_every_row(tmp_path):
    # (before the fix tensorboardX's check-then-close at exit raced the thread's close and printed "flush of closed
    # file" tracebacks, in 2 of 3 runs of a script that left the order to chance; this one forces that order, and
    # printed the traceback in every run of the code before the fix, and of the fix without its lock or its close)
    proc = run_python("-c", RACE_AT_EXIT, str(tmp_path), timeout=120)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr[-2000:]
    assert all(tensorboard_scalars(tmp_path / str(i) / "tensorboard")["train_loss"] == [(5, 4.5)] for i in range(4))


def test_a_registered_metric_is_in_the_result_the_tune_sink_reports(sharpness, tiny_config):
    assert TuneSink(tiny_config).result({**ROW, "test_sharpness": 37.5})["test_sharpness"] == 37.5


@pytest.mark.slow
def test_a_registered_metric_reaches_the_wandb_run(sharpness, tiny_config, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    sink = WandbSink("lmtune-tests", tiny_config, tmp_path)
    sink.write({**ROW, "test_sharpness": 37.5})
    sink.close(RunResult("completed", {"status": "completed"}, tmp_path))
    (run,) = read_wandb_runs(tmp_path)
    assert run["history"][0]["test_sharpness"] == 37.5


def test_a_metric_registered_for_the_instability_figure_gets_a_panel_there(sharpness, tmp_path):
    best, broken = records({"test_sharpness": [1.0, 2.0, 3.0]})
    with_it = plot_instability([best, broken], best, tmp_path / "with.png")
    unregister(sharpness.name)
    without = plot_instability([best, broken], best, tmp_path / "without.png")
    register(sharpness)
    assert sharpness in instability_panels()
    assert png_width(with_it) - png_width(without) > 400  # one panel of 5 inches at 120 dpi more


def test_a_metric_registered_as_a_probe_is_compared_with_the_best_trial(sharpness):
    best, broken = records({"test_sharpness": [1.0, 2.0, 3.0]})
    assert probe_labels()["test_sharpness"] == "test sharpness"
    assert "test sharpness" in first_growth(broken, best)


def test_an_old_metrics_csv_without_the_new_columns_reads_as_not_logged(tmp_path):
    path = tmp_path / METRICS_FILE
    path.write_text(OLD_HEADER + "\n" + "5,1280,4.5,,0.001,0.7" + ",1.0" * 11 + "\n")
    (row,) = read_metrics(path)
    assert "update_ratio_max" not in row and row["grad_norm"] == 0.7
    assert "update_ratio_max" not in read_metrics_frame(path).columns
    best, broken = records({})
    assert "relative update size" not in first_growth(broken, best)  # not a probe, and not logged
    assert plot_instability([best, broken], best, tmp_path / "instability.png").is_file()


def test_a_run_resumed_on_an_old_metrics_csv_keeps_its_rows_and_widens_the_header(tmp_path):
    path = tmp_path / METRICS_FILE
    path.write_text(OLD_HEADER + "\n" + "5,1280,4.5,,0.001,0.7" + ",1.0" * 11 + "\n")
    with CsvSink(tmp_path, resume_step=5) as sink:
        sink.write({**ROW, "step": 10, "update_ratio_max": 0.02, "update_ratio_l0": 0.01, "update_ratio_l1": 0.02})
    header = path.read_text().splitlines()[0].split(",")
    assert header == OLD_HEADER.split(",") + UPDATE_COLUMNS
    old, new = read_metrics(path)
    assert old["update_ratio_max"] is None and new["update_ratio_l1"] == 0.02


def test_history_rows_keep_a_column_no_metric_names_now(tmp_path):
    write_metrics(tmp_path / METRICS_FILE, [{**ROW, "retired_metric": 1.5}])
    assert read_metrics(tmp_path / METRICS_FILE)[0]["retired_metric"] == 1.5


# ---------------------------------------------------------------------------------------------- update ratio


def update_ratios(out_dir: Path) -> dict[int, list[float]]:
    """Step -> [max, layer 0, layer 1] of the run's relative update sizes."""
    return {row["step"]: [row[c] for c in UPDATE_COLUMNS] for row in read_metrics(out_dir / METRICS_FILE)}


def assert_sound(small: dict[int, list[float]], large: dict[int, list[float]]) -> None:
    """Finite and positive at every row, the max the largest layer's, and larger at the larger LR."""
    assert small.keys() == large.keys() == {5, 10}
    for ratios in (*small.values(), *large.values()):
        assert all(math.isfinite(r) and r > 0 for r in ratios)
        assert ratios[0] == max(ratios[1:])
    for step in small:
        assert large[step][0] > 3 * small[step][0]


def test_a_single_run_logs_each_layers_relative_update_size_larger_at_a_larger_lr(make_tiny_config, tmp_path):
    for lr in (1e-3, 1e-2):
        assert train(make_tiny_config(lr=lr, steps=10), tmp_path / str(lr)).status == "completed"
    assert_sound(update_ratios(tmp_path / "0.001"), update_ratios(tmp_path / "0.01"))


@pytest.mark.slow
def test_a_fused_run_logs_each_members_relative_update_size_as_its_single_run_does(make_tiny_config, tmp_path):
    configs = [resolve_config(make_tiny_config(lr=lr, steps=10), Path(make_tiny_config().data_dir))
               for lr in (1e-3, 1e-2)]
    train_fused(configs, [tmp_path / "fused-small", tmp_path / "fused-large"])
    small, large = update_ratios(tmp_path / "fused-small"), update_ratios(tmp_path / "fused-large")
    assert_sound(small, large)
    train(make_tiny_config(lr=1e-2, steps=10), tmp_path / "alone")
    for step, ratios in update_ratios(tmp_path / "alone").items():
        assert large[step] == pytest.approx(ratios, rel=1e-4)
