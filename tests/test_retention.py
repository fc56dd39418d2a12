"""What of a sweep's checkpoints stays on disk (--keep, the searches' holds), the disk a sweep is refused without,
and a full disk: nothing half-written, the sweep stopped whole."""

from __future__ import annotations

import errno
import hashlib
import json
import os
from pathlib import Path

import pytest
from conftest import assert_refused, trial_dirs, write_grid_space

from lmtune.files import DiskFullError, atomic_write_bytes
from lmtune.searches import STRATEGIES
from lmtune.sweep.disk import Keep
from lmtune.sweep.retention import prune_sweep, prune_trial
from lmtune.sweep.stopping import DiskGuard, OutcomeRecorder, TrialStopper
from lmtune.sweep.storage import filesystem_of


def make_trial(folder: Path, tune_steps: tuple[int, ...] = (10, 20), own_steps: tuple[int, ...] = (),
               stable: bool = False) -> Path:
    """A trial folder as a sweep leaves it: Tune's checkpoint folders, best.pt (+ stable.pt), metrics."""
    for index, step in enumerate(tune_steps):
        directory = folder / f"checkpoint_{index:06d}"
        directory.mkdir(parents=True)
        (directory / f"step_{step:08d}.pt").write_bytes(b"f" * 100)
        (directory / f"step_{step:08d}.pt.sha256").write_text("x\n")
    own = folder / "checkpoints"
    own.mkdir(parents=True, exist_ok=True)
    (own / "best.pt").write_bytes(b"b" * 30)
    for step in own_steps:
        (own / f"step_{step:08d}.pt").write_bytes(b"f" * 100)
    if stable:
        (own / "stable.pt").write_bytes(b"s" * 100)
    (folder / "metrics.csv").write_text("step\n1\n")
    return folder


