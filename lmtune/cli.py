"""``lmtune COMMAND [ARGS ...]``: the console script, one command per CLI module.

``lmtune run ARGS`` is ``python -m lmtune.run ARGS``: the module's own ``main`` gets ARGS, so its options,
``--help`` and exit status are the module's. ``lmtune`` alone or ``lmtune --help`` lists the commands, each
described by the first sentence of its module's docstring; ``lmtune --version`` prints the version. ``python -m
lmtune`` is the same as ``lmtune`` (lmtune/__main__.py).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import re
import shutil
import sys
import textwrap

from lmtune.errors import LmtuneError, cli_entry, shown
from lmtune.training.config import field_type
from lmtune.training.handout import canonical_settings, refused_handout_name

# The CLI modules (lmtune/NAME.py, each with a main(argv)), in the order a user meets them.
COMMANDS = ("run", "analyze", "train", "sample", "prepare", "lr_find", "bench", "diagnose", "gpu_check")

_via_console_script = False
"""Whether the command now running was started as ``lmtune COMMAND`` (its usage line then says so)."""


def prog(command: str) -> str:
    """The program name a CLI module's usage line shows: ``lmtune run`` when run through the console script,
    else ``python -m lmtune.run``."""
    return f"lmtune {command}" if _via_console_script else f"python -m lmtune.{command}"


_GIVEN = "_lmtune_given"
"""The namespace attribute where _GivenOnce keeps what each option was given (removed once parsing ends)."""


class _GivenOnce(argparse.Action):
    """argparse's ``store``, refusing a repeat: ``--input a.txt --input b.txt`` would otherwise keep b.txt alone and
    drop a.txt without a word (the data dropped silently)."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = namespace.__dict__.setdefault(_GIVEN, {})
        if option_string is not None and self.dest in given:
            first, second = (_as_given(value) for value in (given[self.dest], values))
            several = (f" ({option_string} takes several after one flag: {option_string} {first} {second})"
                       if self.nargs in ("+", "*") else "")
            raise LmtuneError(f"{option_string} is given twice ({shown(first)}, then {shown(second)}); give it "
                              f"once{several}")
        given[self.dest] = values
        setattr(namespace, self.dest, values)


def _as_given(value) -> str:
    return " ".join(map(str, value)) if isinstance(value, list) else str(value)


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, with every option that stores a value taking it once (a repeat is one line, not the
    last one kept); appending options (``--set``) are unchanged."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register("action", None, _GivenOnce)
        self.register("action", "store", _GivenOnce)

    def parse_known_args(self, args=None, namespace=None):
        parsed, rest = super().parse_known_args(args, namespace)
        parsed.__dict__.pop(_GIVEN, None)
        return parsed, rest


def command_parser(command: str, description: str) -> argparse.ArgumentParser:
    """The parser of ``lmtune COMMAND``: its usage line names the command as it was started (prog) and a single-value
    option given twice is refused in one line."""
    return ArgumentParser(prog=prog(command), description=description)


def describe(command: str) -> str:
    """The first sentence of the command's module docstring, without its leading ``python -m ...``: and
    parentheses (read from the source: listing the commands imports none of them, nor Ray or torch)."""
    spec = importlib.util.find_spec(f"lmtune.{command}")
    assert spec is not None and spec.origin is not None, command  # (each of COMMANDS is a module of lmtune)
    with open(spec.origin, encoding="utf-8") as source:
        doc = ast.get_docstring(ast.parse(source.read())) or ""
    text = " ".join(doc.split("\n\n")[0].split())
    text = re.sub(r"^``[^`]*``[^:]*:\s*", "", text)  # "``python -m lmtune.run``: a sweep" -> "a sweep"
    text = re.sub(r"\s*\([^()]*\)", "", text).replace("``", "")
    sentence = re.match(r".*?[.?!](?=\s|$)", text)
    return (sentence.group(0) if sentence else text).rstrip(".")


def usage() -> str:
    width = min(shutil.get_terminal_size().columns, 100)
    name_width = max(map(len, COMMANDS))
    lines = ["usage: lmtune COMMAND [ARGS ...] | lmtune --version", "",
             "Learning-rate sweeps for small Transformer language models on Ray Tune. lmtune COMMAND is",
             "python -m lmtune.COMMAND; lmtune COMMAND --help lists its options.", "", "commands:"]
    for command in COMMANDS:
        lines += textwrap.wrap(describe(command), width, initial_indent=f"  {command:{name_width}s}  ",
                               subsequent_indent=" " * (name_width + 4))
    return "\n".join(lines)


@cli_entry
def main(argv: list[str] | None = None) -> int:
    global _via_console_script
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        from lmtune import __version__

        print(f"lmtune {__version__}")
        return 0
    command, args = argv[0], argv[1:]
    if command not in COMMANDS:
        raise LmtuneError(f"unknown command {shown(command)}; choose one of: {', '.join(COMMANDS)}")
    module = importlib.import_module(f"lmtune.{command}")
    _via_console_script = True
    try:
        return module.main(args)
    finally:
        _via_console_script = False


if __name__ == "__main__":
    from lmtune import cli  # the module whose flag prog() reads (this one runs as __main__)

    raise SystemExit(cli.main())


def parse_set_args(pairs: list[str] | None) -> dict[str, str]:
    """Parse ``--set key=value`` pairs into a dict of raw strings (types checked by apply_overrides)."""
    result: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise LmtuneError(f"--set {shown(pair)}: expected key=value, e.g. --set lr=3e-4")
        refused_handout_name(key, "--set")
        field_type(key)
        if key in result:
            raise LmtuneError(f"--set {key} is given twice; give it once")
        result[key] = value.strip()
    return canonical_settings(result)


def set_names(pairs: list[str] | None) -> list[str]:
    """The settings' names as ``--set key=value`` pairs give them (a handout's name as given: before
    parse_set_args maps it to lmtune's)."""
    return [pair.partition("=")[0].strip() for pair in pairs or []]


def device_flag(name: str):
    """The torch device ``--device NAME`` names, for a command with a ``--device`` flag and no ``--set`` (sample,
    diagnose): a device this machine lacks is refused in one line naming ``--device``, not ``--set device=``."""
    from lmtune.training.device import resolve_device

    try:
        return resolve_device(name)
    except LmtuneError as err:
        raise LmtuneError(str(err).replace("--set device=", "--device ")) from None
