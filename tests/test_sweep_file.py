"""sweep.json has one reader: SweepRecord.read checks it (one-line refusals naming the file and the key) and parses
it once into typed values, the plan and where and how the sweep ran; writing it back gives the same keys and values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import DISK_CONFIG, grid_sweep_record

from lmtune.errors import LmtuneError
from lmtune.sweep.disk import Keep
from lmtune.sweep.plan import SweepPlan
from lmtune.sweep.spaces import load_space
from lmtune.sweep.sweep_file import SweepRecord
from lmtune.training.config import budget_config

GOLDEN_EDGE = Path(__file__).resolve().parent / "golden" / "quick_edge"


def test_a_real_sweeps_record_written_back_has_the_same_keys_and_values_in_the_same_order(tmp_path: Path):
    written = json.loads((GOLDEN_EDGE / "sweep.json").read_text())
    SweepRecord.read(GOLDEN_EDGE).write(tmp_path)
    again = json.loads((tmp_path / "sweep.json").read_text())
    assert again == written and list(again) == list(written)


def test_a_record_read_back_is_the_record_written(tmp_path: Path):
    space = load_space("quick_edge")
    plan = SweepPlan.create(space, budget_config(space.budget, dict(space.fixed), data_dir="/data"))
    record = SweepRecord(name="s", plan=plan, resources_per_trial={"cpu": 1.0, "gpu": 0.0}, max_concurrent=2,
                         command=("python -m lmtune.run",), resumed_at=("2030-01-01T00:00:00+0000",), keep=Keep.LAST)
    record.write(tmp_path)
    assert SweepRecord.read(tmp_path) == record


def test_the_plans_tokens_and_asha_rungs_are_typed_values():
    record = SweepRecord.read(GOLDEN_EDGE)
    base, asha = record.plan.base, record.plan.asha
    assert base.total_tokens == 162 * 16 * 64 and asha.max_t == base.total_tokens and asha.grace_period == 18432
    assert record.plan.budget().rungs == (18432, 55296, 165888)
    assert record.data.meta.vocab_size == base.model.vocab_size == 3801 and record.keep == Keep.BEST


def test_a_record_without_a_space_or_base_config_has_no_plan(tmp_path: Path):
    (tmp_path / "sweep.json").write_text(json.dumps({"name": "hand", "start_time": "T"}))
    record = SweepRecord.read(tmp_path)
    assert record.plan is None and record.num_trials is None and record.start_time == "T"


@pytest.mark.parametrize("edit, key", [
    (lambda r: r["space"].pop("params"), "no usable sweep plan (KeyError: 'params')"),
    (lambda r: r["space"].update(search="annealing"), "space.search is 'annealing'"),
    (lambda r: r["base_config"]["train"].update(steps="many"), "base_config.train.steps is 'many'"),
    (lambda r: r["data"].update(meta={"vocab_size": 10}), "data.meta is not the meta.json lmtune.prepare writes"),
    (lambda r: r.update(keep=3), "keep is 3, not a string"),
])
def test_a_record_this_version_cannot_use_is_refused_in_one_line_naming_the_file_and_the_key(edit, key,
                                                                                             tmp_path: Path):
    record = grid_sweep_record("s", [0.001, 0.01], DISK_CONFIG).to_json()
    record["data"] = {"dir": "/data", "meta": None}
    edit(record)
    (tmp_path / "sweep.json").write_text(json.dumps(record))
    with pytest.raises(LmtuneError) as refused:
        SweepRecord.read(tmp_path)
    message = str(refused.value)
    assert message.startswith(f"{tmp_path / 'sweep.json'}: {key}") and "\n" not in message
