"""What the kit reads at run time, shipped inside the package and read through importlib.resources:
the GPUs' policy tables, their calibration records, the planted control's measured costs, the index
of the step profiles and CUDA-graph step times, and the server-instance prior. Each file names the
run or command that made it (runtime_tables/README.md); the evidence itself stays in the results folders.
The tables that past runs used are kept here too, by GPU (and model shape), found from the paths the
runs' records name through `resolve` (moved.json)."""

from __future__ import annotations

import json
from functools import cache
from importlib.resources import files
from pathlib import Path

DIR = Path(str(files(__name__)))  # where the installed package keeps its tables (writers write here)
MOVED = DIR / "moved.json"  # {"moved": {path a committed record names: file here}}


def path(name: str) -> Path:
    """The table file `name`, e.g. "policy-h200-in-graph.json" (it may not exist yet)."""
    return DIR / name


@cache
def _moved() -> dict[str, str]:
    """moved.json's map, read once per process (it changes only with the package)."""
    return json.loads(MOVED.read_text(encoding="utf-8"))["moved"]


def resolve(recorded: str | Path) -> Path:
    """Where a table a committed record names (project-relative, as written when the run was made) is
    kept now: the file of this package moved.json maps it to, else the path as recorded."""
    name = _moved().get(Path(recorded).as_posix())
    return path(name) if name else Path(recorded)
