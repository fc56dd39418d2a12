"""Prepare training data: train a byte-level BPE tokenizer and encode text into flat token files
(``prepare_text``), take already-tokenized ids (``prepare_tokens``), or build the built-in corpus
(``ensure_builtin_corpus``). The command is ``python -m lmtune.prepare``.

The parts: lmtune.data.documents reads text inputs as documents and splits them into train and val,
lmtune.data.tokenizer trains the tokenizer and encodes, lmtune.data.datadir writes the data dir
atomically (its module doc says what DIR holds), lmtune.data.corpus generates the built-in stories.
``--tokens`` inputs are memory-mapped and copied in fixed-size slices; their last ``val_fraction`` (at
least ``min_val_tokens``) becomes val.

The validation split is either held out of the training input (``val_fraction``) or a file of its own
(``val_input`` for text, encoded with the tokenizer trained on the training text alone; ``val_tokens`` for
ids); meta.json records which (lmtune.data.datadir.ValidationSource), with the file's SHA-256.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from lmtune.data.corpus import stories
from lmtune.data.datadir import (
    NO_ROOM,
    BuiltinKey,
    PreparedMeta,
    Source,
    TokenFiles,
    ValidationSource,
    check_out,
    dtype_for,
    file_sha256,
    no_room,
    open_new,
    staging,
    top_up_val,
    write_all,
    write_meta,
)
from lmtune.data.documents import CHUNK_BYTES, EOT, MIN_VAL_TOKENS, DocumentTally, min_val_tokens
from lmtune.data.token_input import (
    check_dtype_applies,
    copy_ids,
    largest_id,
    load_id_tokenizer,
    open_tokens,
    open_val_tokens,
    token_vocab,
)
from lmtune.data.tokenizer import encode, require_tokenizers, train_tokenizer
from lmtune.errors import LmtuneError
from lmtune.files import check_destination

log = logging.getLogger(__name__)

# The largest --vocab-size: beyond any model lmtune trains, and the tokenizer library allocates per entry
# up front (--vocab-size 1000000000 asks it for 70 GB).
MAX_VOCAB_SIZE = 1 << 20
# The built-in corpus has only a few thousand distinct words; a 10k BPE would spend most merges on
# whole phrases (memorisation rather than language) and make the embedding/softmax slow on CPU.
BUILTIN_VOCAB_SIZE = 4096
BUILTIN_SEED = 0
BUILTIN_BYTES = 4_000_000
# The share of the training input held out for validation when no validation file of its own is given.
DEFAULT_VAL_FRACTION = 0.01


def _check_text_file(path: Path, option: str) -> None:
    """One line when ``path`` (given to ``option``) is missing, not a regular file, or empty."""
    if not path.exists():
        raise LmtuneError(f"input file {path} does not exist; check the path passed to {option}")
    if not path.is_file():
        raise LmtuneError(f"input {path} is not a regular file; pass text files to {option}")
    if path.stat().st_size == 0:
        raise LmtuneError(f"input file {path} is empty; pass a file with text in it to {option}")


def _check_inputs(inputs: list[Path]) -> None:
    if not inputs:
        raise LmtuneError("no input files given; pass --input FILE [FILE ...] (or omit it for the built-in corpus)")
    for p in inputs:
        _check_text_file(p, "--input")


def _check_distinct(val_path: Path, train_paths: list[Path], val_option: str, train_option: str) -> None:
    """Refuse a validation file that is one of the training files (the same path, or the same bytes)."""
    for p in train_paths:
        same = p.resolve() == val_path.resolve() or (
            p.stat().st_size == val_path.stat().st_size and file_sha256(p) == file_sha256(val_path))
        if same:
            raise LmtuneError(f"{val_option} {val_path} is the same data as {train_option} {p}: a validation split "
                              "must be held-out data; pass the validation file (e.g. TinyStoriesV2-GPT4-valid.txt)")


def _val_fraction(val_fraction: float | None, val_file: Path | None, val_option: str) -> float | None:
    """The share to hold out of the training input: ``val_fraction`` (default DEFAULT_VAL_FRACTION) when there
    is no validation file of its own, None when there is (and refused when both are given)."""
    if val_file is not None:
        if val_fraction is not None:
            raise LmtuneError(f"--val-fraction and {val_option} contradict each other: the validation split is either "
                              f"held out of the training input or a file of its own; drop --val-fraction")
        return None
    fraction = DEFAULT_VAL_FRACTION if val_fraction is None else val_fraction
    if not 0.0 < fraction <= 0.5:
        raise LmtuneError(f"--val-fraction {fraction} is out of range; use a value in (0, 0.5], e.g. 0.01")
    return fraction


def _own_file(path: Path, tokens: int) -> ValidationSource:
    """The validation record of a validation file of its own."""
    return ValidationSource(source="file", tokens=tokens, file=str(path), sha256=file_sha256(path),
                            size_bytes=path.stat().st_size)


def _show_progress(total_bytes: int) -> bool:
    return sys.stderr.isatty() and total_bytes > 16 * CHUNK_BYTES


# --------------------------------------------------------------------------- text inputs


def prepare_text(
    inputs: list[Path],
    out: Path,
    vocab_size: int = 10000,
    val_fraction: float | None = None,
    chunk_bytes: int = CHUNK_BYTES,
    force: bool = False,
    builtin: BuiltinKey | None = None,
    val_input: Path | None = None,
) -> Path:
    """Train a byte-level BPE tokenizer on ``inputs`` and encode them into ``out``; returns ``out``. The validation
    split is ``val_input``'s text, encoded with that tokenizer, when given; else ``val_fraction`` (default 1%) of the
    inputs' documents, held out. ``builtin``: the key meta.json records when this is the built-in corpus."""
    inputs, out = [Path(p) for p in inputs], Path(out)
    val_input = None if val_input is None else Path(val_input)
    require_tokenizers("prepare trains a BPE tokenizer with it; pip install tokenizers, or prepare token ids with "
                       "--tokens")
    fraction = _val_fraction(val_fraction, val_input, "--val-input")
    _check_inputs(inputs)
    if val_input is not None:
        _check_text_file(val_input, "--val-input")
        _check_distinct(val_input, inputs, "--val-input", "--input")
    check_out(out, force)
    if not 258 <= vocab_size <= MAX_VOCAB_SIZE:
        raise LmtuneError(f"--vocab-size {vocab_size} is outside what byte-level BPE can train here; "
                          f"use 258 (the 256 bytes, <|endoftext|> and a merge) to {MAX_VOCAB_SIZE:,}")
    t0 = time.perf_counter()
    progress = _show_progress(sum(p.stat().st_size for p in [*inputs, *([val_input] if val_input else [])]))
    tally = DocumentTally(fraction or DEFAULT_VAL_FRACTION)
    tok = train_tokenizer(inputs, vocab_size, tally, chunk_bytes, progress)  # on the training text only
    if tally.docs == 0:
        raise LmtuneError(f"{', '.join(map(str, inputs))} hold no text (only separators/whitespace); "
                          "pass files with text in them")
    eot_id, real_vocab = tok.token_to_id(EOT), tok.get_vocab_size()
    dtype = dtype_for(real_vocab)
    t1 = time.perf_counter()
    log.info("trained tokenizer (vocab %d) on %d documents in %.1fs", real_vocab, tally.docs, t1 - t0)
    saved = tok.to_str(pretty=True).encode()  # (tokenizer.json: written by write_all, as the token files are)
    # Room: byte-level BPE gives at most one token per input byte.
    text_bytes = sum(p.stat().st_size for p in [*inputs, *([val_input] if val_input else [])])
    with staging(out, force, need=text_bytes * dtype.itemsize + len(saved), exact=False) as tmp:
        with TokenFiles(tmp, dtype) as files:
            _encode_splits(tok, inputs, val_input, chunk_bytes, tally, files, progress)
        if val_input is None:
            n_train, n_val, validation = _hold_out_documents(tmp, dtype, eot_id, files.counts, fraction)
        elif files.counts["val"] == 0:
            raise LmtuneError(f"--val-input {val_input} holds no text (only separators/whitespace); pass the "
                              "validation text file")
        else:
            n_train, n_val = files.counts["train"], files.counts["val"]
            validation = _own_file(val_input, n_val)
        with open_new(tmp / "tokenizer.json") as handle:
            write_all(handle, saved)
        write_meta(tmp, PreparedMeta(
            vocab_size=real_vocab, dtype=dtype.name, train_tokens=n_train, val_tokens=n_val,
            max_token_id=files.max_id, eot_id=eot_id, sources=[Source(str(p), p.stat().st_size) for p in inputs],
            tokenizer="tokenizer.json", validation=validation, builtin=builtin))
    log.info("encoded %d train + %d val tokens into %s in %.1fs", n_train, n_val, out, time.perf_counter() - t1)
    return out


