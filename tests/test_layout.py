"""The rooms of docs/DESIGN.md import only what the design allows, and no package has an import cycle
(checked on the source, not at runtime: an import inside a function counts too)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KIT = ("common", "runtime_tables", "kernels", "integration", "traces", "loadgen", "experiments", "research")
# room -> kit modules it may import (a prefix admits its submodules). experiments' own rooms are layered:
# core < stats < reporting < analyze < runner (each may import those before it, never those after).
_EXP_BELOW = {
    "experiments.core": (),
    "experiments.stats": ("experiments.core",),
    "experiments.reporting": ("experiments.core", "experiments.stats"),
    "experiments.analyze": ("experiments.core", "experiments.stats", "experiments.reporting"),
    "experiments.runner": ("experiments.core", "experiments.stats", "experiments.reporting",
                           "experiments.analyze"),
    "experiments.run": ("experiments.runner",),
    "experiments": ("experiments.stats.runframe",),  # the package's lazy load_run
}
_EXP_OUTSIDE = ("traces", "loadgen", "common", "runtime_tables", "kernels.environment", "integration.arms",
                "integration.names",
                "integration.launcher", "integration.endpoint", "integration.proof.profiles",
                "integration.proof.normcalls", "integration.proof.plantedcost")
ALLOWED = {
    "common": ("common",),
    "runtime_tables": ("runtime_tables",),  # data read through importlib.resources; every room may read it
    "kernels": ("kernels", "common", "runtime_tables"),
    "integration": ("integration", "kernels", "common", "runtime_tables"),
    "traces": ("traces", "common"),
    "loadgen": ("loadgen", "traces", "common"),
    **{room: (room, *below, *_EXP_OUTSIDE) for room, below in _EXP_BELOW.items()},
    "research": KIT,  # the diagnostic tools may import the library; nothing imports them
}


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


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


def _room(module: str) -> str:
    """The most specific room of ALLOWED that holds `module`."""
    return max((r for r in ALLOWED if _allowed(module, (r,))), key=len)


def _sources() -> list[Path]:
    return sorted(p for room in KIT for p in (ROOT / room).rglob("*.py"))


def test_every_room_imports_only_what_the_design_allows() -> None:
    wrong = [f"{path.relative_to(ROOT)} imports {name}" for path in _sources()
             for name in _kit_imports(path) if not _allowed(name, ALLOWED[_room(_module(path))])]
    assert wrong == []


def test_nothing_in_the_library_imports_the_research_tools() -> None:
    wrong = [f"{path.relative_to(ROOT)} imports {name}" for path in _sources()
             if _room(_module(path)) != "research"
             for name in _kit_imports(path) if _allowed(name, ("research",))]
    assert wrong == []


def _graph() -> dict[str, set[str]]:
    """module -> the kit modules it imports (a `from pkg import name` counts when name is a module)."""
    modules = {_module(p) for p in _sources()}
    graph: dict[str, set[str]] = {}
    for path in _sources():
        deps = set()
        for name in _kit_imports(path):
            while name not in modules and "." in name:
                name = name.rsplit(".", 1)[0]
            if name in modules and name != _module(path):
                deps.add(name)
        graph[_module(path)] = deps
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles() -> None:
    # package __init__ modules are left out: importing a submodule names its package, not a dependency
    graph = {m: {d for d in deps if not any(x.startswith(d + ".") for x in graph_keys)}
             for graph_keys in [set(_graph())] for m, deps in _graph().items()}
    assert _cycles(graph) == []


def test_a_cycle_is_caught() -> None:  # negative control of the cycle check
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_plugin_side_does_not_import_the_proof_tools() -> None:
    for name in ("plugin.py", "ops.py", "choice.py", "arms.py", "launcher.py"):
        imports = _kit_imports(ROOT / "integration" / name)
        assert not [n for n in imports if n.startswith("integration.proof")], name


def test_a_forbidden_import_is_caught(tmp_path: Path) -> None:  # negative control of the room check
    bad = tmp_path / "bad.py"
    bad.write_text("from integration import choice\nimport experiments.stats.intervals\n"
                   "from experiments.runner import config\n")
    assert [n for n in _kit_imports(bad) if not _allowed(n, ALLOWED["experiments.stats"])] == [
        "integration.choice", "experiments.runner.config"]


def test_the_shared_names_are_imported_from_their_home_only() -> None:
    # integration.names is their one home: no module renames or re-exports them (`X as X`), so a name
    # such as POLICY_ENV has one import path
    renamed = [f"{path.relative_to(ROOT)}: {a.name} as {a.asname}" for path in _sources()
               for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
               if isinstance(node, ast.ImportFrom) and node.module == "integration.names"
               for a in node.names if a.asname]
    assert renamed == []
    # nor re-exports any name of the kit (`from integration.choice import TABLES as TABLES`)
    reexported = [f"{path.relative_to(ROOT)}: {node.module}.{a.name}" for path in _sources()
                  for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                  if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in KIT
                  for a in node.names if a.asname == a.name]
    assert reexported == []
