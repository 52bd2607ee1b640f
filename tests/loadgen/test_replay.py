"""The replayer against the in-process fake streaming server: schedule, records, every failure kind."""

from __future__ import annotations

import asyncio
import socket
import time

import aiohttp
import pytest

from loadgen import dispatch
from loadgen.dispatch import sleep_until
from loadgen.fakeserver import FakeServerConfig, fake_server
from loadgen.prompts import token_id_prompts
from loadgen.records import lateness_ms, read_records, succeeded, tpot_ms, ttft_ms
from loadgen.replay import ReplayOptions, ReplayStopped, ServerUnreachable, base_url, due_times_ns, replay
from traces.trace import TraceRequest


def run(cfg: FakeServerConfig, reqs: list[TraceRequest], **kw):
    async def go():
        async with fake_server(cfg) as url:
            return await replay(url, reqs, ReplayOptions(progress=False, **kw))
    return asyncio.run(go())


def test_schedule_records_and_file(tmp_path):
    # Request 0 streams long, the others short: the file holds records in finish order.
    reqs = [TraceRequest(0.0, 50, 40)] + [TraceRequest(0.01 + 0.005 * i, 20 + i, 3) for i in range(30)]
    out = tmp_path / "r.jsonl"
    cfg = FakeServerConfig(ttft_s=0.01, itl_s=0.005)
    recs = run(cfg, reqs, out=out, tags={"arm": "stock", "window": 1})
    assert [r.index for r in recs] == list(range(len(reqs)))
    assert all(succeeded(r) for r in recs), [r.error for r in recs if not succeeded(r)]
    assert [r.due_ns for r in recs] == [round(q.timestamp * 1e9) for q in reqs]
    assert min(lateness_ms(r) for r in recs) >= 0  # never sent early (how late is the benchmark's)
    for r, q in zip(recs, reqs):
        assert (r.input_tokens, r.output_tokens, r.prompt_tokens, r.completion_tokens) == (
            q.input_tokens, q.output_tokens, q.input_tokens, q.output_tokens)
        assert r.n_chunks == q.output_tokens and r.status == 200
        assert r.due_ns <= r.sent_ns < r.first_token_ns <= r.last_token_ns <= r.end_ns
        assert ttft_ms(r) >= 10.0  # the server sleeps 10 ms before the first token: a floor
        assert tpot_ms(r) > 0
        assert len(r.itl_us) == r.n_chunks - 1  # one gap per token chunk after the first
        span_us = (r.last_token_ns - r.first_token_ns) / 1e3
        assert span_us - len(r.itl_us) <= sum(r.itl_us) <= span_us  # the gaps tile first to last token
        assert r.tags == {"arm": "stock", "window": 1}
    on_disk = read_records(out)
    assert sorted(on_disk, key=lambda r: r.index) == recs
    assert on_disk[-1].index == 0  # the long one finished last


def test_http_error_is_recorded_with_body():
    recs = run(FakeServerConfig(max_model_len=64), [TraceRequest(0.0, 100, 4), TraceRequest(0.0, 10, 4)])
    bad, good = recs
    assert bad.status == 400 and bad.error.startswith("HTTP 400: ") and "maximum context length" in bad.error
    assert bad.first_token_ns is None and bad.completion_tokens is None and not succeeded(bad)
    assert succeeded(good)


def test_short_reply_is_an_error():
    (r,) = run(FakeServerConfig(max_output_tokens=3), [TraceRequest(0.0, 10, 5)])
    assert r.status == 200 and r.completion_tokens == 3 and r.n_chunks == 3
    assert r.error == "short reply: 3 of 5 tokens (finish_reason=length)"


def test_truncated_stream_is_an_error():
    (r,) = run(FakeServerConfig(drop_after_tokens=2), [TraceRequest(0.0, 10, 6)])
    assert r.status == 200 and r.n_chunks == 2 and r.completion_tokens is None
    assert r.first_token_ns is not None and r.error is not None and not succeeded(r)


def test_timeout_is_an_error_after_the_timeout():
    (r,) = run(FakeServerConfig(ttft_s=0.01, itl_s=2.0), [TraceRequest(0.0, 10, 3)], timeout_s=0.3)
    assert r.error.startswith("timeout: reply not complete within 0.3 s (after 1 token chunks)")
    assert (r.end_ns - r.sent_ns) / 1e9 >= 0.3 * 0.99  # never before the limit (an upper bound can stall)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_no_server_gives_fast_error_records(tmp_path):
    reqs = [TraceRequest(0.02 * i, 10, 2) for i in range(5)]
    options = ReplayOptions(model="m", progress=False, out=tmp_path / "r.jsonl", dead_after=0)
    recs = asyncio.run(replay(f"http://127.0.0.1:{_closed_port()}", reqs, options))
    assert len(read_records(tmp_path / "r.jsonl")) == 5
    for r in recs:
        assert r.status is None and r.sent_ns is not None and "ClientConnectorError" in r.error
        assert r.end_ns - r.sent_ns < 10**9 * 30  # refused at once, not after the 30-s connect timeout