def _encode_splits(tok, inputs: list[Path], val_input: Path | None, chunk_bytes: int, tally: DocumentTally,
                   files: TokenFiles, progress: bool) -> None:
    """Encode into ``files``: the inputs' documents split by ``tally``'s hash, or (a validation file of its own) all
    of them into train and ``val_input``'s into val."""
    eot_id = tok.token_to_id(EOT)
    if val_input is None:
        encode(tok, inputs, chunk_bytes, eot_id, tally.split_of(), files, progress)
        return
    encode(tok, inputs, chunk_bytes, eot_id, lambda _doc: "train", files, progress)
    encode(tok, [val_input], chunk_bytes, eot_id, lambda _doc: "val", files, progress)


def _hold_out_documents(tmp: Path, dtype: np.dtype, eot_id: int, counts: dict[str, int],
                        fraction: float) -> tuple[int, int, ValidationSource]:
    """(train tokens, val tokens, the record) once the hashed documents are in val.bin: topped up from the end of
    train.bin to the validation floor when they fall short of it."""
    n_train, n_val = counts["train"], counts["val"]
    short = min_val_tokens(n_train + n_val, fraction) - n_val
    if short > 0:
        moved = top_up_val(tmp, dtype, eot_id, n_train, short)
        n_train, n_val = n_train - moved, n_val + moved
    return n_train, n_val, ValidationSource(source="held_out", tokens=n_val, fraction=fraction, unit="documents",
                                            topped_up=short > 0)


