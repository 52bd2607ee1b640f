"""Step-size histograms from vLLM's /metrics text: parse, difference of two scrapes, sums."""

from __future__ import annotations

import pytest

from experiments.runner.metrics_scrape import accumulate, difference, parse_histogram


def _text(c1: float, c8: float, cinf: float, total: float, engines: int = 1) -> str:
    lines = ["# HELP vllm:iteration_tokens_total Histogram of number of tokens per engine_step.",
             "# TYPE vllm:iteration_tokens_total histogram"]
    for e in range(engines):
        lab = f'engine="{e}",model_name="tiny-llama"'
        lines += [f'vllm:iteration_tokens_total_bucket{{{lab},le="1.0"}} {c1}',
                  f'vllm:iteration_tokens_total_bucket{{{lab},le="8.0"}} {c8}',
                  f'vllm:iteration_tokens_total_bucket{{{lab},le="+Inf"}} {cinf}',
                  f"vllm:iteration_tokens_total_count{{{lab}}} {cinf}",
                  f"vllm:iteration_tokens_total_sum{{{lab}}} {total}"]
    lines += ["# TYPE vllm:num_requests_running gauge", 'vllm:num_requests_running{engine="0"} 0.0']
    return "\n".join(lines) + "\n"


def test_parse_sums_engines() -> None:
    h = parse_histogram(_text(2, 5, 6, 100.0, engines=2))
    assert h.bounds == (1.0, 8.0, float("inf"))
    assert h.cumulative == (4.0, 10.0, 12.0) and h.count == 12.0 and h.total == 200.0


def test_missing_metric_is_an_error() -> None:
    with pytest.raises(ValueError, match="vllm:iteration_tokens_total not found"):
        parse_histogram('# TYPE vllm:other gauge\nvllm:other 1.0\n')


def test_difference_gives_per_bucket_counts_of_the_window() -> None:
    before = parse_histogram(_text(2, 5, 6, 100.0))
    after = parse_histogram(_text(10, 25, 27, 400.0))
    assert difference(before, after) == {"buckets": [1.0, 8.0, "+Inf"], "counts": [8, 12, 1],
                                         "count": 21, "sum": 300.0}


def test_difference_refuses_a_restarted_server() -> None:
    with pytest.raises(ValueError, match="backwards"):
        difference(parse_histogram(_text(10, 25, 27, 400.0)), parse_histogram(_text(1, 2, 3, 4.0)))


def test_accumulate_adds_windows() -> None:
    a = {"buckets": [1.0, "+Inf"], "counts": [1, 2], "count": 3, "sum": 10.0}
    b = {"buckets": [1.0, "+Inf"], "counts": [4, 0], "count": 4, "sum": 4.0}
    total = accumulate(accumulate(None, a), b)
    assert total == {"buckets": [1.0, "+Inf"], "counts": [5, 2], "count": 7, "sum": 14.0}
    assert a["counts"] == [1, 2]  # inputs untouched
