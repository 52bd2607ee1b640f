"""Open-loop replay of a request list against an OpenAI-compatible /v1/completions server.

Request ``i`` is due at ``t0 + requests[i].timestamp`` on ``time.perf_counter_ns()``, whatever
happened to earlier requests (open loop: a slow server never slows the schedule down, and
latencies count from the due time, so queueing shows up instead of being hidden). The scheduler
(loadgen.dispatch) builds bodies ahead of their due times, sleeps with asyncio until ``SPIN_NS``
before a due time, yields to the loop in a tight spin until it, and starts the request as its own
task. Every request of the list gets exactly one record, whatever ends the replay.

Connection pool: unlimited by default (``max_connections=None``). In an open loop the number in
flight is set by the schedule and the server, not by the client; a pool limit below it would
queue requests inside the client, where the wait hides as send lateness the server never saw.
Pass a number to cap it anyway (for a server that limits connections).
"""

from __future__ import annotations

import asyncio
import json
import resource
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence
from urllib.parse import urlsplit

import aiohttp
from tqdm import tqdm

from loadgen.dispatch import Dispatcher, unsent_record
from loadgen.prompts import PromptSource, check_vocab_size, request_problem, token_id_prompts
from loadgen.records import RecordWriteError, RecordWriter, RequestRecord
from traces.trace import MAX_TIMESTAMP_S, TraceRequest

DEAD_AFTER = 5  # consecutive requests that cannot connect before the server is declared unreachable
READ_BUFSIZE = 4 << 20  # one SSE line must fit: large error bodies or usage blocks


def due_times_ns(requests: Sequence[TraceRequest]) -> list[int]:
    """Due offsets (ns from t0); raises ValueError naming the first bad or out-of-order timestamp."""
    due: list[int] = []
    for i, r in enumerate(requests):
        ts = r.timestamp
        if not (isinstance(ts, (int, float)) and 0 <= ts <= MAX_TIMESTAMP_S):
            raise ValueError(f"request {i}: timestamp must be a number from 0 to {MAX_TIMESTAMP_S:,.0f} s, "
                             f"got {ts!r}")
        ns = round(ts * 1e9)
        if due and ns < due[-1]:
            raise ValueError(f"request {i}: timestamp {ts} is before request {i - 1}'s; sort the list")
        due.append(ns)
    return due


