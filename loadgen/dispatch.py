"""The scheduler of one replay: bodies built ahead, requests started at their due times, one record each.

Request ``i`` is due at ``t0 + due[i]``. Its body (token ids encoded as JSON) is built ahead of
that time: before t0 for every request due within ``LOOKAHEAD_NS`` of the first, and later, while
the scheduler waits for request ``i``, for every request due within ``LOOKAHEAD_NS`` of request
``i``, one body at a time with a yield to the event loop between (requests just started go out
first), as long as more than ``BUILD_SLACK_NS`` remain before ``i`` is due and the bodies built
ahead hold less than ``AHEAD_BYTES`` (so a trace of huge prompts never holds many at once). A
burst of many requests at one timestamp is so built during the quiet time before it and sent back to back.

Whatever stops the replay (the schedule's end, a cancellation or signal, a record that cannot be
stored, a body that cannot be built, a server that refuses ``dead_after`` connections in a row),
every request of the list ends with exactly one record: finished ones as they finish, in-flight
ones cancelled with the reason, unstarted ones ``not sent`` with the reason.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable, Mapping, Sequence

import aiohttp

from loadgen.client import completion_body, connect_failed, run_request
from loadgen.prompts import PromptSource
from loadgen.records import RequestRecord
from traces.trace import TraceRequest

SPIN_NS = 1_500_000  # epoll rounds timeouts up to whole ms, so a coarse sleep can wake ~1 ms late
# Linux lets a sleeping epoll_wait wake up to 0.1% of its timeout late (timer slack: 3 ms for a 3-s
# sleep, measured 2.8 ms here), so a long sleep ends this early and a short one (10 us slack) follows.
STAGE_NS = 10_000_000
START_DELAY_NS = 20_000_000  # t0 lies this far after setup, so request 0 is not late by construction
LOOKAHEAD_NS = 1_000_000_000  # bodies are built for requests due within this of the one awaited
BUILD_SLACK_NS = 3_000_000  # no body is built when the next due time is closer than this
AHEAD_BYTES = 256 << 20  # bodies built ahead hold at most this much memory (past it: built when due)


async def sleep_until(deadline_ns: int, spin_ns: int = SPIN_NS) -> None:
    """Sleep until perf_counter_ns() >= deadline_ns: coarse asyncio sleeps (a long one first ends
    STAGE_NS early, then a short one), then a yielding spin."""
    while True:
        left = deadline_ns - time.perf_counter_ns()
        if left <= 0:
            return
        if left > STAGE_NS:
            await asyncio.sleep((left - STAGE_NS) / 1e9)
            continue
        await asyncio.sleep((left - spin_ns) / 1e9 if left > spin_ns else 0)


def unsent_record(i: int, req: TraceRequest, due_ns: int, tags: Mapping, reason: str) -> RequestRecord:
    """The record of a request the replay never sent, with the reason."""
    return RequestRecord(
        index=i, due_ns=due_ns, sent_ns=None, first_token_ns=None, last_token_ns=None, end_ns=None,
        input_tokens=req.input_tokens, output_tokens=req.output_tokens, prompt_tokens=None,
        completion_tokens=None, n_chunks=0, max_gap_ms=None, status=None,
        error=f"not sent: {reason}", tags=dict(tags),
    )


class Dispatcher:
    """Starts every request of a list at its due time and guarantees one record per request."""

    def __init__(self, session: aiohttp.ClientSession, endpoint: str, requests: Sequence[TraceRequest],
                 due: list[int], *, model: str, seed: int, prompts: PromptSource, tags: Mapping,
                 timeout: aiohttp.ClientTimeout, sink: Callable[[RequestRecord], None],
                 dead_after: int, t0_ns: int | None = None) -> None:
        self.session, self.endpoint, self.requests, self.due = session, endpoint, requests, due
        self.model, self.seed, self.prompts, self.tags = model, seed, prompts, dict(tags)
        self.timeout, self.sink, self.dead_after = timeout, sink, dead_after
        self.bodies: dict[int, bytes] = {}
        self.held = 0  # bytes of the bodies built and not yet sent
        self.next_body = 0  # the first request whose body is not built yet
        self.tasks: set[asyncio.Task] = set()
        self.recorded: set[int] = set()
        self.stop_reason: str | None = None  # set by whatever ends the replay early
        self.stop_error: BaseException | None = None  # the exception behind it, if one
        self.unreachable = False
        self._connect_failures = 0  # consecutive, in finish order
        self._walking: asyncio.Task | None = None
        self.t0 = 0
        self.t0_ns = t0_ns  # a t0 shared with other replays (perf_counter_ns), else chosen in run()

    def _record(self, rec: RequestRecord) -> None:
        """The sink of every request: store the record, watch for a dead server."""
        self.recorded.add(rec.index)
        try:
            self.sink(rec)
        except Exception as exc:  # noqa: BLE001 - disk full, closed file: stop, keep the records
            self._stop(f"could not store the record of request {rec.index}: {exc}", exc)
        if connect_failed(rec):
            self._connect_failures += 1
            if self.dead_after and self._connect_failures >= self.dead_after:
                self.unreachable = True
                self._stop(f"the server is unreachable: {self._connect_failures} requests in a row could "
                           f"not connect (last: {rec.error})")
        elif rec.status is not None:
            self._connect_failures = 0

    def _stop(self, reason: str, error: BaseException | None = None) -> None:
        if self.stop_reason is not None:
            return
        self.stop_reason, self.stop_error = reason, error
        if self._walking is not None and self._walking is not asyncio.current_task():
            self._walking.cancel()

    def _build_next(self) -> None:
        j, req = self.next_body, self.requests[self.next_body]
        prompt = self.prompts(j, req, self.seed)
        self.bodies[j] = completion_body(self.model, prompt, req.output_tokens)
        self.held += len(self.bodies[j])
        self.next_body += 1

    def _build_now(self, until_due_ns: int, through: int) -> None:
        """Build the bodies of requests due by `until_due_ns` at once: request `through` and those
        before it always, the later ones while the bodies held stay under AHEAD_BYTES."""
        while self.next_body < len(self.requests) and self.due[self.next_body] <= until_due_ns:
            if self.next_body > through and self.held >= AHEAD_BYTES:
                return
            self._build_next()

    async def _build_ahead(self, until_due_ns: int, deadline_ns: int) -> None:
        """Build bodies of requests due by `until_due_ns` while perf_counter_ns() < deadline_ns,
        yielding to the loop after each, so requests just started are not held up."""
        while (self.next_body < len(self.requests) and self.due[self.next_body] <= until_due_ns
               and self.held < AHEAD_BYTES):
            await asyncio.sleep(0)
            if time.perf_counter_ns() >= deadline_ns:
                return
            self._build_next()

    async def _walk(self) -> None:
        for i, req in enumerate(self.requests):
            due_at = self.t0 + self.due[i]
            await self._build_ahead(self.due[i] + LOOKAHEAD_NS, due_at - BUILD_SLACK_NS)
            self._build_now(self.due[i], i)  # no slack was left: request i's own body, late
            await sleep_until(due_at)
            body = self.bodies.pop(i)
            self.held -= len(body)
            task = asyncio.create_task(run_request(
                self.session, self.endpoint, body, index=i, input_tokens=req.input_tokens,
                output_tokens=req.output_tokens, due_ns=self.due[i], t0_ns=self.t0, timeout=self.timeout,
                tags=self.tags, sink=self._record))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        while self.tasks:
            await asyncio.wait(set(self.tasks))

    async def run(self) -> None:
        """Replay the whole list; return when every request has its record.

        Sets stop_reason when the replay ended early; re-raises a cancellation from outside (after
        every request got its record).
        """
        outside: asyncio.CancelledError | None = None
        self._walking = asyncio.current_task()
        try:
            try:
                self._build_now(self.due[0] + LOOKAHEAD_NS, 0)  # before t0: the first second's bodies
                self.t0 = time.perf_counter_ns() + START_DELAY_NS if self.t0_ns is None else self.t0_ns
                await self._walk()
            except asyncio.CancelledError as exc:
                if self.stop_reason is None:  # Ctrl-C, SIGTERM, a caller's cancel
                    outside = exc
                    why = exc.args[0] if exc.args and exc.args[0] else "the replay was cancelled"
                    self.stop_reason = str(why)
                else:  # our own stop (_stop cancelled the walk)
                    self._walking.uncancel()
            except Exception as exc:  # noqa: BLE001 - a body that cannot be built, a bad argument
                self._stop(f"the replay failed: {type(exc).__name__}: {exc}", exc)
        finally:
            self._walking = None
            await self._close()
        if outside is not None:
            raise outside

    async def _close(self) -> None:
        """Cancel what is in flight (each records itself) and record every request left without one."""
        reason = self.stop_reason or "the replay stopped"
        for task in self.tasks:
            task.cancel(reason)
        while self.tasks:
            await asyncio.wait(set(self.tasks))
        for i, req in enumerate(self.requests):
            if i not in self.recorded:
                self._record(unsent_record(i, req, self.due[i], self.tags, reason))