# --------------------------------------------------------------------------- pre-tokenized inputs


def prepare_tokens(
    path: Path,
    out: Path,
    vocab_size: int | None = None,
    val_fraction: float | None = None,
    force: bool = False,
    dtype: str | None = None,
    val_tokens: Path | None = None,
    tokenizer: Path | None = None,
) -> Path:
    """Copy an already-tokenized flat id array into ``out``. The validation split is ``val_tokens``'s ids when
    given, else the last ``val_fraction`` (default 1%) of ``path``. ``tokenizer`` (a tokenizers JSON, or a
    GPT-2-style vocab.json with merges.txt: lmtune.data.tokenizer.load_tokenizer) is saved beside them as
    tokenizer.json, so that samples and the report decode."""
    path, out = Path(path), Path(out)
    val_tokens = None if val_tokens is None else Path(val_tokens)
    fraction = _val_fraction(val_fraction, val_tokens, "--val-tokens")
    arr = open_tokens(path, dtype)
    val = None if val_tokens is None else open_val_tokens(val_tokens, dtype, arr, path)
    if val_tokens is not None:
        _check_distinct(val_tokens, [path], "--val-tokens", "--tokens")
    check_dtype_applies(dtype, {path: arr, **({val_tokens: val} if val is not None else {})})
    tok = load_id_tokenizer(tokenizer) if tokenizer is not None else None
    check_out(out, force)
    largest = {path: largest_id(path, arr), **({val_tokens: largest_id(val_tokens, val)} if val is not None else {})}
    vocab_size = token_vocab(vocab_size, largest, tokenizer, tok.get_vocab_size() if tok else None)
    out_dtype = dtype_for(vocab_size)
    n = int(arr.shape[0])
    if val is None:
        n_val = min(n - 1, min_val_tokens(n, fraction))
        n_train = n - n_val
        validation = ValidationSource(source="held_out", tokens=n_val, fraction=fraction, unit="tokens",
                                      topped_up=n_val > math.ceil(n * fraction))
    else:
        n_train, n_val = n, int(val.shape[0])
        validation = _own_file(val_tokens, n_val)
    saved = tok.to_str(pretty=True).encode() if tok is not None else b""
    with staging(out, force, need=(n_train + n_val) * out_dtype.itemsize + len(saved)) as tmp:
        copy_ids(arr, 0, n_train, tmp / "train.bin", out_dtype)
        copy_ids(*((val, 0, n_val) if val is not None else (arr, n_train, n)), tmp / "val.bin", out_dtype)
        if tok is not None:
            with open_new(tmp / "tokenizer.json") as handle:
                write_all(handle, saved)
        write_meta(tmp, PreparedMeta(
            vocab_size=vocab_size, dtype=out_dtype.name, train_tokens=n_train, val_tokens=n_val,
            max_token_id=max(largest.values()), eot_id=tok.token_to_id(EOT) if tok else None,
            sources=[Source(str(path), path.stat().st_size)], tokenizer="tokenizer.json" if tok else None,
            validation=validation))
    return out


