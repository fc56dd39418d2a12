"""The byte-level BPE tokenizer of a text prepare: trained on the inputs, then encoding them into the
token files, ``<|endoftext|>`` after every document.

Memory: both passes read the inputs a chunk at a time (lmtune.data.documents.iter_pieces) and the
encoding pass appends ids to the .bin files as it produces them, so memory is O(chunk + vocab) and
independent of the input size.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from lmtune.data.datadir import TokenFiles
from lmtune.data.documents import CHUNK_BYTES, EOT, DocumentTally, iter_pieces

log = logging.getLogger(__name__)

# The longest pre-tokenised word BPE trains on (in bytes, as the byte-level alphabet counts them): longer
# runs without whitespace are cut into pieces this long, which keeps training time linear in the input.
MAX_PIECE_BYTES = 256
_ENCODE_BATCH_CHARS = 1 << 20  # text handed to one encode_batch call; bounds memory, keeps rayon busy


def require_tokenizers(why: str) -> None:
    """One line when the ``tokenizers`` package is not installed (a bare GPU box may lack it): ``why`` it is
    needed, and the fix."""
    import importlib.util

    if importlib.util.find_spec("tokenizers") is None:
        from lmtune.errors import LmtuneError

        raise LmtuneError(f"the tokenizers package is not installed: {why}")


def train_tokenizer(inputs: list[Path], vocab_size: int, tally: DocumentTally, chunk_bytes: int, progress: bool):
    """A BPE tokenizer trained on ``inputs``; ``tally`` counts their documents on the way."""
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
    read = _ReadProgress(sum(p.stat().st_size for p in inputs))

    def texts() -> Iterator[str]:
        for p in inputs:
            for text, ends in iter_pieces(p, chunk_bytes):
                read.add(len(text))
                if ends:
                    tally.add()
                if text:
                    yield text

    tok.train_from_iterator(texts(), trainer=trainer)
    return tok


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


def encode(tok, inputs: list[Path], chunk_bytes: int, eot_id: int, split_of: Callable[[int], str],
           files: TokenFiles, progress: bool) -> None:
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


def load_tokenizer(path: Path):
    """The tokenizer at ``path`` for prompts and samples: a ``tokenizers`` JSON file (lmtune.prepare saves one as
    tokenizer.json), a GPT-2-style ``vocab.json`` ({token: id}) with its ``merges.txt`` beside it (a byte-level BPE,
    as CS336 students save theirs), or a folder holding either. One line when it is none of these."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from lmtune.errors import LmtuneError

    path = Path(path)
    if path.is_dir():
        found = next((path / name for name in ("tokenizer.json", "vocab.json") if (path / name).is_file()), None)
        if found is None:
            raise LmtuneError(f"--tokenizer {path}: the folder holds no tokenizer.json and no vocab.json; give one of "
                              "them")
        path = found
    if not path.is_file():
        raise LmtuneError(f"--tokenizer {path}: no such file; give a tokenizer.json, or a vocab.json with merges.txt "
                          "beside it")
    try:
        if path.name != "vocab.json":
            return Tokenizer.from_file(str(path))
        merges = path.with_name("merges.txt")
        if not merges.is_file():
            raise LmtuneError(f"--tokenizer {path}: a GPT-2-style vocab.json needs its merges.txt beside it "
                              f"({merges} is missing)")
        tok = Tokenizer(models.BPE.from_file(str(path), str(merges)))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        if tok.token_to_id(EOT) is not None:
            tok.add_special_tokens([EOT])
        return tok
    except LmtuneError:
        raise
    except Exception as err:  # noqa: BLE001 - the tokenizers library's parse errors, whatever they are
        raise LmtuneError(f"--tokenizer {path}: not a tokenizer the tokenizers library reads ({type(err).__name__}: "
                          f"{str(err).strip()[:160]}); give a tokenizer.json, or a GPT-2-style vocab.json "
                          "({token: id}) with merges.txt") from None
