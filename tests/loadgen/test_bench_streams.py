"""loadgen.bench with several streams at once (the duet's client): every stream replays the whole
schedule from one t0, and the gap between the streams' sends of the same request is measured."""

from __future__ import annotations

import socket

import pytest

from loadgen import bench
from loadgen.records import RequestRecord


def _sent(index: int, sent_ns: int | None) -> RequestRecord:
    return RequestRecord(index=index, due_ns=0, sent_ns=sent_ns, first_token_ns=None, last_token_ns=None,
                         end_ns=None, input_tokens=1, output_tokens=1, prompt_tokens=None,
                         completion_tokens=None, n_chunks=0, max_gap_ms=None, status=None, error=None,
                         tags={})


def test_pair_send_gaps_are_the_spread_of_one_request_across_streams() -> None:
    a = [_sent(0, 1_000_000), _sent(1, 5_000_000), _sent(2, None)]
    b = [_sent(0, 1_500_000), _sent(1, 4_000_000), _sent(2, 9_000_000)]
    assert bench.pair_send_gaps_ms([a, b]) == [0.5, 1.0]  # request 2 was not sent by stream a


def _two_free_ports() -> int:
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no two consecutive free ports")


@pytest.mark.e2e
def test_two_streams_on_one_loop_replay_the_whole_schedule_each() -> None:
    args = bench.build_parser().parse_args(["--streams", "2", "--rate", "40", "--duration", "1",
                                            "--tokens", "4", "--port", str(_two_free_ports())])
    doc = bench.run_bench(args)
    r = doc["results"]
    assert r["requests"] == r["completed"] == 80 and r["failed"] == 0
    assert doc["samples"]["stream"] == [0] * 40 + [1] * 40
    assert len(r["per_stream_lateness_ms"]) == 2 and r["pair_send_gap_ms"]["count"] == 40
    assert min(doc["samples"]["lateness_ms"]) >= 0  # nothing sent before its due time
