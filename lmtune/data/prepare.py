"""Prepare training data: train a byte-level BPE tokenizer and encode text into flat token files
(``prepare_text``), take already-tokenized ids (``prepare_tokens``), or build the built-in corpus
(``ensure_builtin_corpus``). The command is ``python -m lmtune.prepare``.

The parts: lmtune.data.documents reads text inputs as documents and splits them into train and val,
lmtune.data.tokenizer trains the tokenizer and encodes, lmtune.data.datadir writes the data dir
atomically (its module doc says what DIR holds), lmtune.data.corpus generates the built-in stories.
``--tokens`` inputs are memory-mapped and copied in fixed-size slices; their last ``val_fraction`` (at
least ``min_val_tokens``) becomes val.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from lmtune.data.corpus import stories
from lmtune.data.datadir import (
    BuiltinKey,
    PreparedMeta,
    Source,
    TokenFiles,
    check_out,
    dtype_for,
    staging,
    top_up_val,
    write_meta,
)
from lmtune.data.documents import CHUNK_BYTES, EOT, MIN_VAL_TOKENS, DocumentTally, min_val_tokens
from lmtune.data.tokenizer import encode, require_tokenizers, train_tokenizer
from lmtune.errors import LmtuneError
from lmtune.files import check_destination

log = logging.getLogger(__name__)

# The largest --vocab-size: beyond any model lmtune trains, and the tokenizer library allocates per entry
# up front (--vocab-size 1000000000 asks it for 70 GB).
MAX_VOCAB_SIZE = 1 << 20
# Token files are uint16 or uint32: an id must fit 32 bits.
MAX_TOKEN_ID = 2**32 - 1
# The built-in corpus has only a few thousand distinct words; a 10k BPE would spend most merges on
# whole phrases (memorisation rather than language) and make the embedding/softmax slow on CPU.
BUILTIN_VOCAB_SIZE = 4096
BUILTIN_SEED = 0
BUILTIN_BYTES = 4_000_000
TOKENS_SLICE = 1 << 24  # elements copied per step from a --tokens array


def _check_inputs(inputs: list[Path]) -> None:
    if not inputs:
        raise LmtuneError("no input files given; pass --input FILE [FILE ...] (or omit it for the built-in corpus)")
    for p in inputs:
        if not p.exists():
            raise LmtuneError(f"input file {p} does not exist; check the path passed to --input")
        if not p.is_file():
            raise LmtuneError(f"input {p} is not a regular file; pass text files to --input")
        if p.stat().st_size == 0:
            raise LmtuneError(f"input file {p} is empty; pass a file with text in it")


def _check_val_fraction(val_fraction: float) -> None:
    if not 0.0 < val_fraction <= 0.5:
        raise LmtuneError(f"--val-fraction {val_fraction} is out of range; use a value in (0, 0.5], e.g. 0.01")


def _show_progress(total_bytes: int) -> bool:
    return sys.stderr.isatty() and total_bytes > 16 * CHUNK_BYTES


# --------------------------------------------------------------------------- text inputs


def prepare_text(
    inputs: list[Path],
    out: Path,
    vocab_size: int = 10000,
    val_fraction: float = 0.01,
    chunk_bytes: int = CHUNK_BYTES,
    force: bool = False,
    builtin: BuiltinKey | None = None,
) -> Path:
    """Train a byte-level BPE tokenizer on ``inputs`` and encode them into ``out``; returns ``out``.
    ``builtin``: the key meta.json records when this is the built-in corpus."""
    inputs = [Path(p) for p in inputs]
    out = Path(out)
    require_tokenizers("prepare trains a BPE tokenizer with it; pip install tokenizers, or prepare token ids with "
                       "--tokens")
    _check_inputs(inputs)
    check_out(out, force)
    _check_val_fraction(val_fraction)
    if not 258 <= vocab_size <= MAX_VOCAB_SIZE:
        raise LmtuneError(f"--vocab-size {vocab_size} is outside what byte-level BPE can train here; "
                          f"use 258 (the 256 bytes, <|endoftext|> and a merge) to {MAX_VOCAB_SIZE:,}")
    t0 = time.perf_counter()
    progress = _show_progress(sum(p.stat().st_size for p in inputs))
    tally = DocumentTally(val_fraction)
    tok = train_tokenizer(inputs, vocab_size, tally, chunk_bytes, progress)
    if tally.docs == 0:
        raise LmtuneError(f"{', '.join(map(str, inputs))} hold no text (only separators/whitespace); "
                          "pass files with text in them")
    eot_id, real_vocab = tok.token_to_id(EOT), tok.get_vocab_size()
    dtype = dtype_for(real_vocab)
    t1 = time.perf_counter()
    log.info("trained tokenizer (vocab %d) on %d documents in %.1fs", real_vocab, tally.docs, t1 - t0)
    with staging(out, force) as tmp:
        with TokenFiles(tmp, dtype) as files:
            encode(tok, inputs, chunk_bytes, eot_id, tally.split_of(), files, progress)
        n_train, n_val = files.counts["train"], files.counts["val"]
        short = min_val_tokens(n_train + n_val, val_fraction) - n_val
        if short > 0:
            moved = top_up_val(tmp, dtype, eot_id, n_train, short)
            n_train, n_val = n_train - moved, n_val + moved
        tok.save(str(tmp / "tokenizer.json"))
        write_meta(tmp, PreparedMeta(
            vocab_size=real_vocab, dtype=dtype.name, train_tokens=n_train, val_tokens=n_val,
            max_token_id=files.max_id, eot_id=eot_id, sources=[Source(str(p), p.stat().st_size) for p in inputs],
            tokenizer="tokenizer.json", builtin=builtin))
    log.info("encoded %d train + %d val tokens into %s in %.1fs", n_train, n_val, out, time.perf_counter() - t1)
    return out


# --------------------------------------------------------------------------- pre-tokenized inputs


def _open_tokens(path: Path, dtype: str | None) -> np.ndarray:
    if not path.exists():
        raise LmtuneError(f"token file {path} does not exist; check the path passed to --tokens")
    if path.stat().st_size == 0:
        raise LmtuneError(f"token file {path} is empty; pass a non-empty .npy or .bin array of token ids")
    if path.suffix == ".npy":
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except Exception as err:  # numpy raises several types for a corrupt header
            raise LmtuneError(f"cannot read {path} as a .npy array ({type(err).__name__}: {err}); "
                              "save it with numpy.save or pass a raw .bin with --dtype") from None
    elif path.suffix == ".bin":
        dt = np.dtype(dtype or "uint16")
        if path.stat().st_size % dt.itemsize:
            raise LmtuneError(f"{path} has {path.stat().st_size} bytes, not a multiple of {dt.itemsize} "
                              f"({dt.name}); pass the right --dtype")
        arr = np.memmap(path, dtype=dt, mode="r")
    else:
        raise LmtuneError(f"token file {path} must end in .npy or .bin; rename it or convert it")
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise LmtuneError(f"{path} holds a {arr.ndim}-D {arr.dtype} array; pass a flat 1-D integer array of "
                          "token ids")
    return arr


def _id_range(arr: np.ndarray) -> tuple[int, int]:
    """(smallest, largest) id, read TOKENS_SLICE at a time."""
    lo, hi = None, None
    for s in range(0, int(arr.shape[0]), TOKENS_SLICE):
        part = np.asarray(arr[s : s + TOKENS_SLICE])
        lo = int(part.min()) if lo is None else min(lo, int(part.min()))
        hi = int(part.max()) if hi is None else max(hi, int(part.max()))
    return lo, hi


def prepare_tokens(
    path: Path,
    out: Path,
    vocab_size: int | None = None,
    val_fraction: float = 0.01,
    force: bool = False,
    dtype: str | None = None,
) -> Path:
    """Copy an already-tokenized flat id array into ``out``: the last ``val_fraction`` becomes val."""
    path, out = Path(path), Path(out)
    _check_val_fraction(val_fraction)
    arr = _open_tokens(path, dtype)
    check_out(out, force)
    n = int(arr.shape[0])
    if n < 2:
        raise LmtuneError(f"{path} holds {n} token(s); pass at least 2 so both train and val are non-empty")
    lo, hi = _id_range(arr)
    if lo < 0:
        raise LmtuneError(f"{path} contains negative token id {lo}; token ids must be >= 0 (wrong --dtype?)")
    if hi > MAX_TOKEN_ID:
        raise LmtuneError(f"{path} contains token id {hi}, which does not fit the 32-bit token files lmtune "
                          f"writes (largest {MAX_TOKEN_ID}); remap the ids to a dense range first")
    if vocab_size is not None and not 1 <= vocab_size <= MAX_TOKEN_ID + 1:
        raise LmtuneError(f"--vocab-size {vocab_size} must be between 1 and 2**32 (ids are stored in 32 bits)")
    if vocab_size is None:
        vocab_size = hi + 1
    elif hi >= vocab_size:
        raise LmtuneError(f"{path} contains token id {hi} >= --vocab-size {vocab_size}; "
                          f"pass --vocab-size {hi + 1} or more")
    out_dtype = dtype_for(vocab_size)
    n_val = min(n - 1, min_val_tokens(n, val_fraction))
    n_train = n - n_val
    with staging(out, force) as tmp:
        for name, a, b in (("train", 0, n_train), ("val", n_train, n)):
            with open(tmp / f"{name}.bin", "wb") as f:
                for s in range(a, b, TOKENS_SLICE):
                    np.asarray(arr[s : min(s + TOKENS_SLICE, b)]).astype(out_dtype).tofile(f)
        write_meta(tmp, PreparedMeta(
            vocab_size=vocab_size, dtype=out_dtype.name, train_tokens=n_train, val_tokens=n_val, max_token_id=hi,
            eot_id=None, sources=[Source(str(path), path.stat().st_size)], tokenizer=None))
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
        text = stories.write_corpus(root / "stories.txt", target_bytes=BUILTIN_BYTES, seed=BUILTIN_SEED)
        prepare_text([text], root, vocab_size=BUILTIN_VOCAB_SIZE, force=True, builtin=key)
        log.info("built-in corpus ready in %s (%.1fs)", root, time.perf_counter() - t0)
    return root
