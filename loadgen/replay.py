"""Open-loop replay of a request list against an OpenAI-compatible /v1/completions server.

Request ``i`` is due at ``t0 + requests[i].timestamp`` on ``time.perf_counter_ns()``, whatever
happened to earlier requests (open loop: a slow server never slows the schedule down, and
latencies count from the due time, so queueing shows up instead of being hidden). One scheduler
coroutine walks the list: it encodes the next request's body while it has slack, sleeps with
asyncio until ``SPIN_NS`` before the due time (the event loop's timers are only ms-precise), then
yields to the loop in a tight spin until the due time, and starts the request as its own task.

Connection pool: unlimited by default (``max_connections=None``). In an open loop the number in
flight is set by the schedule and the server, not by the client; a pool limit below it would
queue requests inside the client, where the wait hides as send lateness the server never saw.
Pass a number to cap it anyway (for a server that limits connections).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import resource
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import aiohttp
from tqdm import tqdm

from loadgen.client import completion_body, run_request
from loadgen.prompts import prompt_token_ids
from loadgen.records import RecordWriter, RequestRecord
from traces.trace import TraceRequest

SPIN_NS = 1_500_000  # epoll rounds timeouts up to whole ms, so a coarse sleep can wake ~1 ms late
START_DELAY_NS = 20_000_000  # t0 lies this far after setup, so request 0 is not late by construction
READ_BUFSIZE = 4 << 20  # one SSE line must fit: large error bodies or usage blocks


def due_times_ns(requests: Sequence[TraceRequest]) -> list[int]:
    """Due offsets (ns from t0); raises ValueError naming the first bad or out-of-order timestamp."""
    due: list[int] = []
    for i, r in enumerate(requests):
        ts = r.timestamp
        if not (isinstance(ts, (int, float)) and math.isfinite(ts) and ts >= 0):
            raise ValueError(f"request {i}: timestamp must be a finite number >= 0, got {ts!r}")
        ns = round(ts * 1e9)
        if due and ns < due[-1]:
            raise ValueError(f"request {i}: timestamp {ts} is before request {i - 1}'s; sort the list")
        due.append(ns)
    return due


def clip_tokens(requests: Sequence[TraceRequest], max_input: int | None = None,
                max_output: int | None = None) -> list[TraceRequest]:
    """Requests with input/output token counts capped (None: no cap); for quick runs on small servers."""
    for name, cap in (("max_input", max_input), ("max_output", max_output)):
        if cap is not None and cap < 1:
            raise ValueError(f"{name} must be >= 1 or None, got {cap}")
    return [dataclasses.replace(r, input_tokens=min(r.input_tokens, max_input or r.input_tokens),
                                output_tokens=min(r.output_tokens, max_output or r.output_tokens))
            for r in requests]


async def sleep_until(deadline_ns: int, spin_ns: int = SPIN_NS) -> None:
    """Sleep until perf_counter_ns() >= deadline_ns: coarse asyncio sleep, then a yielding spin."""
    while True:
        left = deadline_ns - time.perf_counter_ns()
        if left <= 0:
            return
        await asyncio.sleep((left - spin_ns) / 1e9 if left > spin_ns else 0)


async def fetch_model_name(session: aiohttp.ClientSession, url: str) -> str:
    """The served model name from GET /v1/models (the only one; several is an error)."""
    async with session.get(f"{url}/v1/models") as resp:
        if resp.status != 200:
            raise RuntimeError(f"GET {url}/v1/models: HTTP {resp.status}: {(await resp.text())[:500]}")
        ids = [m["id"] for m in (await resp.json()).get("data", [])]
    if len(ids) != 1:
        raise RuntimeError(f"GET {url}/v1/models lists {ids}; pass the model name explicitly")
    return ids[0]


def raise_fd_limit() -> int:
    """Raise this process's soft open-file limit to the hard one (one socket per request in flight)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def _unsent_record(i: int, req: TraceRequest, due_ns: int, tags: Mapping[str, Any]) -> RequestRecord:
    return RequestRecord(
        index=i, due_ns=due_ns, sent_ns=None, first_token_ns=None, last_token_ns=None, end_ns=None,
        input_tokens=req.input_tokens, output_tokens=req.output_tokens, prompt_tokens=None,
        completion_tokens=None, n_chunks=0, max_gap_ms=None, status=None,
        error="not sent: the replay stopped before this request was started", tags=dict(tags),
    )


