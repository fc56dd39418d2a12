"""``python -m lmtune.prepare``: turn text (or token ids) into a data dir lmtune trains on.

    python -m lmtune.prepare --input TRAIN.txt [...] --out DIR [--vocab-size 10000] [--val-input VALID.txt]
    python -m lmtune.prepare --tokens train.npy --out DIR [--val-tokens valid.npy] [--tokenizer vocab.json]
    python -m lmtune.prepare                  # the built-in synthetic corpus into data/builtin/

The validation split is a file of its own (--val-input, --val-tokens) or, without one, --val-fraction (default 1%)
held out of the training input; meta.json records which. docs/data.md is the full page.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lmtune.cli import command_parser
from lmtune.data.dataset import describe_validation
from lmtune.data.prepare import DEFAULT_VAL_FRACTION, ensure_builtin_corpus, prepare_text, prepare_tokens
from lmtune.errors import LmtuneError, cli_entry, setup_cli_logging, shown


def build_parser() -> argparse.ArgumentParser:
    ap = command_parser("prepare", description="Prepare training data: train a "
                                 "byte-level BPE tokenizer and encode text into flat token files.")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--input", nargs="+", type=Path, help="UTF-8 text files (documents separated by a "
                     "line '<|endoftext|>'); omit both --input and --tokens for the built-in corpus")
    src.add_argument("--tokens", type=Path, help="already-tokenized flat id array (.npy, or raw .bin)")
    ap.add_argument("--val-input", type=Path, help="with --input: the validation text (e.g. "
                    "TinyStoriesV2-GPT4-valid.txt), encoded with the tokenizer trained on --input alone; the "
                    "validation split is exactly its tokens")
    ap.add_argument("--val-tokens", type=Path, help="with --tokens: the validation ids (.npy, or raw .bin), from "
                    "the same tokenizer and of the same dtype as --tokens; the validation split is exactly them")
    ap.add_argument("--tokenizer", type=Path, help="with --tokens: the tokenizer the ids came from (a GPT-2-style "
                    "vocab.json with merges.txt beside it, or a tokenizers JSON), saved into --out as "
                    "tokenizer.json so that samples and the report decode")
    ap.add_argument("--out", type=Path, help="output data dir (default data/builtin for the built-in corpus)")
    ap.add_argument("--vocab-size", type=int, default=None, help="BPE vocab size (default 10000); with "
                    "--tokens the model vocab (default the --tokenizer's size, else the largest id + 1)")
    ap.add_argument("--val-fraction", type=float, default=None,
                    help="without --val-input/--val-tokens: share of the training input held out for validation, "
                         f"in (0, 0.5] (default {DEFAULT_VAL_FRACTION})")
    ap.add_argument("--dtype", choices=("uint16", "uint32", "int32", "int64"), help="dtype of raw .bin "
                    "--tokens/--val-tokens files (default uint16)")
    ap.add_argument("--force", action="store_true", help="overwrite an existing prepared --out")
    return ap


def _repeated(files: list[Path]) -> Path | None:
    """The first of ``files`` named twice (however it is written), if any."""
    seen: set[Path] = set()
    for file in files:
        if file.resolve() in seen:
            return file
        seen.add(file.resolve())
    return None


def check_combination(args: argparse.Namespace) -> None:
    """One line for options that do not go together: a validation file or tokenizer of the other kind of input,
    or any of them for the built-in corpus."""
    if args.input and args.val_tokens is not None:
        raise LmtuneError("--val-tokens takes ids but --input takes text: pass the validation text with --val-input "
                          "(or both as ids: --tokens and --val-tokens)")
    if args.input and args.tokenizer is not None:
        raise LmtuneError("--tokenizer goes with --tokens: with --input, prepare trains its own tokenizer on the "
                          "training text; drop --tokenizer (or pass your own ids with --tokens)")
    if args.tokens and args.val_input is not None:
        raise LmtuneError("--val-input takes text but --tokens takes ids: pass the validation ids with --val-tokens "
                          "(or both as text: --input and --val-input)")
    if not args.input and not args.tokens:
        given = [flag for flag, value in (("--vocab-size", args.vocab_size), ("--dtype", args.dtype),
                                          ("--val-fraction", args.val_fraction), ("--val-input", args.val_input),
                                          ("--val-tokens", args.val_tokens), ("--tokenizer", args.tokenizer))
                 if value is not None]
        if given:
            raise LmtuneError(f"{', '.join(given)}: for --input or --tokens only; the built-in corpus has its own "
                              "(drop them, or pass --input FILE)")
    if args.input and (twice := _repeated(args.input)):
        raise LmtuneError(f"--input {shown(str(twice))} is given twice; give each file once (its documents would be "
                          "trained on twice)")
    if (args.input or args.tokens) and args.out is None:
        raise LmtuneError(f"--out is required with {'--input' if args.input else '--tokens'}; pass --out DIR")


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_cli_logging()
    check_combination(args)
    if args.input:
        out = prepare_text(args.input, args.out, vocab_size=10000 if args.vocab_size is None else args.vocab_size,
                           val_fraction=args.val_fraction, force=args.force, val_input=args.val_input)
    elif args.tokens:
        out = prepare_tokens(args.tokens, args.out, vocab_size=args.vocab_size, val_fraction=args.val_fraction,
                             force=args.force, dtype=args.dtype, val_tokens=args.val_tokens,
                             tokenizer=args.tokenizer)
    else:
        out = ensure_builtin_corpus(args.out or Path("data/builtin"), option="--out" if args.out else None)
    meta = json.loads((out / "meta.json").read_text())
    print(f"prepared {out}: train {meta['train_tokens']:,} tokens, val {meta['val_tokens']:,} tokens, "
          f"vocab {meta['vocab_size']} ({meta['dtype']})")
    print(describe_validation(meta.get("validation")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
