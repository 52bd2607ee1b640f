"""Parsers of the public formats: good fixtures convert exactly, each malformed line names its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from traces.formats import FORMATS, order_rows, parse_azure, parse_burstgpt, parse_mooncake, to_requests
from traces.trace import TraceError, TraceRequest

AZURE = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
    "2023-11-16 18:15:46.6805900,374,44\r\n"
    "2023-11-16 18:15:50.9951690,396,109\r\n"
    "2023-11-16 18:15:50.9951695,10,1\r\n"  # half a microsecond later: rounds half-even
    "2023-11-16 18:15:51,879,55\r\n"  # no fraction
    "2023-11-17 00:00:01.5,7,3\r\n"  # across midnight
)

MOONCAKE = (
    '{"timestamp": 1000, "input_length": 6755, "output_length": 500, "hash_ids": [0, 1, 2]}\n'
    '{"timestamp": 1000, "input_length": 7319, "output_length": 490, "hash_ids": [0, 3]}\n'
    '{"timestamp": 4052, "input_length": 2287, "output_length": 316, "hash_ids": [], "extra": 1}\n'
    '{"timestamp": 4052.5, "input_length": 5, "output_length": 6}\n'
)

BURSTGPT = (
    "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
    "5,ChatGPT,472,18,490,Conversation log\n"
    "45,ChatGPT,1087,0,1087,Conversation log\n"  # failed: no response
    "118.25,GPT-4,417,276,693,API log\n"
    "119,ChatGPT,0,50,50,Conversation log\n"  # no request tokens
    "120,ChatGPT,30,40,70,Failed log\n"  # failed by log type
    "121.0000004,GPT-4,9,8,17,API log\n"
)


def _file(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8"))
    return path


def _convert(path: Path, fmt: str) -> list[TraceRequest]:
    parsed = FORMATS[fmt](path)
    rows, _ = order_rows(path, parsed.rows, sort=False)
    return to_requests(rows)


def test_azure_good(tmp_path: Path) -> None:
    reqs = _convert(_file(tmp_path, "a.csv", AZURE), "azure")
    assert reqs == [
        TraceRequest(0.0, 374, 44),
        TraceRequest(4.314579, 396, 109),
        TraceRequest(4.31458, 10, 1),  # 4.3145795 -> 4.314580 (half-even)
        TraceRequest(4.31941, 879, 55),
        TraceRequest(20654.81941, 7, 3),  # 5 h 44 min 14.81941 s later
    ]
    assert parse_azure(_file(tmp_path, "a.csv", AZURE)).ignored_fields == []


def test_mooncake_good(tmp_path: Path) -> None:
    path = _file(tmp_path, "m.jsonl", MOONCAKE)
    assert _convert(path, "mooncake") == [
        TraceRequest(0.0, 6755, 500, (0, 1, 2)),
        TraceRequest(0.0, 7319, 490, (0, 3)),
        TraceRequest(3.052, 2287, 316, ()),
        TraceRequest(3.0525, 5, 6),
    ]
    assert parse_mooncake(path).ignored_fields == ["extra"]


def test_burstgpt_drops_failed_rows_with_counts(tmp_path: Path) -> None:
    path = _file(tmp_path, "b.csv", BURSTGPT)
    parsed = parse_burstgpt(path)
    assert parsed.dropped == {
        "failed (Response tokens == 0)": [3],
        "Request tokens == 0": [5],
        "failed (Log Type)": [6],
    }
    assert parsed.ignored_fields == ["Model", "Total tokens"]
    assert _convert(path, "burstgpt") == [
        TraceRequest(0.0, 472, 18),
        TraceRequest(113.25, 417, 276),
        TraceRequest(116.0, 9, 8),  # 116.0000004 rounds to the microsecond
    ]


AZURE_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
BURST_HEAD = (
    "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,ChatGPT,472,18,490,API log\n"
)
MOON_HEAD = '{"timestamp": 0, "input_length": 5, "output_length": 6}\n'


@pytest.mark.parametrize(
    "fmt, head, bad, reason",
    [
        ("azure", AZURE_HEAD, "2023-11-16 18:15:47.1,12,", "GeneratedTokens must be an integer"),
        ("azure", AZURE_HEAD, "2023-11-16 18:15:47.1,12", "expected 3 fields, got 2"),
        ("azure", AZURE_HEAD, "2023-11-16 18:15:47.1,12,3,4", "expected 3 fields, got 4"),
        ("azure", AZURE_HEAD, "2023-11-16 18:15:47.1,0,3", "ContextTokens must be >= 1"),
        ("azure", AZURE_HEAD, "2023-11-16 18:15:47.1,12,0", "GeneratedTokens must be >= 1"),
        ("azure", AZURE_HEAD, "2023-11-16 18:15:47.1,12.0,3", "ContextTokens must be an integer"),
        ("azure", AZURE_HEAD, "2023-11-16 18:15:47.1,-12,3", "ContextTokens must be an integer"),
        ("azure", AZURE_HEAD, "16/11/2023 18:15:47,12,3", "TIMESTAMP must look like"),
        ("azure", AZURE_HEAD, "2023-13-16 18:15:47,12,3", "TIMESTAMP '2023-13-16 18:15:47'"),
        ("azure", AZURE_HEAD, "", "expected 3 fields, got 0"),
        ("mooncake", MOON_HEAD, "{bad", "bad JSON"),
        ("mooncake", MOON_HEAD, "[1]", "expected a JSON object"),
        ("mooncake", MOON_HEAD, '{"timestamp": 5, "input_length": 5}', "missing key(s) output_length"),
        (
            "mooncake",
            MOON_HEAD,
            '{"timestamp": "5", "input_length": 5, "output_length": 6}',
            "timestamp must be",
        ),
        (
            "mooncake",
            MOON_HEAD,
            '{"timestamp": -5, "input_length": 5, "output_length": 6}',
            "timestamp must be",
        ),
        (
            "mooncake",
            MOON_HEAD,
            '{"timestamp": 5, "input_length": 0, "output_length": 6}',
            "input_length must be",
        ),
        (
            "mooncake",
            MOON_HEAD,
            '{"timestamp": 5, "input_length": 5, "output_length": 6.0}',
            "output_length must",
        ),
        (
            "mooncake",
            MOON_HEAD,
            '{"timestamp": 5, "input_length": 5, "output_length": 6, "hash_ids": ["a"]}',
            "hash_ids must be a list of ints",
        ),
        ("mooncake", MOON_HEAD, "", "empty line"),
        ("burstgpt", BURST_HEAD, "x,ChatGPT,1,2,3,API log", "Timestamp must be a number"),
        ("burstgpt", BURST_HEAD, "-1,ChatGPT,1,2,3,API log", "Timestamp must be a finite number >= 0"),
        ("burstgpt", BURST_HEAD, "7,ChatGPT,one,2,3,API log", "Request tokens must be an integer"),
        ("burstgpt", BURST_HEAD, "7,ChatGPT,1,,3,API log", "Response tokens must be an integer"),
        ("burstgpt", BURST_HEAD, "7,ChatGPT,1,2", "expected 6 fields, got 4"),
    ],
)
def test_malformed_line_is_rejected_with_its_number(
    tmp_path: Path, fmt: str, head: str, bad: str, reason: str
) -> None:
    # The bad line is line 3 (CSV: header, good row, bad row; JSONL: two good lines, bad line).
    text = head + bad + "\n" + head.splitlines()[-1] + "\n" if fmt != "mooncake" else head * 2 + bad + "\n"
    path = _file(tmp_path, "in", text)
    with pytest.raises(TraceError) as info:
        FORMATS[fmt](path)
    msg = str(info.value)
    assert msg.startswith(f"{path}:3: "), msg
    assert reason in msg, msg


def test_quoted_multiline_field_keeps_physical_line_numbers(tmp_path: Path) -> None:
    text = BURST_HEAD + '6,"Chat\nGPT",1,2,3,API log\n7,ChatGPT,1,zero,3,API log\n'
    path = _file(tmp_path, "b.csv", text)
    with pytest.raises(TraceError, match=r":5: Response tokens must be an integer"):
        parse_burstgpt(path)


@pytest.mark.parametrize("fmt", ["azure", "burstgpt"])
def test_missing_column_is_named(tmp_path: Path, fmt: str) -> None:
    path = _file(tmp_path, "x.csv", "TIMESTAMP,Request tokens,GeneratedTokens\n1,2,3\n")
    with pytest.raises(TraceError, match=r":1: missing column\(s\) "):
        FORMATS[fmt](path)


def test_out_of_order_rows_fail_or_sort_stably(tmp_path: Path) -> None:
    text = (
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:00:02,1,1\n"
        "2023-11-16 18:00:03,2,2\n"
        "2023-11-16 18:00:01,3,3\n"
        "2023-11-16 18:00:03,4,4\n"
    )
    path = _file(tmp_path, "a.csv", text)
    parsed = parse_azure(path)
    with pytest.raises(TraceError, match=r":4: not in time order \(earlier than line 3\)"):
        order_rows(path, parsed.rows, sort=False)
    rows, moved = order_rows(path, parsed.rows, sort=True)
    assert moved == 1
    assert [(r.timestamp, r.input_tokens) for r in to_requests(rows)] == [
        (0.0, 3),
        (1.0, 1),
        (2.0, 2),
        (2.0, 4),
    ]


@pytest.mark.parametrize(
    "fmt, head", [("azure", AZURE_HEAD), ("burstgpt", BURST_HEAD), ("mooncake", MOON_HEAD)]
)
def test_invalid_utf8_names_its_line(tmp_path: Path, fmt: str, head: str) -> None:
    body = head.encode() if fmt != "mooncake" else head.encode() * 2
    path = tmp_path / "in"
    path.write_bytes(body + b"\xfe\xff,1,2\n")
    with pytest.raises(TraceError, match=r":3: not valid UTF-8"):
        FORMATS[fmt](path)