def test_cancel_leaves_one_record_per_request(tmp_path):
    reqs = [TraceRequest(0.0, 10, 50)] + [TraceRequest(0.5 * i, 10, 2) for i in range(1, 10)]
    out = tmp_path / "r.jsonl"

    async def go():
        async with fake_server(FakeServerConfig(itl_s=0.05)) as url:
            task = asyncio.create_task(replay(url, reqs, ReplayOptions(out=out, progress=False)))
            await asyncio.sleep(0.8)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    asyncio.run(go())
    by_index = {r.index: r for r in read_records(out)}
    assert sorted(by_index) == list(range(10)) and len(read_records(out)) == 10
    assert by_index[0].error.startswith("cancelled") and by_index[0].n_chunks > 0
    assert succeeded(by_index[1])
    assert by_index[9].error.startswith("not sent") and by_index[9].sent_ns is None


def test_model_name_from_server_and_wrong_model_rejected():
    (r,) = run(FakeServerConfig(model="served-name"), [TraceRequest(0.0, 5, 2)])
    assert succeeded(r)
    (r,) = run(FakeServerConfig(model="served-name"), [TraceRequest(0.0, 5, 2)], model="other")
    assert r.status == 400
    assert "does not exist" in r.error


def test_a_sleeping_server_refuses_every_request_until_woken():
    reqs = [TraceRequest(0.001 * i, 5, 2) for i in range(3)]

    async def go():
        async with fake_server(FakeServerConfig()) as url, aiohttp.ClientSession() as s:
            async with s.post(f"{url}/sleep?level=1") as r:
                assert r.status == 200
            async with s.get(f"{url}/is_sleeping") as r:
                assert (await r.json()) == {"is_sleeping": True}
            asleep = await replay(url, reqs, ReplayOptions(progress=False))
            async with s.post(f"{url}/wake_up") as r:
                assert r.status == 200
            return asleep, await replay(url, reqs, ReplayOptions(progress=False))

    asleep, awake = asyncio.run(go())
    assert [r.status for r in asleep] == [503] * 3 and not any(succeeded(r) for r in asleep)
    assert "the engine is asleep" in asleep[0].error and all(succeeded(r) for r in awake)


def test_record_that_cannot_be_stored_stops_the_replay(tmp_path, monkeypatch):
    from loadgen.records import RecordWriter

    def full(self, rec):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(RecordWriter, "write", full)
    reqs = [TraceRequest(0.01 * i, 5, 2) for i in range(5)]
    with pytest.raises(ReplayStopped, match="could not store the record of request .*No space left") as got:
        run(FakeServerConfig(), reqs, out=tmp_path / "r.jsonl")
    recs = got.value.records
    assert [r.index for r in recs] == list(range(5))  # still one record per request, in memory
    stopped = [r for r in recs
               if r.error and r.error.startswith(("not sent: could not", "cancelled: could not"))]
    assert stopped and recs[-1] in stopped


def test_dead_server_stops_the_replay_and_records_the_rest(tmp_path):
    reqs = [TraceRequest(1.0 * i, 10, 2) for i in range(30)]  # 30 s of schedule
    out = tmp_path / "r.jsonl"
    options = ReplayOptions(model="m", progress=False, out=out, dead_after=2)
    with pytest.raises(ServerUnreachable, match="unreachable: 2 requests in a row could not connect") as got:
        asyncio.run(replay(f"http://127.0.0.1:{_closed_port()}", reqs, options))
    recs = got.value.records
    assert [r.index for r in recs] == list(range(30)) and len(read_records(out)) == 30
    assert [r.error.startswith("connection failed: ClientConnectorError") for r in recs[:2]] == [True, True]
    unsent = [r for r in recs if r.sent_ns is None]
    assert len(unsent) >= 25  # stopped after the second failure, not at the schedule's end
    assert all(r.error.startswith("not sent: the server is unreachable") for r in unsent)


def test_a_server_that_answers_is_never_declared_dead():
    recs = run(FakeServerConfig(), [TraceRequest(0.001 * i, 5, 2) for i in range(10)], dead_after=1)
    assert all(succeeded(r) for r in recs)


