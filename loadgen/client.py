"""One streaming /v1/completions request -> one RequestRecord.

The request asks for exactly ``output_tokens`` tokens: ``max_tokens`` and ``ignore_eos`` leave
max_tokens as the only stop condition (no stop strings or stop ids are sent). ``min_tokens`` is
not sent: with ignore_eos it cannot change the length, and in vLLM it adds a per-step logits
processor to the measured path. Token counts come from the final ``usage`` chunk
(``stream_options.include_usage``), never from counting chunks. ``return_token_ids`` is not asked
for either: vLLM would echo the whole prompt in the first chunk, server work on the TTFT path.
vLLM sends a choice chunk only when it carries new tokens, so every choice chunk is a token chunk,
unless the chunk itself says otherwise with an empty ``token_ids`` list.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import aiohttp

from loadgen.records import RequestRecord

ERROR_BODY_CHARS = 2000  # enough of a non-200 body to read the server's reason
_DATA = b"data:"


_JSON_HEADERS = {"Content-Type": "application/json"}
CONNECT_FAILED = "connection failed: "  # error prefix of a request that never reached the server


def connect_failed(rec: RequestRecord) -> bool:
    """True when the request could not even connect (refused, unreachable host): no server there."""
    return rec.error is not None and rec.error.startswith(CONNECT_FAILED)


def completion_body(model: str, prompt: list[int] | str, output_tokens: int) -> bytes:
    """The encoded JSON body of one streaming completion that yields exactly output_tokens tokens.

    Encoded ahead of the due time by the scheduler, so a long prompt costs nothing at send time.
    """
    return json.dumps(completion_payload(model, prompt, output_tokens)).encode()


def completion_payload(model: str, prompt: list[int] | str, output_tokens: int) -> dict:
    """The JSON object of one streaming completion that yields exactly output_tokens tokens (the
    prompt as token ids, or as text for a server with a tokenizer)."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": output_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


@dataclass
class _Stream:
    """What the stream has shown so far (times in ns since t0)."""

    first_ns: int | None = None
    last_ns: int | None = None
    n_chunks: int = 0
    gaps_ns: list[int] = field(default_factory=list)  # between successive token chunks
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    done: bool = False
    error: str | None = None

    def on_token_chunk(self, now_ns: int) -> None:
        if self.last_ns is not None:
            self.gaps_ns.append(now_ns - self.last_ns)
        if self.first_ns is None:
            self.first_ns = now_ns
        self.last_ns = now_ns
        self.n_chunks += 1

    def on_event(self, obj: dict, now_ns: int) -> None:
        """Fold one parsed SSE data object into the state."""
        if "error" in obj:
            self.error = f"server error in stream: {json.dumps(obj['error'])[:ERROR_BODY_CHARS]}"
            return
        carried = False
        for choice in obj.get("choices") or ():
            ids = choice.get("token_ids")
            carried = carried or (len(ids) > 0 if ids is not None else True)
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
        if carried:
            self.on_token_chunk(now_ns)
        usage = obj.get("usage")
        if usage:
            self.on_usage(usage)

    def on_usage(self, usage: object) -> None:
        """Keep the server's token counts; a count that is not an integer >= 0 is this request's
        error (the reply's timings stay), never a number taken on trust."""
        if not isinstance(usage, dict):
            self.error = f"bad usage chunk: {json.dumps(usage)[:200]}, not an object"
            return
        for key in ("prompt_tokens", "completion_tokens"):
            v = usage.get(key)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                self.error = f"bad usage chunk: {key} is {json.dumps(v)[:200]}, not an integer >= 0"
                return
        self.prompt_tokens = usage.get("prompt_tokens")
        self.completion_tokens = usage.get("completion_tokens")

    def verdict(self, asked: int) -> str | None:
        """The error of a stream that ended (None if it delivered exactly `asked` tokens)."""
        if self.error is not None:
            return self.error
        got = f"{self.n_chunks} token chunks"
        if not self.done:
            return f"truncated stream: ended without [DONE] after {got}"
        if self.completion_tokens is None:
            return f"no usage chunk in the stream (after {got})"
        if self.completion_tokens != asked:
            got = self.completion_tokens
            said = (f"short reply: {got} of {asked} tokens" if got < asked
                    else f"long reply: {got} tokens, {asked} asked")
            return f"{said} (finish_reason={self.finish_reason})"
        return None


