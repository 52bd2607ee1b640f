"""Summary statistics of hand-made records."""

from __future__ import annotations

from loadgen.records import RequestRecord
from loadgen.summary import format_summary, peak_in_flight, percentiles, summarize_records


def rec(i: int, due_ms: float, sent_ms: float | None, end_ms: float | None, *, tokens: int = 3,
        error: str | None = None) -> RequestRecord:
    ns = lambda ms: None if ms is None else int(ms * 1e6)  # noqa: E731
    ok = error is None
    return RequestRecord(
        index=i, due_ns=ns(due_ms), sent_ns=ns(sent_ms), first_token_ns=ns(due_ms + 10) if ok else None,
        last_token_ns=ns(due_ms + 10 + 2 * (tokens - 1)) if ok else None, end_ns=ns(end_ms),
        input_tokens=10, output_tokens=tokens, prompt_tokens=10 if ok else None,
        completion_tokens=tokens if ok else None, n_chunks=tokens if ok else 0,
        max_gap_ms=2.0 if ok else None,
        status=200 if ok else None, error=error, tags={}, itl_us=(2_000,) * (tokens - 1) if ok else None)


def test_percentiles_literal():
    assert percentiles([4, 6, 9, 7, 5, 8, 3, 0, 1, 2], (25, 50)) == {"p25": 2.25, "p50": 4.5}
    assert percentiles([]) == {"p50": None, "p99": None}


def test_peak_in_flight():
    rs = [rec(0, 0, 0, 100), rec(1, 10, 10, 50), rec(2, 60, 60, 70), rec(3, 200, None, None, error="x")]
    assert peak_in_flight(rs) == 2


def test_summary_counts_rates_and_latencies():
    rs = [rec(i, 100 * i, 100 * i + 0.5 * i, 100 * i + 20) for i in range(5)]
    rs.append(rec(5, 500, 500.5, 501, error="HTTP 400: too long"))
    s = summarize_records(rs)
    assert (s["requests"], s["completed"], s["failed"]) == (6, 5, 1)
    assert s["offered_rate_rps"] == 10.0  # 5 gaps over 500 ms
    assert s["achieved_rate_rps"] == 5 / 0.5005  # last send at 500.5 ms
    assert s["ttft_ms"] == {"p50": 10.0, "p99": 10.0}
    assert s["tpot_ms"] == {"p50": 2.0, "p99": 2.0}
    assert s["itl_ms"] == {"p50": 2.0, "p99": 2.0}  # every gap of the succeeded requests, pooled
    assert s["lateness_ms"]["max"] == 2.0  # request 4: sent at 402 ms, due at 400 ms
    assert s["top_errors"] == [{"error": "HTTP 400: too long", "count": 1}]
    text = format_summary(s)
    assert "completed 5, failed 1" in text and "HTTP 400: too long" in text and "ITL   p50 2.00 ms" in text
    assert "warning" not in text
    late = summarize_records(rs + [rec(6, 600, 625, 650)])
    assert "sent up to 25 ms late" in format_summary(late)


def test_a_stopped_replay_achieves_no_more_than_was_offered():
    # two requests sent at once, then the replay stopped: the third, due at 10 s, was never sent
    rs = [rec(0, 0, 0, 20), rec(1, 100, 100, 120), rec(2, 10_000, None, None, error="not sent: stopped")]
    s = summarize_records(rs)
    assert s["offered_rate_rps"] == 2 / 10.0
    assert s["achieved_rate_rps"] == 1 / 10.0  # one gap over the whole schedule, not over 0.1 s
