"""Per-request records: raw monotonic timestamps in, metrics derived by pure functions.

A record keeps only what was observed (due, sent, first and last token, end, the gaps between token
chunks, server token counts, HTTP status, error text). Every time is ``time.perf_counter_ns()``
minus the replay's ``t0``, so records of one replay share one clock. Metrics return ``None`` when
they are undefined (no first token, TPOT of a 1-token reply), never a made-up 0.
"""

from __future__ import annotations

import errno
import json
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import IO, Any

from common.jsonfile import RepeatedKeys, open_text, unique_keys

_NS_PER_MS = 1e6
# The client keeps its schedule when its send lateness p99 is at most this (loadgen.bench's target;
# docs/FINDINGS.md, section 4): a later send no longer replays the trace's arrival times.
LATENESS_TARGET_P99_MS = 2.0


@dataclass(frozen=True)
class RequestRecord:
    """What one replayed request saw; times in ns since the replay's t0."""

    index: int  # position in the replayed list
    due_ns: int  # when the schedule said to send it
    sent_ns: int | None  # when the client began the HTTP request
    first_token_ns: int | None  # first chunk that carried a token
    last_token_ns: int | None  # last chunk that carried a token
    end_ns: int | None  # stream finished, failed or timed out
    input_tokens: int  # asked (prompt length)
    output_tokens: int  # asked (max_tokens)
    prompt_tokens: int | None  # server usage
    completion_tokens: int | None  # server usage
    n_chunks: int  # token-bearing stream chunks received
    max_gap_ms: float | None  # largest gap between token-bearing chunks
    status: int | None  # HTTP status
    error: str | None  # None when it succeeded
    tags: dict = field(default_factory=dict)  # caller's labels (arm, window, load, phase, ...)
    itl_us: tuple[int, ...] | None = None  # gaps between successive token chunks (us); None: not kept


def _ms(a: int | None, b: int | None) -> float | None:
    if a is None or b is None:
        return None
    return (b - a) / _NS_PER_MS


def ttft_ms(r: RequestRecord) -> float | None:
    """Time to first token, from the due time (not the send time)."""
    return _ms(r.due_ns, r.first_token_ns)


def tpot_ms(r: RequestRecord) -> float | None:
    """(last token - first token) / (completion_tokens - 1); None for fewer than 2 tokens, and None
    where the first and last token came in one network read (the client fell behind the stream and
    saw the whole reply at once: its token timing was not observed, and 0 would be false)."""
    if r.completion_tokens is None or r.completion_tokens < 2:
        return None
    span = _ms(r.first_token_ns, r.last_token_ns)
    return None if span is None or span == 0 else span / (r.completion_tokens - 1)


def e2e_ms(r: RequestRecord) -> float | None:
    """End-to-end latency, from the due time to the end of the stream."""
    return _ms(r.due_ns, r.end_ns)


def lateness_ms(r: RequestRecord) -> float | None:
    """How late the client began sending, relative to the schedule."""
    return _ms(r.due_ns, r.sent_ns)


def succeeded(r: RequestRecord) -> bool:
    """No error, HTTP 200, and the server produced exactly the asked number of tokens."""
    return r.error is None and r.status == 200 and r.completion_tokens == r.output_tokens


def itl_ms(r: RequestRecord) -> list[float]:
    """Inter-token latencies: the gaps between successive token-bearing chunks, in ms (as vLLM's
    benchmark counts them: one per chunk after the first); [] where none were kept (records written
    before the field existed) or fewer than two chunks came."""
    return [g / 1e3 for g in r.itl_us or ()]


def tpot_unobserved(r: RequestRecord) -> bool:
    """A reply that succeeded with 2+ tokens whose TPOT the client could not observe (tpot_ms None)."""
    return succeeded(r) and (r.completion_tokens or 0) >= 2 and tpot_ms(r) is None


def batched(r: RequestRecord) -> bool:
    """A reply that succeeded with 2+ tokens in fewer token chunks than tokens: the server sent
    several tokens per event (its output loop fell behind the engine), so its token cadence is the
    frontend's, not the engine step's."""
    return succeeded(r) and (r.completion_tokens or 0) >= 2 and r.n_chunks < r.completion_tokens


_FIELDS = tuple(f.name for f in fields(RequestRecord))
_OPTIONAL = ("tags", "itl_us")  # a record file written before itl_us existed reads back without it
_TIMES = ("due_ns", "sent_ns", "first_token_ns", "last_token_ns", "end_ns")  # in the order they happen


def _whole(v: Any, lo: int, hi: int | None = None) -> bool:
    return type(v) is int and v >= lo and (hi is None or v <= hi)  # bool is no count


def _or_null(test: Callable[[Any], bool], what: str) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: v is None or test(v)), f"{what} or null"


_COUNT = (lambda v: _whole(v, 0)), "an integer >= 0"
_POSITIVE = (lambda v: _whole(v, 1)), "an integer >= 1"
_COUNT_OR_NULL = _or_null(*_COUNT)
# every field's type and range as a record file holds it: (test, what the field must be)
_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "index": _COUNT, "due_ns": _COUNT, "sent_ns": _COUNT_OR_NULL, "first_token_ns": _COUNT_OR_NULL,
    "last_token_ns": _COUNT_OR_NULL, "end_ns": _COUNT_OR_NULL, "input_tokens": _POSITIVE,
    "output_tokens": _POSITIVE, "prompt_tokens": _COUNT_OR_NULL, "completion_tokens": _COUNT_OR_NULL,
    "n_chunks": _COUNT,
    "max_gap_ms": _or_null(lambda v: type(v) in (int, float) and math.isfinite(v) and v >= 0,
                           "a finite number >= 0"),
    "status": _or_null(lambda v: _whole(v, 100, 599), "an integer from 100 to 599"),
    "error": _or_null(lambda v: isinstance(v, str), "a string"),
    "tags": ((lambda v: isinstance(v, dict)), "an object"),
    "itl_us": _or_null(lambda v: isinstance(v, list) and all(_whole(g, 0) for g in v),
                       "a list of integers >= 0"),
}


