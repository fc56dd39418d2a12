import json

import numpy as np
import pytest
from tokenizers import Tokenizer

from lmtune import prepare as prepare_cli
from lmtune.data import documents, prepare
from lmtune.data.corpus import stories
from lmtune.errors import LmtuneError


def _docs_file(tmp_path, n=300, seed=0):
    docs = list(stories.generate_stories(n, seed=seed))
    path = tmp_path / "in.txt"
    path.write_text("".join(f"{d}\n<|endoftext|>\n" for d in docs))
    return path, docs


def _decode_docs(out, split):
    meta = json.loads((out / "meta.json").read_text())
    ids = np.fromfile(out / f"{split}.bin", dtype=meta["dtype"]).tolist()
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    docs, cur = [], []
    for i in ids:
        if i == meta["eot_id"]:
            docs.append(tok.decode(cur))
            cur = []
        else:
            cur.append(i)
    assert cur == []  # every document ends with <|endoftext|>
    return docs


def test_text_round_trips_through_ids_back_to_the_documents(tmp_path):
    path, docs = _docs_file(tmp_path)
    out = prepare.prepare_text([path], tmp_path / "out", vocab_size=1000, val_fraction=0.05)
    train, val = _decode_docs(out, "train"), _decode_docs(out, "val")
    assert len(val) >= 1 and len(train) >= 1
    assert sorted(train + val) == sorted(docs)
    assert train == [d for d in docs if d in set(train)]  # document order is kept within a split


def test_meta_json_describes_the_uint16_files(tmp_path):
    path, _ = _docs_file(tmp_path, n=100)
    out = prepare.prepare_text([path], tmp_path / "out", vocab_size=600)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["dtype"] == "uint16"
    assert meta["vocab_size"] <= 600
    assert meta["train_tokens"] * 2 == (out / "train.bin").stat().st_size
    assert meta["val_tokens"] * 2 == (out / "val.bin").stat().st_size
    assert meta["val_tokens"] > 0
    assert meta["eot_id"] == 0
    assert meta["max_token_id"] < meta["vocab_size"]
    assert meta["sources"] == [{"name": str(path), "size_bytes": path.stat().st_size}]
    assert meta["tokenizer"] == "tokenizer.json"
    assert meta["created_by"] == "lmtune.prepare"
    assert len(meta["content_hash"]) == 64


def test_single_document_is_split_by_tokens_into_train_and_val(tmp_path):
    path = tmp_path / "one.txt"
    path.write_text("Just one small document without any separator line.\n" * 20)
    out = prepare.prepare_text([path], tmp_path / "out", vocab_size=300)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["train_tokens"] > 0 and meta["val_tokens"] > 0


def test_the_validation_split_is_at_least_a_tenth_of_a_small_input_in_whole_documents(tmp_path):
    path, docs = _docs_file(tmp_path, n=300)
    out = prepare.prepare_text([path], tmp_path / "out", vocab_size=600, val_fraction=0.001)
    meta = json.loads((out / "meta.json").read_text())
    total = meta["train_tokens"] + meta["val_tokens"]
    assert total < 10 * documents.MIN_VAL_TOKENS  # so a tenth of it is the minimum here
    assert meta["val_tokens"] >= total // 10 > 0.001 * total
    train, val = _decode_docs(out, "train"), _decode_docs(out, "val")
    assert sorted(train + val) == sorted(docs)  # no document was cut in two


def test_streaming_with_tiny_chunks_equals_whole_file_encoding(tmp_path):
    path, docs = _docs_file(tmp_path, n=200)
    # One document far longer than a chunk exercises the cut inside a document.
    long_doc = "\n".join(docs[:30])
    path.write_text(path.read_text() + long_doc + "\n<|endoftext|>\n")
    assert path.stat().st_size > 10 * 4096
    small = prepare.prepare_text([path], tmp_path / "small", vocab_size=800, chunk_bytes=4096)
    whole = prepare.prepare_text([path], tmp_path / "whole", vocab_size=800, chunk_bytes=1 << 30)
    for name in ("train.bin", "val.bin", "tokenizer.json"):
        assert (small / name).read_bytes() == (whole / name).read_bytes()
    assert long_doc in _decode_docs(small, "train") + _decode_docs(small, "val")


def test_text_without_line_breaks_streams_in_bounded_pieces_with_the_same_ids(tmp_path):
    # One line of 300 kB: before, the whole file became one piece (a 20 MB file peaked at 4 GB).
    path = tmp_path / "oneline.txt"
    path.write_text(" ".join(stories.generate_stories(300, seed=1)).replace("\n", " "))
    assert "\n" not in path.read_text() and path.stat().st_size > 40 * 4096
    pieces = [text for text, _ in documents.iter_pieces(path, chunk_bytes=4096)]
    assert "".join(pieces) == path.read_text()
    assert max(len(piece) for piece in pieces) <= 2 * 4096
    small = prepare.prepare_text([path], tmp_path / "small", vocab_size=600, chunk_bytes=4096)
    whole = prepare.prepare_text([path], tmp_path / "whole", vocab_size=600, chunk_bytes=1 << 30)
    for name in ("train.bin", "val.bin", "tokenizer.json"):
        assert (small / name).read_bytes() == (whole / name).read_bytes()


