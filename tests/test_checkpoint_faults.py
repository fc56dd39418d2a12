"""A training run's checkpoints under faults: SIGKILL in the middle of checkpoint writes never leaves a partial one
that a resumed run loads, and a damaged newest checkpoint is skipped for the previous good one, with a warning.
Real processes and real torch; no Ray (tests/test_faults.py has the sweep's faults)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import run_lmtune, sigkill, start_lmtune, wait_until
from faults import note

from lmtune.training import checkpoint as ckpt
from lmtune.training.loop import train
from lmtune.training.metrics import read_metrics

# =============================================================================================
# A checkpoint write killed at random moments; corrupt checkpoints


BIG = ["d_model=192", "d_ff=768", "n_layers=3", "n_heads=4", "context_length=32", "batch_size=4", "steps=60",
       "warmup_steps=2", "log_interval=2", "eval_interval=60", "eval_batches=1", "checkpoint_interval=2",
       "keep_checkpoints=2", "device=cpu", "compile=off"]


def _newest_verified(directory: Path) -> Path | None:
    for path in reversed(ckpt.periodic_checkpoints(directory)):
        try:
            ckpt.load_checkpoint(path)
            return path
        except ValueError:
            continue
    return None


def _state(pid: int) -> str:
    """A live process's state letter (R running, S sleeping, T stopped, ...)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _kill_mid_write(proc: subprocess.Popen, cdir: Path) -> Path:
    """SIGKILL ``proc`` in the middle of a checkpoint write: frozen (SIGSTOP) the moment its temp checkpoint file
    is seen and, if the file is still there once it stands still, killed; else let go until its next write.
    Returns the temp file of the write it never finished."""
    pattern = f".step_*.pt.tmp-{proc.pid}"
    while True:
        wait_until(lambda: any(cdir.glob(pattern)), proc, 60, "a checkpoint write", poll_s=0.001)
        os.kill(proc.pid, signal.SIGSTOP)
        wait_until(lambda: _state(proc.pid) == "T", proc, 10, "the writer stopped", poll_s=0.001)
        unfinished = sorted(cdir.glob(pattern))
        if unfinished:
            sigkill(proc)
            return unfinished[0]
        os.kill(proc.pid, signal.SIGCONT)  # (it finished that write between our look and the stop)


@pytest.mark.slow
def test_sigkill_at_random_moments_of_checkpoint_writes_never_loads_a_partial_one(builtin_data, tmp_path):
    """A ~40 MB checkpoint every 2 steps (3.2M-param model with AdamW state), and the training
    process SIGKILLed 4 times: every other round in the middle of a checkpoint write (_kill_mid_write: each
    such round leaves an unfinished write), the others at a random delay. After each kill every step_*.pt
    either verifies or is one load_latest skips, and an unfinished write is never what it loads; the next
    --resume continues from exactly the newest complete one; the last round completes with every step
    logged once."""
    out = tmp_path / "run"
    cdir = out / "checkpoints"
    common = ["--data", str(builtin_data), "--out", str(out), *sum((["--set", s] for s in BIG), [])]
    rng = random.Random(5)
    unfinished_writes, rounds, resumed_from = [], 4, []
    for round_index in range(rounds):
        expected = _newest_verified(cdir)
        proc = start_lmtune("train", *common, *(["--resume"] if round_index else []), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
        try:
            before = set(p.name for p in cdir.glob("*")) if cdir.exists() else set()

            def new_checkpoint(before=before) -> bool:
                return cdir.exists() and bool(set(p.name for p in cdir.glob("step_*.pt.sha256")) - before)

            # Wait for this process's first new checkpoint (so each round makes progress).
            wait_until(new_checkpoint, proc, 180, "new checkpoint", poll_s=0.005)
            if round_index % 2 == 0:
                _kill_mid_write(proc, cdir)
            else:
                time.sleep(rng.uniform(0.0, 1.5))
                sigkill(proc)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            stderr = proc.stderr.read()
            proc.stderr.close()
        # Every periodic checkpoint left either verifies or is skipped by load_latest.
        found = ckpt.load_latest(cdir)
        assert found is not None
        state, path = found
        # ...and what it returns is the newest one that verifies: every newer file fails verification.
        assert path == _newest_verified(cdir)
        for candidate in ckpt.periodic_checkpoints(cdir):
            if candidate.name > path.name:
                with pytest.raises(ValueError):
                    ckpt.load_checkpoint(candidate)
        assert state["step"] == int(path.stem.split("_")[1])
        # A temp checkpoint named after the killed process is a write it never finished: what is loaded is older.
        for unfinished in cdir.glob(f".step_*.pt.tmp-{proc.pid}"):
            step = int(unfinished.name.split("_")[1].split(".")[0])
            assert state["step"] < step, (unfinished.name, path.name)
            unfinished_writes.append(unfinished.name)
        assert round_index % 2 or any(f"tmp-{proc.pid}" in name for name in unfinished_writes), round_index
        if round_index:
            log_text = (out / "training.log").read_text()
            resumes = re.findall(r"resuming from (\S+)", log_text)
            assert resumes and Path(resumes[-1]).name == expected.name, (resumes[-3:], expected, stderr[-1500:])
            resumed_from.append(expected.name)

    proc = run_lmtune("train", *common, "--resume", "--quiet", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 60
    steps = [r["step"] for r in read_metrics(out / "metrics.csv")]
    assert steps == sorted(set(steps)) and steps[-1] == 60
    note(f"train SIGKILL x{rounds}: {len(unfinished_writes)} kills with a checkpoint write in flight "
         f"({unfinished_writes}); resumed from {resumed_from}; no partial checkpoint loaded; completed 60/60 steps")


@pytest.fixture(scope="module")
def three_checkpoints(make_tiny_config, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ckpts")
    train(make_tiny_config(keep_checkpoints=3), out)
    assert [p.name for p in ckpt.periodic_checkpoints(out / "checkpoints")] == [
        "step_00000010.pt", "step_00000020.pt", "step_00000030.pt"]
    return out / "checkpoints"


def _truncate(path: Path) -> None:
    with open(path, "r+b") as handle:
        handle.truncate(path.stat().st_size // 2)


def _garbage_stale_checksum(path: Path) -> None:
    path.write_bytes(os.urandom(path.stat().st_size))


def _no_checksum(path: Path) -> None:
    ckpt.checksum_path(path).unlink()


def _garbage_matching_checksum(path: Path) -> None:
    """Corrupt data whose checksum matches (written by a buggy tool): only the load can tell."""
    data = b"not a torch file" + os.urandom(1000)
    path.write_bytes(data)
    ckpt.checksum_path(path).write_text(hashlib.sha256(data).hexdigest() + "\n")


@pytest.mark.parametrize("damage", [_truncate, _garbage_stale_checksum, _no_checksum, _garbage_matching_checksum],
                         ids=["truncated", "garbage-stale-sha256", "no-sha256", "garbage-matching-sha256"])
def test_damaged_newest_checkpoint_is_skipped_for_the_previous_good_one_with_a_warning(
        three_checkpoints, tmp_path, caplog, damage):
    cdir = tmp_path / "checkpoints"
    shutil.copytree(three_checkpoints, cdir)
    damage(cdir / "step_00000030.pt")
    caplog.set_level(logging.INFO, logger="lmtune")

    state, path = ckpt.load_latest(cdir)

    assert path.name == "step_00000020.pt" and state["step"] == 20
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("skipping" in w and "step_00000030.pt" in w for w in warnings), warnings
