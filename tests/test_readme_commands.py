"""Every `python -m <module>` of the kit that a README or docs/ names is a real, runnable module."""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KIT = ("common", "kernels", "integration", "traces", "loadgen", "experiments", "research")
COMMAND = re.compile(r"python3? -m ((?:" + "|".join(KIT) + r")(?:\.[A-Za-z_]\w*)*)")


def _documents() -> list[Path]:
    tracked = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True)
    if tracked.returncode == 0 and tracked.stdout.strip():
        return [ROOT / p for p in tracked.stdout.split()]
    return sorted(p for p in ROOT.rglob("*.md") if ".venv" not in p.parts)


def _named_modules() -> dict[str, str]:
    out = {}
    for doc in _documents():
        for m in COMMAND.finditer(doc.read_text(encoding="utf-8")):
            out.setdefault(m.group(1), str(doc.relative_to(ROOT)))
    return out


def _runnable(module: str) -> bool:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return False
    if spec.submodule_search_locations:  # a package: needs a __main__
        return importlib.util.find_spec(module + ".__main__") is not None
    return '__name__ == "__main__"' in Path(spec.origin).read_text(encoding="utf-8")


def test_documented_commands_name_runnable_modules() -> None:
    named = _named_modules()
    assert "experiments.analyze" in named and "integration.proof.prove" in named  # the scan works
    broken = {m: doc for m, doc in named.items() if not _runnable(m)}
    assert broken == {}


def test_a_stale_module_name_is_caught() -> None:  # negative control of the scan
    assert not _runnable("integration.prove") and not _runnable("integration.compare")


README_MAX_LINES = 150  # a front door: what it is, install, the two commands, own arms, a summary


def test_the_readme_is_a_front_door() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES
    assert any("`make test`" in line for line in lines)  # CI reads the test command from it
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| level")]
    assert len(rows) <= 8  # the summary table; the full one is docs/FINDINGS.md's
