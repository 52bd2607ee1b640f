"""Convert a public trace (Azure, Mooncake, BurstGPT) to the project's JSONL trace format.

    python -m traces.convert --format azure AzureLLMInferenceTrace_conv.csv traces/chat.jsonl

Prints what it read, wrote and dropped (per reason, with line numbers); never drops silently.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from common.atomicfile import write_atomic
from common.cliargs import OneLineParser, add_debug_flag, fail, output_problem, same_file
from traces.formats import FORMATS, order_rows, to_requests
from traces.trace import TraceError, file_sha256, write_trace

PROG = "python -m traces.convert"

_SHOWN_LINES = 5  # dropped line numbers printed per reason (all of them go into --report)


@dataclass(frozen=True)
class ConversionReport:
    """What a conversion read, wrote and dropped."""

    format: str
    source: str
    output: str
    rows_read: int
    written: int
    dropped: dict[str, list[int]]  # reason -> source line numbers
    out_of_order: int  # rows moved by --sort
    ignored_fields: list[str]  # source columns/keys not carried into the trace
    sha256: str  # of the output file

    @property
    def dropped_total(self) -> int:
        """Number of dropped rows, all reasons together."""
        return sum(len(v) for v in self.dropped.values())

    def lines(self) -> list[str]:
        """Human-readable summary, one fact per line."""
        out = [
            f"read {self.rows_read} rows from {self.source} ({self.format})",
            f"wrote {self.written} requests to {self.output} (sha256 {self.sha256})",
            f"dropped {self.dropped_total} rows",
        ]
        for reason, lines in self.dropped.items():
            shown = ", ".join(map(str, lines[:_SHOWN_LINES])) + (", ..." if len(lines) > _SHOWN_LINES else "")
            out.append(f"  {len(lines)} {reason}: lines {shown}")
        if self.out_of_order:
            out.append(f"sorted by time: {self.out_of_order} rows were out of order")
        if self.ignored_fields:
            out.append(f"not carried over: {', '.join(self.ignored_fields)}")
        return out


def convert(fmt: str, src: str | Path, dst: str | Path, sort: bool = False) -> ConversionReport:
    """Convert src (in format fmt) to the JSONL trace dst; raise TraceError on a malformed line.

    Raises ValueError when dst is src itself (writing would destroy the source before it is read).
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    src, dst = Path(src), Path(dst)
    if same_file(src, dst):
        raise ValueError(f"output {dst} is the input {src}; write the trace to another file")
    parsed = FORMATS[fmt](src)
    rows, out_of_order = order_rows(src, parsed.rows, sort)
    reqs = to_requests(rows)
    dropped_total = sum(len(v) for v in parsed.dropped.values())
    if not reqs:
        raise TraceError(f"{src}:1: no requests to write ({dropped_total} rows dropped)")
    write_trace(reqs, dst)
    return ConversionReport(
        format=fmt,
        source=str(src),
        output=str(dst),
        rows_read=len(rows) + dropped_total,
        written=len(reqs),
        dropped=parsed.dropped,
        out_of_order=out_of_order,
        ignored_fields=parsed.ignored_fields,
        sha256=file_sha256(dst),
    )


def build_parser() -> argparse.ArgumentParser:
    """The command line of traces.convert."""
    p = OneLineParser(
        prog=PROG,
        description="Convert a public LLM request trace to JSONL "
        '({"timestamp": s, "input_tokens": n, "output_tokens": n[, "hash_ids": [...]]} per line), '
        "times rebased to the first request and rounded to the microsecond.",
    )
    p.add_argument(
        "--format",
        required=True,
        choices=sorted(FORMATS),
        help="input format: azure (CSV), mooncake (JSONL), burstgpt (CSV; failed rows dropped and "
             "counted)",
    )
    p.add_argument("input", type=Path, help="the source trace file")
    p.add_argument("output", type=Path,
                   help="the JSONL trace to write (overwritten; refused when it is the input file)")
    p.add_argument(
        "--sort",
        action="store_true",
        help="sort rows stably by time (default: fail at the first out-of-order line)",
    )
    p.add_argument(
        "--report",
        type=Path,
        default=None,
        help="also write the conversion report (counts, dropped lines, sha256) as JSON here",
    )
    add_debug_flag(p)
    return p


def _check_paths(args: argparse.Namespace) -> str | None:
    """Why the output or --report cannot be written, before anything is; None when they can."""
    problem = output_problem("output", args.output, [args.input])
    if problem is None and args.report is not None:
        if same_file(args.output, args.report):
            return f"--report {args.report} is the output file; choose another path"
        problem = output_problem("--report", args.report, [args.input])
    return problem


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (0 written, 2 bad flag, input file or line)."""
    args = build_parser().parse_args(argv)
    problem = _check_paths(args)
    if problem:
        return fail(PROG, problem)
    try:
        report = convert(args.format, args.input, args.output, sort=args.sort)
        print("\n".join(report.lines()))
        if args.report is not None:
            write_atomic(args.report, json.dumps(asdict(report), indent=2) + "\n")
    except (ValueError, OSError) as exc:  # TraceError is a ValueError
        if args.debug:
            raise
        return fail(PROG, str(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
