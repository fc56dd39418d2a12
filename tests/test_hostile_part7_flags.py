"""What a hostile tester tried (part seven) on the commands' flags: a single-value option given twice was the last
one kept and the first dropped without a word (``prepare --input train.txt --input valid.txt`` trained on the
validation text alone). Every such option now refuses a repeat in one line; options that take several values say
how to give them."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import assert_refused

from lmtune import analyze, prepare, run, sample, train


def test_an_option_that_takes_several_files_refuses_a_second_flag_and_shows_the_one_flag_form(tmp_path, capsys):
    line = assert_refused(prepare.main, ["--input", "train.txt", "--input", "valid.txt", "--out", str(tmp_path)],
                          capsys, "--input is given twice", "'train.txt', then 'valid.txt'")
    assert "--input train.txt valid.txt" in line
    assert not list(tmp_path.iterdir())


def test_the_same_input_file_named_twice_is_refused_however_it_is_written(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("train.txt").write_text("a story.\n")
    assert_refused(prepare.main, ["--input", "train.txt", "./train.txt", "--out", "data"], capsys,
                   "--input 'train.txt' is given twice", "once")
    assert not Path("data").exists()


@pytest.mark.parametrize(("main", "argv", "option"), [
    (prepare.main, ["--val-input", "a.txt", "--val-input", "b.txt"], "--val-input"),
    (prepare.main, ["--tokens", "a.npy", "--tokens", "b.npy"], "--tokens"),
    (run.main, ["--space", "quick", "--name", "a", "--name", "b"], "--name"),
    (train.main, ["--budget", "quick", "--budget", "full"], "--budget"),
    (sample.main, ["ckpt.pt", "--prompt", "Once", "--prompt", "Twice"], "--prompt"),
    (analyze.main, ["--runs", "a.csv", "--runs", "b.csv"], "--runs"),
])
def test_a_single_value_option_given_twice_is_one_line_naming_both_values(main, argv, option, capsys):
    assert_refused(main, argv, capsys, f"{option} is given twice", "give it once")


def test_two_lrs_for_one_named_run_are_refused(tmp_path, capsys):
    assert_refused(analyze.main, ["--runs", str(tmp_path / "runs.csv"), "--lr-of", "big=0.03", "--lr-of", "big=0.3"],
                   capsys, "--lr-of 'big' is given twice", "0.03, then 0.3")


def test_a_prompt_as_text_and_as_ids_together_are_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        sample.main(["ckpt.pt", "--prompt", "Once", "--prompt-ids", "1"])
    assert exit_.value.code == 2
    assert "--prompt-ids: not allowed with argument --prompt" in capsys.readouterr().err


def test_an_option_given_once_parses_as_before_and_leaves_nothing_behind():
    args = prepare.build_parser().parse_args(["--input", "a.txt", "b.txt", "--out", "data"])
    assert args.input == [Path("a.txt"), Path("b.txt")]
    assert not any(name.startswith("_") for name in vars(args))
