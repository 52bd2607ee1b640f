"""What the code reads at run time lives in the runtime_tables package, each file noted in its README;
the results folders are evidence that no module names (docs/DESIGN.md, "Rooms")."""

from __future__ import annotations

import re
from importlib.resources import files
from pathlib import Path

import runtime_tables

ROOT = Path(__file__).resolve().parents[1]
RUNTIME_ROOMS = ("common", "runtime_tables", "kernels", "integration", "traces", "loadgen", "experiments")
EVIDENCE_NAMES = re.compile(r"kernels/results|integration/results|instance-floor")


def test_no_module_of_the_kit_names_an_evidence_folder() -> None:
    named = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for room in RUNTIME_ROOMS
             for path in sorted((ROOT / room).rglob("*.py"))
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
             if EVIDENCE_NAMES.search(line)]
    assert named == []


def test_every_table_is_noted_in_the_readme() -> None:
    readme = (ROOT / "runtime_tables" / "README.md").read_text(encoding="utf-8")
    patterns = [re.compile(re.escape(name).replace(re.escape("<gpu>"), r"[\w.-]+") + r"(\.xz)?")
                for name in re.findall(r"`([\w<>.-]+\.(?:json|md))`", readme)]
    kept = sorted(p.name for p in runtime_tables.DIR.iterdir() if p.name not in ("__init__.py", "README.md")
                  and not p.name.startswith((".", "__")))
    assert kept and [name for name in kept if not any(p.fullmatch(name) for p in patterns)] == []


def test_tables_are_read_from_the_package() -> None:
    assert runtime_tables.DIR == Path(str(files("runtime_tables")))
    assert all(runtime_tables.path(name).is_file()
               for name in ("profiles.json", "instance-prior.json", "policy-h200-in-graph.json"))