def test_body_that_cannot_be_built_stops_with_a_record_for_every_request(tmp_path):
    real = token_id_prompts()

    def fails_on_3(i, req, seed):  # a prompt source (the replay's hook) that fails on request 3
        if i == 3:
            raise MemoryError("no memory for the prompt")
        return real(i, req, seed)
    # request 3 is due past the look-ahead of the first, so its body is built after 0..2 were sent
    reqs = [TraceRequest(0.0, 10, 60), TraceRequest(0.01, 5, 2), TraceRequest(0.02, 5, 2),
            TraceRequest(1.5, 5, 2), TraceRequest(1.6, 5, 2)]
    out = tmp_path / "r.jsonl"
    with pytest.raises(ReplayStopped, match="MemoryError: no memory for the prompt"):
        run(FakeServerConfig(itl_s=0.05), reqs, out=out, prompts=fails_on_3)
    by_index = {r.index: r for r in read_records(out)}
    assert sorted(by_index) == list(range(5))
    assert by_index[0].error.startswith("cancelled: the replay failed: MemoryError")  # was streaming
    for i in (1, 2):  # their tasks were created; whether they had begun sending is the loop's timing
        assert by_index[i].error.startswith(("cancelled: the replay failed", "not sent: the replay failed"))
    assert by_index[3].error.startswith("not sent: the replay failed") and by_index[4].sent_ns is None


def test_bad_request_is_rejected_before_anything_is_sent(tmp_path):
    reqs = [TraceRequest(0.0, 5, 2), TraceRequest(0.1, 5, 2, (0, -2))]
    with pytest.raises(ValueError, match="request 1: hash_ids must be ints >= 0, got -2"):
        run(FakeServerConfig(), reqs, out=tmp_path / "r.jsonl")
    assert not (tmp_path / "r.jsonl").exists()


def test_url_with_v1_and_trailing_slash():
    assert base_url("http://h:8000/v1/") == base_url("http://h:8000/") == "http://h:8000"
    with pytest.raises(ValueError, match="http:// or https://"):
        base_url("h:8000")

    async def go():
        async with fake_server(FakeServerConfig()) as url:
            return await replay(url + "/v1", [TraceRequest(0.0, 5, 2)], ReplayOptions(progress=False))
    (r,) = asyncio.run(go())
    assert succeeded(r)


def test_burst_bodies_are_built_before_their_due_time(monkeypatch):
    built_at: dict[int, int] = {}
    real = dispatch.completion_body

    def spy(model, ids, n):
        built_at[len(built_at)] = time.perf_counter_ns()
        return real(model, ids, n)
    sent_at: dict[int, int] = {}
    real_run = dispatch.run_request

    async def spy_run(*a, index, **kw):
        sent_at[index] = time.perf_counter_ns()
        return await real_run(*a, index=index, **kw)
    monkeypatch.setattr(dispatch, "completion_body", spy)
    monkeypatch.setattr(dispatch, "run_request", spy_run)
    reqs = [TraceRequest(0.0, 64, 2)] * 5 + [TraceRequest(0.3, 2000, 2)] * 10
    recs = run(FakeServerConfig(), reqs)
    assert all(succeeded(r) for r in recs)
    # every body of the second burst existed before the first of its requests was started
    assert max(built_at[i] for i in range(5, 15)) < min(sent_at[i] for i in range(5, 15))


def test_bad_schedules_are_named():
    with pytest.raises(ValueError, match="request 2: timestamp 0.5 is before request 1"):
        due_times_ns([TraceRequest(0.0, 1, 1), TraceRequest(1.0, 1, 1), TraceRequest(0.5, 1, 1)])
    with pytest.raises(ValueError, match="request 1: timestamp must be a number from 0 to 1,000,000,000"):
        due_times_ns([TraceRequest(0.0, 1, 1), TraceRequest(1e308, 1, 1)])
    with pytest.raises(ValueError, match="no requests"):
        asyncio.run(replay("http://127.0.0.1:1", [], ReplayOptions(progress=False)))
    with pytest.raises(ValueError, match="tags must be JSON-serializable"):
        ReplayOptions(tags={"x": object()})


def test_sleep_until_never_wakes_early():
    async def go():
        wakes = []
        for k in range(20):
            deadline = time.perf_counter_ns() + 3_000_000 + 100_000 * k
            await sleep_until(deadline)
            wakes.append(time.perf_counter_ns() - deadline)
        return wakes
    wakes = asyncio.run(go())
    assert min(wakes) >= 0  # how late it wakes is the benchmark's to measure
