"""``python -m lmtune.prepare``: turn text (or token ids) into a data dir lmtune trains on.

    python -m lmtune.prepare --input FILE [FILE ...] --out DIR [--vocab-size 10000] [--val-fraction 0.01]
    python -m lmtune.prepare --tokens FILE.npy|FILE.bin --out DIR [--vocab-size N] [--dtype uint16]
    python -m lmtune.prepare                  # the built-in synthetic corpus into data/builtin/
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lmtune.cli import prog
from lmtune.data.prepare import ensure_builtin_corpus, prepare_text, prepare_tokens
from lmtune.errors import LmtuneError, cli_entry, setup_cli_logging


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog("prepare"), description="Prepare training data: train a "
                                 "byte-level BPE tokenizer and encode text into flat token files.")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--input", nargs="+", type=Path, help="UTF-8 text files (documents separated by a "
                     "line '<|endoftext|>'); omit both --input and --tokens for the built-in corpus")
    src.add_argument("--tokens", type=Path, help="already-tokenized flat id array (.npy, or raw .bin)")
    ap.add_argument("--out", type=Path, help="output data dir (default data/builtin for the built-in corpus)")
    ap.add_argument("--vocab-size", type=int, default=None, help="BPE vocab size (default 10000); with "
                    "--tokens the model vocab (default max id + 1)")
    ap.add_argument("--val-fraction", type=float, default=0.01,
                    help="share of the documents held out for validation, in (0, 0.5] (default 0.01)")
    ap.add_argument("--dtype", choices=("uint16", "uint32", "int32", "int64"), help="dtype of a raw .bin "
                    "--tokens file (default uint16)")
    ap.add_argument("--force", action="store_true", help="overwrite an existing prepared --out")
    return ap


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_cli_logging()
    if args.input:
        if args.out is None:
            raise LmtuneError("--out is required with --input; pass --out DIR")
        out = prepare_text(args.input, args.out, vocab_size=10000 if args.vocab_size is None else args.vocab_size,
                           val_fraction=args.val_fraction, force=args.force)
    elif args.tokens:
        if args.out is None:
            raise LmtuneError("--out is required with --tokens; pass --out DIR")
        out = prepare_tokens(args.tokens, args.out, vocab_size=args.vocab_size,
                             val_fraction=args.val_fraction, force=args.force, dtype=args.dtype)
    else:
        if args.vocab_size is not None or args.dtype is not None:
            raise LmtuneError("--vocab-size and --dtype apply to --input or --tokens; the built-in corpus has its "
                              "own (drop them, or pass --input FILE)")
        out = ensure_builtin_corpus(args.out or Path("data/builtin"), option="--out" if args.out else None)
    meta = json.loads((out / "meta.json").read_text())
    print(f"prepared {out}: train {meta['train_tokens']:,} tokens, val {meta['val_tokens']:,} tokens, "
          f"vocab {meta['vocab_size']} ({meta['dtype']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
