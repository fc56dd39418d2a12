"""The validation split of a student's own data (issue 56 item 1): ``prepare --input TRAIN --val-input VALID`` and
``prepare --tokens train.npy --val-tokens valid.npy [--tokenizer vocab.json]`` make the validation split exactly the
given file's tokens; meta.json, sweep.json and the report say where it came from; every bad input is one line."""

import hashlib
import json
import math
import re
import shlex
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from lmtune import prepare as prepare_cli
from lmtune.data import prepare
from lmtune.data.corpus import stories
from lmtune.data.dataset import describe_validation, read_meta, unigram_loss
from lmtune.data.documents import EOT
from lmtune.data.tokenizer import load_tokenizer
from lmtune.report.sweep_facts import data_description
from lmtune.sweep.sweep_file import DataRecord, SweepRecord

VOCAB = 400


def _stories_file(path, n, seed):
    docs = list(stories.generate_stories(n, seed=seed))
    path.write_text("".join(f"{d}\n<|endoftext|>\n" for d in docs))
    return path, docs


@pytest.fixture(scope="module")
def text_files(tmp_path_factory):
    """A training text and a validation text of other stories, as the handout's two files are."""
    root = tmp_path_factory.mktemp("text")
    train, _ = _stories_file(root / "train.txt", 120, seed=0)
    valid, valid_docs = _stories_file(root / "valid.txt", 20, seed=1)
    return train, valid, valid_docs


@pytest.fixture(scope="module")
def with_val_input(text_files, tmp_path_factory):
    train, valid, _ = text_files
    return prepare.prepare_text([train], tmp_path_factory.mktemp("prepared") / "data", vocab_size=VOCAB,
                                val_input=valid)


def _ids(out, split):
    meta = json.loads((out / "meta.json").read_text())
    return np.fromfile(out / f"{split}.bin", dtype=meta["dtype"])


