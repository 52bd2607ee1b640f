"""Request traces: the JSONL line format, a validating loader, a writer and small transforms.

One request per line, sorted by time::

    {"timestamp": 0.0, "input_tokens": 374, "output_tokens": 44}
    {"timestamp": 4.314579, "input_tokens": 396, "output_tokens": 109, "hash_ids": [0, 1]}

``timestamp`` is seconds from the trace start (int or float, 0 to ``MAX_TIMESTAMP_S``, never decreasing),
``input_tokens`` and ``output_tokens`` are ints from 1 to ``MAX_TOKENS``, ``hash_ids`` (optional)
is a list of ints >= 0.
Any other key is rejected: a misspelled or unexpected field is an error, not something to skip; so
is a key given twice (JSON alone would keep the last).
Every bad line raises :class:`TraceError` with ``path:line: reason``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from common.atomicfile import write_atomic
from common.jsonfile import RepeatedKeys, open_bytes, stored, unique_keys

REQUIRED_KEYS = ("timestamp", "input_tokens", "output_tokens")
OPTIONAL_KEYS = ("hash_ids",)
PERCENTILES = (50, 90, 99)
# The stated ceiling on a token count: twice the longest context of the models the kit serves (1M),
# and a prompt of this many ids is a body of about 14 MB, so one absurd row cannot exhaust memory.
MAX_TOKENS = 2_097_152
# The stated ceiling on a timestamp, as read and after a speed-up: about 32 years, longer than any
# trace, so its due time in nanoseconds fits the int64 that records and numpy keep (2**63 ns is 292
# years); past it a finite float such as 1e308 overflows when made nanoseconds.
MAX_TIMESTAMP_S = 1e9
# Timestamps made by window/scale are rounded to the nanosecond to drop float noise (10.1 - 10.0).
_TS_DIGITS = 9


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace: arrival time and token counts."""

    timestamp: float  # seconds from trace start
    input_tokens: int  # >= 1
    output_tokens: int  # >= 1
    hash_ids: tuple[int, ...] | None = None


class TraceError(ValueError):
    """A trace file or trace input is invalid; the message reads ``path:line: reason``."""


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


def _json_object(text: str) -> dict:
    """Decode one line as a JSON object with exactly the allowed keys; raises ValueError."""
    try:
        obj = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=unique_keys)
    except RepeatedKeys as exc:
        raise ValueError(str(exc)) from None
    except ValueError as exc:
        raise ValueError(f"bad JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    missing = [k for k in REQUIRED_KEYS if k not in obj]
    if missing:
        raise ValueError(f"missing key(s) {', '.join(missing)}")
    unknown = sorted(set(obj) - set(REQUIRED_KEYS) - set(OPTIONAL_KEYS))
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(unknown)}")
    return obj


def _parse_line(text: str) -> TraceRequest:
    """Parse and validate one line; raises ValueError with the reason."""
    obj = _json_object(text)
    ts = obj["timestamp"]
    if not (_is_int(ts) or isinstance(ts, float)) or not math.isfinite(ts):
        raise ValueError(f"timestamp must be a finite number, got {ts!r}")
    if ts < 0:
        raise ValueError(f"timestamp must be >= 0, got {ts!r}")
    if ts > MAX_TIMESTAMP_S:
        raise ValueError(f"timestamp {ts:g} s is past the ceiling of {MAX_TIMESTAMP_S:,.0f} s a trace "
                         "may span")
    for key in ("input_tokens", "output_tokens"):
        v = obj[key]
        if not _is_int(v):
            raise ValueError(f"{key} must be an int, got {v!r}")
        if v < 1:
            raise ValueError(f"{key} must be >= 1, got {v}")
        if v > MAX_TOKENS:
            raise ValueError(f"{key} {v:,} is past the ceiling of {MAX_TOKENS:,} tokens a request may ask")
    hash_ids = None
    if "hash_ids" in obj:
        if not isinstance(obj["hash_ids"], list) or not all(_is_int(h) for h in obj["hash_ids"]):
            raise ValueError(f"hash_ids must be a list of ints, got {obj['hash_ids']!r}")
        negative = [h for h in obj["hash_ids"] if h < 0]
        if negative:
            raise ValueError(f"hash_ids must be >= 0, got {negative[0]}")
        hash_ids = tuple(obj["hash_ids"])
    return TraceRequest(float(ts), obj["input_tokens"], obj["output_tokens"], hash_ids)


