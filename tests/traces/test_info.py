"""traces.info: summary printing, window + speed-up, --out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from traces.info import main
from traces.trace import TraceRequest, load_trace, write_trace

REQS = [TraceRequest(float(t), 10 * (i + 1), i + 1) for i, t in enumerate([0, 2, 4, 6, 8, 10])]


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.jsonl"
    write_trace(REQS, path)
    return path


def test_text_summary(trace: Path, capsys: pytest.CaptureFixture) -> None:
    assert main([str(trace)]) == 0
    out = capsys.readouterr().out
    assert "count        6 requests" in out
    assert "duration     10.000000 s" in out
    assert "rate         0.5000 req/s" in out
    # inputs 10..60: mean 35, p50 35, p90 55, p99 59.5, max 60
    assert "input              35.0       35.0       55.0       59.5         60" in out


def test_window_speedup_out(trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out_path = tmp_path / "slice.jsonl"
    args = [str(trace), "--start", "3", "--duration", "5", "--speedup", "2", "--out", str(out_path), "--json"]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    # [3, 8) holds t = 4 and 6 (8 is excluded); rebased to 1 and 3, then halved by the speed-up
    assert summary["count"] == 2
    assert summary["start_s"] == 0.5 and summary["end_s"] == 1.5 and summary["rate_rps"] == 1.0
    assert summary["sha256"] and summary["trace"] == str(trace)
    assert [(r.timestamp, r.input_tokens) for r in load_trace(out_path)] == [(0.5, 30), (1.5, 40)]


def test_bad_trace_and_empty_window(trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_tokens": 1, "output_tokens": 1}\n{"timestamp": 1}\n')
    assert main([str(bad)]) == 1
    assert f"{bad}:2: missing key(s)" in capsys.readouterr().err
    assert main([str(trace), "--start", "100", "--out", str(tmp_path / "o.jsonl")]) == 1
    assert "holds no requests" in capsys.readouterr().err
    assert main([str(trace), "--speedup", "0"]) == 1
    assert "speedup must be" in capsys.readouterr().err