async def _dispatch(
    session: aiohttp.ClientSession, endpoint: str, requests: Sequence[TraceRequest], due: list[int],
    *, model: str, seed: int, vocab_size: int, tags: Mapping[str, Any], timeout: aiohttp.ClientTimeout,
    sink: Callable[[RequestRecord], None],
) -> None:
    """Start every request at its due time; return when all have finished.

    If cancelled, in-flight requests are cancelled (each still reaches `sink`, with its error),
    and every request not yet started gets an unsent error record.
    """
    tasks: set[asyncio.Task] = set()
    failures: list[BaseException] = []  # a record that could not be stored (disk full, ...)

    def done(task: asyncio.Task) -> None:
        tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            failures.append(task.exception())

    started = 0
    t0 = time.perf_counter_ns() + START_DELAY_NS
    try:
        for i, req in enumerate(requests):
            body = completion_body(model, prompt_token_ids(i, req, seed=seed, vocab_size=vocab_size),
                                   req.output_tokens)
            await sleep_until(t0 + due[i])
            task = asyncio.create_task(run_request(
                session, endpoint, body, index=i, input_tokens=req.input_tokens,
                output_tokens=req.output_tokens, due_ns=due[i], t0_ns=t0, timeout=timeout,
                tags=tags, sink=sink))
            started += 1
            tasks.add(task)
            task.add_done_callback(done)
            if failures:
                raise failures[0]
        while tasks:
            await asyncio.wait(set(tasks))
        if failures:
            raise failures[0]
    finally:
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(set(tasks))
        for i in range(started, len(requests)):
            sink(_unsent_record(i, requests[i], due[i], tags))


async def replay(
    url: str,
    requests: Sequence[TraceRequest],
    *,
    out: Path | None = None,
    model: str | None = None,
    tags: Mapping | None = None,
    timeout_s: float = 600.0,
    max_connections: int | None = None,
    seed: int = 0,
    progress: bool = True,
    vocab_size: int = 32000,
    connect_timeout_s: float = 30.0,
) -> list[RequestRecord]:
    """Replay `requests` open-loop against `url`; return one record per request, by index.

    Records are appended to `out` (JSONL, one flushed line per finished request) as they finish.
    `timeout_s` bounds a whole request (send to last byte), `connect_timeout_s` its connection.
    `model` defaults to the server's only served model. Prompts: see loadgen.prompts.
    """
    if not requests:
        raise ValueError("no requests to replay")
    if timeout_s <= 0 or connect_timeout_s <= 0:
        raise ValueError(f"timeouts must be > 0, got timeout_s={timeout_s}, "
                         f"connect_timeout_s={connect_timeout_s}")
    if max_connections is not None and max_connections < 1:
        raise ValueError(f"max_connections must be >= 1 or None (unlimited), got {max_connections}")
    due = due_times_ns(requests)
    try:
        json.dumps(dict(tags or {}))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"tags must be JSON-serializable: {exc}") from None
    url = url.rstrip("/")
    raise_fd_limit()
    records: dict[int, RequestRecord] = {}
    writer = RecordWriter(out) if out is not None else None
    bar = tqdm(total=len(requests), unit="req", disable=not progress, mininterval=0.5)

    def sink(rec: RequestRecord) -> None:
        assert rec.index not in records, f"request {rec.index} recorded twice"
        records[rec.index] = rec
        if writer is not None:
            writer.write(rec)
        bar.update(1)

    timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=connect_timeout_s)
    connector = aiohttp.TCPConnector(limit=max_connections or 0, limit_per_host=0)
    try:
        async with aiohttp.ClientSession(connector=connector, read_bufsize=READ_BUFSIZE,
                                         timeout=timeout) as session:
            model = model or await fetch_model_name(session, url)
            await _dispatch(session, f"{url}/v1/completions", requests, due, model=model, seed=seed,
                            vocab_size=vocab_size, tags=dict(tags or {}), timeout=timeout, sink=sink)
    finally:
        bar.close()
        if writer is not None:
            writer.close()
    return [records[i] for i in range(len(requests))]


EVENT_LOOPS = ("asyncio", "uvloop")


def replay_sync(url: str, requests: Sequence[TraceRequest], *, event_loop: str = "asyncio",
                **kwargs: Any) -> list[RequestRecord]:
    """replay() run to completion on a fresh event loop (same arguments).

    event_loop "uvloop" needs the uvloop package (vLLM installs it); it is not a dependency.
    """
    if event_loop not in EVENT_LOOPS:
        raise ValueError(f"event_loop must be one of {EVENT_LOOPS}, got {event_loop!r}")
    if event_loop == "uvloop":
        import uvloop  # optional: only when asked for

        return uvloop.run(replay(url, requests, **kwargs))
    return asyncio.run(replay(url, requests, **kwargs))
