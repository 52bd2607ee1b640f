"""The trace loader's validation, the writer, and window / scale / summary on literal numbers."""

from __future__ import annotations

import hashlib
import lzma
import math
from pathlib import Path

import pytest

from traces.trace import (
    TraceError,
    TraceRequest,
    clip_tokens,
    file_sha256,
    load_trace,
    read_trace,
    scale_rate,
    time_window,
    trace_summary,
    write_trace,
)

GOOD = '{"timestamp": 0, "input_tokens": 10, "output_tokens": 2}\n'


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text(text, encoding="utf-8")
    return path


def test_load_valid_lines(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        GOOD
        + '{"timestamp": 0.5, "input_tokens": 7, "output_tokens": 1, "hash_ids": [3, 4]}\n'
        + '{"timestamp": 0.5, "input_tokens": 1, "output_tokens": 9}',  # equal time, no final newline
    )
    reqs = load_trace(path)
    assert reqs == [
        TraceRequest(0.0, 10, 2),
        TraceRequest(0.5, 7, 1, (3, 4)),
        TraceRequest(0.5, 1, 9),
    ]
    assert isinstance(reqs[0].timestamp, float)


@pytest.mark.parametrize(
    "bad, reason",
    [
        ("{not json", "bad JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"timestamp": 1, "input_tokens": 5}', "missing key(s) output_tokens"),
        ('{"timestamp": 1, "input_tokens": 5, "output_tokens": 2, "prio": 1}', "unknown key(s) prio"),
        ('{"timestamp": 1, "input_tokens": 5, "output_tokens": 2, "timestamp": 99.0}',
         "key(s) timestamp given more than once"),
        ('{"output_tokens": 9, "timestamp": 1, "input_tokens": 5, "output_tokens": 2}',
         "key(s) output_tokens given more than once"),
        ('{"timestamp": -0.5, "input_tokens": 5, "output_tokens": 2}', "timestamp must be >= 0"),
        ('{"timestamp": "1", "input_tokens": 5, "output_tokens": 2}', "timestamp must be a finite number"),
        ('{"timestamp": NaN, "input_tokens": 5, "output_tokens": 2}', "bad JSON"),
        ('{"timestamp": 1e999, "input_tokens": 5, "output_tokens": 2}', "timestamp must be a finite number"),
        ('{"timestamp": 1e308, "input_tokens": 5, "output_tokens": 2}',
         "timestamp 1e+308 s is past the ceiling of 1,000,000,000 s"),
        ('{"timestamp": 1, "input_tokens": 0, "output_tokens": 2}', "input_tokens must be >= 1"),
        ('{"timestamp": 1, "input_tokens": 5, "output_tokens": 0}', "output_tokens must be >= 1"),
        ('{"timestamp": 1, "input_tokens": 1000000000, "output_tokens": 2}',
         "input_tokens 1,000,000,000 is past the ceiling of 2,097,152 tokens"),
        ('{"timestamp": 1, "input_tokens": 5, "output_tokens": 2097153}', "output_tokens 2,097,153 is past"),
        ('{"timestamp": 1, "input_tokens": 5.0, "output_tokens": 2}', "input_tokens must be an int"),
        ('{"timestamp": 1, "input_tokens": true, "output_tokens": 2}', "input_tokens must be an int"),
        ('{"timestamp": 1, "input_tokens": 5, "output_tokens": "2"}', "output_tokens must be an int"),
        ('{"timestamp": 1, "input_tokens": 5, "output_tokens": 2, "hash_ids": [1, 2.5]}', "hash_ids must be"),
        ('{"timestamp": 1, "input_tokens": 5, "output_tokens": 2, "hash_ids": 7}', "hash_ids must be"),
        ('{"timestamp": 1, "input_tokens": 5, "output_tokens": 2, "hash_ids": null}', "hash_ids must be"),
        ("", "empty line"),
        ("   ", "empty line"),
    ],
)
def test_bad_line_names_its_line(tmp_path: Path, bad: str, reason: str) -> None:
    path = _write(tmp_path, GOOD + GOOD + bad + "\n" + GOOD)
    with pytest.raises(TraceError) as info:
        load_trace(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}:3: ")
    assert reason in msg


def test_unsorted_names_its_line(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        '{"timestamp": 1.0, "input_tokens": 5, "output_tokens": 2}\n'
        '{"timestamp": 2.0, "input_tokens": 5, "output_tokens": 2}\n'
        '{"timestamp": 1.5, "input_tokens": 5, "output_tokens": 2}\n',
    )
    with pytest.raises(TraceError, match=r":3: not sorted by time: timestamp 1.5 < 2.0 on line 2"):
        load_trace(path)


def test_empty_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r":1: empty trace"):
        load_trace(_write(tmp_path, ""))


def test_write_then_load_round_trips(tmp_path: Path) -> None:
    reqs = [TraceRequest(0.0, 3, 4), TraceRequest(1.25, 5, 6, (1, 2, 3)), TraceRequest(2.000001, 1, 1, ())]
    path = tmp_path / "out.jsonl"
    write_trace(reqs, path)
    assert path.read_text().splitlines()[1] == (
        '{"timestamp": 1.25, "input_tokens": 5, "output_tokens": 6, "hash_ids": [1, 2, 3]}'
    )
    assert load_trace(path) == reqs


