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
    assert main([str(bad)]) == 2
    err = capsys.readouterr().err
    assert err == f"python -m traces.info: error: {bad}:2: missing key(s) input_tokens, output_tokens\n"
    assert main([str(trace), "--start", "100", "--out", str(tmp_path / "o.jsonl")]) == 2
    assert "holds no requests" in capsys.readouterr().err


@pytest.mark.parametrize(("flag", "value"), [("--speedup", "0"), ("--start", "-1"), ("--duration", "0"),
                                             ("--bin-s", "nan"), ("--idle-s", "x")])
def test_bad_flag_is_one_line_naming_it(trace: Path, capsys: pytest.CaptureFixture, flag: str,
                                        value: str) -> None:
    with pytest.raises(SystemExit) as exc:
        main([str(trace), flag, value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"argument {flag}:" in err


def test_out_into_a_missing_folder_is_refused(trace: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "none" / "o.jsonl"
    assert main([str(trace), "--out", str(out)]) == 2
    assert capsys.readouterr().err.count("\n") == 1 and not out.parent.exists()


def test_out_onto_its_own_input_is_refused(trace: Path, capsys: pytest.CaptureFixture) -> None:
    before = trace.read_bytes()
    assert main([str(trace), "--start", "1", "--out", str(trace.parent / "." / trace.name)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is the input file" in err and trace.read_bytes() == before


def test_gaps_of_a_trace_with_a_planted_gap(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # 1 request/s over [0, 30), nothing for 200 s, 1 request/s over [229, 259)
    path = tmp_path / "gap.jsonl"
    write_trace([TraceRequest(float(t), 5, 5) for t in [*range(30), *range(229, 259)]], path)
    assert main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "empty bins   19 of 26 bins of 10 s" in out  # bins 0-2 and 22-25 hold requests
    assert "longest gap  200.000000 s, after the arrival at 29.000000 s" in out
    assert "idle         1 gaps >= 60 s, 200.000000 s in all" in out
    assert "busy spans   2: 0-29 s (30 requests), 229-258 s (30 requests)" in out
    assert main([str(path), "--json", "--idle-s", "300", "--bin-s", "100"]) == 0
    gaps = json.loads(capsys.readouterr().out)["gaps"]
    assert gaps["empty_bins"] == 1 and gaps["bins"] == 3 and gaps["idle_stretches"] == 0  # [100, 200) empty
    assert gaps["busy_spans"] == [{"first_s": 0.0, "last_s": 258.0, "requests": 60}]
