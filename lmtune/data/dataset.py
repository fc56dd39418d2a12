"""A prepared data dir: reading and checking meta.json and the token files.

A data dir is what ``python -m lmtune.prepare`` writes: train.bin / val.bin (flat token ids) and
meta.json. The splits are memory-mapped, so loading is instant and memory is shared between trials.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lmtune.errors import LmtuneError

log = logging.getLogger(__name__)

_PREPARE_HINT = "run python -m lmtune.prepare --input FILE --out DIR (or without --input for the built-in corpus)"


@dataclass(frozen=True)
class DataMeta:
    """Parsed meta.json."""

    vocab_size: int
    dtype: str
    train_tokens: int
    val_tokens: int
    max_token_id: int
    eot_id: int | None
    content_hash: str
    sources: list
    tokenizer: str | None
    unigram_loss: float | None = None
    """The data's unigram baseline (``unigram_loss``); None in a meta.json written before lmtune recorded it."""
    validation: dict | None = None
    """Where the validation split came from, as meta.json records it (lmtune.data.datadir.ValidationSource's
    fields; ``describe_validation`` says it in words); None in a meta.json written before lmtune recorded it."""


@dataclass
class TokenData:
    dir: Path
    meta: DataMeta
    train: np.ndarray  # np.memmap
    val: np.ndarray  # np.memmap


def read_meta(data_dir: Path) -> DataMeta:
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise LmtuneError(f"data dir {data_dir} does not exist; {_PREPARE_HINT}")
    path = data_dir / "meta.json"
    if not path.is_file():
        raise LmtuneError(f"{path} is missing, so {data_dir} is not a prepared data dir; {_PREPARE_HINT}")
    try:
        raw = json.loads(path.read_text())
        meta = DataMeta(
            vocab_size=int(raw["vocab_size"]),
            dtype=str(raw["dtype"]),
            train_tokens=int(raw["train_tokens"]),
            val_tokens=int(raw["val_tokens"]),
            max_token_id=int(raw["max_token_id"]),
            eot_id=None if raw.get("eot_id") is None else int(raw["eot_id"]),
            content_hash=str(raw.get("content_hash", "")),
            sources=list(raw.get("sources", [])),
            tokenizer=raw.get("tokenizer"),
            unigram_loss=None if raw.get("unigram_loss") is None else float(raw["unigram_loss"]),
            validation=validation_record(raw.get("validation")),
        )
    except (ValueError, KeyError, TypeError) as err:
        raise LmtuneError(f"{path} is unreadable or incomplete ({type(err).__name__}: {err}); "
                          f"re-prepare with --force: {_PREPARE_HINT}") from None
    if meta.dtype not in ("uint16", "uint32"):
        raise LmtuneError(f"{path} has dtype {meta.dtype!r}; re-prepare with python -m lmtune.prepare --force")
    return meta


