"""A full disk, anywhere, is one line (part seven, item 4): what was being written, the room it needs and the room
there is, with the sweep's --resume command where a sweep can resume; analyze's line has no "resume" and leaves
nothing partial under the report's name. And (item 9) a report figure's path taken by a folder is one line, no
temporary file left. Each full disk is injected: a write to the chosen files raises ENOSPC, as the kernel does."""

from __future__ import annotations

import builtins
import errno
import io
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import TINY, assert_one_line_error, assert_refused, disk_sweep, set_args, snapshot

from lmtune import analyze
from lmtune import train as train_cli
from lmtune.errors import LmtuneError, cli_entry
from lmtune.files import DiskFullError, atomic_write_bytes, staged_folder
from lmtune.run import print_result
from lmtune.sweep.options import SweepOptions
from lmtune.sweep.ray_state import RayStateBackup, backup_dir
from lmtune.sweep.runner import DISK_FULL, fit_sweep
from lmtune.sweep.storage import SweepStorage
from lmtune.sweep.sweep_file import SweepRecord

SWEEP = {"full": (0.001, "completed", {10: 4.0, 30: 2.5}), "cut": (0.0005, "stopped_early", {10: 3.9})}


class _FullFile:
    """A file open for writing on a full disk: every write raises ENOSPC (the rest is the real file's)."""

    def __init__(self, handle):
        self._handle = handle

    def write(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name):
        return getattr(self._handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._handle.close()


@pytest.fixture
def fill_disk(monkeypatch) -> Callable[[Callable[[Path], bool]], None]:
    """``fill_disk(full)``: from then on, a write to any file opened for writing whose path ``full`` accepts
    raises ENOSPC (builtins.open and io.open: lmtune's atomic writes and pathlib's alike)."""
    real_open = builtins.open

    def fill(full: Callable[[Path], bool]) -> None:
        def open_on_full_disk(file, mode="r", *args, **kwargs):
            handle = real_open(file, mode, *args, **kwargs)
            writes = any(flag in mode for flag in "wax+")
            return _FullFile(handle) if writes and isinstance(file, str | os.PathLike) and full(Path(file)) \
                else handle

        monkeypatch.setattr(builtins, "open", open_on_full_disk)
        monkeypatch.setattr(io, "open", open_on_full_disk)

    return fill


def one_disk_full_line(code: int, stderr: str, *fragments: str) -> str:
    """A full disk's report: exit status 1 and one ``error: no space left ...`` line holding each fragment."""
    return assert_one_line_error(code, stderr, *fragments, status=1, starts="no space left on the disk of ")


def leftovers(folder: Path) -> list[str]:
    """Temporary files and staging folders anywhere under ``folder``."""
    return sorted(str(p) for p in folder.rglob("*") if ".tmp" in p.name or "staging" in p.name)


# ---------------------------------------------------------------------------------------------
# A sweep's driver


def ray_staging(root: Path, state: str) -> Path:
    """A folder as Ray stages its experiment state in: one whole experiment_state file holding ``state``."""
    staging = root / "staging"
    staging.mkdir(exist_ok=True)
    (staging / "experiment_state-2026-01-01_00-00-00.json").write_text(json.dumps({"state": state}))
    return staging


def test_a_full_disk_while_the_driver_keeps_rays_state_leaves_the_previous_copy_whole_and_no_partial_one(
        tmp_path, fill_disk):
    sweep_dir = tmp_path / "sweep"
    backup = RayStateBackup(sweep_dir)
    backup.keep(ray_staging(tmp_path, "first"))
    (kept,) = backup_dir(sweep_dir).iterdir()
    before = snapshot(kept)
    fill_disk(lambda path: backup_dir(sweep_dir) in path.parents)
    with pytest.raises(DiskFullError) as raised:
        backup.keep(ray_staging(tmp_path, "second, a longer save"))
    assert raised.value.size == len(json.dumps({"state": "second, a longer save"}))
    assert f"no space left on the disk of {backup_dir(sweep_dir)} to write snapshot-" in str(raised.value)
    assert list(backup_dir(sweep_dir).iterdir()) == [kept] and snapshot(kept) == before


def test_a_full_disk_under_the_sweeps_driver_stops_it_with_one_line_and_its_resume_command(
        tmp_path, fill_disk, capsys):
    sweep_dir = disk_sweep(tmp_path, SWEEP)
    options = SweepOptions(space="grid", name=sweep_dir.name, results=tmp_path)
    plan = SweepRecord.read(sweep_dir).plan
    staging = ray_staging(tmp_path, "a save")
    fill_disk(lambda path: backup_dir(sweep_dir) in path.parents)

    def fit() -> list:  # Tune's loop on the driver, as far as lmtune's callback that keeps Ray's state
        RayStateBackup(sweep_dir).keep(staging)
        return []

    result = fit_sweep(fit, options, SweepStorage(options.storage_path, options.name), plan, reserve=0)
    code = print_result(result, options)
    out = capsys.readouterr().out.strip().splitlines()
    assert result.stopped_by == DISK_FULL and code == 1
    assert out[-2].startswith(f"sweep stopped: no space left on the disk of {backup_dir(sweep_dir)} to write "
                              "snapshot-"), out
    assert f"(needs {len(json.dumps({'state': 'a save'}))} B; " in out[-2]
    assert " free); free space, then resume; unfinished trials keep their newest checkpoint" in out[-2]
    assert out[-1] == f"resume it with: python -m lmtune.run --name disk --resume --results {tmp_path}"
    assert SweepRecord.read(sweep_dir).ended["stopped_by"] == DISK_FULL
    assert leftovers(sweep_dir) == []


# ---------------------------------------------------------------------------------------------
# train


def test_a_full_disk_during_train_is_one_line_naming_the_checkpoint_and_the_resume(
        builtin_data, tmp_path, fill_disk, capsys):
    out = tmp_path / "run"
    fill_disk(lambda path: "step_00000020.pt" in path.name)  # (the first, at step 10, is written whole)
    code = train_cli.main(["--data", str(builtin_data), "--out", str(out), "--quiet", *set_args(TINY)])
    line = one_disk_full_line(code, capsys.readouterr().err, f"of {out / 'checkpoints'} to write step_00000020.pt",
                              "MB; ", " free)", f"python -m lmtune.train --resume --out {out}")
    assert "step 10" in line
    assert leftovers(out) == []


def test_a_full_disk_before_trains_first_checkpoint_says_there_is_nothing_to_resume(
        builtin_data, tmp_path, fill_disk, capsys):
    out = tmp_path / "run"
    fill_disk(lambda path: "step_00000010.pt" in path.name)
    code = train_cli.main(["--data", str(builtin_data), "--out", str(out), "--quiet", *set_args(TINY)])
    line = one_disk_full_line(code, capsys.readouterr().err, "to write step_00000010.pt", "no checkpoint")
    assert "--resume" not in line


# ---------------------------------------------------------------------------------------------
# analyze


def previous_report(sweep_dir: Path) -> Path:
    """The sweep's report folder as an earlier analyze left it (its marker, its text and tables: bytes only)."""
    report = sweep_dir / "report"
    report.mkdir()
    (report / ".lmtune-report").write_text(json.dumps({"sweep": str(sweep_dir.resolve())}) + "\n")
    for name in ("lr_sweep_analysis.md", "summary.json", "summary.csv", "lr_vs_loss.png"):
        (report / name).write_text(f"the earlier {name}\n")
    return report


def test_a_full_disk_during_analyze_is_one_line_without_resume_and_leaves_no_report(tmp_path, fill_disk, capsys):
    sweep_dir = disk_sweep(tmp_path, SWEEP)
    fill_disk(lambda path: "summary.csv" in path.name)  # (the last file written)
    code = analyze.main([str(sweep_dir), "--x", "tokens"])
    line = one_disk_full_line(code, capsys.readouterr().err, f"of {sweep_dir / 'report'} to write summary.csv",
                              "B; ", " free)", "run analyze again", "nothing was written")
    assert "resume" not in line
    assert not (sweep_dir / "report").exists() and leftovers(sweep_dir) == []


def test_a_full_disk_during_analyze_leaves_the_previous_report_as_it_was(tmp_path, fill_disk, capsys):
    sweep_dir = disk_sweep(tmp_path, SWEEP)
    before = snapshot(previous_report(sweep_dir))
    fill_disk(lambda path: "summary.csv" in path.name)
    one_disk_full_line(analyze.main([str(sweep_dir), "--x", "tokens"]), capsys.readouterr().err,
                       "to write summary.csv", "the previous report in")
    assert snapshot(sweep_dir / "report") == before and leftovers(sweep_dir) == []


def test_a_report_figure_whose_path_is_a_folder_is_one_line_and_leaves_the_report_as_it_was(tmp_path, capsys):
    sweep_dir = disk_sweep(tmp_path, SWEEP)
    figure = previous_report(sweep_dir) / "lr_vs_loss.png"
    figure.unlink()
    (figure / "inside").mkdir(parents=True)
    before = snapshot(sweep_dir / "report")
    assert_refused(analyze.main, [str(sweep_dir), "--x", "tokens"], capsys, f"{figure} is a folder",
                   "remove or rename it")
    assert snapshot(sweep_dir / "report") == before and leftovers(sweep_dir) == []


def test_a_staging_folder_a_killed_analyze_left_goes_with_the_next_report_written_there(tmp_path):
    stale = tmp_path / "report" / ".lmtune-staging-999999999"  # (no such process)
    stale.mkdir(parents=True)
    (stale / "summary.json").write_text("{")
    with staged_folder(tmp_path / "report") as staged:
        (staged / "summary.json").write_text("{}")
    assert [p.name for p in (tmp_path / "report").iterdir()] == ["summary.json"]


# ---------------------------------------------------------------------------------------------
# Anywhere else


def test_an_atomic_write_onto_a_folder_is_one_line_and_leaves_no_temporary_file(tmp_path):
    (tmp_path / "figure.png").mkdir()
    with pytest.raises(LmtuneError, match=f"{tmp_path / 'figure.png'} is a folder"):
        atomic_write_bytes(tmp_path / "figure.png", b"png")
    assert [p.name for p in tmp_path.iterdir()] == ["figure.png"]


def test_any_commands_full_disk_is_one_line_with_the_free_space_and_exit_status_1(tmp_path, capsys):
    @cli_entry
    def main(argv: list[str]) -> int:
        with open(tmp_path / "out.bin", "wb") as handle:
            handle.flush()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "out.bin"))

    line = one_disk_full_line(main([]), capsys.readouterr().err, f"of {tmp_path} to write out.bin", " free)",
                              "free space, then run the command again")
    assert "resume" not in line
