"""What a hostile tester tried (part seven) on the data and bench commands: ``prepare`` on a full disk, flags that
do nothing (``--dtype`` with a .npy, a tokenizer smaller than the model's vocabulary), inputs that are not what they
claim (a text file named .npy, a binary --space file, a dashboard address that is none) and a batch no memory holds.
Each is one line naming the problem and the fix; a full disk leaves nothing partial and no temporary file behind."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY, assert_refused

from lmtune import bench, prepare, run, sample
from lmtune.data.prepare import prepare_tokens
from lmtune.errors import LmtuneError
from lmtune.sweep.preflight import check_dashboard_host
from lmtune.sweep.spaces import load_space
from lmtune.training.config import budget_config
from lmtune.training.loop import train

STORY = "Once upon a time a cat sat on a mat and looked at the moon.\n<|endoftext|>\n"


def fill_disk_under(monkeypatch: pytest.MonkeyPatch, folder: Path, room: int = 0) -> None:
    """Writes to files under ``folder`` find the disk full once ``room`` bytes went in (injected at the lowest write,
    ``os.write``: what a real full disk answers)."""
    real_write, written = os.write, [0]

    def write(fd: int, data) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(folder)):
            if written[0] + len(data) > room:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            written[0] += len(data)
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)


def leftovers(folder: Path) -> list[str]:
    """Temporary files and folders anywhere under ``folder``."""
    return [str(p.relative_to(folder)) for p in folder.rglob("*") if ".tmp" in p.name]


# --------------------------------------------------------------------------- item 4: a full disk


def test_prepare_on_a_full_disk_is_one_line_naming_the_file_and_the_room_it_needs_and_leaves_nothing(
        tmp_path, capsys, monkeypatch):
    text = tmp_path / "train.txt"
    text.write_text(STORY * 400)
    fill_disk_under(monkeypatch, tmp_path / "disk", room=1000)
    assert_refused(prepare.main, ["--input", str(text), "--out", str(tmp_path / "disk" / "data"), "--vocab-size",
                                  "300"], capsys, "no space left", "train.bin", "needs up to", "free")
    assert not (tmp_path / "disk" / "data").exists() and leftovers(tmp_path) == []


def test_prepare_over_old_data_on_a_full_disk_leaves_the_old_data_as_it_was(tmp_path, capsys, monkeypatch):
    np.save(tmp_path / "ids.npy", np.arange(5000, dtype=np.uint16) % 300)
    out = prepare_tokens(tmp_path / "ids.npy", tmp_path / "disk" / "data")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    fill_disk_under(monkeypatch, tmp_path / "disk")
    assert_refused(prepare.main, ["--tokens", str(tmp_path / "ids.npy"), "--out", str(out), "--force", "--vocab-size",
                                  "400"], capsys, "no space left", "train.bin", "the data needs 9.8 KiB")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert leftovers(tmp_path) == []


def test_the_built_in_corpus_on_a_full_disk_is_one_line_and_leaves_no_partial_text(tmp_path, capsys, monkeypatch):
    fill_disk_under(monkeypatch, tmp_path, room=1 << 20)
    assert_refused(prepare.main, ["--out", str(tmp_path / "builtin")], capsys, "no space left", "stories.txt",
                   "MiB")
    assert not (tmp_path / "builtin" / "stories.txt").exists() and leftovers(tmp_path) == []


# --------------------------------------------------------------------------- item 9: one line, not a traceback


def test_bench_refuses_a_batch_no_memory_holds_before_allocating_it(capsys, monkeypatch):
    def timing_run(*args, **kwargs):
        raise AssertionError("the timing run started: its batch was allocated")

    monkeypatch.setattr(bench, "run_bench", timing_run)
    assert_refused(bench.main, ["--budget", "quick", "--batch-size", "100000000", "--device", "cpu"], capsys,
                   "--batch-size 100000000", "GiB", "free", "batch_size")


def test_a_binary_search_space_file_is_one_line_saying_it_is_not_text(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(LmtuneError, match="not UTF-8 text") as refused:
        load_space(str(path))
    assert str(path) in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("host", ["999.1.1.1", "no-such-host.invalid", "8.8.8.8", ""])
def test_a_dashboard_host_this_machine_cannot_listen_on_is_one_line(host):
    with pytest.raises(LmtuneError, match="--dashboard-host") as refused:
        check_dashboard_host(host)
    assert "127.0.0.1" in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0", "localhost", "::1"])
def test_a_dashboard_host_of_this_machine_is_taken(host):
    check_dashboard_host(host)


def test_run_refuses_a_bad_dashboard_host_before_ray_starts(tmp_path, capsys, monkeypatch):
    def sweep(*args, **kwargs):
        raise AssertionError("the sweep started")

    monkeypatch.setattr(run, "run_sweep", sweep)
    assert_refused(run.main, ["--dashboard-host", "999.1.1.1", "--results", str(tmp_path)], capsys,
                   "--dashboard-host '999.1.1.1'")


# --------------------------------------------------------------------------- item 11: flags that do nothing


def test_prepare_refuses_dtype_with_a_npy_which_carries_its_own(tmp_path, capsys):
    np.save(tmp_path / "ids.npy", np.arange(1000, dtype=np.uint16))
    assert_refused(prepare.main, ["--tokens", str(tmp_path / "ids.npy"), "--dtype", "uint32", "--out",
                                  str(tmp_path / "data")], capsys, "--dtype", "ids.npy", ".npy", "uint16", ".bin")
    assert not (tmp_path / "data").exists()


@pytest.fixture(scope="module")
def padded_run(tmp_path_factory) -> tuple[Path, Path]:
    """(best.pt, the data's tokenizer.json) of a short run whose model vocabulary, 320, is padded above the 300 ids
    its data holds and its tokenizer has."""
    from tokenizers import Tokenizer, models

    root = tmp_path_factory.mktemp("padded")
    tokenizer = root / "tokenizer.json"
    Tokenizer(models.WordLevel({f"w{i}": i for i in range(300)}, unk_token="w0")).save(str(tokenizer))
    np.save(root / "ids.npy", np.random.default_rng(0).integers(0, 300, size=20_000, dtype=np.uint16))
    data = prepare_tokens(root / "ids.npy", root / "data", vocab_size=320, tokenizer=tokenizer)
    settings = {**TINY, "steps": 2, "warmup_steps": 1, "eval_interval": 2, "checkpoint_interval": 2,
                "log_interval": 1}
    train(budget_config("quick", settings, data_dir=str(data)), root / "run")
    return root / "run" / "checkpoints" / "best.pt", tokenizer


def test_sample_refuses_a_tokenizer_smaller_than_the_models_vocabulary_naming_both_sizes(
        padded_run, tmp_path, capsys):
    from tokenizers import Tokenizer, models

    small = tmp_path / "small.json"
    Tokenizer(models.WordLevel({f"w{i}": i for i in range(100)}, unk_token="w0")).save(str(small))
    assert_refused(sample.main, [str(padded_run[0]), "--prompt-ids", "1,2", "--tokenizer", str(small)], capsys,
                   "--tokenizer", "100 tokens", "320", "vocabulary")


def test_sample_takes_the_datas_own_tokenizer_where_the_models_vocabulary_is_padded_above_it(padded_run, capsys):
    assert sample.main([str(padded_run[0]), "--prompt-ids", "1,2", "--max-tokens", "3", "--tokenizer",
                        str(padded_run[1])]) == 0
    assert capsys.readouterr().out.startswith("w1 w2")


# --------------------------------------------------------------------------- item 13: minor


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_a_prepared_data_folder_gets_the_users_umask_like_the_built_in_one(tmp_path, umask):
    np.save(tmp_path / "ids.npy", np.arange(1000, dtype=np.uint16))
    before = os.umask(umask)
    try:
        out = prepare_tokens(tmp_path / "ids.npy", tmp_path / "data")
    finally:
        os.umask(before)
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask
    assert (out / "meta.json").stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_text_file_named_npy_is_one_line_saying_what_it_is_not_without_numpys_advice(tmp_path, capsys):
    (tmp_path / "ids.npy").write_text("1 2 3 4 5\n")
    line = assert_refused(prepare.main, ["--tokens", str(tmp_path / "ids.npy"), "--out", str(tmp_path / "data")],
                          capsys, "not a .npy array", "numpy.save", ".bin")
    assert "pickle" not in line
