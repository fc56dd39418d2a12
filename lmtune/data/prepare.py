"""Prepare training data: train a byte-level BPE tokenizer and encode text into flat token files
(``prepare_text``), take already-tokenized ids (``prepare_tokens``), or build the built-in corpus
(``ensure_builtin_corpus``). The command is ``python -m lmtune.prepare``.

Output (DIR): train.bin and val.bin (raw uint16 token ids, uint32 when the vocabulary exceeds 65535),
tokenizer.json (or none for --tokens) and meta.json.

Documents are separated by a line containing exactly ``<|endoftext|>``; a file without such lines is
one document. ``<|endoftext|>`` is appended after every document when encoding.

The validation split is ``val_fraction`` of the tokens (whole documents, picked by a hash of their
index), and at least ``MIN_VAL_TOKENS`` (65,536) or a tenth of all tokens, whichever is less: when the
documents picked hold fewer, whole documents from the end of train move to val (a single document is
split by tokens).

Memory: inputs are read CHUNK_BYTES at a time, in both the tokenizer-training and the encoding pass, and
token ids are appended to the .bin files as they are produced, so memory is O(chunk + vocab) and
independent of the input size. (A document longer than a chunk is cut at a line break whose neighbours
are both non-space, where the byte-level pre-tokenizer splits anyway, so the ids are the same as
encoding it whole; only a single line longer than a chunk is held in full.) ``--tokens`` inputs are
memory-mapped and copied in fixed-size slices.

Writes are atomic: everything goes into a temp dir next to DIR first. A new DIR is created by renaming
that temp dir; an existing DIR gets the files renamed into it with meta.json last, and meta.json is what
marks a DIR as prepared, so a crash never leaves something that looks prepared but is not.
"""

from __future__ import annotations

import codecs
import contextlib
import hashlib
import json
import logging
import math
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from lmtune.data import corpus
from lmtune.errors import LmtuneError
from lmtune.files import check_destination

log = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20
# The longest pre-tokenised word BPE trains on (in bytes, as the byte-level alphabet counts them): longer
# runs without whitespace are cut into pieces this long, which keeps training time linear in the input.
MAX_PIECE_BYTES = 256
# The largest --vocab-size: beyond any model lmtune trains, and the tokenizer library allocates per entry
# up front (--vocab-size 1000000000 asks it for 70 GB).
MAX_VOCAB_SIZE = 1 << 20
# Token files are uint16 or uint32: an id must fit 32 bits.
MAX_TOKEN_ID = 2**32 - 1
EOT = "<|endoftext|>"
# The built-in corpus has only a few thousand distinct words; a 10k BPE would spend most merges on
# whole phrases (memorisation rather than language) and make the embedding/softmax slow on CPU.
BUILTIN_VOCAB_SIZE = 4096
BUILTIN_SEED = 0
BUILTIN_BYTES = 4_000_000
# The validation split holds at least this many tokens (or a tenth of the data, if that is less).
MIN_VAL_TOKENS = 65_536
TOKENS_SLICE = 1 << 24  # elements copied per step from a --tokens array
_ENCODE_BATCH_CHARS = 1 << 20  # text handed to one encode_batch call; bounds memory, keeps rayon busy
_SEP_RE = re.compile(r"^<\|endoftext\|>\r?(?:\n|\Z)", re.MULTILINE)
_FILES = ("train.bin", "val.bin", "tokenizer.json", "meta.json")


# --------------------------------------------------------------------------- reading documents


