"""Token-id inputs as ``prepare --tokens`` reads them (lmtune.data.prepare.prepare_tokens): a .npy or raw .bin file
memory-mapped as a flat id array and checked (its ids, its dtype, the vocabulary they fit), a validation file of the
same kind, the ids copied into the data dir in fixed-size slices, and the tokenizer they came from. Each problem is one
LmtuneError naming the file and the option."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lmtune.data.datadir import open_new, write_all
from lmtune.data.tokenizer import load_tokenizer, require_tokenizers
from lmtune.errors import LmtuneError

# Token files are uint16 or uint32: an id must fit 32 bits.
MAX_TOKEN_ID = 2**32 - 1
TOKENS_SLICE = 1 << 24  # elements copied per step from a --tokens array
NPY_MAGIC = b"\x93NUMPY"  # what every .npy file starts with (numpy.lib.format)


def open_tokens(path: Path, dtype: str | None, option: str = "--tokens") -> np.ndarray:
    """``path`` (given to ``option``) as a flat integer array, memory-mapped; one line when it is not one."""
    if not path.exists():
        raise LmtuneError(f"token file {path} does not exist; check the path passed to {option}")
    if not path.is_file():
        raise LmtuneError(f"token file {path} is not a regular file; pass a .npy or .bin array to {option}")
    if path.stat().st_size == 0:
        raise LmtuneError(f"token file {path} is empty; pass a non-empty .npy or .bin array of token ids to {option}")
    if path.suffix == ".npy":
        arr = load_npy(path, option)
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
    if arr.shape[0] < 2:
        raise LmtuneError(f"{path} holds {arr.shape[0]} token(s); pass at least 2 so that its split is not empty")
    return arr


def load_npy(path: Path, option: str) -> np.ndarray:
    """``path`` memory-mapped as a .npy array; one line when it is none (numpy's own message for a file without its
    header is advice to unpickle it, which lmtune never does: a pickle runs code)."""
    with open(path, "rb") as handle:
        if handle.read(len(NPY_MAGIC)) != NPY_MAGIC:
            raise LmtuneError(f"cannot read {path}: it is not a .npy array (no numpy header: text, or another "
                              f"format, named .npy); save the ids with numpy.save, or give {option} a raw .bin of "
                              "ids with --dtype")
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as err:  # noqa: BLE001 - numpy raises several types for a corrupt header
        why = "it holds Python objects" if "pickle" in str(err) else f"{type(err).__name__}: {err}"
        raise LmtuneError(f"cannot read {path} as a .npy array of token ids ({why}); save the ids with numpy.save, "
                          f"or give {option} a raw .bin of ids with --dtype") from None
    return arr


def check_dtype_applies(dtype: str | None, arrays: dict[Path, np.ndarray]) -> None:
    """--dtype reads raw .bin files: refused, in one line, where every token file is a .npy (which records its own
    dtype, and --dtype would do nothing)."""
    if dtype is None or any(p.suffix == ".bin" for p in arrays):
        return
    found = ", ".join(f"{p} holds {arr.dtype}" for p, arr in arrays.items())
    raise LmtuneError(f"--dtype {dtype} does nothing here: a .npy records its own dtype ({found}); drop --dtype (it "
                      "is for raw .bin token files)")


def id_range(arr: np.ndarray) -> tuple[int, int]:
    """(smallest, largest) id of a non-empty array (open_tokens holds at least 2), read TOKENS_SLICE at a time."""
    smallest, largest = [], []
    for s in range(0, int(arr.shape[0]), TOKENS_SLICE):
        part = np.asarray(arr[s : s + TOKENS_SLICE])
        smallest.append(int(part.min()))
        largest.append(int(part.max()))
    return min(smallest), max(largest)


def largest_id(path: Path, arr: np.ndarray) -> int:
    """The largest id in ``arr``, after refusing a negative id or one that does not fit 32 bits."""
    lo, hi = id_range(arr)
    if lo < 0:
        raise LmtuneError(f"{path} contains negative token id {lo}; token ids must be >= 0 (wrong --dtype?)")
    if hi > MAX_TOKEN_ID:
        raise LmtuneError(f"{path} contains token id {hi}, which does not fit the 32-bit token files lmtune "
                          f"writes (largest {MAX_TOKEN_ID}); remap the ids to a dense range first")
    return hi


def token_vocab(vocab_size: int | None, largest: dict[Path, int], tokenizer: Path | None,
                 tokenizer_size: int | None) -> int:
    """The model vocabulary of token-id inputs: --vocab-size, else the tokenizer's size, else the largest id + 1;
    one line naming the file whose ids do not fit it."""
    if vocab_size is not None and not 1 <= vocab_size <= MAX_TOKEN_ID + 1:
        raise LmtuneError(f"--vocab-size {vocab_size} must be between 1 and 2**32 (ids are stored in 32 bits)")
    for path, hi in largest.items():
        if tokenizer_size is not None and hi >= tokenizer_size:
            raise LmtuneError(f"{path} contains token id {hi} but the tokenizer {tokenizer} has {tokenizer_size:,} "
                              "tokens; pass the tokenizer these ids were encoded with")
        if vocab_size is not None and hi >= vocab_size:
            raise LmtuneError(f"{path} contains token id {hi} >= --vocab-size {vocab_size}; "
                              f"pass --vocab-size {hi + 1} or more")
    if vocab_size is not None:
        return vocab_size
    return tokenizer_size if tokenizer_size is not None else max(largest.values()) + 1


def open_val_tokens(val_tokens: Path, dtype: str | None, train: np.ndarray, train_path: Path) -> np.ndarray:
    """--val-tokens as an array of the same dtype as --tokens's (both from one tokenizer)."""
    val = open_tokens(val_tokens, dtype, "--val-tokens")
    if val.dtype != train.dtype:
        raise LmtuneError(f"--val-tokens {val_tokens} holds {val.dtype} ids but --tokens {train_path} holds "
                          f"{train.dtype}; save both arrays with one dtype (e.g. numpy.save(path, ids.astype("
                          f"numpy.{train.dtype})))")
    return val


def copy_ids(arr: np.ndarray, start: int, end: int, dest: Path, dtype: np.dtype) -> None:
    """``arr[start:end]`` as ``dtype`` into the file ``dest``, TOKENS_SLICE at a time."""
    with open_new(dest) as f:
        for s in range(start, end, TOKENS_SLICE):
            write_all(f, np.asarray(arr[s : min(s + TOKENS_SLICE, end)]).astype(dtype))


def load_id_tokenizer(path: Path):
    """The student's own tokenizer for token-id inputs (load_tokenizer's formats; one line when it is none)."""
    require_tokenizers("--tokenizer is read with it; pip install tokenizers, or drop --tokenizer (samples are then "
                       "shown as token ids)")
    return load_tokenizer(Path(path))
