"""Summary statistics of a JSONL trace, optionally of a time window at a speed-up, and slicing.

    python -m traces.info traces/chat.jsonl
    python -m traces.info traces/chat.jsonl --start 600 --duration 120 --speedup 2 --out slice.jsonl

The window is taken on the original time axis first, then the speed-up is applied. The summary
says where the requests are: the longest gap, empty time bins, idle stretches and busy spans.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from common.cliargs import (
    OneLineParser,
    add_debug_flag,
    fail,
    non_negative_float,
    output_problem,
    positive_float,
)
from traces.gaps import BIN_S, IDLE_S, Span, describe_spans, gap_summary
from traces.trace import (
    TraceError,
    TraceRequest,
    file_sha256,
    load_trace,
    scale_rate,
    time_window,
    trace_summary,
    write_trace,
)

PROG = "python -m traces.info"


def format_summary(summary: dict) -> str:
    """Human-readable text of a trace_summary() result."""
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
    return "\n".join(lines + format_gaps(summary["gaps"]) if "gaps" in summary else lines)


def format_gaps(g: dict) -> list[str]:
    """Text lines of a traces.gaps.gap_summary() result."""
    lines = [f"empty bins   {g['empty_bins']} of {g['bins']} bins of {g['bin_s']:g} s"]
    if g["longest_gap_s"] is not None:
        lines.append(f"longest gap  {g['longest_gap_s']:.6f} s, after the arrival at "
                     f"{g['longest_gap_after_s']:.6f} s")
    lines.append(f"idle         {g['idle_stretches']} gaps >= {g['idle_s']:g} s, "
                 f"{g['idle_s_total']:.6f} s in all")
    spans = [Span(**s) for s in g["busy_spans"]]
    lines.append(f"busy spans   {len(spans)}: {describe_spans(spans)}")
    return lines


def build_parser() -> argparse.ArgumentParser:
    """The command line of traces.info."""
    p = OneLineParser(
        prog=PROG,
        description="Validate a JSONL trace and print its summary: count, duration, rate (req/s), "
        "input/output token mean, p50, p90, p99, max, and where the requests are (longest gap, empty "
        "time bins, idle stretches, busy spans). Optionally slice a window and speed it up.",
    )
    p.add_argument("trace", type=Path, help="JSONL trace file (validated line by line)")
    p.add_argument(
        "--start",
        type=non_negative_float,
        default=None,
        help="window start, seconds on the trace's time axis (default 0)",
    )
    p.add_argument(
        "--duration",
        type=positive_float,
        default=None,
        help="window length in trace seconds from --start, rebased to 0 (default: to the end of the "
             "trace)",
    )
    p.add_argument(
        "--speedup",
        type=positive_float,
        default=1.0,
        help="replay at this many times the original rate: timestamps are divided by it (default 1)",
    )
    p.add_argument("--out", type=Path, default=None, help="write the resulting requests here as JSONL")
    p.add_argument("--json", action="store_true", help="print the summary as JSON instead of text")
    p.add_argument("--bin-s", type=positive_float, default=BIN_S,
                   help=f"width of the time bins counted as empty or not, seconds (default {BIN_S:g})")
    p.add_argument("--idle-s", type=positive_float, default=IDLE_S,
                   help=f"a gap between arrivals at least this long is an idle stretch; busy spans lie "
                        f"between them (default {IDLE_S:g})")
    add_debug_flag(p)
    return p


def select(
    reqs: list[TraceRequest], start: float | None, duration: float | None, speedup: float
) -> list[TraceRequest]:
    """Apply the window (when start or duration is given) and then the speed-up."""
    if start is not None or duration is not None:
        reqs = time_window(reqs, 0.0 if start is None else start, math.inf if duration is None else duration)
    try:
        return scale_rate(reqs, speedup) if speedup != 1.0 else list(reqs)
    except ValueError as exc:
        raise ValueError(f"--speedup {speedup:g}: {exc}") from None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (0, or 2 for a bad flag, trace file or line)."""
    args = build_parser().parse_args(argv)
    problem = None if args.out is None else output_problem("--out", args.out, [args.trace])
    if problem:
        return fail(PROG, problem)
    try:
        return _run(args)
    except (TraceError, OSError, ValueError) as exc:
        if args.debug:
            raise
        return fail(PROG, str(exc))


def _run(args: argparse.Namespace) -> int:
    """Print the summary and write the slice; a bad trace or write raises TraceError or OSError."""
    reqs = select(load_trace(args.trace), args.start, args.duration, args.speedup)
    if args.out is not None and not reqs:
        return fail(PROG, "the selected window holds no requests; nothing to write")
    summary = trace_summary(reqs)
    summary["gaps"] = gap_summary([r.timestamp for r in reqs], args.bin_s, args.idle_s)
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
