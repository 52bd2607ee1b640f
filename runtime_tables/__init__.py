"""What the kit reads at run time, shipped inside the package and read through importlib.resources:
the GPUs' policy tables, their calibration records, the planted control's measured costs, the index
of the step profiles and CUDA-graph step times, and the server-instance prior. Each file names the
run or command that made it (runtime_tables/README.md); the evidence itself stays in the results folders."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

DIR = Path(str(files(__name__)))  # where the installed package keeps its tables (writers write here)


def path(name: str) -> Path:
    """The table file `name`, e.g. "policy-h200-in-graph.json" (it may not exist yet)."""
    return DIR / name
