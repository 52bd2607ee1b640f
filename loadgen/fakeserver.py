"""A stand-in for vLLM's streaming /v1/completions, for the replayer's tests and benchmark.

It streams one SSE chunk per token at a fixed pace (``ttft_s`` to the first, ``itl_s`` between
the next ones) in vLLM's chunk format, then the final usage chunk and ``data: [DONE]``. Knobs
reproduce the failures a replay must record: a prompt over ``max_model_len`` gets HTTP 400 (as
vLLM answers), ``max_output_tokens`` ends replies early (a short reply), ``extra_tokens`` makes
them longer than asked (a long one), ``drop_after_tokens`` aborts the connection mid-stream (a
truncated stream), a large ``itl_s`` makes a client time out, ``usage_as_text`` writes the usage
counts as JSON strings (a malformed usage chunk).

It has vLLM's sleep-mode endpoints too (a server started with ``--enable-sleep-mode`` and
``VLLM_SERVER_DEV_MODE=1``): ``POST /sleep?level=N``, ``POST /wake_up`` and ``GET /is_sleeping``
(``{"is_sleeping": bool}``). While asleep it refuses completions with HTTP 503, so a request sent to a
server nobody woke fails at once and is recorded so; ``wake_fails_after``
makes the wake-ups after that many answer HTTP 500, ``sleep_mode=False`` answers the three with 404
(a server started without them).
Listens on 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import AsyncIterator

from aiohttp import web

HOST = "127.0.0.1"


@dataclass(frozen=True)
class FakeServerConfig:
    """How the fake server answers."""

    ttft_s: float = 0.005
    itl_s: float = 0.005
    model: str = "fake-model"
    vocab_size: int = 32000
    max_model_len: int | None = None
    max_output_tokens: int | None = None
    drop_after_tokens: int | None = None
    extra_tokens: int = 0  # sent beyond max_tokens (a server that ignores it: a long reply)
    usage_as_text: bool = False  # usage counts as strings ("completion_tokens": "8")
    sleep_mode: bool = True  # the sleep-mode endpoints answer (False: 404, as without dev mode)
    wake_fails_after: int | None = None  # POST /wake_up answers HTTP 500 once this many have succeeded


def _chunk(rid: str, model: str, finish: str | None) -> bytes:
    obj = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
           "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": finish}]}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _usage(rid: str, model: str, prompt: int, completion: int, as_text: bool) -> bytes:
    counts = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    obj = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
           "choices": [], "usage": {k: str(v) if as_text else v for k, v in counts.items()}}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _bad_request(msg: str) -> web.Response:
    return web.json_response({"error": {"message": msg, "type": "BadRequestError", "code": 400}}, status=400)


def _check(body: dict, cfg: FakeServerConfig) -> str | None:
    """The reason a request is invalid, as vLLM would say it, or None."""
    prompt, max_tokens = body.get("prompt"), body.get("max_tokens")
    if body.get("model") != cfg.model:
        return f"The model `{body.get('model')}` does not exist."
    if not (isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)):
        return "prompt must be a non-empty list of token ids"
    if not all(0 <= t < cfg.vocab_size for t in prompt):
        return f"Token id out of vocabulary (size {cfg.vocab_size})"
    if not (isinstance(max_tokens, int) and max_tokens >= 1):
        return "max_tokens must be an int >= 1"
    if body.get("stream") is not True or not body.get("stream_options", {}).get("include_usage"):
        return "this server only streams, with stream_options.include_usage"
    if cfg.max_model_len is not None and len(prompt) + max_tokens > cfg.max_model_len:
        return (f"This model's maximum context length is {cfg.max_model_len} tokens. However, you "
                f"requested {len(prompt) + max_tokens} tokens.")
    return None


def make_app(cfg: FakeServerConfig) -> web.Application:
    """The aiohttp application: GET /v1/models, POST /v1/completions and the sleep-mode endpoints."""
    counter = iter(range(1 << 62))
    state = {"asleep": False, "wakes": 0}

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": cfg.model, "object": "model"}]})

    async def sleep(request: web.Request) -> web.Response:
        level = request.query.get("level", "1")
        if level not in ("0", "1", "2"):
            return web.json_response({"detail": f"level {level!r}: expected 0, 1 or 2"}, status=422)
        state["asleep"] = True
        return web.json_response({"status": "sleeping", "level": int(level)})

    async def wake_up(_: web.Request) -> web.Response:
        if cfg.wake_fails_after is not None and state["wakes"] >= cfg.wake_fails_after:
            return web.json_response({"detail": "wake-up failed"}, status=500)
        state["asleep"], state["wakes"] = False, state["wakes"] + 1
        return web.json_response({"status": "awake"})

    async def is_sleeping(_: web.Request) -> web.Response:
        return web.json_response({"is_sleeping": state["asleep"]})

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if state["asleep"]:
            return web.json_response({"error": {"message": "the engine is asleep", "code": 503}}, status=503)
        reason = _check(body, cfg)
        if reason is not None:
            return _bad_request(reason)
        rid, n_prompt = f"cmpl-{next(counter)}", len(body["prompt"])
        n = min(body["max_tokens"], cfg.max_output_tokens or body["max_tokens"]) + cfg.extra_tokens
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for k in range(n):
            await asyncio.sleep(cfg.ttft_s if k == 0 else cfg.itl_s)
            if cfg.drop_after_tokens is not None and k == cfg.drop_after_tokens:
                assert request.transport is not None
                request.transport.abort()  # the connection dies mid-stream, as when a server crashes
                return resp
            await resp.write(_chunk(rid, cfg.model, "length" if k == n - 1 else None))
        await resp.write(_usage(rid, cfg.model, n_prompt, n, cfg.usage_as_text))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    if cfg.sleep_mode:
        app.router.add_post("/sleep", sleep)
        app.router.add_post("/wake_up", wake_up)
        app.router.add_get("/is_sleeping", is_sleeping)
    return app


@asynccontextmanager
async def fake_server(cfg: FakeServerConfig, port: int = 0) -> AsyncIterator[str]:
    """Run the fake server on this event loop; yields its base URL (port 0 picks a free port)."""
    runner = web.AppRunner(make_app(cfg), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, HOST, port)
    await site.start()
    bound = runner.addresses[0][1]
    try:
        yield f"http://{HOST}:{bound}"
    finally:
        await runner.cleanup()


def serve_forever(cfg: FakeServerConfig, port: int) -> None:
    """Blocking entry point for a separate process (the benchmark's server)."""
    web.run_app(make_app(cfg), host=HOST, port=port, access_log=None, print=None)