async def fetch_model_name(session: aiohttp.ClientSession, url: str, timeout_s: float = 30.0) -> str:
    """The served model name from GET /v1/models (the only one; several is an error).

    Raises RuntimeError naming the URL when the server cannot be reached, does not answer within
    `timeout_s` (connect to last byte) or answers otherwise.
    """
    try:
        async with session.get(f"{url}/v1/models", timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status != 200:
                raise RuntimeError(f"GET {url}/v1/models: HTTP {resp.status}: {(await resp.text())[:500]}")
            ids = [m["id"] for m in (await resp.json()).get("data", [])]
    except asyncio.TimeoutError:
        raise RuntimeError(f"GET {url}/v1/models: the server never answered (no reply within {timeout_s:g} s)"
                           ) from None
    except (aiohttp.ClientError, OSError, ValueError, KeyError, TypeError) as exc:
        raise RuntimeError(f"GET {url}/v1/models: {type(exc).__name__}: {exc}") from None
    if len(ids) != 1:
        raise RuntimeError(f"GET {url}/v1/models lists {ids}; pass the model name explicitly")
    return ids[0]


def raise_fd_limit() -> int:
    """Raise this process's soft open-file limit to the hard one (one socket per request in flight)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


class ReplayStopped(RuntimeError):
    """The replay ended before its schedule did; `records` still holds one record per request."""

    def __init__(self, reason: str, records: list[RequestRecord]) -> None:
        super().__init__(reason)
        self.reason, self.records = reason, records


class ServerUnreachable(ReplayStopped):
    """`dead_after` requests in a row could not connect: the rest were not sent."""


class ServerNotReady(ReplayStopped):
    """The model list could not be read (no answer, refused, HTTP error): no request was sent."""


def base_url(url: str) -> str:
    """The server's base URL: trailing '/' and an OpenAI-style '/v1' dropped; ValueError if not http(s)."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"expected an http:// or https:// URL like http://127.0.0.1:8000, got {url!r}")
    path = parts.path.rstrip("/")
    path = path.removesuffix("/v1")
    return f"{parts.scheme}://{parts.netloc}{path}"


def check_requests(requests: Sequence[TraceRequest]) -> list[int]:
    """Due offsets (ns) of a list whose every body can be built; ValueError naming the first bad one."""
    for i, req in enumerate(requests):
        problem = request_problem(req)
        if problem is not None:
            raise ValueError(f"request {i}: {problem}")
    return due_times_ns(requests)


@dataclass(frozen=True)
class ReplayOptions:
    """How replay() sends a request list: everything but the URL and the requests (checked when made).

    Records are appended to `out` (JSONL, one flushed line per finished request) as they finish.
    `timeout_s` bounds a whole request (send to last byte), `connect_timeout_s` its connection.
    `model` defaults to the server's only served model, asked with GET /v1/models within
    `probe_timeout_s`. Prompts: `prompts(index, request, seed)`, by default token ids below
    `vocab_size` (loadgen.prompts); text: loadgen.textprompts. After `dead_after` requests in a row
    fail to connect (0: never) the rest are not sent. `t0_ns` (perf_counter_ns) is the schedule's
    start when several replays share one (default: 20 ms after the first second's bodies are built).
    """

    out: Path | None = None
    model: str | None = None
    tags: Mapping[str, Any] = field(default_factory=dict)
    timeout_s: float = 600.0
    max_connections: int | None = None
    seed: int = 0
    progress: bool = True
    vocab_size: int = 32000
    prompts: PromptSource | None = None
    connect_timeout_s: float = 30.0
    probe_timeout_s: float = 30.0
    dead_after: int = DEAD_AFTER
    t0_ns: int | None = None

    def __post_init__(self) -> None:
        if min(self.timeout_s, self.connect_timeout_s, self.probe_timeout_s) <= 0:
            raise ValueError(f"timeouts must be > 0, got timeout_s={self.timeout_s}, "
                             f"connect_timeout_s={self.connect_timeout_s}, "
                             f"probe_timeout_s={self.probe_timeout_s}")
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1 or None (unlimited), got {self.max_connections}")
        if self.dead_after < 0:
            raise ValueError(f"dead_after must be >= 0, got {self.dead_after}")
        check_vocab_size(self.vocab_size)
        try:
            json.dumps(dict(self.tags))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"tags must be JSON-serializable: {exc}") from None


async def replay(url: str, requests: Sequence[TraceRequest],
                 options: ReplayOptions = ReplayOptions()) -> list[RequestRecord]:
    """Replay `requests` open-loop against `url` as `options` say; return one record per request, by
    index.

    When the model list cannot be had every request is recorded `not sent` and ServerNotReady is
    raised. After `options.dead_after` requests in a row fail to connect the rest are not sent and
    ServerUnreachable is raised; a record that cannot be stored or any other early end raises
    ReplayStopped. Both carry every request's record; so does a cancellation, on disk.
    """
    if not requests:
        raise ValueError("no requests to replay")
    due = check_requests(requests)
    o = options
    tags = dict(o.tags)
    url = base_url(url)
    raise_fd_limit()
    records: dict[int, RequestRecord] = {}
    writer = RecordWriter(o.out) if o.out is not None else None
    bar = tqdm(total=len(requests), unit="req", disable=not o.progress, mininterval=0.5)

    def sink(rec: RequestRecord) -> None:
        assert rec.index not in records, f"request {rec.index} recorded twice"
        records[rec.index] = rec
        bar.update(1)
        if writer is not None:
            writer.write(rec)

    timeout = aiohttp.ClientTimeout(total=o.timeout_s, sock_connect=o.connect_timeout_s)
    connector = aiohttp.TCPConnector(limit=o.max_connections or 0, limit_per_host=0)
    try:
        async with aiohttp.ClientSession(connector=connector, read_bufsize=READ_BUFSIZE, timeout=timeout,
                                         cookie_jar=aiohttp.DummyCookieJar()) as session:  # no cookies
            try:
                model = o.model or await fetch_model_name(session, url, o.probe_timeout_s)
            except RuntimeError as exc:
                recs = _not_sent(requests, due, tags, f"no model list: {exc}", sink)
                failed = f"; the records file failed too: {writer.failed}" if writer and writer.failed else ""
                raise ServerNotReady(f"{exc}{failed}", recs) from None
            except asyncio.CancelledError as exc:  # a signal while the server is silent
                _not_sent(requests, due, tags, str(exc.args[0] if exc.args and exc.args[0]
                                                    else "the replay was cancelled"), sink)
                raise
            dispatcher = Dispatcher(session, f"{url}/v1/completions", requests, due, model=model, seed=o.seed,
                                    prompts=o.prompts or token_id_prompts(o.vocab_size), tags=tags,
                                    timeout=timeout, sink=sink, dead_after=o.dead_after, t0_ns=o.t0_ns)
            await dispatcher.run()
    finally:
        bar.close()
        if writer is not None:
            writer.close()
    result = [records[i] for i in range(len(requests))]
    if dispatcher.stop_reason is not None:
        kind = ServerUnreachable if dispatcher.unreachable else ReplayStopped
        raise kind(f"{url}: {dispatcher.stop_reason}", result) from dispatcher.stop_error
    return result


