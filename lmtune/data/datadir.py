"""Writing a data dir: train.bin and val.bin (raw uint16 token ids, uint32 when the vocabulary exceeds
65535), tokenizer.json (none for token-id inputs prepared without --tokenizer) and meta.json, which also records
where the validation split came from (``ValidationSource``).

Writes are atomic: everything goes into a temp dir next to DIR first (``staging``). A new DIR is created
by renaming that temp dir; an existing DIR gets the files renamed into it with meta.json last, and
meta.json is what marks a DIR as prepared, so a crash never leaves something that looks prepared but is
not. Every byte goes through ``write_all``, so that a full disk is one line (``staging`` says which file and how
much room the data needs) and the temp dir goes. (Reading a data dir is lmtune.data.dataset.)
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import secrets
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from lmtune.data.dataset import unigram_loss
from lmtune.errors import LmtuneError
from lmtune.files import check_destination, existing_ancestor

FILES = ("train.bin", "val.bin", "tokenizer.json", "meta.json")
CREATED_BY = "lmtune.prepare"


@dataclass(frozen=True)
class Source:
    """One training input file, as meta.json lists it (a validation file of its own is under ``validation``)."""

    name: str
    """Its path, as given."""
    size_bytes: int
    """Its size when it was prepared."""


@dataclass(frozen=True)
class ValidationSource:
    """Where val.bin came from, as meta.json records it under ``validation``
    (lmtune.data.dataset.describe_validation says it in words)."""

    source: str
    """"file": a validation file of its own (--val-input, --val-tokens); "held_out": carved out of the training
    input (--val-fraction)."""
    tokens: int
    """Tokens in val.bin."""
    file: str | None = None
    """A file of its own: its path, as given."""
    sha256: str | None = None
    """A file of its own: the SHA-256 of its bytes, as ``sha256sum`` prints it."""
    size_bytes: int | None = None
    """A file of its own: its size."""
    fraction: float | None = None
    """Held out: the share of the training input asked for."""
    unit: str | None = None
    """Held out: what was held out, "documents" (text: whole documents, picked by a hash of their index) or
    "tokens" (a token array: its last ``fraction``)."""
    topped_up: bool | None = None
    """Held out: True when that share fell short of the validation floor (lmtune.data.documents.min_val_tokens)
    and more was moved there from the end of the training split."""

    def to_json(self) -> dict[str, object]:
        """Its fields that apply (those of the other source left out)."""
        return {k: v for k, v in asdict(self).items() if v is not None}


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes, read 4 MiB at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class BuiltinKey:
    """What the built-in corpus was built from; a copy whose meta.json records another key is rebuilt."""

    generator_version: int
    """lmtune.data.corpus.stories.GENERATOR_VERSION: bumped whenever the generated text changes."""
    seed: int
    """The stories' seed."""
    vocab_size: int
    """The BPE vocabulary it was encoded with."""
    target_bytes: int
    """The text's size: stories are written until it is reached."""
    min_val_tokens: int
    """The validation split's floor it was split with (lmtune.data.documents.MIN_VAL_TOKENS)."""


@dataclass(frozen=True)
class PreparedMeta:
    """What meta.json says about the token files (lmtune.data.dataset.DataMeta reads it back)."""

    vocab_size: int
    """The model vocabulary the ids belong to."""
    dtype: str
    """uint16, or uint32 for a vocabulary above 65535."""
    train_tokens: int
    """Tokens in train.bin."""
    val_tokens: int
    """Tokens in val.bin."""
    max_token_id: int
    """The largest id in either file."""
    eot_id: int | None
    """The id of <|endoftext|> (None for token-id inputs whose tokenizer, if any, has none)."""
    sources: list[Source]
    """The training input files."""
    tokenizer: str | None
    """The tokenizer file beside the token files (None for token-id inputs prepared without --tokenizer)."""
    validation: ValidationSource | None = None
    """Where val.bin came from (every prepare records it; None only in code that predates it)."""
    builtin: BuiltinKey | None = None
    """The built-in corpus's key, when this is the built-in corpus (absent from meta.json otherwise)."""

    def to_json(self, content_hash: str) -> dict[str, object]:
        """meta.json's content, in its key order: the fields, then the files' hash and who wrote them."""
        fields = asdict(self)
        fields["validation"] = self.validation.to_json() if self.validation is not None else None
        for optional in ("validation", "builtin"):
            if fields[optional] is None:
                del fields[optional]
        return {**fields, "content_hash": content_hash, "created_by": CREATED_BY}


def check_out(out: Path, force: bool) -> None:
    """Refuse an --out that holds prepared data (or files of the names prepare writes) unless ``force``."""
    check_destination(out, "--out")
    if force:
        return
    if (out / "meta.json").exists():
        raise LmtuneError(f"{out} already holds prepared data (meta.json); pass --force to overwrite it "
                          "or choose another --out")
    taken = [name for name in FILES if (out / name).exists()]
    if taken:
        raise LmtuneError(f"{out} already holds {', '.join(taken)} (not prepared by lmtune: no meta.json); pass "
                          "--force to replace them or choose another --out")


def dtype_for(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint32 if vocab_size > 65535 else np.uint16)


def content_hash(d: Path) -> str:
    """sha256 of train.bin then val.bin: what tells two data dirs' tokens apart."""
    h = hashlib.sha256()
    for name in ("train.bin", "val.bin"):
        with open(d / name, "rb") as f:
            while block := f.read(1 << 22):
                h.update(block)
    return h.hexdigest()


