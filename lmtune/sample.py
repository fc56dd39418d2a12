"""``python -m lmtune.sample CHECKPOINT``: generate text from a trained model (lmtune.training.sampling).

The checkpoint's own config names its model and its data. lmtune's model needs nothing more; a user's model is code,
and a checkpoint is data: its recorded code is imported only with ``--trust-code``, or the user names their own copy
with ``--model PATH:NAME`` (lmtune.usercode.consent); without either, one line saying so. The data's tokenizer
encodes the prompt and decodes the sample; ``--tokenizer`` gives another (a tokenizers JSON, or a GPT-2-style
vocab.json with merges.txt: for data prepared from token ids; one with fewer tokens than the model's vocabulary is
refused, as not the one its data was encoded with). Without any tokenizer the sample is printed as token
ids. Generation stops at ``<|endoftext|>`` or after --max-tokens.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import os
import sys
from pathlib import Path

from lmtune.cli import command_parser, device_flag
from lmtune.data.documents import EOT
from lmtune.errors import LmtuneError, cli_entry, setup_cli_logging, shown
from lmtune.training.sampling import DEFAULT_PROMPT, MAX_SEED, SampleSettings, generate
from lmtune.usercode.consent import add_consent_arguments, consent_from_arguments
from lmtune.usercode.guard import user_call
from lmtune.usercode.spec import load_model

DEFAULTS = SampleSettings()


def build_parser() -> argparse.ArgumentParser:
    p = command_parser("sample", description="Generate text from a trained model's checkpoint.")
    p.add_argument("checkpoint", type=Path, help="a run's checkpoints/best.pt (or a periodic checkpoint), a trial's "
                                                 "folder (the checkpoint it kept) or a sweep's folder, results/NAME "
                                                 "(its best trial's checkpoint)")
    prompt = p.add_mutually_exclusive_group()  # (one prompt: text or ids)
    prompt.add_argument("--prompt", default=None, help=f"the text to continue (default: {DEFAULT_PROMPT!r})")
    prompt.add_argument("--prompt-ids", metavar="ID,ID,...", help="the prompt as token ids instead of text")
    p.add_argument("--max-tokens", type=int, default=DEFAULTS.max_tokens,
                   help=f"tokens to generate at most (default {DEFAULTS.max_tokens})")
    p.add_argument("--temperature", type=float, default=DEFAULTS.temperature,
                   help=f"softmax temperature; 0 always takes the most likely token (default {DEFAULTS.temperature})")
    p.add_argument("--top-p", type=float, default=DEFAULTS.top_p,
                   help=f"nucleus sampling's probability mass (default {DEFAULTS.top_p})")
    p.add_argument("--seed", type=int, default=0, help="random seed of the draws (default 0)")
    p.add_argument("--samples", type=int, default=1, help="samples to draw, seeds --seed, --seed+1, ... (default 1)")
    p.add_argument("--tokenizer", type=Path, help="tokenizer.json, or a GPT-2-style vocab.json with merges.txt "
                                                  "beside it (default: the run's data's tokenizer.json)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps (default auto)")
    add_consent_arguments(p)
    return p


def checkpoint_to_sample(path: Path) -> tuple[Path, str | None]:
    """The checkpoint file ``path`` names: itself, or the one a sweep's or a run's folder offers, with a line saying
    which (None for a file); one line (LmtuneError) where a folder offers none (lmtune.report.sampled_checkpoint)."""
    if path.is_file():
        return path, None
    from lmtune.report.sampled_checkpoint import checkpoint_in, missing_in_sweep  # (the report's reader: only here)

    if path.is_dir():
        return checkpoint_in(path)
    if not path.exists() and (why := missing_in_sweep(path)):
        raise LmtuneError(why)
    return path, None  # (load_model says what is wrong with it)


def prompt_ids(args: argparse.Namespace, tokenizer, data_dir: str) -> list[int]:
    if args.prompt_ids is not None:
        try:
            return [int(part) for part in args.prompt_ids.split(",") if part.strip()]
        except ValueError:
            raise LmtuneError(f"--prompt-ids {shown(args.prompt_ids)}: give token ids separated by commas, e.g. "
                              "--prompt-ids 464,3290") from None
    if tokenizer is None:
        raise LmtuneError(f"--prompt: no tokenizer to encode it ({no_tokenizer_why(data_dir)}); give --tokenizer PATH, "
                          "or the prompt as --prompt-ids")
    return tokenizer.encode(args.prompt if args.prompt is not None else DEFAULT_PROMPT).ids


def no_tokenizer_why(data_dir: str) -> str:
    """Why the run's data gives no tokenizer: its folder is not where the run recorded it (a relative path read from
    another folder, or data moved), or it was prepared from token ids."""
    if not Path(data_dir).is_dir():
        return (f"the run's data folder {data_dir} is not found from {Path.cwd()}: run sample where the run was "
                "trained")
    return "the run's data was prepared from token ids and has no tokenizer.json"


def run_tokenizer(args: argparse.Namespace, data_dir: str):
    """--tokenizer's, else the run's data's tokenizer.json, else None."""
    from lmtune.data.tokenizer import load_tokenizer

    if args.tokenizer is not None:
        return load_tokenizer(args.tokenizer)
    own = Path(data_dir) / "tokenizer.json"
    return load_tokenizer(own) if own.is_file() else None