def _on_line(line: bytes, st: _Stream, now_ns: int) -> bool:
    """Handle one SSE line; True when the stream is over ([DONE] or an error)."""
    if not line.startswith(_DATA):
        return False  # blank separators, comments, event names
    data = line[len(_DATA):].strip()
    if data == b"[DONE]":
        st.done = True
        return True
    try:
        obj = json.loads(data)
    except ValueError:
        st.error = f"bad JSON in stream: {data[:200]!r}"
        return True
    st.on_event(obj, now_ns)
    return st.error is not None


async def _read_stream(resp: aiohttp.ClientResponse, st: _Stream, t0_ns: int) -> None:
    """Consume the SSE body until [DONE] or the connection ends.

    Reads whatever bytes have arrived and splits lines itself (one await per network read, not
    per line); every event in one read gets the time that read returned.
    """
    tail = b""
    async for data in resp.content.iter_any():
        now = time.perf_counter_ns() - t0_ns
        lines = (tail + data).split(b"\n")
        tail = lines.pop()
        for line in lines:
            if _on_line(line.rstrip(b"\r"), st, now):
                return
    if tail:
        _on_line(tail.rstrip(b"\r"), st, time.perf_counter_ns() - t0_ns)


async def run_request(
    session: aiohttp.ClientSession,
    endpoint: str,
    body: bytes,
    *,
    index: int,
    input_tokens: int,
    output_tokens: int,
    due_ns: int,
    t0_ns: int,
    timeout: aiohttp.ClientTimeout,
    tags: Mapping[str, Any] | None = None,
    sink: Callable[[RequestRecord], None] | None = None,
) -> RequestRecord:
    """Send one streaming request now and return its record.

    ``sink`` gets the record before this returns, also when the task is cancelled (its error then
    says so), so a caller that writes records never misses one.
    """
    st = _Stream()
    status: int | None = None
    sent_ns = time.perf_counter_ns() - t0_ns
    try:
        async with session.post(endpoint, data=body, headers=_JSON_HEADERS, timeout=timeout) as resp:
            status = resp.status
            if status != 200:
                body = await resp.text(errors="replace")
                st.error = f"HTTP {status}: {body[:ERROR_BODY_CHARS]}"
            else:
                await _read_stream(resp, st, t0_ns)
    except asyncio.TimeoutError:
        st.error = f"timeout: reply not complete within {timeout.total} s (after {st.n_chunks} token chunks)"
    except aiohttp.ClientConnectorError as exc:
        st.error = f"{CONNECT_FAILED}{type(exc).__name__}: {exc}"
    except (aiohttp.ClientError, OSError) as exc:
        st.error = f"{type(exc).__name__}: {exc}"
    except asyncio.CancelledError as exc:
        why = exc.args[0] if exc.args and exc.args[0] else "the replay stopped"
        st.error = f"cancelled: {why}, before the reply finished"
        raise
    except Exception as exc:  # noqa: BLE001 - any failure becomes this request's error record
        st.error = f"unexpected {type(exc).__name__}: {exc}"
    finally:
        rec = RequestRecord(
            index=index, due_ns=due_ns, sent_ns=sent_ns, first_token_ns=st.first_ns,
            last_token_ns=st.last_ns, end_ns=time.perf_counter_ns() - t0_ns,
            input_tokens=input_tokens, output_tokens=output_tokens,
            prompt_tokens=st.prompt_tokens, completion_tokens=st.completion_tokens,
            n_chunks=st.n_chunks, max_gap_ms=max(st.gaps_ns) / 1e6 if st.gaps_ns else None,
            status=status, error=st.verdict(output_tokens), tags=dict(tags or {}),
            itl_us=tuple(g // 1000 for g in st.gaps_ns),
        )
        if sink is not None:
            sink(rec)
    return rec
