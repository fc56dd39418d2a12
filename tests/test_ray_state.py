"""Ray's experiment snapshot, kept whole for a --resume after a kill -9 cut it short (lmtune.sweep.ray_state).

The whole path (a sweep killed, its snapshot cut short, resumed to the end) is
tests/test_faults.py::test_sigkilled_sweep_driver_resumes_with_every_trial_ending_once.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest

from lmtune.errors import LmtuneError
from lmtune.sweep.ray_state import RayStateBackup, backup_dir, repair_ray_state, whole

STATE = "experiment_state-2026-11-28_10-00-00.json"
SEARCHER = "searcher-state-2026-11-28_10-00-00.pkl"
GENERATOR = "basic-variant-state-2026-11-28_10-00-00.json"  # a pickle, as Ray names it


def write_snapshot(sweep: Path, trials: int) -> None:
    """Files shaped as Ray's snapshot: its experiment state, a pickled searcher, and lmtune's sweep.json."""
    sweep.mkdir(parents=True, exist_ok=True)
    (sweep / STATE).write_text(json.dumps({"trial_data": [f"trial {i}" for i in range(trials)]}))
    (sweep / SEARCHER).write_bytes(pickle.dumps({"suggested": list(range(trials))}))
    (sweep / GENERATOR).write_bytes(pickle.dumps({"iterators": list(range(trials))}))
    (sweep / "sweep.json").write_text("{}")


def cut_short(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize("name", [STATE, SEARCHER, GENERATOR])
def test_a_file_cut_short_does_not_read_whole(tmp_path, name):
    write_snapshot(tmp_path, trials=3)
    assert whole(tmp_path / name) is not None
    cut_short(tmp_path / name)
    assert whole(tmp_path / name) is None


def test_an_empty_file_does_not_read_whole(tmp_path):
    (tmp_path / STATE).write_bytes(b"")
    assert whole(tmp_path / STATE) is None


def test_the_backup_keeps_rays_files_but_not_lmtunes_sweep_file(tmp_path):
    write_snapshot(tmp_path, trials=3)
    RayStateBackup(tmp_path).keep()
    assert sorted(p.name for p in backup_dir(tmp_path).iterdir()) == sorted([STATE, SEARCHER, GENERATOR])
    assert (backup_dir(tmp_path) / STATE).read_bytes() == (tmp_path / STATE).read_bytes()


def test_the_backup_keeps_its_whole_copy_while_rays_file_is_cut_short_and_takes_it_once_whole(tmp_path):
    write_snapshot(tmp_path, trials=3)
    backup = RayStateBackup(tmp_path)
    backup.keep()
    write_snapshot(tmp_path, trials=5)
    cut_short(tmp_path / STATE)  # Ray still copying it
    backup.keep()
    assert json.loads((backup_dir(tmp_path) / STATE).read_text())["trial_data"] == [f"trial {i}" for i in range(3)]
    write_snapshot(tmp_path, trials=5)
    os.utime(tmp_path / STATE, ns=(1, 2))  # a new copy, whatever the clock's resolution
    backup.keep()
    assert len(json.loads((backup_dir(tmp_path) / STATE).read_text())["trial_data"]) == 5


def test_repair_puts_back_the_kept_copy_of_a_file_cut_short_and_leaves_whole_ones(tmp_path):
    write_snapshot(tmp_path, trials=3)
    RayStateBackup(tmp_path).keep()
    searcher_before = (tmp_path / SEARCHER).read_bytes()
    cut_short(tmp_path / STATE)
    assert repair_ray_state(tmp_path) == [STATE]
    assert json.loads((tmp_path / STATE).read_text())["trial_data"] == ["trial 0", "trial 1", "trial 2"]
    assert (tmp_path / SEARCHER).read_bytes() == searcher_before
    assert repair_ray_state(tmp_path) == []


def test_a_file_cut_short_without_a_kept_copy_is_refused_in_one_line_and_left_as_it_is(tmp_path):
    write_snapshot(tmp_path, trials=3)
    cut_short(tmp_path / STATE)
    before = (tmp_path / STATE).read_bytes()
    with pytest.raises(LmtuneError, match=r"cut short .* no whole copy of it was kept; analyze the sweep"):
        repair_ray_state(tmp_path)
    assert (tmp_path / STATE).read_bytes() == before


def test_the_backup_callback_pickled_with_the_tuner_comes_back_without_its_memory(tmp_path):
    backup = RayStateBackup(tmp_path)
    write_snapshot(tmp_path, trials=1)
    backup.keep()
    restored = pickle.loads(pickle.dumps(backup))
    assert restored.sweep_dir == tmp_path and restored._copied == {}