REQS = [TraceRequest(t, i, o) for t, i, o in [(0.0, 10, 1), (10.0, 20, 2), (10.1, 30, 3), (12.5, 40, 4)]]


def test_time_window_rebases_to_window_start() -> None:
    window = time_window(REQS, 10.0, 2.5)  # 12.5 is the exclusive end
    assert window == [TraceRequest(0.0, 20, 2), TraceRequest(0.1, 30, 3)]
    assert time_window(REQS, 5.0, 5.0) == []  # 10.0 not < 10.0
    assert time_window(REQS, 1.0, math.inf) == [
        TraceRequest(9.0, 20, 2),
        TraceRequest(9.1, 30, 3),
        TraceRequest(11.5, 40, 4),
    ]
    for start, dur in [(-1.0, 1.0), (0.0, 0.0), (0.0, -2.0), (math.nan, 1.0), (0.0, math.nan)]:
        with pytest.raises(ValueError):
            time_window(REQS, start, dur)


def test_scale_rate_divides_timestamps() -> None:
    assert [r.timestamp for r in scale_rate(REQS, 2.0)] == [0.0, 5.0, 5.05, 6.25]
    assert [r.timestamp for r in scale_rate(REQS, 0.5)] == [0.0, 20.0, 20.2, 25.0]
    assert [r.input_tokens for r in scale_rate(REQS, 3.0)] == [10, 20, 30, 40]
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError):
            scale_rate(REQS, bad)
    with pytest.raises(ValueError, match=r"request 1: timestamp 10 s at speedup 1e-300 is 1e\+301 s, "
                                         "past the ceiling of 1,000,000,000 s"):
        scale_rate(REQS, 1e-300)


def test_summarize_literal_numbers() -> None:
    s = trace_summary(REQS)
    assert s["count"] == 4
    assert s["start_s"] == 0.0 and s["end_s"] == 12.5 and s["duration_s"] == 12.5
    assert s["rate_rps"] == pytest.approx(3 / 12.5)  # 0.24: (count - 1) / duration
    assert s["with_hash_ids"] == 0
    # inputs 10, 20, 30, 40: linear-interpolation percentiles
    assert s["input_tokens"] == pytest.approx(
        {"mean": 25.0, "p50": 25.0, "p90": 37.0, "p99": 39.7, "min": 10, "max": 40, "total": 100}
    )
    assert s["output_tokens"]["p90"] == pytest.approx(3.7)
    assert s["output_tokens"]["max"] == 4


def test_summarize_edge_cases() -> None:
    empty = trace_summary([])
    assert empty["count"] == 0 and empty["rate_rps"] is None and empty["input_tokens"] is None
    one = trace_summary([TraceRequest(3.0, 5, 6)])
    assert one["count"] == 1 and one["duration_s"] == 0.0 and one["rate_rps"] is None
    assert one["input_tokens"]["p99"] == 5.0


def test_file_sha256(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD)
    assert file_sha256(path) == hashlib.sha256(GOOD.encode()).hexdigest()


def test_a_trace_kept_xz_reads_and_hashes_by_its_plain_name(tmp_path: Path) -> None:
    text = '{"timestamp": 0.0, "input_tokens": 3, "output_tokens": 2}\n' \
           '{"timestamp": 1.5, "input_tokens": 7, "output_tokens": 1}\n'
    (tmp_path / "t.jsonl.xz").write_bytes(lzma.compress(text.encode()))
    reqs = load_trace(tmp_path / "t.jsonl")
    assert [(r.timestamp, r.input_tokens, r.output_tokens) for r in reqs] == [(0.0, 3, 2), (1.5, 7, 1)]
    assert file_sha256(tmp_path / "t.jsonl") == hashlib.sha256(text.encode()).hexdigest()


def test_a_trace_is_read_and_hashed_once_until_it_changes(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD)
    first = read_trace(path)
    assert read_trace(path) is first and first.sha256 == file_sha256(path)  # the same bytes, parsed once
    assert load_trace(path) == list(first.requests) == [TraceRequest(0.0, 10, 2)]
    _write(tmp_path, GOOD + GOOD)  # another version of the file: read again
    again = read_trace(path)
    assert len(again.requests) == 2 and again.sha256 == file_sha256(path) != first.sha256


def test_invalid_utf8_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(
        GOOD.encode() * 2 + b'{"timestamp": 1, "input_tokens": 5, "output_tokens": 2, "x": "\xff"}\n'
    )
    with pytest.raises(TraceError, match=r":3: not valid UTF-8"):
        load_trace(path)


def test_crlf_line_endings_load(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(GOOD.replace("\n", "\r\n").encode() * 2)
    assert len(load_trace(path)) == 2


def test_clip_tokens():
    reqs = [TraceRequest(0.0, 900, 40, (1, 2)), TraceRequest(1.0, 10, 3)]
    assert clip_tokens(reqs, 512, 16) == [TraceRequest(0.0, 512, 16, (1, 2)), TraceRequest(1.0, 10, 3)]
    with pytest.raises(ValueError, match="max_output"):
        clip_tokens(reqs, None, 0)
