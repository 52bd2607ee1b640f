"""Where a trace's requests are: gaps between arrivals, empty time bins, idle stretches, busy spans.

Public traces are bursty: Azure's code trace has hundreds of empty 10-s bins and gaps of minutes,
so a window cut at the wrong time can hold no request at all. These functions say where the
requests lie, for ``python -m traces.info`` and for the experiments' window planning.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

BIN_S = 10.0  # default width of the time bins counted as empty or not
IDLE_S = 60.0  # default: a gap between arrivals at least this long is an idle stretch


@dataclass(frozen=True)
class Span:
    """A busy span: consecutive arrivals with every gap shorter than the idle threshold."""

    first_s: float  # first arrival in the span
    last_s: float  # last arrival in the span
    requests: int

    def to_json(self) -> dict:
        return {"first_s": self.first_s, "last_s": self.last_s, "requests": self.requests}


def busy_spans(timestamps: Sequence[float], idle_s: float) -> list[Span]:
    """Maximal runs of sorted arrival times in which no gap reaches idle_s (an empty list for none)."""
    if not idle_s > 0:
        raise ValueError(f"idle_s must be > 0, got {idle_s!r}")
    spans: list[Span] = []
    start = 0
    for i in range(1, len(timestamps) + 1):
        if i == len(timestamps) or timestamps[i] - timestamps[i - 1] >= idle_s:
            spans.append(Span(timestamps[start], timestamps[i - 1], i - start))
            start = i
    return spans


def count_in(timestamps: Sequence[float], lo: float, hi: float) -> int:
    """How many sorted arrival times t satisfy lo <= t < hi."""
    return bisect.bisect_left(timestamps, hi) - bisect.bisect_left(timestamps, lo)


def gap_summary(timestamps: Sequence[float], bin_s: float = BIN_S, idle_s: float = IDLE_S) -> dict:
    """Gaps and idle stretches of sorted arrival times.

    Keys: bin_s and idle_s (the thresholds used); bins (bins of bin_s from the first arrival to the
    last, inclusive) and empty_bins (those with no arrival); longest_gap_s with longest_gap_after_s
    (the arrival it follows; None for fewer than two arrivals); idle_stretches (gaps >= idle_s),
    idle_s_total (their total length); busy_spans (Span.to_json of each run between idle stretches).
    """
    if not (math.isfinite(bin_s) and bin_s > 0):
        raise ValueError(f"bin_s must be a finite number > 0, got {bin_s!r}")
    spans = busy_spans(timestamps, idle_s)
    out: dict = {"bin_s": bin_s, "idle_s": idle_s, "bins": 0, "empty_bins": 0, "longest_gap_s": None,
                 "longest_gap_after_s": None, "idle_stretches": 0, "idle_s_total": 0.0,
                 "busy_spans": [s.to_json() for s in spans]}
    if not timestamps:
        return out
    start = timestamps[0]
    bins = int((timestamps[-1] - start) // bin_s) + 1
    occupied = {int((t - start) // bin_s) for t in timestamps}
    out.update(bins=bins, empty_bins=bins - len(occupied))
    gaps = [(b - a, a) for a, b in itertools.pairwise(timestamps)]
    if gaps:
        longest, after = max(gaps, key=lambda g: g[0])  # the first of equal gaps
        out.update(longest_gap_s=longest, longest_gap_after_s=after)
    idle = [g for g, _ in gaps if g >= idle_s]
    out.update(idle_stretches=len(idle), idle_s_total=float(sum(idle)))
    return out


def describe_spans(spans: Sequence[Span], shown: int = 5) -> str:
    """'0-340.2 s (812 requests), 557.1-900 s (90 requests)', the first `shown` spans and a count."""
    text = ", ".join(f"{s.first_s:g}-{s.last_s:g} s ({s.requests} requests)" for s in spans[:shown])
    return text + (f" and {len(spans) - shown} more spans" if len(spans) > shown else "")
