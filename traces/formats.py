"""Parsers for public LLM request traces, one per format, and their conversion to TraceRequests.

Formats (``FORMATS``):

- ``azure``: Azure LLM inference trace CSV, ``TIMESTAMP,ContextTokens,GeneratedTokens``, with
  TIMESTAMP like ``2023-11-16 18:15:46.6805900`` (no time zone; differences are taken as written).
- ``mooncake``: Mooncake JSONL, ``{"timestamp": <ms>, "input_length", "output_length", "hash_ids"}``.
- ``burstgpt``: BurstGPT CSV, ``Timestamp`` (s), ``Request tokens``, ``Response tokens`` and an
  optional ``Log Type``. Failed requests (``Response tokens`` == 0, or a Log Type that says
  "fail") and rows with ``Request tokens`` == 0 are dropped, counted per reason with their line
  numbers; every other bad row is an error.

Every malformed line raises TraceError("path:line: reason"). Columns or keys a format has beyond
the ones used are ignored and listed in the result (``ignored_fields``). Times are rebased so the
first request is at 0 and rounded to the microsecond (exact decimal arithmetic, half-even).
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from pathlib import Path

from traces.trace import TraceError, TraceRequest, jsonl_lines, read_utf8

MICROSECOND = Decimal("0.000001")
_AZURE_TIME = re.compile(r"(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?")
_EPOCH = datetime(1970, 1, 1)


@dataclass(frozen=True)
class RawRow:
    """One request as read from a source file, before rebasing its time."""

    line: int
    time_s: Decimal  # seconds, on the source's own clock
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] | None = None


@dataclass
class Parsed:
    """Rows read from a source file, rows dropped (reason -> line numbers) and unused fields."""

    rows: list[RawRow] = field(default_factory=list)
    dropped: dict[str, list[int]] = field(default_factory=dict)
    ignored_fields: list[str] = field(default_factory=list)

    def drop(self, reason: str, line: int) -> None:
        """Record a dropped row."""
        self.dropped.setdefault(reason, []).append(line)


def _count(text: str, column: str, minimum: int) -> int:
    """Parse a token count column: a plain non-negative decimal integer >= minimum."""
    text = text.strip()
    if not text.isdigit() or not text.isascii():
        raise ValueError(f"{column} must be an integer, got {text!r}")
    value = int(text)
    if value < minimum:
        raise ValueError(f"{column} must be >= {minimum}, got {value}")
    return value


def _decimal_seconds(text: str, column: str, scale: Decimal = Decimal(1)) -> Decimal:
    """Parse a non-negative finite decimal time, multiplied by scale to give seconds."""
    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        raise ValueError(f"{column} must be a number, got {text!r}") from None
    if not value.is_finite() or value < 0:
        raise ValueError(f"{column} must be a finite number >= 0, got {text!r}")
    return value * scale


def _azure_time(text: str) -> Decimal:
    """Seconds since 1970-01-01 of an Azure TIMESTAMP, exact to its written digits."""
    m = _AZURE_TIME.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"TIMESTAMP must look like 2023-11-16 18:15:46.6805900, got {text!r}")
    try:
        dt = datetime.strptime(f"{m[1]} {m[2]}", "%Y-%m-%d %H:%M:%S")
    except ValueError as exc:
        raise ValueError(f"TIMESTAMP {text!r}: {exc}") from None
    delta = dt - _EPOCH
    return Decimal(delta.days * 86400 + delta.seconds) + Decimal(f"0.{m[3] or 0}")


def _csv_rows(path: Path, required: tuple[str, ...], parsed: Parsed) -> Iterator[tuple[int, dict]]:
    """Yield (line number, {column: value}) for each data row of a CSV with a header."""
    reader = csv.reader(io.StringIO(read_utf8(path, "utf-8-sig"), newline=""))
    try:
        header = [h.strip() for h in next(reader, [])]
        missing = [c for c in required if c not in header]
        if missing:
            raise TraceError(f"{path}:1: missing column(s) {', '.join(missing)} in header {header}")
        parsed.ignored_fields = [h for h in header if h not in required]
        for row in reader:
            line = reader.line_num
            if len(row) != len(header):
                raise TraceError(f"{path}:{line}: expected {len(header)} fields, got {len(row)}")
            yield line, dict(zip(header, row, strict=True))
    except csv.Error as exc:
        raise TraceError(f"{path}:{reader.line_num}: bad CSV: {exc}") from None


def parse_azure(path: Path) -> Parsed:
    """Azure LLM inference trace CSV (TIMESTAMP, ContextTokens, GeneratedTokens)."""
    parsed = Parsed()
    for line, row in _csv_rows(path, ("TIMESTAMP", "ContextTokens", "GeneratedTokens"), parsed):
        try:
            raw = RawRow(
                line,
                _azure_time(row["TIMESTAMP"]),
                _count(row["ContextTokens"], "ContextTokens", 1),
                _count(row["GeneratedTokens"], "GeneratedTokens", 1),
            )
        except ValueError as exc:
            raise TraceError(f"{path}:{line}: {exc}") from None
        parsed.rows.append(raw)
    return parsed


def parse_burstgpt(path: Path) -> Parsed:
    """BurstGPT CSV (Timestamp, Request tokens, Response tokens[, Log Type]); drops failed rows."""
    parsed = Parsed()
    required = ("Timestamp", "Request tokens", "Response tokens")
    for line, row in _csv_rows(path, required, parsed):
        try:
            time_s = _decimal_seconds(row["Timestamp"], "Timestamp")
            inp = _count(row["Request tokens"], "Request tokens", 0)
            out = _count(row["Response tokens"], "Response tokens", 0)
        except ValueError as exc:
            raise TraceError(f"{path}:{line}: {exc}") from None
        if "fail" in row.get("Log Type", "").lower():
            parsed.drop("failed (Log Type)", line)
        elif out == 0:
            parsed.drop("failed (Response tokens == 0)", line)
        elif inp == 0:
            parsed.drop("Request tokens == 0", line)
        else:
            parsed.rows.append(RawRow(line, time_s, inp, out))
    if "Log Type" in parsed.ignored_fields:
        parsed.ignored_fields.remove("Log Type")
    return parsed


def _mooncake_row(line: int, text: str, ignored: set[str]) -> RawRow:
    """Validate one Mooncake JSONL line."""
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"bad JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    missing = [k for k in ("timestamp", "input_length", "output_length") if k not in obj]
    if missing:
        raise ValueError(f"missing key(s) {', '.join(missing)}")
    ignored.update(set(obj) - {"timestamp", "input_length", "output_length", "hash_ids"})
    ts = obj["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, (int, float)):
        raise ValueError(f"timestamp must be a number of milliseconds, got {ts!r}")
    counts = []
    for key in ("input_length", "output_length"):
        v = obj[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{key} must be an int >= 1, got {v!r}")
        counts.append(v)
    hash_ids = None
    if "hash_ids" in obj:
        if not isinstance(obj["hash_ids"], list) or any(
            isinstance(h, bool) or not isinstance(h, int) for h in obj["hash_ids"]
        ):
            raise ValueError(f"hash_ids must be a list of ints, got {obj['hash_ids']!r}")
        if any(h < 0 for h in obj["hash_ids"]):
            raise ValueError(f"hash_ids must be >= 0, got {min(obj['hash_ids'])}")
        hash_ids = tuple(obj["hash_ids"])
    time_s = _decimal_seconds(repr(ts), "timestamp", Decimal("0.001"))
    return RawRow(line, time_s, counts[0], counts[1], hash_ids)


def parse_mooncake(path: Path) -> Parsed:
    """Mooncake JSONL (timestamp in ms, input_length, output_length, hash_ids)."""
    parsed = Parsed()
    ignored: set[str] = set()
    for line, text in jsonl_lines(path):
        if not text.strip():
            raise TraceError(f"{path}:{line}: empty line")
        try:
            parsed.rows.append(_mooncake_row(line, text, ignored))
        except ValueError as exc:
            raise TraceError(f"{path}:{line}: {exc}") from None
    parsed.ignored_fields = sorted(ignored)
    return parsed


FORMATS: dict[str, Callable[[Path], Parsed]] = {
    "azure": parse_azure,
    "mooncake": parse_mooncake,
    "burstgpt": parse_burstgpt,
}


def order_rows(path: Path, rows: list[RawRow], sort: bool) -> tuple[list[RawRow], int]:
    """Check time order; with sort, order stably instead. Returns (rows, rows that were out of order)."""
    out_of_order = 0
    latest: RawRow | None = None
    for row in rows:
        if latest is not None and row.time_s < latest.time_s:
            if not sort:
                raise TraceError(
                    f"{path}:{row.line}: not in time order (earlier than line {latest.line}); "
                    "pass --sort to order the rows stably by time"
                )
            out_of_order += 1
        else:
            latest = row
    if out_of_order:
        rows = sorted(rows, key=lambda r: r.time_s)
    return rows, out_of_order


def to_requests(rows: list[RawRow]) -> list[TraceRequest]:
    """Rebase times to the first row (which must be earliest) and round them to the microsecond."""
    if not rows:
        return []
    t0 = rows[0].time_s
    return [
        TraceRequest(
            float((r.time_s - t0).quantize(MICROSECOND, rounding=ROUND_HALF_EVEN)),
            r.input_tokens,
            r.output_tokens,
            r.hash_ids,
        )
        for r in rows
    ]