def test_text_without_any_whitespace_still_streams_in_bounded_pieces(tmp_path):
    path = tmp_path / "blob.txt"
    path.write_text("ab<|endoftext|>cd" * 20_000)  # separators mid-line are text, not document breaks
    pieces = list(documents.iter_pieces(path, chunk_bytes=4096))
    assert "".join(text for text, _ in pieces) == path.read_text()
    assert max(len(text) for text, _ in pieces) <= 2 * 4096
    assert [ends for _, ends in pieces].count(True) == 1  # one document


def test_tokens_npy_is_split_into_train_and_val_without_a_tokenizer(tmp_path):
    ids = np.arange(1000, dtype=np.int64) % 97
    np.save(tmp_path / "ids.npy", ids)
    out = prepare.prepare_tokens(tmp_path / "ids.npy", tmp_path / "out", val_fraction=0.1)
    meta = json.loads((out / "meta.json").read_text())
    assert (meta["vocab_size"], meta["dtype"], meta["tokenizer"]) == (97, "uint16", None)
    assert (meta["train_tokens"], meta["val_tokens"]) == (900, 100)
    assert np.array_equal(np.fromfile(out / "train.bin", dtype=np.uint16), ids[:900])
    assert np.array_equal(np.fromfile(out / "val.bin", dtype=np.uint16), ids[900:])


def test_tokens_with_an_id_above_65535_are_stored_as_uint32(tmp_path):
    ids = np.array([1, 2, 70_000, 3, 4, 5], dtype=np.int64)
    np.save(tmp_path / "ids.npy", ids)
    assert prepare_cli.main(["--tokens", str(tmp_path / "ids.npy"), "--out", str(tmp_path / "out")]) == 0
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert (meta["dtype"], meta["vocab_size"], meta["max_token_id"]) == ("uint32", 70_001, 70_000)
    both = np.concatenate([np.fromfile(tmp_path / "out" / f"{s}.bin", dtype=np.uint32) for s in ("train", "val")])
    assert np.array_equal(both, ids)


def test_raw_bin_tokens_are_read_as_uint16(tmp_path):
    np.arange(50, dtype=np.uint16).tofile(tmp_path / "ids.bin")
    out = prepare.prepare_tokens(tmp_path / "ids.bin", tmp_path / "out", vocab_size=100)
    meta = json.loads((out / "meta.json").read_text())
    assert (meta["vocab_size"], meta["train_tokens"] + meta["val_tokens"]) == (100, 50)


def test_refuses_to_overwrite_a_prepared_dir_without_force(tmp_path):
    path, _ = _docs_file(tmp_path, n=50)
    out = prepare.prepare_text([path], tmp_path / "out", vocab_size=400)
    before = (out / "meta.json").read_bytes()
    with pytest.raises(LmtuneError, match="already holds prepared data.*--force"):
        prepare.prepare_text([path], out, vocab_size=400)
    assert (out / "meta.json").read_bytes() == before
    prepare.prepare_text([path], out, vocab_size=500, force=True)
    assert json.loads((out / "meta.json").read_text())["vocab_size"] <= 500
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.tmp")]  # temp dir cleaned up


def test_refuses_to_replace_token_files_a_user_put_in_out_without_force(tmp_path):
    path, _ = _docs_file(tmp_path, n=50)
    out = tmp_path / "mine"
    out.mkdir()
    (out / "train.bin").write_bytes(b"my own tokens")
    with pytest.raises(LmtuneError, match="already holds train.bin.*--force"):
        prepare.prepare_text([path], out, vocab_size=400)
    assert (out / "train.bin").read_bytes() == b"my own tokens"
    prepare.prepare_text([path], out, vocab_size=400, force=True)
    assert (out / "meta.json").exists()


def test_missing_input_file_is_named_in_the_error(tmp_path):
    with pytest.raises(LmtuneError, match=r"nope\.txt does not exist"):
        prepare.prepare_text([tmp_path / "nope.txt"], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_empty_input_file_is_named_in_the_error(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(LmtuneError, match=r"empty\.txt is empty"):
        prepare.prepare_text([tmp_path / "empty.txt"], tmp_path / "out")


def test_unreadable_npy_is_named_in_the_error(tmp_path):
    (tmp_path / "bad.npy").write_bytes(b"not a numpy file at all")
    with pytest.raises(LmtuneError, match=r"cannot read .*bad\.npy"):
        prepare.prepare_tokens(tmp_path / "bad.npy", tmp_path / "out")


def test_negative_token_ids_are_rejected(tmp_path):
    np.save(tmp_path / "neg.npy", np.array([1, -2, 3]))
    with pytest.raises(LmtuneError, match="negative token id -2"):
        prepare.prepare_tokens(tmp_path / "neg.npy", tmp_path / "out")


def test_cli_reports_bad_input_as_one_line_with_exit_status_2(tmp_path, capsys):
    rc = prepare_cli.main(["--input", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert err.startswith("error: ") and "missing.txt" in err and "\n" not in err


@pytest.mark.slow
def test_builtin_corpus_is_built_once_and_then_reused(tmp_path):
    root = tmp_path / "builtin"
    assert prepare.ensure_builtin_corpus(root) == root
    meta = json.loads((root / "meta.json").read_text())
    assert meta["dtype"] == "uint16" and meta["vocab_size"] <= prepare.BUILTIN_VOCAB_SIZE
    assert meta["train_tokens"] > 500_000 and meta["val_tokens"] > 0
    mtimes = {p.name: p.stat().st_mtime_ns for p in root.iterdir()}
    prepare.ensure_builtin_corpus(root)
    assert {p.name: p.stat().st_mtime_ns for p in root.iterdir()} == mtimes
