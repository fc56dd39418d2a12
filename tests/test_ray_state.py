"""Ray's experiment snapshot, kept whole and consistent for a --resume after a kill -9 (lmtune.sweep.ray_state).

Ray saves into a staging folder on the driver (``staging`` here) and copies it into the experiment folder
(``sweep``) in the background; the tests write both as Ray would. The whole path (a sweep killed, its snapshot cut
short and lmtune's copy a save behind, resumed to the end) is
tests/test_faults.py::test_sigkilled_sweep_driver_resumes_with_every_trial_ending_once.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

import pytest

from lmtune.errors import LmtuneError
from lmtune.sweep.ray_state import RayStateBackup, newest_set, repair_ray_state, whole

STATE = "experiment_state-2026-11-28_10-00-00.json"
SEARCHER = "searcher-state-2026-11-28_10-00-00.pkl"
GENERATOR = "basic-variant-state-2026-11-28_10-00-00.json"  # a pickle, as Ray names it
RAY_FILES = (STATE, SEARCHER, GENERATOR)


@dataclass
class TrialAsTuneHandsIt:
    """What the backup reads of each of Tune's trials its callback gets: the trial's folder and its status."""

    path: str
    status: str = "RUNNING"


@pytest.fixture
def sweep(tmp_path) -> Path:
    return tmp_path / "results" / "kd"


@pytest.fixture
def staging(tmp_path) -> Path:
    return tmp_path / "ray-session" / "driver_artifacts"


def ray_saves(folder: Path, trials: int) -> None:
    """Files shaped as one save of Ray's: its experiment state, a pickled searcher and generator, and lmtune's
    sweep.json beside them."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / STATE).write_text(json.dumps({"trial_data": [f"trial {i}" for i in range(trials)]}))
    (folder / SEARCHER).write_bytes(pickle.dumps({"suggested": list(range(trials))}))
    (folder / GENERATOR).write_bytes(pickle.dumps({"iterators": list(range(trials))}))
    (folder / "sweep.json").write_text("{}")


def copied(staging: Path, sweep: Path, names=RAY_FILES) -> None:
    """Ray's syncer copying ``names`` of the save into the experiment folder."""
    for name in names:
        shutil.copy2(staging / name, sweep / name)


def trials_in(state: Path) -> list[str]:
    return json.loads(state.read_text())["trial_data"]