def _sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def student_tokens(tmp_path_factory):
    """What a CS336 student has after the assignment's first part: their own byte-level BPE saved as a GPT-2-style
    vocab.json + merges.txt, and train.npy / valid.npy encoded with it."""
    root = tmp_path_factory.mktemp("student")
    train_docs = list(stories.generate_stories(120, seed=2))
    valid_docs = list(stories.generate_stories(20, seed=3))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(train_docs, trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=[EOT], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.model.save(str(root))  # vocab.json and merges.txt
    tok.save(str(root / "tokenizer.json"))
    eot = tok.token_to_id(EOT)
    for name, docs in (("train", train_docs), ("valid", valid_docs)):
        ids = [i for d in docs for i in [*tok.encode(d).ids, eot]]
        np.save(root / f"{name}.npy", np.array(ids, dtype=np.uint16))
    (root / "valid.txt").write_text("".join(valid_docs))
    return root, valid_docs


# --------------------------------------------------------------------------- --input with --val-input


def test_val_input_validation_split_is_exactly_the_files_tokens(with_val_input, text_files):
    _, _, valid_docs = text_files
    tok = Tokenizer.from_file(str(with_val_input / "tokenizer.json"))
    eot = tok.token_to_id(EOT)
    expected = [i for d in valid_docs for i in [*tok.encode(d).ids, eot]]
    assert _ids(with_val_input, "val").tolist() == expected


def test_val_input_keeps_every_training_document_in_train(with_val_input, text_files):
    train, _, _ = text_files
    tok = Tokenizer.from_file(str(with_val_input / "tokenizer.json"))
    docs = train.read_text().split("\n<|endoftext|>\n")[:-1]
    expected = [i for d in docs for i in [*tok.encode(d).ids, tok.token_to_id(EOT)]]
    assert _ids(with_val_input, "train").tolist() == expected


def test_val_input_tokenizer_is_trained_on_the_training_text_alone(with_val_input, text_files, tmp_path):
    train, _, _ = text_files
    held_out = prepare.prepare_text([train], tmp_path / "held_out", vocab_size=VOCAB)  # trained on train.txt only
    vocab = Tokenizer.from_file(str(with_val_input / "tokenizer.json")).get_vocab()
    assert vocab == Tokenizer.from_file(str(held_out / "tokenizer.json")).get_vocab()


def test_meta_json_records_the_validation_files_name_hash_and_tokens(with_val_input, text_files):
    _, valid, _ = text_files
    meta = json.loads((with_val_input / "meta.json").read_text())
    assert meta["validation"] == {"source": "file", "tokens": meta["val_tokens"], "file": str(valid),
                                  "sha256": _sha256(valid), "size_bytes": valid.stat().st_size}


def test_unigram_baseline_is_the_training_frequencies_against_the_given_validation_file(with_val_input):
    meta = json.loads((with_val_input / "meta.json").read_text())
    expected = unigram_loss(_ids(with_val_input, "train"), _ids(with_val_input, "val"), meta["vocab_size"])
    assert math.isclose(meta["unigram_loss"], expected)


def test_meta_json_records_a_held_out_split_as_its_share_of_the_training_documents(text_files, tmp_path):
    train, _, _ = text_files
    out = prepare.prepare_text([train], tmp_path / "out", vocab_size=VOCAB, val_fraction=0.05)
    validation = json.loads((out / "meta.json").read_text())["validation"]
    assert (validation["source"], validation["fraction"], validation["unit"]) == ("held_out", 0.05, "documents")
    assert describe_validation(validation).startswith("validation split: 5% of the training documents, held out")


# --------------------------------------------------------------------------- --tokens with --val-tokens


def test_val_tokens_validation_split_is_exactly_the_given_array(student_tokens, tmp_path):
    root, _ = student_tokens
    out = prepare.prepare_tokens(root / "train.npy", tmp_path / "out", val_tokens=root / "valid.npy")
    assert _ids(out, "val").tolist() == np.load(root / "valid.npy").tolist()
    assert _ids(out, "train").tolist() == np.load(root / "train.npy").tolist()


def test_meta_json_records_the_validation_arrays_name_hash_and_tokens(student_tokens, tmp_path):
    root, _ = student_tokens
    out = prepare.prepare_tokens(root / "train.npy", tmp_path / "out", val_tokens=root / "valid.npy")
    meta = json.loads((out / "meta.json").read_text())
    assert meta["validation"] == {"source": "file", "tokens": int(np.load(root / "valid.npy").shape[0]),
                                  "file": str(root / "valid.npy"), "sha256": _sha256(root / "valid.npy"),
                                  "size_bytes": (root / "valid.npy").stat().st_size}


def test_vocab_size_is_the_largest_id_of_either_array_plus_one(tmp_path):
    np.save(tmp_path / "train.npy", np.array([0, 1, 2, 3] * 10, dtype=np.uint16))
    np.save(tmp_path / "valid.npy", np.array([5, 1, 2], dtype=np.uint16))
    out = prepare.prepare_tokens(tmp_path / "train.npy", tmp_path / "out", val_tokens=tmp_path / "valid.npy")
    assert json.loads((out / "meta.json").read_text())["vocab_size"] == 6


def test_gpt2_style_vocab_and_merges_are_converted_so_the_data_decodes(student_tokens, tmp_path):
    root, valid_docs = student_tokens
    out = prepare.prepare_tokens(root / "train.npy", tmp_path / "out", val_tokens=root / "valid.npy",
                                 tokenizer=root / "vocab.json")
    meta = json.loads((out / "meta.json").read_text())
    tok = load_tokenizer(out / "tokenizer.json")  # as lmtune sample and the report's samples read it
    assert (meta["tokenizer"], meta["eot_id"], meta["vocab_size"]) == ("tokenizer.json", tok.token_to_id(EOT), VOCAB)
    assert tok.decode(_ids(out, "val").tolist()) == "".join(valid_docs)


def test_a_tokenizers_json_is_saved_into_the_data_dir(student_tokens, tmp_path):
    root, _ = student_tokens
    out = prepare.prepare_tokens(root / "train.npy", tmp_path / "out", tokenizer=root / "tokenizer.json")
    assert Tokenizer.from_file(str(out / "tokenizer.json")).get_vocab() == \
        Tokenizer.from_file(str(root / "tokenizer.json")).get_vocab()


def test_meta_json_records_a_held_out_token_split_as_the_arrays_last_share(tmp_path):
    np.save(tmp_path / "ids.npy", np.arange(1000, dtype=np.uint16) % 97)
    out = prepare.prepare_tokens(tmp_path / "ids.npy", tmp_path / "out", val_fraction=0.1)
    validation = json.loads((out / "meta.json").read_text())["validation"]
    assert validation == {"source": "held_out", "tokens": 100, "fraction": 0.1, "unit": "tokens",
                          "topped_up": False}


# --------------------------------------------------------------------------- sweep.json and the report


def test_sweep_json_and_the_reports_data_line_state_the_validation_files_source(with_val_input, text_files, tmp_path):
    _, valid, _ = text_files
    SweepRecord(name="s", data=DataRecord(str(with_val_input), read_meta(with_val_input))).write(tmp_path)
    record = SweepRecord.read(tmp_path)  # what the report reads back from sweep.json
    line = data_description(record)
    assert f"validation split: {valid} (SHA-256 {_sha256(valid)}, " in line
    assert "\n" not in line


def test_the_reports_data_line_says_nothing_new_for_a_dir_prepared_before_the_source_was_recorded(with_val_input):
    meta = read_meta(with_val_input)
    old = SweepRecord(name="s", data=DataRecord(str(with_val_input), meta.__class__(
        **{**meta.__dict__, "validation": None})))
    assert "validation split" not in data_description(old)


# --------------------------------------------------------------------------- refusals, one line each


def _refusal(argv, capsys):
    rc = prepare_cli.main([str(a) for a in argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("error: ") and "\n" not in err, err
    return err


def test_val_fraction_with_val_input_is_refused_as_contradictory(text_files, tmp_path, capsys):
    train, valid, _ = text_files
    err = _refusal(["--input", train, "--val-input", valid, "--val-fraction", "0.1", "--out", tmp_path / "o"], capsys)
    assert "--val-fraction and --val-input contradict each other" in err and "drop --val-fraction" in err


def test_val_fraction_with_val_tokens_is_refused_as_contradictory(student_tokens, tmp_path, capsys):
    root, _ = student_tokens
    err = _refusal(["--tokens", root / "train.npy", "--val-tokens", root / "valid.npy", "--val-fraction", "0.1",
                    "--out", tmp_path / "o"], capsys)
    assert "--val-fraction and --val-tokens contradict each other" in err


def test_val_input_with_tokens_is_refused(student_tokens, tmp_path, capsys):
    root, _ = student_tokens
    err = _refusal(["--tokens", root / "train.npy", "--val-input", root / "valid.txt", "--out", tmp_path / "o"],
                   capsys)
    assert "pass the validation ids with --val-tokens" in err


def test_val_tokens_with_input_is_refused(text_files, student_tokens, tmp_path, capsys):
    train, _, _ = text_files
    err = _refusal(["--input", train, "--val-tokens", student_tokens[0] / "valid.npy", "--out", tmp_path / "o"],
                   capsys)
    assert "pass the validation text with --val-input" in err


def test_tokenizer_with_input_is_refused(text_files, student_tokens, tmp_path, capsys):
    train, _, _ = text_files
    err = _refusal(["--input", train, "--tokenizer", student_tokens[0] / "vocab.json", "--out", tmp_path / "o"],
                   capsys)
    assert "--tokenizer goes with --tokens" in err


def test_a_validation_file_for_the_builtin_corpus_is_refused(text_files, capsys):
    err = _refusal(["--val-input", text_files[1]], capsys)
    assert "--val-input: for --input or --tokens only" in err


def test_a_missing_validation_file_is_named(text_files, tmp_path, capsys):
    err = _refusal(["--input", text_files[0], "--val-input", tmp_path / "nope.txt", "--out", tmp_path / "o"], capsys)
    assert "nope.txt does not exist; check the path passed to --val-input" in err


def test_an_empty_validation_file_is_named(text_files, tmp_path, capsys):
    (tmp_path / "empty.txt").write_text("")
    err = _refusal(["--input", text_files[0], "--val-input", tmp_path / "empty.txt", "--out", tmp_path / "o"], capsys)
    assert "empty.txt is empty; pass a file with text in it to --val-input" in err


def test_a_validation_file_without_text_is_named(text_files, tmp_path, capsys):
    (tmp_path / "blank.txt").write_text("\n<|endoftext|>\n   \n")
    err = _refusal(["--input", text_files[0], "--val-input", tmp_path / "blank.txt", "--vocab-size", VOCAB,
                    "--out", tmp_path / "o"], capsys)
    assert "blank.txt holds no text" in err
    assert not (tmp_path / "o").exists()


def test_the_training_file_given_as_validation_file_is_refused(text_files, tmp_path, capsys):
    train = text_files[0]
    err = _refusal(["--input", train, "--val-input", train, "--out", tmp_path / "o"], capsys)
    assert "is the same data as --input" in err


def test_a_missing_validation_array_is_named(student_tokens, tmp_path, capsys):
    err = _refusal(["--tokens", student_tokens[0] / "train.npy", "--val-tokens", tmp_path / "nope.npy",
                    "--out", tmp_path / "o"], capsys)
    assert "nope.npy does not exist; check the path passed to --val-tokens" in err


def test_an_empty_validation_array_is_named(student_tokens, tmp_path, capsys):
    np.save(tmp_path / "none.npy", np.array([], dtype=np.uint16))
    err = _refusal(["--tokens", student_tokens[0] / "train.npy", "--val-tokens", tmp_path / "none.npy",
                    "--out", tmp_path / "o"], capsys)
    assert "none.npy holds 0 token(s)" in err


def test_a_validation_array_of_another_dtype_is_refused(student_tokens, tmp_path, capsys):
    root, _ = student_tokens
    np.save(tmp_path / "valid64.npy", np.load(root / "valid.npy").astype(np.int64))
    err = _refusal(["--tokens", root / "train.npy", "--val-tokens", tmp_path / "valid64.npy", "--out", tmp_path / "o"],
                   capsys)
    assert "valid64.npy holds int64 ids but --tokens" in err and "uint16" in err


def test_a_validation_id_beyond_the_vocab_size_names_the_validation_file(tmp_path, capsys):
    np.save(tmp_path / "train.npy", np.array([0, 1, 2, 3] * 10, dtype=np.uint16))
    np.save(tmp_path / "valid.npy", np.array([1, 9, 2], dtype=np.uint16))
    err = _refusal(["--tokens", tmp_path / "train.npy", "--val-tokens", tmp_path / "valid.npy", "--vocab-size", "4",
                    "--out", tmp_path / "o"], capsys)
    assert "valid.npy contains token id 9 >= --vocab-size 4; pass --vocab-size 10 or more" in err


def test_an_id_beyond_the_tokenizer_names_the_file(student_tokens, tmp_path, capsys):
    root, _ = student_tokens
    np.save(tmp_path / "valid.npy", np.array([1, VOCAB + 5, 2], dtype=np.uint16))
    err = _refusal(["--tokens", root / "train.npy", "--val-tokens", tmp_path / "valid.npy", "--tokenizer",
                    root / "vocab.json", "--out", tmp_path / "o"], capsys)
    assert f"valid.npy contains token id {VOCAB + 5} but the tokenizer" in err


def test_a_vocab_json_without_its_merges_is_refused(student_tokens, tmp_path, capsys):
    (tmp_path / "vocab.json").write_text((student_tokens[0] / "vocab.json").read_text())
    err = _refusal(["--tokens", student_tokens[0] / "train.npy", "--tokenizer", tmp_path / "vocab.json",
                    "--out", tmp_path / "o"], capsys)
    assert "needs its merges.txt beside it" in err


def test_a_prepared_dir_is_not_overwritten_without_force(student_tokens, tmp_path, capsys):
    root, _ = student_tokens
    argv = ["--tokens", root / "train.npy", "--val-tokens", root / "valid.npy", "--out", tmp_path / "o"]
    assert prepare_cli.main([str(a) for a in argv]) == 0
    before = (tmp_path / "o" / "meta.json").read_bytes()
    assert "pass --force" in _refusal(argv, capsys)
    assert (tmp_path / "o" / "meta.json").read_bytes() == before


# --------------------------------------------------------------------------- docs/data.md


DOCS = Path(__file__).resolve().parent.parent / "docs" / "data.md"


def _doc_commands() -> list[list[str]]:
    """The prepare commands docs/data.md shows in its bash blocks (continuations joined, comments and synopsis lines
    with [optional] parts left out)."""
    blocks = re.findall(r"```bash\n(.*?)```", DOCS.read_text(), re.S)
    lines = [line.split("#")[0].strip() for block in blocks for line in block.replace("\\\n", " ").splitlines()]
    return [shlex.split(line)[3:] for line in lines if line.startswith("python -m lmtune.prepare") and "[" not in line]


def test_docs_data_page_shows_prepare_commands_the_command_accepts():
    commands = _doc_commands()
    assert len(commands) >= 4
    for argv in commands:
        prepare_cli.check_combination(prepare_cli.build_parser().parse_args(argv))


def test_docs_data_page_names_every_prepare_option():
    options = [o for a in prepare_cli.build_parser()._actions for o in a.option_strings if o.startswith("--")]
    assert [o for o in options if f"`{o}" not in DOCS.read_text() and o != "--help"] == []