def _record_problem(d: dict) -> str | None:
    """What is wrong with a record's JSON object: the first field of the wrong type or range, or times
    out of order (due, sent, first token, last token, end); None when nothing is."""
    for key, (ok, what) in _RULES.items():
        if key in d and not ok(d[key]):
            return f"{key} must be {what}, got {json.dumps(d[key])[:200]}"
    times = [(k, d[k]) for k in _TIMES if d.get(k) is not None]
    for (before, t0), (key, t) in zip(times, times[1:]):
        if t < t0:
            return f"times out of order: {key} {t} is before {before} {t0}"
    return None


def record_to_json(r: RequestRecord) -> dict:
    """A JSON-ready dict with every field (tags copied)."""
    d = asdict(r)
    d["tags"] = dict(r.tags)
    return d


def record_from_json(d: dict) -> RequestRecord:
    """Inverse of record_to_json; raises ValueError naming missing or unknown keys, or the field of
    the wrong type or range (_record_problem)."""
    missing = [k for k in _FIELDS if k not in d and k not in _OPTIONAL]
    unknown = sorted(set(d) - set(_FIELDS))
    if missing or unknown:
        raise ValueError(f"bad record: missing {missing}, unknown {unknown}")
    problem = _record_problem(d)
    if problem is not None:
        raise ValueError(f"bad record: {problem}")
    itl = d.get("itl_us")
    return RequestRecord(**{**d, "tags": dict(d.get("tags", {})),
                            "itl_us": None if itl is None else tuple(itl)})


def read_records(path: str | Path) -> list[RequestRecord]:
    """Records of a .jsonl, .jsonl.xz or .jsonl.gz file, in file order; bad lines raise
    ValueError("path:line: ...")."""
    records, tail = read_whole_records(path)
    if tail:
        try:
            records.append(_record(tail))
        except ValueError as exc:
            raise ValueError(f"{path}:{len(records) + 1}: {exc}") from None
    return records


def read_whole_records(path: str | Path, check: Callable[[RequestRecord], str | None] | None = None,
                       bad: list[tuple[int, str]] | None = None) -> tuple[list[RequestRecord], str]:
    """Records of the file's whole lines (each ending in a newline), and the text after the last one:
    "" unless the file ends in a torn line (a writer stopped mid-line). A bad whole line, or a record
    `check` names a problem of, raises ValueError("path:line: reason"), or with `bad` given is left
    out and its (line, reason) appended to `bad`."""
    path = Path(path)
    with open_text(path) as f:
        lines = f.read().split("\n")
    tail = lines.pop()
    records = []
    for lineno, line in enumerate(lines, start=1):
        try:
            r = _record(line)
            problem = None if check is None else check(r)
            if problem is not None:
                raise ValueError(problem)
        except ValueError as exc:
            if bad is None:
                raise ValueError(f"{path}:{lineno}: {exc}") from None
            bad.append((lineno, str(exc)))
            continue
        records.append(r)
    return records, tail


def _record(line: str) -> RequestRecord:
    """The record of one line; ValueError saying what is wrong with it."""
    try:
        obj = json.loads(line, object_pairs_hook=unique_keys)
    except RepeatedKeys as exc:
        raise ValueError(f"bad record: {exc}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"bad record: expected a JSON object, got {json.dumps(obj)[:200]}")
    return record_from_json(obj)


class RecordWriteError(OSError):
    """The records file failed (disk full, I/O error): it keeps its whole lines, the rest are not in it."""


class RecordWriter:
    """Appends one JSON line per record, unbuffered, so a crash loses no finished record.

    A write that fails (ENOSPC, EIO) cuts the file back to its last whole line and raises
    RecordWriteError naming the file; every later write raises it again without touching the file,
    so the file never ends in a torn line and closing it never fails.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f: IO[bytes] | None = self.path.open("ab", buffering=0)
        self._whole = self._f.seek(0, 2)  # bytes that end in a whole line
        self.failed: str | None = None  # why the file stopped taking records
        self.written = 0

    def write(self, r: RequestRecord) -> None:
        """Append one record as one line; RecordWriteError if the file cannot take it."""
        assert self._f is not None, f"{self.path}: writer is closed"
        if self.failed is not None:
            raise RecordWriteError(self.failed)
        line = (json.dumps(record_to_json(r)) + "\n").encode()
        data = memoryview(line)
        try:
            while data:
                n = self._f.write(data)
                if not n:
                    raise OSError(errno.ENOSPC, "the file took no bytes")
                data = data[n:]
        except OSError as exc:
            self._cut()
            self.failed = f"{self.path}: {exc.strerror or exc} ({self.written} records written whole)"
            raise RecordWriteError(self.failed) from None
        self._whole += len(line)
        self.written += 1

    def _cut(self) -> None:
        """Drop a torn line at the end, where the file lets us (a device like /dev/full does not)."""
        try:
            os.ftruncate(self._f.fileno(), self._whole)
        except OSError:
            pass

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None

    def __enter__(self) -> "RecordWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