def read_utf8(path: str | Path, encoding: str = "utf-8") -> str:
    """A file's text (decompressed where it is kept .xz or .gz: common.jsonfile.open_bytes); bytes that
    are not valid UTF-8 raise TraceError naming their line."""
    with open_bytes(path) as f:
        return _decoded(path, f.read(), encoding)


def _decoded(path: str | Path, data: bytes, encoding: str = "utf-8") -> str:
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise TraceError(f"{path}:{line}: not valid UTF-8 ({exc.reason})") from None


def jsonl_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """(line number, text) for each line of a UTF-8 file split at '\n'; a final newline ends no line."""
    return _lines(read_utf8(path))


def _lines(text: str) -> Iterator[tuple[int, str]]:
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return enumerate(lines, start=1)


@dataclass(frozen=True)
class TraceFile:
    """A trace file read once: its validated requests and the SHA-256 of the bytes they came from."""

    path: Path
    requests: tuple[TraceRequest, ...]
    sha256: str


def read_trace(path: str | Path) -> TraceFile:
    """The JSONL trace at `path`, read, validated and hashed once per process for each version of the
    file (its size and modification time), however many parts of a run ask; TraceError("path:line:
    reason") on the first bad line. A trace kept .xz or .gz reads and hashes as the text it holds."""
    st = stored(path).stat()
    return _read_trace(Path(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _read_trace(path: Path, size: int, mtime_ns: int) -> TraceFile:
    with open_bytes(path) as f:
        data = f.read()
    return TraceFile(path, tuple(_parsed(path, _decoded(path, data))), hashlib.sha256(data).hexdigest())


def load_trace(path: str | Path) -> list[TraceRequest]:
    """The requests of a JSONL trace (read_trace)."""
    return list(read_trace(path).requests)


def _parsed(path: Path, text: str) -> list[TraceRequest]:
    """The requests of a trace's text, validated line by line."""
    reqs: list[TraceRequest] = []
    for lineno, line in _lines(text):
        if not line.strip():
            raise TraceError(f"{path}:{lineno}: empty line")
        try:
            req = _parse_line(line)
        except ValueError as exc:
            raise TraceError(f"{path}:{lineno}: {exc}") from None
        if reqs and req.timestamp < reqs[-1].timestamp:
            raise TraceError(
                f"{path}:{lineno}: not sorted by time: timestamp {req.timestamp} "
                f"< {reqs[-1].timestamp} on line {lineno - 1}"
            )
        reqs.append(req)
    if not reqs:
        raise TraceError(f"{path}:1: empty trace, no requests")
    return reqs


def request_to_json(req: TraceRequest) -> dict:
    """The JSON object of one trace line (hash_ids only when present)."""
    obj: dict[str, Any] = {
        "timestamp": req.timestamp,
        "input_tokens": req.input_tokens,
        "output_tokens": req.output_tokens,
    }
    if req.hash_ids is not None:
        obj["hash_ids"] = list(req.hash_ids)
    return obj


def write_trace(reqs: Sequence[TraceRequest], path: str | Path) -> None:
    """Write requests as JSONL (one object per line, '\\n' endings, UTF-8), deterministically and
    atomically (an interrupted write leaves no half trace)."""
    write_atomic(path, "".join(json.dumps(request_to_json(req)) + "\n" for req in reqs))


def time_window(reqs: Sequence[TraceRequest], start_s: float, duration_s: float) -> list[TraceRequest]:
    """Requests with start_s <= t < start_s + duration_s, rebased so that start_s becomes 0.

    The gap between start_s and the first request in the window is kept, so a replay of the
    window lasts duration_s like the original stretch did. duration_s may be math.inf (to the end).
    """
    if not (math.isfinite(start_s) and start_s >= 0):
        raise ValueError(f"start_s must be a finite number >= 0, got {start_s!r}")
    if not duration_s > 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s!r}")
    end = start_s + duration_s
    return [
        TraceRequest(round(r.timestamp - start_s, _TS_DIGITS), r.input_tokens, r.output_tokens, r.hash_ids)
        for r in reqs
        if start_s <= r.timestamp < end
    ]


def scale_rate(reqs: Sequence[TraceRequest], speedup: float) -> list[TraceRequest]:
    """Replay at speedup x the original rate: every timestamp divided by speedup; ValueError naming the
    first request it would put past MAX_TIMESTAMP_S."""
    if not (math.isfinite(speedup) and speedup > 0):
        raise ValueError(f"speedup must be a finite number > 0, got {speedup!r}")
    scaled = [replace(r, timestamp=round(r.timestamp / speedup, _TS_DIGITS)) for r in reqs]
    for i, (r, s) in enumerate(zip(reqs, scaled, strict=True)):
        if s.timestamp > MAX_TIMESTAMP_S:
            raise ValueError(f"request {i}: timestamp {r.timestamp:g} s at speedup {speedup:g} is "
                             f"{s.timestamp:g} s, past the ceiling of {MAX_TIMESTAMP_S:,.0f} s a schedule "
                             "may span")
    return scaled


def clip_tokens(requests: Sequence[TraceRequest], max_input: int | None = None,
                max_output: int | None = None) -> list[TraceRequest]:
    """Requests with input/output token counts capped (None: no cap); for quick runs on small servers."""
    for name, cap in (("max_input", max_input), ("max_output", max_output)):
        if cap is not None and cap < 1:
            raise ValueError(f"{name} must be >= 1 or None, got {cap}")
    return [replace(r, input_tokens=min(r.input_tokens, max_input or r.input_tokens),
                    output_tokens=min(r.output_tokens, max_output or r.output_tokens))
            for r in requests]


def _token_stats(values: np.ndarray) -> dict:
    pct = np.percentile(values, PERCENTILES)  # linear interpolation between closest ranks
    stats = {"mean": float(values.mean())}
    stats.update({f"p{p}": float(v) for p, v in zip(PERCENTILES, pct, strict=True)})
    stats.update({"min": int(values.min()), "max": int(values.max()), "total": int(values.sum())})
    return stats


def trace_summary(reqs: Sequence[TraceRequest]) -> dict:
    """Summary statistics of a trace.

    Keys: count, start_s, end_s (first/last timestamp), duration_s (end_s - start_s),
    rate_rps ((count - 1) / duration_s: the inverse of the mean inter-arrival gap; None when
    duration is 0), with_hash_ids (requests that carry hash_ids), input_tokens and output_tokens
    ({mean, p50, p90, p99, min, max, total}; percentiles interpolate linearly, numpy's default).
    An empty sequence gives count 0 and None everywhere else.
    """
    if not reqs:
        keys = ("start_s", "end_s", "duration_s", "rate_rps", "input_tokens", "output_tokens")
        return {"count": 0, "with_hash_ids": 0, **{k: None for k in keys}}
    start = min(r.timestamp for r in reqs)
    end = max(r.timestamp for r in reqs)
    duration = end - start
    return {
        "count": len(reqs),
        "start_s": start,
        "end_s": end,
        "duration_s": duration,
        "rate_rps": (len(reqs) - 1) / duration if duration > 0 else None,
        "with_hash_ids": sum(r.hash_ids is not None for r in reqs),
        "input_tokens": _token_stats(np.array([r.input_tokens for r in reqs], dtype=np.int64)),
        "output_tokens": _token_stats(np.array([r.output_tokens for r in reqs], dtype=np.int64)),
    }


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes, decompressed where it is kept .xz or .gz (a trace committed
    compressed hashes as the trace it holds)."""
    h = hashlib.sha256()
    with open_bytes(path) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
