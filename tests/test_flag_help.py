"""Every command-line flag of the kit says what it does: each `add_argument` call passes a non-empty
`help` (checked on the source, so a flag added without one fails here, not in a user's --help)."""

from __future__ import annotations

import ast
from pathlib import Path

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