def left(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_keep_best_leaves_an_ended_trial_its_best_pt_and_its_records_only(tmp_path):
    trial = make_trial(tmp_path / "t", own_steps=(20,), stable=True)
    fs, _ = filesystem_of(str(tmp_path))
    freed = prune_trial(fs, str(trial), Keep.BEST)
    assert left(trial) == ["checkpoints/best.pt", "metrics.csv"]
    assert freed == 2 * (100 + 2) + 100 + 100


def test_keep_last_leaves_the_newest_of_tunes_checkpoints_beside_best_pt(tmp_path):
    trial = make_trial(tmp_path / "t")
    fs, _ = filesystem_of(str(tmp_path))
    prune_trial(fs, str(trial), Keep.LAST)
    assert left(trial) == ["checkpoint_000001/step_00000020.pt", "checkpoint_000001/step_00000020.pt.sha256",
                           "checkpoints/best.pt", "metrics.csv"]


def test_keep_all_prunes_nothing(tmp_path):
    trial = make_trial(tmp_path / "t", stable=True)
    before = left(trial)
    fs, _ = filesystem_of(str(tmp_path))
    assert prune_trial(fs, str(trial), Keep.ALL) == 0
    assert left(trial) == before


def test_what_the_search_holds_survives_the_trials_end_but_not_the_sweeps(tmp_path):
    sweep = tmp_path / "sweep"
    trial = make_trial(sweep / "t", stable=True)
    (sweep / ".staging" / "t").mkdir(parents=True)
    (sweep / ".staging" / "t" / "step_00000030.pt").write_bytes(b"f" * 100)
    fs, _ = filesystem_of(str(tmp_path))
    prune_trial(fs, str(trial), Keep.BEST, held=frozenset({"periodic", "stable"}))
    assert "checkpoint_000001/step_00000020.pt" in left(trial) and "checkpoints/stable.pt" in left(trial)
    assert "checkpoint_000000/step_00000010.pt" not in left(trial)
    prune_sweep(str(tmp_path), "sweep", Keep.BEST)
    assert left(trial) == ["checkpoints/best.pt", "metrics.csv"]
    assert not (sweep / ".staging").exists()


@pytest.mark.parametrize(("search", "outcome", "held"), [
    ("edge", "stopped_early", {"periodic"}), ("edge", "completed", set()), ("edge", "diverged", set()),
    ("horizon", "completed", {"stable"}), ("grid", "stopped_early", set()), ("optuna", "stopped_early", set()),
])
def test_each_search_says_what_of_an_ended_trial_it_may_still_use(search, outcome, held):
    strategy = STRATEGIES[search].strategy
    assert strategy.held_checkpoints(strategy, outcome) == held


def test_a_full_disk_leaves_neither_a_partial_file_nor_its_temp_file(tmp_path, monkeypatch):
    target = tmp_path / "step_00000010.pt"
    target.write_bytes(b"old")

    def no_space(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(DiskFullError, match="no space left on the disk of .* free space, then run the command again"):
        atomic_write_bytes(target, b"new" * 1000)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == [target.name]


def test_the_stopper_stops_every_trial_once_the_disk_cannot_take_the_next_checkpoints(tmp_path, monkeypatch):
    free = {"bytes": 10_000}
    monkeypatch.setattr("lmtune.sweep.stopping.free_disk", lambda directory: free["bytes"])
    guard = DiskGuard(tmp_path, reserve=5_000, interval_s=0)
    stopper = TrialStopper(OutcomeRecorder(tmp_path / "ledger.json"), disk_guard=guard)
    assert not stopper.stop_all()
    free["bytes"] = 4_000
    assert stopper.stop_all()
    assert "less than the next checkpoints need (5.0 kB)" in guard.full


def test_a_resumed_sweeps_disk_guard_asks_the_disk_afresh(tmp_path, monkeypatch):
    import pickle

    monkeypatch.setattr("lmtune.sweep.stopping.free_disk", lambda directory: 0)
    guard = DiskGuard(tmp_path, reserve=1, interval_s=0)
    assert guard.exhausted()
    restored = pickle.loads(pickle.dumps(guard))
    assert restored.full is None


@pytest.mark.slow
def test_a_sweep_is_refused_in_one_line_when_the_disk_has_less_than_it_needs(builtin_data, tmp_path, monkeypatch,
                                                                              capsys):
    from lmtune import run

    space = write_grid_space(tmp_path / "grid.yaml", [1e-3, 3e-3])
    monkeypatch.setattr("lmtune.sweep.disk.free_disk", lambda directory: 1_000)
    argv = ["--space", str(space), "--name", "s", "--results", str(tmp_path / "results"), "--data",
            str(builtin_data), "--no-dashboard", "--quiet", "--num-cpus", "1"]
    line = assert_refused(run.main, argv, capsys, "only 1.0 kB free under", "--force")
    assert "needs about" in line
    assert not (tmp_path / "results" / "s").exists()


# ---------------------------------------------------------------------------------------------
# A real sweep's files (the session's quick sweep: 6 trials under ASHA, --keep last; --keep best, the default,
# is checked on the edge sweep, tests/test_edge_sweep.py)


def checkpoint_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*.pt") if p.is_file()]


@pytest.mark.slow
def test_no_checkpoint_of_a_sweep_is_stored_twice(quick_sweep: Path):
    by_content: dict[str, set[int]] = {}
    for path in checkpoint_files(quick_sweep):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        by_content.setdefault(digest, set()).add(path.stat().st_ino)  # hard links to one file count once
    assert by_content and all(len(inodes) == 1 for inodes in by_content.values())


@pytest.mark.slow
def test_keep_last_leaves_each_ended_trial_its_best_pt_and_its_newest_checkpoint_only(quick_sweep: Path):
    trials = trial_dirs(quick_sweep).values()
    assert trials  # (an empty sweep would pass every check below)
    for trial in trials:
        names = sorted(str(p.relative_to(trial)) for p in checkpoint_files(trial))
        tune_kept = [n for n in names if n.startswith("checkpoint_")]
        assert set(names) - set(tune_kept) <= {"checkpoints/best.pt"}, names
        assert len(tune_kept) <= 1, names  # the newest only: Tune keeps one while the trial runs
        steps = [json.loads(line)["step"] for line in (trial / "result.json").read_text().splitlines()]
        if tune_kept:
            assert int(Path(tune_kept[0]).stem.split("_")[1]) <= max(steps)
    assert sum(bool(list(t.glob("checkpoint_*"))) for t in trial_dirs(quick_sweep).values()) >= 4
    assert not (quick_sweep / ".staging").exists()


@pytest.mark.slow
def test_each_trial_writes_one_tensorboard_stream(quick_sweep: Path):
    assert trial_dirs(quick_sweep)
    for trial in trial_dirs(quick_sweep).values():
        assert len(list(trial.rglob("events.out.tfevents.*"))) == 1, trial


@pytest.mark.slow
def test_a_sweep_prints_the_disk_it_needs_at_start(quick_sweep: Path):
    printed = (quick_sweep.parent / "quick.log").read_text()
    assert "disk: about" in printed and "kept per ended trial" in printed and "free)" in printed
