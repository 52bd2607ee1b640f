"""Command-line plumbing shared by the kit's CLIs: one-line errors (exit 2) and checked flag types.

A bad flag or input ends in one line on stderr that names it (``error: argument --speedup:
expected a number > 0, got '0'``) and exit status 2, never a traceback; ``--debug`` (see
:func:`add_debug_flag`) lets a caller re-raise instead, to see where an error came from.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

USAGE_ERROR = 2  # exit status of a bad flag, file or trace line


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (no usage block) and exit with status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message}\n")


def add_debug_flag(p: argparse.ArgumentParser) -> None:
    """--debug: show the traceback of an error instead of its one-line message."""
    p.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")


def fail(prog: str, message: str, code: int = USAGE_ERROR) -> int:
    """Print ``prog: error: message`` on stderr and return `code` (for ``return fail(...)``)."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return code


def same_file(a: Path, b: Path) -> bool:
    """Whether paths a and b name one file (the same path, a link to it, or another spelling of it)."""
    if a.resolve() == b.resolve():
        return True
    try:
        return a.samefile(b)
    except OSError:  # one of them does not exist yet: not the same file
        return False


def output_problem(flag: str, path: Path, inputs: Sequence[Path | None] = ()) -> str | None:
    """Why `path` cannot be written as the output of `flag` (its folder missing or not writable, a
    folder itself, one of `inputs`), before any work starts; None when it can."""
    folder = path.parent
    if not folder.is_dir():
        return f"{flag} {path}: folder {folder} does not exist"
    if path.is_dir():
        return f"{flag} {path} is a folder; give a file name"
    for given in inputs:
        if given is not None and same_file(given, path):
            return f"{flag} {path} is the input file {given}; write to another file"
    if not os.access(path if path.exists() else folder, os.W_OK):
        return f"{flag} {path}: not writable ({path if path.exists() else folder} is read-only)"
    return None


def refuse_output(prog: str, flag: str, path: str | Path | None,
                  inputs: Sequence[str | Path | None] = ()) -> None:
    """Exit with status 2 and one line when `path` (None: not given) cannot be written as the output
    of `flag` (output_problem); for a CLI to call before its work, not after."""
    if path is not None:
        problem = output_problem(flag, Path(path), [None if i is None else Path(i) for i in inputs])
        if problem:
            raise SystemExit(fail(prog, problem))


def command_line(prog: str, argv: Sequence[str] | None = None) -> str:
    """The command that made a results file, for its `command` field: `prog`, then the arguments
    (``sys.argv[1:]`` when `argv` is None) quoted for a shell, so the line runs as written. A path
    under ``$OUT`` (the GPU machine's output folder) is written ``$OUT/...``, true on every machine."""
    out = os.environ.get("OUT", "").rstrip("/")
    words = []
    for arg in sys.argv[1:] if argv is None else argv:
        rest = arg[len(out):] if out and arg.startswith(out + "/") else None
        words.append("$OUT" + rest if rest is not None and shlex.quote(rest) == rest else shlex.quote(arg))
    return " ".join([prog, *words])


def _number(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return v


def positive_float(text: str) -> float:
    """A finite number > 0."""
    v = _number(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return v


def non_negative_float(text: str) -> float:
    """A finite number >= 0."""
    v = _number(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return v


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def positive_int(text: str) -> int:
    """An int >= 1."""
    v = _integer(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return v


def non_negative_int(text: str) -> int:
    """An int >= 0."""
    v = _integer(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return v
