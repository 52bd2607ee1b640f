"""The tracked tree stays small enough for one device call to carry it beside a vLLM bundle part, with
its bulky evidence committed compressed and its plots left to `experiments.analyze` (docs/DESIGN.md,
"The tracked tree")."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TREE_MAX_BYTES = 25_000_000  # a device call carries 64 MiB: this tree and a 30 MiB bundle part
RAW_MAX_BYTES = 25_000  # a results file of text over this is committed .xz
RAW_SUFFIXES = (".json", ".jsonl", ".log")
KEPT_PLOTS = ("experiments/results/h200-llama8b-confirm3/forest.png",)  # the headline run's plot


def _tracked() -> dict[str, int]:
    """Every tracked file that is on disk, with its size in bytes (what `du -b` counts)."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True)
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout ({listed.stderr.decode().strip()})")
    paths = [p for p in listed.stdout.decode().split("\0") if p]
    return {p: (ROOT / p).stat().st_size for p in paths if (ROOT / p).is_file()}


def test_the_tracked_tree_fits_beside_a_bundle_part() -> None:
    total = sum(_tracked().values())
    assert total <= TREE_MAX_BYTES, f"tracked tree {total:,} bytes, over {TREE_MAX_BYTES:,}"


def test_the_figure_is_the_one_docs_design_states() -> None:
    assert f"{TREE_MAX_BYTES:,} bytes" in (ROOT / "docs" / "DESIGN.md").read_text(encoding="utf-8")


def test_bulky_results_are_committed_compressed() -> None:
    raw = [f"{p} ({n:,} bytes)" for p, n in _tracked().items()
           if "results" in Path(p).parts and p.endswith(RAW_SUFFIXES) and n > RAW_MAX_BYTES]
    assert raw == []


def test_plots_are_made_by_the_analysis_not_committed() -> None:
    assert [p for p in _tracked() if p.endswith(".png") and p not in KEPT_PLOTS] == []
