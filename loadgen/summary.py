"""A replay's headline numbers, computed from its records (no I/O)."""

from __future__ import annotations

from collections import Counter
from typing import Callable, Sequence

import numpy as np

from loadgen.records import RequestRecord, e2e_ms, itl_ms, lateness_ms, succeeded, tpot_ms, ttft_ms

PERCENTILES = (50, 99)
LATE_WARNING_MS = 10.0  # sends later than this mean the client, not the server, set some latencies


def percentiles(values: Sequence[float], ps: Sequence[float] = PERCENTILES) -> dict[str, float | None]:
    """{"p50": ..., "p99": ...} by linear interpolation (numpy's default); None for no values."""
    if len(values) == 0:
        return {f"p{p:g}": None for p in ps}
    return {f"p{p:g}": float(v) for p, v in zip(ps, np.percentile(np.asarray(values, dtype=float), ps))}


Metric = Callable[[RequestRecord], "float | None"]


def _defined(records: Sequence[RequestRecord], metric: Metric) -> list[float]:
    return [v for v in map(metric, records) if v is not None]


def _rate(times_ns: list[int], start_ns: int, until_ns: int | None = None) -> float | None:
    """Events per second from start_ns to the last event, or to until_ns if later: (n - 1) / span."""
    if len(times_ns) < 2:
        return None
    end = max(times_ns) if until_ns is None else max(max(times_ns), until_ns)
    return (len(times_ns) - 1) / ((end - start_ns) / 1e9) if end > start_ns else None


def peak_in_flight(records: Sequence[RequestRecord]) -> int:
    """Most requests open at once (between sent and end)."""
    events = sorted([(r.sent_ns, 1) for r in records if r.sent_ns is not None and r.end_ns is not None]
                    + [(r.end_ns, -1) for r in records if r.sent_ns is not None and r.end_ns is not None])
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak


def summarize_records(records: Sequence[RequestRecord]) -> dict:
    """Counts, rates and latency percentiles of one replay.

    offered_rate_rps: the schedule's rate, (n - 1) / (last due - first due); achieved_rate_rps:
    (sent - 1) / (last send or last due, the later, - first due), so never above offered: below it
    when the client fell behind by the end or did not send everything (a stopped replay), stalls
    on the way show in the lateness percentiles.
    Only successful requests enter TTFT/TPOT/ITL/E2E (ITL: every gap between token chunks, pooled as
    vLLM's benchmark pools them); lateness covers every request that was sent.
    """
    ok = [r for r in records if succeeded(r)]
    sent = [r.sent_ns for r in records if r.sent_ns is not None]
    dues = [r.due_ns for r in records]
    first_due = min(dues, default=0)
    late = _defined(records, lateness_ms)
    errors = Counter((r.error or "")[:120] for r in records if not succeeded(r))
    return {
        "requests": len(records),
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "offered_rate_rps": _rate(dues, first_due),
        "achieved_rate_rps": _rate(sent, first_due, max(dues, default=None)),
        "peak_in_flight": peak_in_flight(records),
        "ttft_ms": percentiles(_defined(ok, ttft_ms)),
        "tpot_ms": percentiles(_defined(ok, tpot_ms)),
        "e2e_ms": percentiles(_defined(ok, e2e_ms)),
        "itl_ms": percentiles([gap for r in ok for gap in itl_ms(r)]),
        "lateness_ms": {**percentiles(late), "max": max(late) if late else None},
        "top_errors": [{"error": e, "count": c} for e, c in errors.most_common(3)],
    }


def _fmt(v: float | None, unit: str = "") -> str:
    return "n/a" if v is None else f"{v:.2f}{unit}"


def format_summary(s: dict) -> str:
    """A few human-readable lines of summarize_records' output."""
    lines = [
        f"requests {s['requests']}: completed {s['completed']}, failed {s['failed']}",
        f"rate: offered {_fmt(s['offered_rate_rps'])} req/s, achieved {_fmt(s['achieved_rate_rps'])} req/s; "
        f"peak in flight {s['peak_in_flight']}",
    ]
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        p = s[key]
        lines.append(f"{key[:-3].upper():5s} p50 {_fmt(p['p50'], ' ms')}, p99 {_fmt(p['p99'], ' ms')}")
    la = s["lateness_ms"]
    lines.append(f"send lateness p50 {_fmt(la['p50'], ' ms')}, p99 {_fmt(la['p99'], ' ms')}, "
                 f"max {_fmt(la['max'], ' ms')}")
    if la["max"] is not None and la["max"] > LATE_WARNING_MS:
        lines.append(f"warning: some requests were sent up to {la['max']:.0f} ms late "
                     "(client short of CPU?); their latencies include that delay")
    lines += [f"  error x{e['count']}: {e['error']}" for e in s["top_errors"]]
    return "\n".join(lines)
