"""A/B experiments of vLLM arms: orchestration, goodput statistics, attribution and reports.

`experiments.load_run(path)` is a run directory's requests as a pandas DataFrame (experiments.stats.runframe;
imported on first use, so `import experiments` stays light).
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_run"]


def __getattr__(name: str) -> Any:
    if name == "load_run":
        from experiments.stats.runframe import load_run

        return load_run
    raise AttributeError(f"module 'experiments' has no attribute {name!r}")