# --------------------------------------------------------------------------- built-in corpus


def builtin_key() -> BuiltinKey:
    return BuiltinKey(generator_version=stories.GENERATOR_VERSION, seed=BUILTIN_SEED,
                      vocab_size=BUILTIN_VOCAB_SIZE, target_bytes=BUILTIN_BYTES, min_val_tokens=MIN_VAL_TOKENS)


def ensure_builtin_corpus(root: Path = Path("data/builtin"), option: str | None = None) -> Path:
    """Generate and prepare the built-in corpus into ``root`` unless an up-to-date copy is there. ``option``: the
    command's option that named ``root`` (a refusal names it), if any."""
    root = Path(root)
    key = builtin_key()

    def up_to_date() -> bool:
        try:
            return json.loads((root / "meta.json").read_text()).get("builtin") == asdict(key)
        except (OSError, ValueError):
            return False

    if up_to_date():
        return root
    require_tokenizers("the built-in corpus is tokenized with it; pip install tokenizers, or give --data DIR (data "
                       "prepared elsewhere)")
    if option is not None:
        check_destination(root, option)
    else:
        check_destination(root, "the built-in corpus folder", fix="give --data DIR (data prepared elsewhere)")
    root.mkdir(parents=True, exist_ok=True)
    # Parallel trials may call this at once; the lock makes one of them build and the rest reuse it.
    with open(root / ".lock", "w") as lock:
        try:
            import fcntl

            fcntl.flock(lock, fcntl.LOCK_EX)
        except ImportError:  # not POSIX: no locking, the atomic renames still keep the dir consistent
            pass
        if up_to_date():
            return root
        t0 = time.perf_counter()
        try:
            text = stories.write_corpus(root / "stories.txt", target_bytes=BUILTIN_BYTES, seed=BUILTIN_SEED)
        except OSError as err:
            if err.errno not in NO_ROOM:
                raise
            # Room: the text, and its tokens (at most one a byte, uint16 for its vocabulary), tokenizer aside.
            need = BUILTIN_BYTES * (1 + dtype_for(BUILTIN_VOCAB_SIZE).itemsize)
            raise no_room(root, "stories.txt (the built-in corpus's text)", need, exact=False) from None
        prepare_text([text], root, vocab_size=BUILTIN_VOCAB_SIZE, force=True, builtin=key)
        log.info("built-in corpus ready in %s (%.1fs)", root, time.perf_counter() - t0)
    return root
