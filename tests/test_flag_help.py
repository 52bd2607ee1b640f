"""Every command-line flag of the kit says what it does: each `add_argument` call passes a non-empty
`help` (checked on the source, so a flag added without one fails here, not in a user's --help)."""

from __future__ import annotations

import argparse
import ast
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_layout import KIT, ROOT


def _flags_without_help(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        func = getattr(node, "func", None)
        if isinstance(node, ast.Call) and isinstance(func, ast.Attribute) and func.attr == "add_argument":
            kw = {k.arg: k.value for k in node.keywords}
            text = kw.get("help")
            if None in kw:  # **options: the caller's dict, checked where it is built
                continue
            if text is None or (isinstance(text, ast.Constant) and not str(text.value).strip()):
                out.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{node.lineno}")
    return out


def test_every_flag_has_help() -> None:
    missing = [m for room in KIT for path in sorted((ROOT / room).rglob("*.py"))
               for m in _flags_without_help(path)]
    assert missing == []


def test_a_flag_without_help_is_caught(tmp_path: Path) -> None:  # negative control of the check itself
    bad = tmp_path / "cli.py"
    bad.write_text('p.add_argument("--a", help="what a does")\np.add_argument("--b")\n'
                   'p.add_argument("--c", help=" ")\n')
    assert [m.rsplit(":", 1)[1] for m in _flags_without_help(bad)] == ["2", "3"]


def _parsers_without_prog(path: Path, module: str | None = None) -> list[str]:
    """Parsers in `path` that pass no prog, or a "python -m X" prog whose X is not `module`."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        func = getattr(node, "func", None)
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if isinstance(node, ast.Call) and name in ("ArgumentParser", "OneLineParser"):
            prog = next((k.value for k in node.keywords if k.arg == "prog"), None)
            named = isinstance(prog, ast.Constant) and str(prog.value).startswith("python -m ")
            if prog is None or (named and module and prog.value != f"python -m {module}"):
                out.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{node.lineno}")
    return out


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__main__" else parts)


def test_every_parser_names_the_command_a_user_types() -> None:
    # run as `python -m pkg.mod`, argparse would name the file (prove.py) in usage lines and errors
    missing = [m for room in KIT for path in sorted((ROOT / room).rglob("*.py"))
               for m in _parsers_without_prog(path, _module(path))]
    assert missing == []


def test_a_parser_without_prog_is_caught(tmp_path: Path) -> None:  # negative control
    bad = tmp_path / "cli.py"
    bad.write_text('import argparse\na = argparse.ArgumentParser(prog="python -m x")\n'
                   'b = argparse.ArgumentParser(description="d")\n'
                   'c = argparse.ArgumentParser(prog="python -m y")\n')
    assert [m.rsplit(":", 1)[1] for m in _parsers_without_prog(bad, "x")] == ["3", "4"]


HELP_MAX = 120  # characters of one flag's help, as --help prints it; longer explanations go to a README
RUN_HELP_MAX_LINES = 120  # lines of `python experiments/run.py --help` at 80 columns


class _Parsed(Exception):
    """Raised in place of parsing, carrying the parser a CLI built."""


def _parser_of(module: str, monkeypatch) -> argparse.ArgumentParser:
    """The parser `module.main` builds, taken where it would parse (nothing of the command runs)."""
    def grab(self, *args, **kwargs):
        raise _Parsed(self)

    main = importlib.import_module(module).main
    with monkeypatch.context() as m:
        m.setattr(argparse.ArgumentParser, "parse_args", grab)
        with pytest.raises(_Parsed) as caught:
            main([])
    return caught.value.args[0]


def _cli_modules() -> list[str]:
    """Every module of the kit that builds a parser in its main (found on the source)."""
    return [".".join(path.relative_to(ROOT).with_suffix("").parts)
            for room in KIT for path in sorted((ROOT / room).rglob("*.py"))
            if _builds_a_parser_in_main(path.read_text(encoding="utf-8"))]


def _builds_a_parser_in_main(source: str) -> bool:
    return bool(re.search(r"^def main\(", source, re.M)
                and re.search(r"(ArgumentParser|OneLineParser)\(", source))


def _long_helps(ap: argparse.ArgumentParser) -> list[str]:
    formatter = ap._get_formatter()
    helps = {(a.option_strings or [a.dest])[0]: formatter._expand_help(a)
             for a in ap._actions if a.help and a.help != argparse.SUPPRESS}
    return [f"{flag} ({len(text)} characters)" for flag, text in helps.items() if len(text) > HELP_MAX]


def test_the_walk_finds_the_kit_commands() -> None:
    modules = _cli_modules()
    assert {"experiments.runner.cli", "experiments.analyze", "loadgen.__main__", "traces.convert",
            "kernels.suite", "integration.proof.prove", "research.plantedsim"} <= set(modules)


@pytest.mark.parametrize("module", _cli_modules())
def test_every_flag_help_is_short(module: str, monkeypatch) -> None:
    assert _long_helps(_parser_of(module, monkeypatch)) == []


def test_a_long_help_is_caught() -> None:  # negative control of the check itself
    ap = argparse.ArgumentParser()
    ap.add_argument("--short", help="fine")
    ap.add_argument("--long", help="x" * (HELP_MAX - 5) + " (%(default)s)", default="abc")
    assert _long_helps(ap) == [f"--long ({HELP_MAX + 1} characters)"]


def test_run_help_fits_a_screenful() -> None:
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": str(ROOT)}  # this checkout's code, at 80 columns
    out = subprocess.run([sys.executable, "experiments/run.py", "--help"], cwd=ROOT, capture_output=True,
                         text=True, check=True, env=env).stdout
    assert len(out.splitlines()) <= RUN_HELP_MAX_LINES, out
