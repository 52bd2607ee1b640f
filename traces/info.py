"""Summary statistics of a JSONL trace, optionally of a time window at a speed-up, and slicing.

    python -m traces.info traces/chat.jsonl
    python -m traces.info traces/chat.jsonl --start 600 --duration 120 --speedup 2 --out slice.jsonl

The window is taken on the original time axis first, then the speed-up is applied.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from traces.trace import (
    TraceError,
    TraceRequest,
    file_sha256,
    load_trace,
    scale_rate,
    summarize,
    time_window,
    write_trace,
)


def format_summary(summary: dict) -> str:
    """Human-readable text of a summarize() result."""
    if summary["count"] == 0:
        return "count        0 requests"
    rate = summary["rate_rps"]
    lines = [
        f"count        {summary['count']} requests ({summary['with_hash_ids']} with hash_ids)",
        f"span         {summary['start_s']:.6f} s .. {summary['end_s']:.6f} s",
        f"duration     {summary['duration_s']:.6f} s",
        f"rate         {'n/a' if rate is None else f'{rate:.4f}'} req/s  ((count - 1) / duration)",
        f"{'tokens':<12} {'mean':>10} {'p50':>10} {'p90':>10} {'p99':>10} {'max':>10}",
    ]
    for key in ("input_tokens", "output_tokens"):
        s = summary[key]
        lines.append(
            f"{key.split('_')[0]:<12} {s['mean']:>10.1f} {s['p50']:>10.1f} {s['p90']:>10.1f} "
            f"{s['p99']:>10.1f} {s['max']:>10d}"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The command line of traces.info."""
    p = argparse.ArgumentParser(
        prog="python -m traces.info",
        description="Validate a JSONL trace and print its summary: count, duration, rate (req/s), "
        "input/output token mean, p50, p90, p99, max. Optionally slice a window and speed it up.",
    )
    p.add_argument("trace", type=Path, help="JSONL trace file (validated line by line)")
    p.add_argument(
        "--start", type=float, default=None, help="window start, seconds on the trace's time axis (default 0)"
    )
    p.add_argument(
        "--duration",
        type=float,
        default=None,
        help="window length in seconds of the original trace; keeps start <= t < start + duration "
        "and rebases the window start to 0 (default: to the end of the trace)",
    )
    p.add_argument(
        "--speedup",
        type=float,
        default=1.0,
        help="replay at this many times the original rate: timestamps are divided by it (default 1)",
    )
    p.add_argument("--out", type=Path, default=None, help="write the resulting requests here as JSONL")
    p.add_argument("--json", action="store_true", help="print the summary as JSON instead of text")
    return p


def select(
    reqs: list[TraceRequest], start: float | None, duration: float | None, speedup: float
) -> list[TraceRequest]:
    """Apply the window (when start or duration is given) and then the speed-up."""
    if start is not None or duration is not None:
        reqs = time_window(reqs, 0.0 if start is None else start, math.inf if duration is None else duration)
    return scale_rate(reqs, speedup) if speedup != 1.0 else list(reqs)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        reqs = select(load_trace(args.trace), args.start, args.duration, args.speedup)
    except (TraceError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.out is not None and not reqs:
        print("error: the selected window holds no requests; nothing to write", file=sys.stderr)
        return 1
    summary = summarize(reqs)
    if args.json:
        print(json.dumps({"trace": str(args.trace), "sha256": file_sha256(args.trace), **summary}, indent=2))
    else:
        print(f"trace        {args.trace} (sha256 {file_sha256(args.trace)})")
        print(format_summary(summary))
    if args.out is not None:
        write_trace(reqs, args.out)
        print(f"wrote {len(reqs)} requests to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