def iter_pieces(path: Path, chunk_bytes: int = CHUNK_BYTES) -> Iterator[tuple[str, bool]]:
    """Yield ``(text, ends_document)`` pieces of ``path`` while holding about one chunk in memory.

    Concatenating the pieces of a document gives the document; the newline that ends the text before a
    separator line belongs to the separator and is dropped.
    """
    decoder = codecs.getincrementaldecoder("utf-8")()
    buf = ""
    doc_started = False  # pieces of the current document were already yielded
    with open(path, "rb") as f:
        while True:
            raw = f.read(chunk_bytes)
            final = not raw
            try:
                buf += decoder.decode(raw, final=final)
            except UnicodeDecodeError as err:
                raise LmtuneError(
                    f"{path} is not UTF-8 text (byte {err.start} of a chunk); convert it to UTF-8 "
                    "or pass already-tokenized ids with --tokens"
                ) from None
            pos = 0
            for m in _SEP_RE.finditer(buf):
                if not m.group().endswith("\n") and not final:
                    break  # the separator line may continue in the next chunk
                text = buf[pos : m.start()]
                if text.endswith("\n"):
                    text = text[:-1]
                if text or doc_started:
                    yield text, True
                doc_started = False
                pos = m.end()
            buf = buf[pos:]
            if final:
                if buf.strip() or doc_started:
                    yield buf, True
                return
            if len(buf) > chunk_bytes:
                cut = _safe_cut(buf)
                if cut > 0:
                    yield buf[:cut], False
                    doc_started = True
                    buf = buf[cut:]


def _safe_cut(buf: str) -> int:
    """Where to cut ``buf`` so that both parts encode to the same token ids as the whole: just after a
    newline, or just before a space, with non-space on both sides (the byte-level pre-tokenizer splits
    there anyway). Newlines first, not in the last (maybe partial) line; text without any such place (one
    endless word) is cut at its end, the one place where ids may differ from encoding it whole."""
    last_nl = buf.rfind("\n")
    idx = buf.rfind("\n", 0, last_nl)
    while idx > 0:
        if not buf[idx - 1].isspace() and not buf[idx + 1].isspace():
            return idx + 1
        idx = buf.rfind("\n", 0, idx)
    idx = buf.rfind(" ", 0, len(buf) - 1)
    while idx > 0:
        if not buf[idx - 1].isspace() and not buf[idx + 1].isspace():
            return idx
        idx = buf.rfind(" ", 0, idx)
    cut = len(buf) - 1
    while cut > 1 and buf[cut] == "<":  # the next piece must not look like a separator line
        cut -= 1
    return cut


def _is_val(index: int, val_fraction: float) -> bool:
    return _unit_hash(index) < val_fraction