def validation_record(value: object) -> dict | None:
    """meta.json's ``validation`` as read back (None: not recorded); ValueError when it is not a mapping."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"validation is {type(value).__name__}, not a mapping")
    return dict(value)


def describe_validation(validation: dict | None) -> str:
    """Where the validation split came from, in one line: its own file with its SHA-256, or the share held out of
    the training input (``validation`` as meta.json records it; None: a data dir prepared before it was recorded,
    when the split was always held out of the training input)."""
    if not validation:
        return "validation split: held out of the training input (its share not recorded: prepared before lmtune " \
               "recorded it)"
    tokens = validation.get("tokens")
    count = f"{tokens:,} tokens" if isinstance(tokens, int) else "tokens not recorded"
    if validation.get("source") == "file":
        return f"validation split: {validation.get('file')} (SHA-256 {validation.get('sha256')}, {count})"
    fraction = validation.get("fraction")
    share = f"{fraction * 100:g}%" if isinstance(fraction, (int, float)) else "a share"
    if validation.get("unit") == "tokens":
        held = f"the last {share} of the training token array"
    else:
        held = f"{share} of the training documents"
    floor = ", topped up to the validation floor" if validation.get("topped_up") else ""
    return f"validation split: {held}, held out ({count}{floor})"


def load_data(data_dir: Path, context_length: int, vocab_size: int | None = None) -> TokenData:
    """Open a prepared data dir after checking it fits a model with ``context_length``/``vocab_size``."""
    data_dir = Path(data_dir)
    meta = read_meta(data_dir)
    itemsize = np.dtype(meta.dtype).itemsize
    for split, n in (("train", meta.train_tokens), ("val", meta.val_tokens)):
        path = data_dir / f"{split}.bin"
        if not path.is_file():
            raise LmtuneError(f"{path} is missing; {_PREPARE_HINT}")
        size = path.stat().st_size
        if size != n * itemsize:
            raise LmtuneError(
                f"{path} has {size} bytes but meta.json says {n} {meta.dtype} tokens ({n * itemsize} bytes); "
                "the dir is corrupt or was modified: re-prepare it with python -m lmtune.prepare --force"
            )
    if vocab_size is not None and meta.max_token_id >= vocab_size:
        raise LmtuneError(
            f"{data_dir} holds token ids up to {meta.max_token_id} but the model vocab_size is {vocab_size}; "
            f"set vocab_size >= {meta.max_token_id + 1} or re-prepare with a smaller --vocab-size"
        )
    if meta.max_token_id >= meta.vocab_size:
        raise LmtuneError(f"{data_dir / 'meta.json'} says vocab_size {meta.vocab_size} but max_token_id "
                          f"{meta.max_token_id}: it was edited or damaged; re-prepare with python -m lmtune.prepare "
                          "--force")
    for split, n in (("train", meta.train_tokens), ("val", meta.val_tokens)):
        if n < context_length + 1:
            raise LmtuneError(
                f"{data_dir / (split + '.bin')} has {n} tokens, fewer than context_length + 1 = "
                f"{context_length + 1}; use a smaller context_length (--set context_length=...) or more data"
            )
    train = np.memmap(data_dir / "train.bin", dtype=meta.dtype, mode="r")
    val = np.memmap(data_dir / "val.bin", dtype=meta.dtype, mode="r")
    for split, tokens in (("val", val), ("train", train)):
        _check_ids(data_dir / f"{split}.bin", tokens, meta, whole=split == "val")
    return TokenData(dir=data_dir, meta=meta, train=train, val=val)


# How much of train.bin load_data reads to check its ids against meta.json: this many slices of
# SAMPLE_SLICE tokens spread evenly over the file (4M tokens, a few ms per 100M-token file). The val split is
# read whole; a train id the sample misses is caught by the batch sampler when a batch first holds it.
SAMPLE_SLICES, SAMPLE_SLICE = 64, 1 << 16


def _check_ids(path: Path, tokens: np.ndarray, meta: DataMeta, whole: bool) -> None:
    """Refuse a token file holding an id above the max_token_id meta.json records (an edited meta.json or
    swapped files): read whole, or sampled at SAMPLE_SLICES places."""
    n = tokens.shape[0]
    if whole or n <= SAMPLE_SLICES * SAMPLE_SLICE:
        starts = range(0, n, 1 << 24)
        width = 1 << 24
    else:
        starts = (np.arange(SAMPLE_SLICES, dtype=np.int64) * (n - SAMPLE_SLICE) // (SAMPLE_SLICES - 1)).tolist()
        width = SAMPLE_SLICE
    for start in starts:
        top = int(np.asarray(tokens[start : start + width]).max())
        if top > meta.max_token_id:
            raise LmtuneError(f"{path} holds token id {top} but meta.json says the largest is {meta.max_token_id} "
                              f"(vocab_size {meta.vocab_size}): the files and meta.json do not belong together; "
                              "re-prepare with python -m lmtune.prepare --force")


def token_counts(tokens: np.ndarray, vocab_size: int) -> np.ndarray:
    """How often each id occurs in ``tokens`` (sliced, so a large memmap is not materialised as int64)."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    step = 1 << 24
    for s in range(0, tokens.shape[0], step):
        counts += np.bincount(np.asarray(tokens[s : s + step]), minlength=vocab_size)[:vocab_size]
    return counts


def unigram_entropy(tokens: np.ndarray, vocab_size: int) -> float:
    """Nats per token of the empirical unigram distribution: the loss of a model that ignores context."""
    counts = token_counts(tokens, vocab_size)
    total = counts.sum()
    if total == 0:
        return 0.0
    p = counts[counts > 0] / total
    return float(-(p * np.log(p)).sum())


def unigram_loss(train: np.ndarray, val: np.ndarray, vocab_size: int) -> float:
    """The data's unigram baseline: nats per validation token when each is predicted from the training split's
    token frequencies, ignoring all context (add-1/2 smoothing, so an id the training split lacks costs a finite
    loss). A run that ends no better than this has learned nothing a frequency count would not: it did not train.
    Unlike ln(vocab) it is measured on the data, so it holds for any vocabulary."""
    p = token_counts(train, vocab_size) + 0.5
    p /= p.sum()
    val_counts = token_counts(val, vocab_size)
    return float(-(val_counts * np.log(p)).sum() / max(1, val_counts.sum()))


def data_unigram_loss(data_dir: Path) -> float:
    """The unigram baseline of a prepared data dir: meta.json's, else (a dir prepared before lmtune recorded it)
    computed from its token files."""
    meta = read_meta(data_dir)
    if meta.unigram_loss is not None:
        return meta.unigram_loss
    train, val = (np.memmap(Path(data_dir) / f"{split}.bin", dtype=meta.dtype, mode="r") for split in ("train", "val"))
    return unigram_loss(train, val, meta.vocab_size)
