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
