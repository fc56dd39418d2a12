"""Text inputs as documents, and which split each document goes to.

Documents are separated by a line containing exactly ``<|endoftext|>``; a file without such lines is one
document. A file is read CHUNK_BYTES at a time: a document longer than a chunk comes in pieces, cut where
the byte-level pre-tokenizer splits anyway, so its pieces encode to the ids of the whole.

The validation split is ``val_fraction`` of the tokens, in whole documents picked by a hash of their
index (seedless, so the same input always splits the same way), and at least ``MIN_VAL_TOKENS`` or a
tenth of all tokens, whichever is less (``min_val_tokens``).
"""

from __future__ import annotations

import codecs
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from lmtune.errors import LmtuneError

CHUNK_BYTES = 1 << 20
EOT = "<|endoftext|>"
# The validation split holds at least this many tokens (or a tenth of the data, if that is less).
MIN_VAL_TOKENS = 65_536
_SEP_RE = re.compile(r"^<\|endoftext\|>\r?(?:\n|\Z)", re.MULTILINE)


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


def is_val(index: int, val_fraction: float) -> bool:
    return unit_hash(index) < val_fraction


def unit_hash(index: int) -> float:
    """splitmix64 of the document index mapped to [0, 1): a stable, seedless, uniform split."""
    z = (index + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return ((z ^ (z >> 31)) >> 11) / float(1 << 53)


def min_val_tokens(total_tokens: int, val_fraction: float) -> int:
    """The validation split's size: val_fraction of the tokens, and at least MIN_VAL_TOKENS or a tenth of
    all tokens, whichever is less (a 1% split of a small input is too few windows to evaluate on)."""
    return max(1, math.ceil(total_tokens * val_fraction), min(MIN_VAL_TOKENS, total_tokens // 10))


@dataclass
class DocumentTally:
    """The documents of the inputs, counted in one pass (the tokenizer's) so that the encoding pass can
    give each split at least one document without holding anything per document."""

    val_fraction: float
    """The share of documents the hash puts in val."""
    docs: int = 0
    """Documents seen so far."""
    val_docs: int = 0
    """Of them, those the hash puts in val."""
    lowest: tuple[float, int] = (2.0, -1)
    """(hash, index) of the document with the lowest hash: forced into val when the hash put none there."""
    highest: tuple[float, int] = (-1.0, -1)
    """(hash, index) of the document with the highest hash: forced into train when the hash put all in val."""

    def add(self) -> None:
        """One more document ended."""
        i = self.docs
        u = unit_hash(i)
        self.lowest = min(self.lowest, (u, i))
        self.highest = max(self.highest, (u, i))
        self.docs += 1
        self.val_docs += is_val(i, self.val_fraction)

    def split_of(self) -> Callable[[int], str]:
        """Document index -> "train" or "val" by its hash, forcing one document into each split when the
        hash alone would leave a split empty (a single document is split by tokens afterwards instead)."""
        n_docs, n_val_docs, val_fraction = self.docs, self.val_docs, self.val_fraction
        force_val = self.lowest[1] if n_val_docs == 0 else -1
        force_train = self.highest[1] if n_val_docs == n_docs and n_docs > 1 else -1

        def split_of(i: int) -> str:
            if n_docs == 1:
                return "train"
            if i == force_val:
                return "val"
            if i == force_train:
                return "train"
            return "val" if is_val(i, val_fraction) else "train"

        return split_of