def _not_sent(requests: Sequence[TraceRequest], due: list[int], tags: Mapping | None, reason: str,
              sink: Callable[[RequestRecord], None]) -> list[RequestRecord]:
    """Every request recorded as not sent with `reason`, to `sink` and in the returned list."""
    recs = [unsent_record(i, req, due[i], dict(tags or {}), reason) for i, req in enumerate(requests)]
    for rec in recs:
        try:
            sink(rec)
        except RecordWriteError:
            pass  # replay() names the failed file in its stop reason
    return recs


EVENT_LOOPS = ("asyncio", "uvloop")
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # a closed terminal stops it like Ctrl-C


def replay_sync(url: str, requests: Sequence[TraceRequest], options: ReplayOptions = ReplayOptions(), *,
                event_loop: str = "asyncio") -> list[RequestRecord]:
    """replay() run to completion on a fresh event loop (same arguments).

    SIGINT, SIGTERM and SIGHUP (in the main thread) stop the replay the same way: every request gets its
    record (in-flight ones cancelled, the rest not sent, the signal named), then KeyboardInterrupt
    is raised. event_loop "uvloop" needs the uvloop package (vLLM installs it; not a dependency):
    ValueError without it, before anything is sent.
    """
    if event_loop not in EVENT_LOOPS:
        raise ValueError(f"event_loop must be one of {EVENT_LOOPS}, got {event_loop!r}")
    run = asyncio.run
    if event_loop == "uvloop":
        try:
            import uvloop  # optional: only when asked for
        except ImportError:
            raise ValueError("event loop uvloop: the uvloop package is not installed "
                             "(pip install uvloop, or use asyncio)") from None
        run = uvloop.run
    caught: list[str] = []
    records = run(_replay_stopping_on_signals(url, requests, caught, options))
    if caught:
        raise KeyboardInterrupt(f"replay stopped by {caught[0]}")
    return records


async def _replay_stopping_on_signals(url: str, requests: Sequence[TraceRequest], caught: list[str],
                                      options: ReplayOptions) -> list[RequestRecord]:
    """replay() as a task that SIGINT/SIGTERM/SIGHUP cancel, naming the signal; previous handlers restored."""
    task = asyncio.ensure_future(replay(url, requests, options))
    if threading.current_thread() is not threading.main_thread():
        return await task
    loop = asyncio.get_running_loop()
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}

    def on_signal(sig: signal.Signals) -> None:
        caught.append(sig.name)
        task.cancel(f"the replay was stopped by {sig.name}")

    for sig in previous:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        return await task
    except asyncio.CancelledError:
        if not caught:
            raise
        return []
    finally:
        for sig, handler in previous.items():
            loop.remove_signal_handler(sig)
            signal.signal(sig, handler)
