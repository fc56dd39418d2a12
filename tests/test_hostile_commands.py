"""What a hostile tester tried (part four) on the commands that write one thing somewhere: prepare, bench and
gpu_check check their destination before any work (a read-only folder, a folder under a file, a dangling
symlink), take an empty option value as the wrong value it is, and say what every option is for."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import BENCH_MODEL, assert_refused, docs_text, read_only, set_args, snapshot

from lmtune import bench, gpu_check
from lmtune import prepare as prepare_cli
from lmtune.data import prepare as data_prepare
from lmtune.errors import LmtuneError

REPO = Path(__file__).resolve().parent.parent


def _text(tmp_path: Path) -> Path:
    source = tmp_path / "text.txt"
    source.write_text("one small story.\n<|endoftext|>\nanother small story.\n" * 20)
    return source


# ---------------------------------------------------------------------------------------------
# prepare


def test_prepare_refuses_an_out_in_a_read_only_folder_before_training_a_tokenizer(tmp_path, capsys):
    source = _text(tmp_path)
    with read_only(tmp_path / "locked") as locked:
        assert_refused(prepare_cli.main, ["--input", str(source), "--out", str(locked / "data")], capsys,
                       "cannot write to", "--out")
        assert list(locked.iterdir()) == []


def test_prepare_refuses_an_out_under_a_file(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    assert_refused(prepare_cli.main, ["--input", str(_text(tmp_path)), "--out", str(blocker / "data")], capsys,
                   "which is a file", "--out")


def test_prepare_refuses_tokens_into_a_read_only_out_folder(tmp_path, capsys):
    import numpy as np

    ids = tmp_path / "ids.npy"
    np.save(ids, np.arange(500, dtype=np.int64) % 50)
    with read_only(tmp_path / "locked") as locked:
        assert_refused(prepare_cli.main, ["--tokens", str(ids), "--out", str(locked)], capsys, "cannot write to")


def test_the_built_in_corpus_refuses_a_read_only_folder_in_one_line(tmp_path, capsys):
    with read_only(tmp_path / "locked") as locked:
        assert_refused(prepare_cli.main, ["--out", str(locked / "builtin")], capsys, "cannot write to",
                       "--out")


def test_the_built_in_corpus_a_sweep_builds_refuses_a_read_only_folder_naming_data(tmp_path, capsys):
    with read_only(tmp_path / "locked") as locked, pytest.raises(LmtuneError, match="built-in corpus folder.*--data"):
        data_prepare.ensure_builtin_corpus(locked / "builtin")


def test_prepare_says_what_val_fraction_is():
    assert "validation" in prepare_cli.build_parser().format_help().rsplit("--val-fraction", 1)[1][:200]


def test_a_built_in_corpus_already_in_place_is_used_from_a_read_only_folder(tmp_path, builtin_data, capsys):
    import shutil

    copy = tmp_path / "builtin"
    shutil.copytree(builtin_data, copy, ignore=shutil.ignore_patterns(".lock"))
    with read_only(copy):
        assert data_prepare.ensure_builtin_corpus(copy) == copy


# ---------------------------------------------------------------------------------------------
# bench

BENCH_QUICK = ["--budget", "quick", "--steps", "1", "--repeats", "1", "--warmup", "1", "--device", "cpu",
               "--compile", "off", "--no-naive", "--no-eval", *set_args(BENCH_MODEL)]


def test_bench_refuses_a_results_file_in_a_read_only_folder_before_timing(tmp_path, capsys):
    with read_only(tmp_path / "locked") as locked:
        line = assert_refused(bench.main, [*BENCH_QUICK, "--record", "--results-file", str(locked / "r.jsonl")],
                              capsys, "cannot write to", "--results-file")
    assert "tokens/s" not in capsys.readouterr().out, line


def test_bench_refuses_a_results_file_that_is_a_folder(tmp_path, capsys):
    assert_refused(bench.main, [*BENCH_QUICK, "--record", "--results-file", str(tmp_path)], capsys,
                   "is a folder", "--results-file")


def test_bench_takes_an_empty_project_as_an_unknown_device_not_as_no_projection(capsys):
    assert_refused(bench.main, ["--project", ""], capsys, "--project", "choose one of")


def test_bench_names_its_model_and_budget_with_budget_as_run_and_train_do(capsys):
    assert bench.main(["--budget", "quick", "--project", "h100", "--json"]) == 0
    by_budget = capsys.readouterr().out
    assert bench.main(["--config", "quick", "--project", "h100", "--json"]) == 0
    assert capsys.readouterr().out == by_budget


def test_bench_says_what_compile_mode_is():
    assert "torch.compile" in bench.build_parser().format_help().rsplit("--compile-mode", 1)[1][:300]


# ---------------------------------------------------------------------------------------------
# gpu_check: its run takes minutes on a GPU, so its destination is checked before the first step


def test_gpu_check_refuses_a_dangling_symlink_as_out_and_writes_nothing_at_its_target(tmp_path, capsys):
    link = tmp_path / "report.json"
    link.symlink_to(tmp_path / "elsewhere" / "target.json")
    assert_refused(gpu_check.main, ["--out", str(link)], capsys, "symlink", "--out")
    assert not (tmp_path / "elsewhere").exists()
    assert capsys.readouterr().out == ""


def test_gpu_check_refuses_an_out_in_a_read_only_folder_before_its_first_step(tmp_path, capsys):
    with read_only(tmp_path / "locked") as locked:
        before = snapshot(locked)
        assert_refused(gpu_check.main, ["--out", str(locked / "report.json")], capsys, "cannot write to")
        assert snapshot(locked) == before


def test_gpu_check_refuses_a_folder_as_out(tmp_path, capsys):
    assert_refused(gpu_check.main, ["--out", str(tmp_path)], capsys, "is a folder")


# ---------------------------------------------------------------------------------------------
# the README


def test_every_module_the_readme_names_exists():
    text = docs_text()
    named = set(re.findall(r"`((?:lmtune/)?(?:[a-z_]+/)+[a-z_]+\.py)`", text))
    missing = [name for name in named
               if not (REPO / name).exists() and not (REPO / "lmtune" / name).exists()]
    assert named and not missing, missing


def test_the_readme_counts_the_commands_there_are():
    from lmtune.cli import COMMANDS

    text = docs_text()
    words = {5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine", 10: "ten"}
    assert f"the {words[len(COMMANDS)]} commands" in text


def test_the_readme_says_no_gpus_per_trial_value_it_refuses():
    assert "0 hides every GPU" not in docs_text()


@pytest.mark.parametrize("module", ["bench", "diagnose"])
def test_the_budget_option_is_called_budget_everywhere(module):
    import importlib

    parser = importlib.import_module(f"lmtune.{module}").build_parser()
    assert "--budget" in parser.format_help()
