"""The flags that name the user's own code, parsed and checked: ``UserCode`` itself, the record a RunConfig holds,
is lmtune.training.code's (its names are imported here too, for the callers that read them with the flags).

A code field names a Python object as ``MODULE:NAME`` (a module importable from the current directory or
``PYTHONPATH``: ``mypkg.model:TransformerLM``) or ``PATH.py:NAME`` (a file: ``examples/cs336_model.py:TransformerLM``).
``normalized`` checks the form once, at the edge, and makes a file's path absolute, so a trial whose working
directory is its own folder finds the same file. Nothing here imports the code: lmtune.usercode.imports does.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from lmtune.errors import LmtuneError, shown
from lmtune.training.code import CALLED_AS as CALLED_AS
from lmtune.training.code import FLAGS as FLAGS
from lmtune.training.code import MODEL_ARG_PREFIX as MODEL_ARG_PREFIX
from lmtune.training.code import MODEL_SETTING as MODEL_SETTING
from lmtune.training.code import ModelArg as ModelArg
from lmtune.training.code import UserCode as UserCode
from lmtune.training.code import check_user_code as check_user_code
from lmtune.training.code import checked_model_args as checked_model_args
from lmtune.training.code import code_setting as code_setting
from lmtune.training.code import is_code_setting as is_code_setting

_QUALNAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def normalized(spec: str, flag: str, base: Path | None = None) -> str:
    """``spec`` checked for its form and, for a file, with its path made absolute (relative to ``base``, default the
    current directory) and the file required to exist; '' stays ''. One line naming ``flag`` otherwise."""
    spec = spec.strip() if isinstance(spec, str) else spec
    if not isinstance(spec, str):
        raise LmtuneError(f"{flag} {shown(spec)}: give MODULE:NAME or path/to/file.py:NAME as text")
    if not spec:
        return ""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not _QUALNAME.fullmatch(name):
        raise LmtuneError(f"{flag} {shown(spec)}: give MODULE:NAME or path/to/file.py:NAME, e.g. "
                          "mypackage.model:TransformerLM or examples/cs336_model.py:TransformerLM")
    if is_file_spec(where):
        path = Path(where).expanduser()
        path = (base or Path.cwd()) / path if not path.is_absolute() else path
        if not path.is_file():
            raise LmtuneError(f"{flag} {shown(spec)}: no file {path}; give the path of your .py file (relative to "
                              "the current directory) or an importable MODULE:NAME")
        return f"{path.resolve()}:{name}"
    if not all(part.isidentifier() for part in where.split(".")):
        raise LmtuneError(f"{flag} {shown(spec)}: {where!r} is neither a module name (dotted identifiers) nor a .py "
                          "file; give MODULE:NAME or path/to/file.py:NAME")
    return f"{where}:{name}"


def is_file_spec(where: str) -> bool:
    """Whether a spec's part before the colon names a file (ends in .py or holds a path separator)."""
    return where.endswith(".py") or "/" in where or "\\" in where


def parse_model_args(pairs: list[str] | None, flag: str = "--model-set") -> dict[str, ModelArg]:
    """``--model-set key=value`` pairs as typed values: true/false, integers and numbers as such, text otherwise."""
    result: dict[str, ModelArg] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise LmtuneError(f"{flag} {shown(pair)}: expected key=value with key an argument name of your model's "
                              "callable, e.g. --model-set use_rope=false")
        result[key] = scalar(value.strip())
    return result


def scalar(text: str) -> ModelArg:
    """A --model-set value as YAML would read it: a bool, an int, a float, or the text itself."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            value = kind(text)
        except ValueError:
            continue
        if kind is float and not math.isfinite(value):
            break
        return value
    return text


def add_code_arguments(parser, optimizer: bool = True, schedule: bool = True) -> None:
    """The flags that name the user's code, on an argparse parser (train, run, lr_find, bench)."""
    parser.add_argument("--model", metavar="MODULE:CALLABLE",
                        help="your own model: MODULE:CALLABLE or path/to/file.py:CALLABLE, called as CALLABLE("
                             "vocab_size=, context_length=, d_model=, num_layers=, num_heads=, d_ff=, rope_theta=[, "
                             "device=, dtype=]) and returning an nn.Module whose forward(token_ids) gives logits "
                             "(default: lmtune's TransformerLM)")
    parser.add_argument("--model-set", action="append", default=[], metavar="KEY=VALUE",
                        help="a further keyword argument of your model's callable, e.g. --model-set use_rope=false "
                             "(repeatable)")
    if optimizer:
        parser.add_argument("--optimizer", metavar="MODULE:CLASS",
                            help="your own torch.optim.Optimizer, called as CLASS(param_groups, lr=, betas=, eps=, "
                                 "weight_decay=) (default: lmtune's AdamW)")
    if schedule:
        parser.add_argument("--schedule", metavar="MODULE:FUNCTION",
                            help="your own LR schedule, called as FUNCTION(it, max_learning_rate, min_learning_rate, "
                                 "warmup_iters, cosine_cycle_iters) (default: lmtune's cosine, or --set schedule=wsd)")


def code_from_arguments(args) -> UserCode:
    """The code the flags name (fields of flags not given: empty)."""
    return UserCode(**{name: normalized(getattr(args, name, None) or "", flag) for name, flag in FLAGS.items()},
                    model_args=parse_model_args(getattr(args, "model_set", None)))
