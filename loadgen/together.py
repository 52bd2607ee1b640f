"""Several open-loop replays at once, from one client process, on one schedule start (t0).

The duet layout of experiments/ sends the same window to every arm's server at the same time: one
`loadgen.replay.replay` per server, all due from one t0 on `time.perf_counter_ns()`, so request i
of every stream is due at the same instant. By default the streams share one event loop
(`asyncio.gather`); `threads=True` gives each stream a thread with an event loop of its own. The
benchmark (`python -m loadgen.bench --streams 2 [--threads]`, loadgen/README.md) measured both
and chose the shared loop (the threads contend for the GIL, whose switch interval is 5 ms).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from loadgen.records import RequestRecord
from loadgen.replay import ReplayOptions, replay
from traces.trace import TraceRequest

LEAD_NS = 100_000_000  # t0 lies this far ahead: every stream builds its first second's bodies before it
Outcome = list[RequestRecord] | BaseException  # a stream's records, or what ended it (ReplayStopped, ...)


@dataclass(frozen=True)
class Stream:
    """One server's replay: its URL, the requests and how to send them (their t0_ns is replaced by
    the one the streams share)."""

    url: str
    requests: Sequence[TraceRequest]
    options: ReplayOptions = ReplayOptions()


def start_time(lead_ns: int = LEAD_NS) -> int:
    """A shared t0 on time.perf_counter_ns() (the system's monotonic clock), `lead_ns` from now."""
    return time.perf_counter_ns() + lead_ns


async def replay_together(streams: Sequence[Stream], t0: int | None = None) -> list[Outcome]:
    """Replay every stream on this event loop from one t0 (default start_time()); one outcome per
    stream, in order: its records, or the exception that ended it (the others run to their end)."""
    t0 = start_time() if t0 is None else t0
    return await asyncio.gather(*(replay(s.url, s.requests, replace(s.options, t0_ns=t0)) for s in streams),
                                return_exceptions=True)


def replay_together_sync(streams: Sequence[Stream], t0: int | None = None,
                         threads: bool = False) -> list[Outcome]:
    """replay_together run to completion on a fresh event loop, or with `threads` one thread and event
    loop per stream (all due from the same t0). Streams writing records to one file need the shared
    loop: its writes never interleave."""
    t0 = start_time() if t0 is None else t0
    if not threads:
        return asyncio.run(replay_together(streams, t0))
    out: list[Outcome] = [RuntimeError("the stream's thread did not finish")] * len(streams)

    def run(i: int, s: Stream) -> None:
        try:
            out[i] = asyncio.run(replay(s.url, s.requests, replace(s.options, t0_ns=t0)))
        except BaseException as exc:  # noqa: BLE001 - handed back as this stream's outcome
            out[i] = exc

    workers = [threading.Thread(target=run, args=(i, s), name=f"stream-{i}") for i, s in enumerate(streams)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return out
