"""A trial's Tune results (result.json, progress.csv) survive its start again by a resumed sweep's new driver."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from conftest import run_python

# A driver with lmtune's result loggers: the trial reports three rows and fails (no checkpoint); a second driver,
# a new process with a Ray of its own, restores the experiment and starts the trial again, from the start, where it
# reports three more.
_DRIVER = """
import sys
from pathlib import Path
import ray
from ray import tune
from lmtune.sweep.experiment import result_loggers

storage, marker, which = sys.argv[1], Path(sys.argv[2]), sys.argv[3]

def trainable(config):
    attempt = 1 if not marker.exists() else 2
    marker.touch()
    for step in range(3):
        tune.report({"attempt": attempt, "step": step})
    if attempt == 1:
        raise RuntimeError("the first attempt fails")

ray.init(address="local", num_cpus=1, include_dashboard=False)  # (a new one: never a stray cluster)
if which == "first":
    tune.Tuner(trainable, run_config=tune.RunConfig(name="restarted", storage_path=storage,
                                                    callbacks=result_loggers(storage))).fit()
else:
    tune.Tuner.restore(str(Path(storage) / "restarted"), trainable, resume_errored=True).fit()
"""


@pytest.fixture(scope="module")
def restarted_trial(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stored folder of a trial the second driver started again without a checkpoint."""
    folder = tmp_path_factory.mktemp("restarted")
    (folder / "driver.py").write_text(_DRIVER)
    for which in ("first", "second"):
        proc = run_python(str(folder / "driver.py"), str(folder / "results"), str(folder / "attempted"), which,
                          cwd=folder)
        assert proc.returncode == 0, proc.stderr[-3000:]
    trials = [p for p in (folder / "results" / "restarted").iterdir() if p.is_dir()]
    assert len(trials) == 1, trials
    return trials[0]


@pytest.mark.slow
def test_a_trial_started_again_keeps_its_stored_result_json_and_continues_it(restarted_trial: Path):
    rows = [json.loads(line) for line in (restarted_trial / "result.json").read_text().splitlines()]
    assert [(row["attempt"], row["step"]) for row in rows] == [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2)]


@pytest.mark.slow
def test_a_trial_started_again_keeps_its_stored_progress_csv_with_one_header(restarted_trial: Path):
    with (restarted_trial / "progress.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [(row["attempt"], row["step"]) for row in rows] == [
        ("1", "0"), ("1", "1"), ("1", "2"), ("2", "0"), ("2", "1"), ("2", "2")]
