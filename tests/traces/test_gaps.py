"""traces.gaps: empty bins, the longest gap, idle stretches and busy spans of a trace with a planted gap."""

from __future__ import annotations

import pytest

from traces.gaps import Span, busy_spans, count_in, describe_spans, gap_summary

# 1 request/s over [0, 30), a planted 200-s gap, 1 request/s over [229, 259), then 2 requests at 400.
PLANTED = [float(t) for t in range(30)] + [229.0 + t for t in range(30)] + [400.0, 400.0]


def test_planted_gap_is_found() -> None:
    g = gap_summary(PLANTED, bin_s=10.0, idle_s=60.0)
    assert g["longest_gap_s"] == 200.0 and g["longest_gap_after_s"] == 29.0
    # bins of 10 s from 0 to 400: 41; occupied: 0-2 (0..29), 22-25 (229..258), 40 (400)
    assert g["bins"] == 41 and g["empty_bins"] == 41 - 8
    # idle stretches: 29 -> 229 (200 s) and 258 -> 400 (142 s)
    assert g["idle_stretches"] == 2 and g["idle_s_total"] == 342.0
    assert g["busy_spans"] == [{"first_s": 0.0, "last_s": 29.0, "requests": 30},
                               {"first_s": 229.0, "last_s": 258.0, "requests": 30},
                               {"first_s": 400.0, "last_s": 400.0, "requests": 2}]


def test_idle_threshold_splits_spans() -> None:
    assert busy_spans(PLANTED, 300.0) == [Span(0.0, 400.0, 62)]
    assert [s.requests for s in busy_spans(PLANTED, 150.0)] == [30, 32]
    assert busy_spans(PLANTED, 200.0)[0] == Span(0.0, 29.0, 30)  # a gap equal to idle_s is idle


def test_steady_trace_has_no_gaps() -> None:
    g = gap_summary([0.5 * i for i in range(100)], bin_s=10.0, idle_s=60.0)
    assert g["empty_bins"] == 0 and g["idle_stretches"] == 0 and g["longest_gap_s"] == 0.5
    assert len(g["busy_spans"]) == 1


def test_empty_and_single_arrival() -> None:
    empty = gap_summary([])
    assert empty["bins"] == 0 and empty["longest_gap_s"] is None and empty["busy_spans"] == []
    one = gap_summary([7.0])
    assert one["bins"] == 1 and one["empty_bins"] == 0 and one["longest_gap_s"] is None
    assert one["busy_spans"] == [{"first_s": 7.0, "last_s": 7.0, "requests": 1}]


def test_bad_thresholds_are_refused() -> None:
    with pytest.raises(ValueError, match="bin_s must be"):
        gap_summary(PLANTED, bin_s=0.0)
    with pytest.raises(ValueError, match="idle_s must be"):
        busy_spans(PLANTED, 0.0)


def test_count_in_is_half_open() -> None:
    assert count_in(PLANTED, 0.0, 30.0) == 30
    assert count_in(PLANTED, 30.0, 229.0) == 0
    assert count_in(PLANTED, 400.0, 401.0) == 2 and count_in(PLANTED, 399.0, 400.0) == 0


def test_describe_spans_shows_the_first_and_counts_the_rest() -> None:
    spans = busy_spans(PLANTED, 60.0)
    assert describe_spans(spans) == "0-29 s (30 requests), 229-258 s (30 requests), 400-400 s (2 requests)"
    assert describe_spans(spans, shown=1) == "0-29 s (30 requests) and 2 more spans"