def check_covers(tokenizer, path: Path, vocab: int, data_dir: str) -> None:
    """Refuse, in one line naming both sizes, a --tokenizer with fewer tokens than the model's vocabulary: not the
    tokenizer its data was encoded with (it would decode the model's ids to garbage, and drop those past its end).
    A vocabulary padded above its data's tokenizer (prepare --tokens --vocab-size) is no reason: a tokenizer that
    covers every id the run's data holds is taken."""
    have = tokenizer.get_vocab_size()
    if have >= vocab:
        return
    from lmtune.data.dataset import read_meta

    with contextlib.suppress(LmtuneError):  # (the run's data not found from here: the sizes alone decide)
        if read_meta(Path(data_dir)).max_token_id < have:
            return
    raise LmtuneError(f"--tokenizer {path} has {have:,} tokens but the model's vocabulary is {vocab:,}: it is not "
                      "the tokenizer the model's data was encoded with (its text would be garbage); give that one "
                      "(the run's data's tokenizer.json), or leave --tokenizer out")


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_cli_logging(logging.WARNING)
    settings = SampleSettings(args.max_tokens, args.temperature, args.top_p, args.seed)
    settings.validate()
    if not 1 <= args.samples <= 100:
        raise LmtuneError(f"--samples must be from 1 to 100 (got {args.samples})")
    if args.seed + args.samples - 1 > MAX_SEED:
        raise LmtuneError(f"--seed with --samples {args.samples} draws seeds up to {args.seed + args.samples - 1}: "
                          f"--seed must be from 0 to {MAX_SEED - args.samples + 1}")
    consent = consent_from_arguments(args)
    checkpoint, which = checkpoint_to_sample(args.checkpoint)
    model, config = load_model(checkpoint, device_flag(args.device), consent)
    tokenizer = run_tokenizer(args, config.data_dir)
    if args.tokenizer is not None:
        check_covers(tokenizer, args.tokenizer, config.model.vocab_size, config.data_dir)
    prompt = prompt_ids(args, tokenizer, config.data_dir)
    vocab = config.model.vocab_size
    if any(not 0 <= i < vocab for i in prompt):
        raise LmtuneError(f"--prompt-ids: every id must be in [0, {vocab}) (the model's vocabulary)")
    stop = tokenizer.token_to_id(EOT) if tokenizer is not None else None
    if which:  # (on stderr once every input is checked: stdout is the sample's, and a refusal stays one line)
        print(which, file=sys.stderr)
    for k in range(args.samples):
        ids = generate(model, prompt, SampleSettings(settings.max_tokens, settings.temperature, settings.top_p,
                                                     settings.seed + k), config.model.context_length, stop,
                       functools.partial(user_call, config.code.model))
        if args.samples > 1:
            print(f"--- sample {k + 1} (seed {settings.seed + k}) ---")
        if tokenizer is None:
            print(f"token ids (no tokenizer: {no_tokenizer_why(config.data_dir)}; give --tokenizer to read text):")
            print(" ".join(map(str, prompt)) + " | " + " ".join(map(str, ids)))
        else:
            print(tokenizer.decode(prompt + ids))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