def _unit_hash(index: int) -> float:
    """splitmix64 of the document index mapped to [0, 1): a stable, seedless, uniform split."""
    z = (index + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return ((z ^ (z >> 31)) >> 11) / float(1 << 53)


# --------------------------------------------------------------------------- helpers


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


def _check_out(out: Path, force: bool) -> None:
    check_destination(out, "--out")
    if force:
        return
    if (out / "meta.json").exists():
        raise LmtuneError(f"{out} already holds prepared data (meta.json); pass --force to overwrite it "
                          "or choose another --out")
    taken = [name for name in _FILES if (out / name).exists()]
    if taken:
        raise LmtuneError(f"{out} already holds {', '.join(taken)} (not prepared by lmtune: no meta.json); pass "
                          "--force to replace them or choose another --out")


def _check_val_fraction(val_fraction: float) -> None:
    if not 0.0 < val_fraction <= 0.5:
        raise LmtuneError(f"--val-fraction {val_fraction} is out of range; use a value in (0, 0.5], e.g. 0.01")


def _dtype_for(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint32 if vocab_size > 65535 else np.uint16)


def _show_progress(total_bytes: int) -> bool:
    return sys.stderr.isatty() and total_bytes > 16 * CHUNK_BYTES


def _content_hash(d: Path) -> str:
    h = hashlib.sha256()
    for name in ("train.bin", "val.bin"):
        with open(d / name, "rb") as f:
            while block := f.read(1 << 22):
                h.update(block)
    return h.hexdigest()


@contextlib.contextmanager
def _staging(out: Path, force: bool) -> Iterator[Path]:
    """A temp dir next to ``out``; on success its files are committed into ``out`` (see module doc)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        yield tmp
        _check_out(out, force)  # re-check: another process may have prepared it meanwhile
        if not out.exists():
            tmp.rename(out)
            return
        with contextlib.suppress(FileNotFoundError):
            (out / "meta.json").unlink()
        for name in _FILES:
            src = tmp / name
            if src.exists():
                os.replace(src, out / name)
            elif name != "meta.json":
                with contextlib.suppress(FileNotFoundError):
                    (out / name).unlink()  # e.g. a stale tokenizer.json from a text prepare
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _write_meta(d: Path, meta: dict) -> None:
    meta = {**meta, "content_hash": _content_hash(d), "created_by": "lmtune.prepare"}
    (d / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")


def min_val_tokens(total_tokens: int, val_fraction: float) -> int:
    """The validation split's size: val_fraction of the tokens, and at least MIN_VAL_TOKENS or a tenth of
    all tokens, whichever is less (a 1% split of a small input is too few windows to evaluate on)."""
    return max(1, math.ceil(total_tokens * val_fraction), min(MIN_VAL_TOKENS, total_tokens // 10))


def _top_up_val(d: Path, dtype: np.dtype, eot_id: int | None, n_train: int, need: int) -> int:
    """Move the end of train.bin to val.bin: the fewest whole documents holding at least ``need`` tokens,
    or (no document boundary there: a single document, or token ids) exactly ``need`` tokens. Returns
    how many tokens moved."""
    if n_train < 2:
        raise LmtuneError("the input holds fewer than 2 tokens; pass more text")
    need = min(need, n_train - 1)
    train = np.memmap(d / "train.bin", dtype=dtype, mode="r")
    cut = n_train - need
    if eot_id is not None:  # back to the end of the document that holds position cut
        ends = np.nonzero(train[:cut] == eot_id)[0]
        cut = int(ends[-1]) + 1 if ends.size else cut
    del train
    item = dtype.itemsize
    with open(d / "train.bin", "r+b") as tr, open(d / "val.bin", "ab") as va:
        tr.seek(cut * item)
        while block := tr.read(1 << 22):
            va.write(block)
        tr.truncate(cut * item)
    return n_train - cut


# --------------------------------------------------------------------------- text inputs


def _train_tokenizer(inputs: list[Path], vocab_size: int, val_fraction: float, chunk_bytes: int, progress: bool):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    # add_prefix_space=False so that a document cut into pieces encodes exactly like the whole. The split
    # after it bounds a pre-tokenised word (a run of letters with no space) at MAX_PIECE_BYTES: BPE training
    # time grows with the square of a word's length, so text without whitespace would otherwise take hours.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.ByteLevel(add_prefix_space=False),
        pre_tokenizers.Split(Regex(f".{{1,{MAX_PIECE_BYTES}}}"), behavior="isolated"),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=progress,
    )
    stats = {"docs": 0, "val_docs": 0, "min_u": (2.0, -1), "max_u": (-1.0, -1)}
    read = _ReadProgress(sum(p.stat().st_size for p in inputs))

    def texts() -> Iterator[str]:
        for p in inputs:
            for text, ends in iter_pieces(p, chunk_bytes):
                read.add(len(text))
                if ends:
                    # Count documents here so the encoding pass can guarantee a non-empty val and
                    # train split without holding anything per document.
                    i = stats["docs"]
                    u = _unit_hash(i)
                    stats["min_u"] = min(stats["min_u"], (u, i))
                    stats["max_u"] = max(stats["max_u"], (u, i))
                    stats["docs"] += 1
                    stats["val_docs"] += _is_val(i, val_fraction)
                if text:
                    yield text

    tok.train_from_iterator(texts(), trainer=trainer)
    return tok, stats


class _ReadProgress:
    """Logs every tenth of a large input the tokenizer trainer has read (its own bar needs a terminal)."""

    def __init__(self, total_bytes: int):
        self.total, self.seen, self.next = total_bytes, 0, total_bytes / 10
        self.enabled = total_bytes > 16 * CHUNK_BYTES

    def add(self, chars: int) -> None:
        self.seen += chars  # characters, not bytes: close enough for a progress line
        if self.enabled and self.seen >= self.next:
            log.info("training the tokenizer: read %d%% of %.0f MB", min(100, 100 * self.seen // self.total),
                     self.total / 2**20)
            self.next += self.total / 10


def prepare_text(
    inputs: list[Path],
    out: Path,
    vocab_size: int = 10000,
    val_fraction: float = 0.01,
    chunk_bytes: int = CHUNK_BYTES,
    force: bool = False,
    extra_meta: dict | None = None,
) -> Path:
    """Train a byte-level BPE tokenizer on ``inputs`` and encode them into ``out``; returns ``out``."""
    inputs = [Path(p) for p in inputs]
    out = Path(out)
    _check_inputs(inputs)
    _check_out(out, force)
    _check_val_fraction(val_fraction)
    if not 258 <= vocab_size <= MAX_VOCAB_SIZE:
        raise LmtuneError(f"--vocab-size {vocab_size} is outside what byte-level BPE can train here; "
                          f"use 258 (the 256 bytes, <|endoftext|> and a merge) to {MAX_VOCAB_SIZE:,}")
    t0 = time.perf_counter()
    progress = _show_progress(sum(p.stat().st_size for p in inputs))
    tok, stats = _train_tokenizer(inputs, vocab_size, val_fraction, chunk_bytes, progress)
    if stats["docs"] == 0:
        raise LmtuneError(f"{', '.join(map(str, inputs))} hold no text (only separators/whitespace); "
                          "pass files with text in them")
    eot_id, real_vocab = tok.token_to_id(EOT), tok.get_vocab_size()
    dtype = _dtype_for(real_vocab)
    t1 = time.perf_counter()
    log.info("trained tokenizer (vocab %d) on %d documents in %.1fs", real_vocab, stats["docs"], t1 - t0)
    with _staging(out, force) as tmp:
        with _TokenFiles(tmp, dtype) as files:
            _encode(tok, inputs, chunk_bytes, eot_id, _document_splits(stats, val_fraction), files, progress)
        counts = dict(files.counts)
        short = min_val_tokens(counts["train"] + counts["val"], val_fraction) - counts["val"]
        if short > 0:
            moved = _top_up_val(tmp, dtype, eot_id, counts["train"], short)
            counts = {"train": counts["train"] - moved, "val": counts["val"] + moved}
        tok.save(str(tmp / "tokenizer.json"))
        _write_meta(tmp, {
            "vocab_size": real_vocab, "dtype": dtype.name, "train_tokens": counts["train"],
            "val_tokens": counts["val"], "max_token_id": files.max_id, "eot_id": eot_id,
            "sources": [{"name": str(p), "size_bytes": p.stat().st_size} for p in inputs],
            "tokenizer": "tokenizer.json", **(extra_meta or {}),
        })
    log.info("encoded %d train + %d val tokens into %s in %.1fs", counts["train"], counts["val"], out,
             time.perf_counter() - t1)
    return out


def _document_splits(stats: dict, val_fraction: float) -> Callable[[int], str]:
    """Document index -> "train" or "val" by its hash, forcing one document into each split when the
    hash alone would leave a split empty (a single document is split by tokens afterwards instead)."""
    n_docs, n_val_docs = stats["docs"], stats["val_docs"]
    force_val = stats["min_u"][1] if n_val_docs == 0 else -1
    force_train = stats["max_u"][1] if n_val_docs == n_docs and n_docs > 1 else -1

    def split_of(i: int) -> str:
        if n_docs == 1:
            return "train"
        if i == force_val:
            return "val"
        if i == force_train:
            return "train"
        return "val" if _is_val(i, val_fraction) else "train"

    return split_of


class _TokenFiles:
    """train.bin and val.bin while they are written: token ids appended, counted, the largest id kept."""

    def __init__(self, folder: Path, dtype: np.dtype):
        self.dtype = dtype
        self.files = {s: open(folder / f"{s}.bin", "wb") for s in ("train", "val")}  # noqa: SIM115
        self.counts = {"train": 0, "val": 0}
        self.max_id = 0

    def append(self, split: str, arrays: list[np.ndarray]) -> None:
        if not arrays:
            return
        ids = np.concatenate(arrays)
        if ids.size:
            self.max_id = max(self.max_id, int(ids.max()))
            ids.astype(self.dtype).tofile(self.files[split])
            self.counts[split] += ids.size

    def __enter__(self) -> _TokenFiles:
        return self

    def __exit__(self, *exc) -> None:
        for handle in self.files.values():
            handle.close()


def _encode(tok, inputs: list[Path], chunk_bytes: int, eot_id: int, split_of: Callable[[int], str],
            files: _TokenFiles, progress: bool) -> None:
    """Encode the inputs piece by piece, in batches of about _ENCODE_BATCH_CHARS, into ``files``;
    <|endoftext|> after each document."""
    from tqdm import tqdm

    bar = tqdm(total=sum(p.stat().st_size for p in inputs), unit="B", unit_scale=True, desc="encoding",
               disable=not progress)
    batch: list[tuple[str, int, bool]] = []

    def flush() -> None:
        encodings = tok.encode_batch([text for text, _, _ in batch], add_special_tokens=False)
        per_split: dict[str, list[np.ndarray]] = {"train": [], "val": []}
        for (_, doc, ends), enc in zip(batch, encodings, strict=True):
            per_split[split_of(doc)].append(np.asarray(enc.ids + [eot_id] if ends else enc.ids, dtype=np.int64))
        for split, arrays in per_split.items():
            files.append(split, arrays)
        bar.update(sum(len(text) for text, _, _ in batch))
        batch.clear()

    doc = batch_chars = 0
    for path in inputs:
        for text, ends in iter_pieces(path, chunk_bytes):
            batch.append((text, doc, ends))
            doc, batch_chars = doc + ends, batch_chars + len(text)
            if batch_chars >= _ENCODE_BATCH_CHARS:
                flush()
                batch_chars = 0
    if batch:
        flush()
    bar.close()


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
    _check_out(out, force)
    n = int(arr.shape[0])
    if n < 2:
        raise LmtuneError(f"{path} holds {n} token(s); pass at least 2 so both train and val are non-empty")
    lo, hi = None, None
    for s in range(0, n, TOKENS_SLICE):
        part = np.asarray(arr[s : s + TOKENS_SLICE])
        lo = int(part.min()) if lo is None else min(lo, int(part.min()))
        hi = int(part.max()) if hi is None else max(hi, int(part.max()))
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
    out_dtype = _dtype_for(vocab_size)
    n_val = min(n - 1, min_val_tokens(n, val_fraction))
    n_train = n - n_val
    with _staging(out, force) as tmp:
        for name, a, b in (("train", 0, n_train), ("val", n_train, n)):
            with open(tmp / f"{name}.bin", "wb") as f:
                for s in range(a, b, TOKENS_SLICE):
                    np.asarray(arr[s : min(s + TOKENS_SLICE, b)]).astype(out_dtype).tofile(f)
        _write_meta(tmp, {
            "vocab_size": vocab_size,
            "dtype": out_dtype.name,
            "train_tokens": n_train,
            "val_tokens": n_val,
            "max_token_id": hi,
            "eot_id": None,
            "sources": [{"name": str(path), "size_bytes": path.stat().st_size}],
            "tokenizer": None,
        })
    return out


# --------------------------------------------------------------------------- built-in corpus


def _builtin_key() -> dict:
    return {"generator_version": corpus.GENERATOR_VERSION, "seed": BUILTIN_SEED,
            "vocab_size": BUILTIN_VOCAB_SIZE, "target_bytes": BUILTIN_BYTES, "min_val_tokens": MIN_VAL_TOKENS}


def ensure_builtin_corpus(root: Path = Path("data/builtin"), option: str | None = None) -> Path:
    """Generate and prepare the built-in corpus into ``root`` unless an up-to-date copy is there. ``option``: the
    command's option that named ``root`` (a refusal names it), if any."""
    root = Path(root)
    key = _builtin_key()

    def up_to_date() -> bool:
        try:
            return json.loads((root / "meta.json").read_text()).get("builtin") == key
        except (OSError, ValueError):
            return False

    if up_to_date():
        return root
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
        stories = corpus.write_corpus(root / "stories.txt", target_bytes=BUILTIN_BYTES, seed=BUILTIN_SEED)
        prepare_text([stories], root, vocab_size=BUILTIN_VOCAB_SIZE, force=True, extra_meta={"builtin": key})
        log.info("built-in corpus ready in %s (%.1fs)", root, time.perf_counter() - t0)
    return root
