"""--patched-policy takes a record of what the patched arm dispatched (run.json's patched_policy
format), so that the analysis reads what ran and never asks the plugin's dispatch code."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import runtime_tables
from common.jsonfile import read_json
from experiments import analyze

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "experiments" / "results" / "h200-llama8b-chat"


def test_the_committed_record_is_what_the_report_used() -> None:
    kept = "runtime_tables/h200/patched-policy-h200-llama8b-chat.json"  # kept with the tables, by GPU
    assert runtime_tables.resolve("experiments/results/h200-llama8b-chat/patched-policy.json") == ROOT / kept
    record = json.loads((ROOT / kept).read_text())
    report = read_json(RUN / "report.json", None, "report")
    assert report["inputs"]["patched_policy"] == kept
    assert set(analyze.POLICY_RECORD_KEYS) <= set(record)
    assert record["segments"]["rms_norm"] == [[1, 16384, True]]  # kernel v1's table: fused everywhere


def test_a_policy_table_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = ROOT / "runtime_tables" / "policy-h200-in-graph.json"  # a table, not a record
    assert analyze.main([str(RUN), "--patched-policy", str(table), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a patched policy record needs" in err[0] and "segments" in err[0]


def test_the_analysis_imports_no_dispatch_module() -> None:
    tree = ast.parse((ROOT / "experiments" / "analyze.py").read_text())
    names = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    names += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [n for n in names if n.startswith(("integration.arms", "integration.choice"))]
    assert "from integration import" not in (ROOT / "experiments" / "analyze.py").read_text()