def cut_short(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def write_tune_checkpoint(sweep: Path, trial: str, index: int, step: int) -> Path:
    """A Tune checkpoint folder in a trial's folder as lmtune's trials hand them over: a step file and its checksum."""
    folder = sweep / trial / f"checkpoint_{index:06d}"
    folder.mkdir(parents=True)
    (folder / f"step_{step:08d}.pt").write_bytes(os.urandom(64))
    (folder / f"step_{step:08d}.pt.sha256").write_text("0" * 64)
    return folder


def saved(backup: RayStateBackup, staging: Path, sweep: Path, trials: int, running=()) -> None:
    """A step of Tune's in which Ray saved: the save, copied into the experiment folder, and the backup's turn."""
    ray_saves(staging, trials)
    os.utime(staging / STATE, ns=(trials, trials))  # (a new save, whatever the clock's resolution)
    copied(staging, sweep)
    backup.keep(staging, [TrialAsTuneHandsIt(str(sweep / name)) for name in running])


@pytest.mark.parametrize("name", RAY_FILES)
def test_a_file_cut_short_does_not_read_whole(tmp_path, name):
    ray_saves(tmp_path, trials=3)
    assert whole(tmp_path / name) is not None
    cut_short(tmp_path / name)
    assert whole(tmp_path / name) is None


def test_an_empty_file_does_not_read_whole(tmp_path):
    (tmp_path / STATE).write_bytes(b"")
    assert whole(tmp_path / STATE) is None


def test_the_backup_keeps_rays_save_from_its_staging_folder_but_not_lmtunes_sweep_file(sweep, staging):
    sweep.mkdir(parents=True)
    saved(RayStateBackup(sweep), staging, sweep, trials=3)
    kept = newest_set(sweep)
    assert sorted(p.name for p in kept.iterdir()) == sorted(RAY_FILES)
    assert (kept / STATE).read_bytes() == (staging / STATE).read_bytes()


def test_the_backup_keeps_only_the_newest_save_and_copies_nothing_when_ray_did_not_save(sweep, staging):
    sweep.mkdir(parents=True)
    backup = RayStateBackup(sweep)
    saved(backup, staging, sweep, trials=3)
    first = newest_set(sweep)
    backup.keep(staging)  # a step without a save
    assert newest_set(sweep) == first
    saved(backup, staging, sweep, trials=5)
    assert len(trials_in(newest_set(sweep) / STATE)) == 5
    assert [p.name for p in (sweep / "decisions" / "ray_state").iterdir()] == [newest_set(sweep).name]


def test_repair_puts_back_the_kept_save_over_a_file_cut_short(sweep, staging):
    sweep.mkdir(parents=True)
    saved(RayStateBackup(sweep), staging, sweep, trials=3)
    cut_short(sweep / STATE)
    assert repair_ray_state(sweep) == [STATE]
    assert trials_in(sweep / STATE) == ["trial 0", "trial 1", "trial 2"]
    assert repair_ray_state(sweep) == []


def test_repair_puts_back_the_whole_save_when_the_copy_mixes_two_saves(sweep, staging):
    """Killed while Ray's syncer copied the newer save file by file: its generator there, its experiment state not
    yet (restored so, the generator would have made trials the experiment state does not list: never run)."""
    sweep.mkdir(parents=True)
    backup = RayStateBackup(sweep)
    saved(backup, staging, sweep, trials=3)
    ray_saves(staging, trials=5)
    os.utime(staging / STATE, ns=(9, 9))
    backup.keep(staging)
    copied(staging, sweep, names=(GENERATOR,))
    assert sorted(repair_ray_state(sweep)) == sorted([STATE, SEARCHER])
    assert all((sweep / name).read_bytes() == (staging / name).read_bytes() for name in RAY_FILES)


def test_repair_leaves_rays_files_when_they_are_the_save_kept(sweep, staging):
    sweep.mkdir(parents=True)
    saved(RayStateBackup(sweep), staging, sweep, trials=3)
    before = {name: (sweep / name).stat().st_mtime_ns for name in RAY_FILES}
    assert repair_ray_state(sweep) == []
    assert {name: (sweep / name).stat().st_mtime_ns for name in RAY_FILES} == before


def test_a_file_cut_short_without_a_kept_save_is_refused_in_one_line_and_left_as_it_is(sweep):
    ray_saves(sweep, trials=3)
    cut_short(sweep / STATE)
    before = (sweep / STATE).read_bytes()
    with pytest.raises(LmtuneError, match=r"cut short .* no whole copy of it was kept; analyze the sweep") as refused:
        repair_ray_state(sweep)
    assert "\n" not in str(refused.value)
    assert (sweep / STATE).read_bytes() == before


def test_a_save_links_the_running_trials_tune_checkpoints_but_not_an_ended_trials(sweep, staging):
    running = write_tune_checkpoint(sweep, "t0_lr=0.01", index=1, step=10)
    write_tune_checkpoint(sweep, "t1_lr=3", index=1, step=10)
    ray_saves(staging, trials=2)
    copied(staging, sweep)
    RayStateBackup(sweep).keep(staging, [TrialAsTuneHandsIt(str(sweep / "t0_lr=0.01")),
                                         TrialAsTuneHandsIt(str(sweep / "t1_lr=3"), "TERMINATED")])
    linked = newest_set(sweep) / "checkpoints" / "t0_lr=0.01" / running.name
    assert sorted(p.name for p in linked.iterdir()) == sorted(p.name for p in running.iterdir())
    assert (linked / "step_00000010.pt").stat().st_ino == (running / "step_00000010.pt").stat().st_ino  # no copy
    assert not (newest_set(sweep) / "checkpoints" / "t1_lr=3").exists()


def test_a_checkpoint_deleted_after_the_kept_save_named_it_is_put_back_on_resume(sweep, staging):
    """Tune deletes a trial's older checkpoint before the save naming the newer one; a kill while Ray's syncer copies
    that save leaves the kept one naming the deleted checkpoint (Ray's restore would fail the trial)."""
    older = write_tune_checkpoint(sweep, "t0", index=1, step=10)
    content = (older / "step_00000010.pt").read_bytes()
    saved(RayStateBackup(sweep), staging, sweep, trials=1, running=["t0"])
    shutil.rmtree(older)  # Tune keeps one checkpoint per trial
    newer = write_tune_checkpoint(sweep, "t0", index=2, step=20)
    ray_saves(staging, trials=2)  # the save naming it (the driver killed before lmtune's turn)
    copied(staging, sweep)
    cut_short(sweep / STATE)
    assert repair_ray_state(sweep) == sorted(RAY_FILES)  # (the kept save whole: the newer one's files mixed in)
    assert (older / "step_00000010.pt").read_bytes() == content
    assert newer.is_dir()


def test_the_links_follow_the_newest_save_so_a_checkpoint_tune_let_go_before_it_is_not_put_back(sweep, staging):
    older = write_tune_checkpoint(sweep, "t0", index=1, step=10)
    backup = RayStateBackup(sweep)
    saved(backup, staging, sweep, trials=1, running=["t0"])
    shutil.rmtree(older)
    write_tune_checkpoint(sweep, "t0", index=2, step=20)
    saved(backup, staging, sweep, trials=2, running=["t0"])
    assert repair_ray_state(sweep) == []
    assert not older.exists()
    assert [p.name for p in (newest_set(sweep) / "checkpoints" / "t0").iterdir()] == ["checkpoint_000002"]


def test_the_backup_callback_pickled_with_the_tuner_comes_back_without_its_memory(sweep, staging):
    sweep.mkdir(parents=True)
    backup = RayStateBackup(sweep)
    saved(backup, staging, sweep, trials=1)
    restored = pickle.loads(pickle.dumps(backup))
    assert restored.sweep_dir == sweep and restored._saved is None


def test_a_ctrl_c_while_the_backup_removes_an_older_save_comes_as_ctrl_c_once_it_is_gone(sweep, staging,
                                                                                        monkeypatch):
    # CPython's rmtree cut by KeyboardInterrupt closes a descriptor twice and raises EBADF instead (a CI run's
    # second Ctrl-C during Tune's last save ended the sweep with that traceback, not status 130).
    sweep.mkdir(parents=True)
    backup = RayStateBackup(sweep)
    saved(backup, staging, sweep, trials=3)
    older = newest_set(sweep)
    removing = shutil.rmtree

    def ctrl_c_meanwhile(path, *args, **kwargs):
        if Path(path) == older:
            signal.raise_signal(signal.SIGINT)
        removing(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", ctrl_c_meanwhile)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # (Ctrl-C's, whatever an earlier test left)
    try:
        with pytest.raises(KeyboardInterrupt):
            saved(backup, staging, sweep, trials=5)
    finally:
        signal.signal(signal.SIGINT, before)
    assert not older.exists()
    assert len(trials_in(newest_set(sweep) / STATE)) == 5
