"""The replayer against a real vLLM CPU server (tiny random-weight Llama)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from integration.launcher import VllmServer
from loadgen.records import read_records, succeeded
from loadgen.replay import ServerUnreachable, replay, replay_sync
from tests.conftest import start_server, tiny_server_config
from traces.trace import TraceRequest, clip_tokens, load_trace, scale_rate

CHAT = Path(__file__).resolve().parents[2] / "traces" / "chat.jsonl"


def chat_slice(n: int, speedup: float = 1.0) -> list:
    """The first n requests of the chat trace, small enough for a CPU server."""
    return clip_tokens(scale_rate(load_trace(CHAT)[:n], speedup), max_input=512, max_output=16)


@pytest.mark.server
def test_chat_slice_completes_with_exact_lengths(stock_server: VllmServer, tmp_path: Path) -> None:
    reqs = chat_slice(15, speedup=2.0)
    out = tmp_path / "records.jsonl"
    recs = replay_sync(stock_server.url, reqs, out=out, progress=False, timeout_s=120, tags={"arm": "stock"})
    assert [r.error for r in recs] == [None] * len(reqs)
    for r, q in zip(recs, reqs):
        assert succeeded(r) and r.status == 200
        assert (r.prompt_tokens, r.completion_tokens) == (q.input_tokens, q.output_tokens)
        assert r.n_chunks >= 1 and r.max_gap_ms is not None or q.output_tokens == 1
        assert r.due_ns <= r.sent_ns < r.first_token_ns <= r.last_token_ns <= r.end_ns
        assert r.tags == {"arm": "stock"}
    assert sorted(read_records(out), key=lambda r: r.index) == recs


@pytest.mark.server
def test_server_killed_mid_run_every_request_gets_one_record(tmp_path: Path) -> None:
    server = start_server(tiny_server_config("stock"), tmp_path / "server.log")
    out = tmp_path / "records.jsonl"
    # 45 requests over 15 s: the first 10 short (done before the kill), the rest long enough
    # (1000 tokens, several seconds each here) that some are streaming when the server is killed at
    # 4 s. Later kills (6 s) met multi-second stalls of the whole 2-core machine once 6-8 of those
    # long streams ran at once, and the streams in flight then finished before the kill. Such a stall
    # also delayed the 4-s kill to 8.2 s once, when 30 requests over 10 s left only 3 due after it;
    # the requests past 10 s keep 5 or more due after a kill up to about 8 s late (they fail at once).
    reqs = [TraceRequest(0.33 * i, q.input_tokens, 16 if i < 10 else 1000)
            for i, q in enumerate(chat_slice(45))]
    kill_at_s = 4.0
    killed_ns: list[int] = []

    def kill() -> None:
        killed_ns.append(time.perf_counter_ns())
        os.killpg(os.getpgid(server.proc.pid), signal.SIGKILL)

    async def go():
        # a thread, not the event loop: a loop busy with 1000-token streams on 2 cores ran a
        # call_later kill 5 s late, after the streams had finished
        timer = threading.Timer(kill_at_s, kill)
        t = time.perf_counter_ns()
        timer.start()
        try:
            recs = await replay(server.url, reqs, out=out, model=server.model_name, progress=False,
                                timeout_s=60)
        except ServerUnreachable as exc:  # the dead-server rule: the rest are recorded as not sent
            recs = exc.records
        return t, recs

    try:
        start_ns, recs = asyncio.run(go())
    finally:
        server.stop()
    on_disk = read_records(out)
    assert len(on_disk) == len(reqs) and sorted(r.index for r in on_disk) == list(range(len(reqs)))
    assert sorted(on_disk, key=lambda r: r.index) == recs
    # kill_rel_s is on a clock that starts a few ms before the replay's t0; margins cover that,
    # and CPU contention on a small machine can delay the client by more.
    kill_rel_s = (killed_ns[0] - start_ns) / 1e9
    table = "\n".join(f"{r.index} due {r.due_ns / 1e9:.2f} sent {r.sent_ns and r.sent_ns / 1e9} "
                      f"end {r.end_ns and r.end_ns / 1e9} chunks {r.n_chunks} {r.error}" for r in recs)
    msg = f"kill at {kill_rel_s:.3f} s\n{table}"
    sent = [r for r in recs if r.sent_ns is not None]
    before = [r for r in sent if r.end_ns / 1e9 < kill_rel_s - 0.5]
    assert len(before) >= 3 and all(succeeded(r) for r in before), msg
    in_flight = [r for r in sent if r.sent_ns / 1e9 < kill_rel_s and r.end_ns / 1e9 >= kill_rel_s]
    assert in_flight and not any(succeeded(r) for r in in_flight), msg
    assert any(r.n_chunks > 0 for r in in_flight), f"no request was cut mid-stream; {msg}"
    after = [r for r in recs if r.due_ns / 1e9 > kill_rel_s + 0.5]
    assert len(after) >= 5, msg  # the kill fires late when the client is starved of CPU
    for r in after:  # refused (a pooled keep-alive connection may fail as reset first), or not sent
        # once the dead-server rule stopped the replay
        assert r.status is None and r.error.startswith(("connection failed: ClientConnectorError",
                                                        "ClientOSError", "not sent")), msg
    assert any(r.error.startswith("not sent") for r in after), f"the dead-server rule never fired; {msg}"
    for r in sent:  # every failure came at once, none waited for the 60 s timeout
        assert succeeded(r) or r.end_ns - r.sent_ns < 5e9, msg
