"""The rooms of docs/DESIGN.md import only what the design allows (checked on the source, not at runtime)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KIT = ("common", "kernels", "integration", "traces", "loadgen", "experiments")
# room -> kit modules it may import (a prefix admits its submodules)
ALLOWED = {
    "common": ("common",),
    "kernels": ("kernels", "common"),
    "integration": ("integration", "kernels", "common"),
    "traces": ("traces", "common"),
    "loadgen": ("loadgen", "traces", "common"),
    "experiments": ("experiments", "traces", "loadgen", "common", "kernels.environment",
                    "integration.arms", "integration.launcher", "integration.endpoint",
                    "integration.proof.profiles", "integration.proof.normcalls",
                    "integration.proof.plantedcost"),
}


def _kit_imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from integration import arms` imports integration.arms (a name may also be a function)
            names += [f"{node.module}.{a.name}" for a in node.names]
    return [n for n in names if n.split(".")[0] in KIT]


def _allowed(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_every_room_imports_only_what_the_design_allows() -> None:
    wrong = [f"{path.relative_to(ROOT)} imports {name}"
             for room, prefixes in ALLOWED.items() for path in sorted((ROOT / room).rglob("*.py"))
             for name in _kit_imports(path) if not _allowed(name, prefixes)]
    assert wrong == []


def test_the_plugin_side_does_not_import_the_proof_tools() -> None:
    for name in ("plugin.py", "ops.py", "choice.py", "arms.py", "launcher.py"):
        imports = _kit_imports(ROOT / "integration" / name)
        assert not [n for n in imports if n.startswith("integration.proof")], name


def test_a_forbidden_import_is_caught(tmp_path: Path) -> None:  # negative control of the check itself
    bad = tmp_path / "bad.py"
    bad.write_text("from integration import choice\nimport experiments.stats\n")
    assert [n for n in _kit_imports(bad) if not _allowed(n, ALLOWED["experiments"])] == ["integration.choice"]