# Errors of a write that found no room: the disk full, or the user's quota spent.
NO_ROOM = (errno.ENOSPC, errno.EDQUOT)


def write_all(handle, data) -> None:
    """Every byte of ``data`` (bytes, or a contiguous array) into ``handle``, an unbuffered binary file: the one
    write prepare makes (``os.write``, so that a full disk is raised here, naming the file, and not at a later
    flush). A full disk raises OSError(ENOSPC) with the file's path as its filename."""
    view = memoryview(data).cast("B")
    fd = handle.fileno()
    while view:
        try:
            view = view[os.write(fd, view):]
        except OSError as err:
            if err.errno in NO_ROOM:
                raise OSError(err.errno, err.strerror, str(handle.name)) from None
            raise


def open_new(path: Path):
    """``path`` opened to be written by ``write_all`` (unbuffered; created with the user's umask)."""
    return open(path, "wb", buffering=0)  # noqa: SIM115 - the caller closes it


def size_text(n: float) -> str:
    """``n`` bytes in KiB, MiB or GiB, whichever reads best."""
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if n < 1024 or unit == "GiB":
            return f"{n:,.1f} {unit}"
    raise AssertionError  # (the loop returns)


def no_room(folder: Path, name: str, need: int, exact: bool) -> LmtuneError:
    """One line for a full disk: ``name`` could not be written in ``folder``, whose data needs ``need`` bytes (up to
    that much where not ``exact``)."""
    free = shutil.disk_usage(existing_ancestor(folder)).free
    return LmtuneError(f"no space left on the disk of {folder} to write {name}: the data needs "
                       f"{'' if exact else 'up to '}{size_text(need)} there and {size_text(free)} is free; free "
                       "space on it, or prepare the data on another disk (prepare --out DIR, then --data DIR)")


def _new_folder(parent: Path, prefix: str) -> Path:
    """A new, empty folder in ``parent`` named ``prefix`` and random hex digits, made with the user's umask (as the
    built-in corpus's folder is; ``tempfile.mkdtemp`` makes its folders 0700, and this one becomes DIR)."""
    while True:
        folder = parent / f"{prefix}{secrets.token_hex(4)}"
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue


@contextlib.contextmanager
def staging(out: Path, force: bool, need: int, exact: bool = True) -> Iterator[Path]:
    """A temp dir next to ``out``; on success its files are committed into ``out`` (see module doc). A full disk
    meanwhile is one line (``no_room``, with ``need`` bytes the data takes, ``exact`` or at most), ``out`` left as it
    was and the temp dir removed."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp: Path | None = None
    try:
        tmp = _new_folder(out.parent, f".{out.name}.tmp-")
        yield tmp
        _commit(tmp, out, force)
    except OSError as err:
        if err.errno not in NO_ROOM:
            raise
        staged = err.filename and tmp is not None and Path(err.filename).parent == tmp
        name = Path(err.filename).name if staged else out.name  # (the file being written, else the folder)
        raise no_room(out, name, need, exact) from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _commit(tmp: Path, out: Path, force: bool) -> None:
    """The staged files of ``tmp`` into ``out``: ``tmp`` renamed to it where it is new, else renamed in one by one
    with meta.json last."""
    check_out(out, force)  # re-check: another process may have prepared it meanwhile
    if not out.exists():
        tmp.rename(out)
        return
    with contextlib.suppress(FileNotFoundError):
        (out / "meta.json").unlink()
    for name in FILES:
        src = tmp / name
        if src.exists():
            os.replace(src, out / name)
        elif name != "meta.json":
            with contextlib.suppress(FileNotFoundError):
                (out / name).unlink()  # e.g. a stale tokenizer.json from a text prepare


def write_meta(d: Path, meta: PreparedMeta) -> None:
    """meta.json, written after the token files it hashes, with the data's unigram baseline measured on them
    (lmtune.data.dataset.unigram_loss: what judges whether a run trained)."""
    train, val = (np.memmap(d / f"{split}.bin", dtype=meta.dtype, mode="r") for split in ("train", "val"))
    content = {**meta.to_json(content_hash(d)), "unigram_loss": unigram_loss(train, val, meta.vocab_size)}
    with open_new(d / "meta.json") as handle:
        write_all(handle, (json.dumps(content, indent=2) + "\n").encode())


class TokenFiles:
    """train.bin and val.bin while they are written: token ids appended, counted, the largest id kept."""

    def __init__(self, folder: Path, dtype: np.dtype):
        self.dtype = dtype
        self.files = {s: open_new(folder / f"{s}.bin") for s in ("train", "val")}
        self.counts = {"train": 0, "val": 0}
        self.max_id = 0

    def append(self, split: str, arrays: list[np.ndarray]) -> None:
        if not arrays:
            return
        ids = np.concatenate(arrays)
        if ids.size:
            self.max_id = max(self.max_id, int(ids.max()))
            write_all(self.files[split], ids.astype(self.dtype))
            self.counts[split] += ids.size

    def __enter__(self) -> TokenFiles:
        return self

    def __exit__(self, *exc) -> None:
        for handle in self.files.values():
            handle.close()


def top_up_val(d: Path, dtype: np.dtype, eot_id: int | None, n_train: int, need: int) -> int:
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
    with open(d / "train.bin", "r+b") as tr, open(d / "val.bin", "ab", buffering=0) as va:
        tr.seek(cut * item)
        while block := tr.read(1 << 22):
            write_all(va, block)
        tr.truncate(cut * item)
    return n_train - cut
