"""Command line: replay a trace file against a server and print a short summary.

    python -m loadgen --url http://127.0.0.1:8000 --trace traces/chat.jsonl --out records.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from common.atomicfile import write_atomic
from common.cliargs import (
    OneLineParser,
    add_debug_flag,
    fail,
    non_negative_float,
    non_negative_int,
    output_problem,
    positive_float,
    positive_int,
    same_file,
)
from loadgen.prompts import MAX_VOCAB_SIZE, check_vocab_size
from loadgen.records import RequestRecord, read_records
from loadgen.replay import (
    DEAD_AFTER,
    EVENT_LOOPS,
    ReplayOptions,
    ReplayStopped,
    ServerNotReady,
    base_url,
    replay_sync,
)
from loadgen.summary import format_summary, summarize_records
from traces.trace import TraceError, clip_tokens, load_trace, scale_rate, time_window

PROG = "python -m loadgen"


def _tag(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _url(text: str) -> str:
    try:
        return base_url(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _vocab_size(text: str) -> int:
    try:
        return check_vocab_size(positive_int(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog=PROG, description=(
        "Open-loop replay of a JSONL request trace against an OpenAI-compatible /v1/completions "
        "server (streaming, token-id prompts). One JSON record per request is appended to --out "
        "as it finishes; a summary is printed at the end. Exit status: 0 every request succeeded, "
        "1 some failed (or the replay was stopped: each request still has its record), 2 bad flags, "
        "trace or server URL."))
    p.add_argument("--url", required=True, type=_url,
                   help="server base URL, e.g. http://127.0.0.1:8000 (a trailing /v1 is accepted)")
    p.add_argument("--trace", required=True, type=Path, help="trace file (JSONL, see traces/trace.py)")
    p.add_argument("--out", required=True, type=Path, help="JSONL file the records are appended to")
    p.add_argument("--append", action="store_true",
                   help="append to an existing non-empty --out (default: refuse, to keep runs apart)")
    p.add_argument("--start", type=non_negative_float, default=0.0,
                   help="window start in trace seconds (default 0)")
    p.add_argument("--duration", type=positive_float, default=None,
                   help="window length in trace seconds (default: to the end of the trace)")
    p.add_argument("--speedup", type=positive_float, default=1.0,
                   help="divide the window's timestamps by this (2 = twice the rate; default 1)")
    p.add_argument("--max-input-tokens", type=positive_int, default=None,
                   help="cap each prompt length (default: none)")
    p.add_argument("--max-output-tokens", type=positive_int, default=None,
                   help="cap each reply length (default: none)")
    p.add_argument("--model", default=None, help="model name to send (default: the server's only model)")
    p.add_argument("--timeout", type=positive_float, default=600.0,
                   help="seconds one request may take in all (600)")
    p.add_argument("--connect-timeout", type=positive_float, default=30.0,
                   help="seconds to open a connection (30)")
    p.add_argument("--probe-timeout", type=positive_float, default=30.0,
                   help="seconds the server has to answer GET /v1/models before nothing is sent (30)")
    p.add_argument("--max-connections", type=positive_int, default=None,
                   help="cap on open connections (default: unlimited, so the client never queues)")
    p.add_argument("--dead-after", type=non_negative_int, default=DEAD_AFTER,
                   help=f"stop after this many failed connections in a row, the rest not sent; 0 never "
                        f"({DEAD_AFTER})")
    p.add_argument("--seed", type=non_negative_int, default=0,
                   help="prompt seed; same seed = same prompts (0)")
    p.add_argument("--vocab-size", type=_vocab_size, default=32000,
                   help=f"prompt ids are drawn below this, at most the model's vocabulary and "
                        f"{MAX_VOCAB_SIZE:,} (32000)")
    p.add_argument("--tag", type=_tag, action="append", default=[], metavar="KEY=VALUE",
                   help="label copied into every record's tags (repeatable)")
    p.add_argument("--event-loop", choices=EVENT_LOOPS, default="asyncio", help="event loop (asyncio)")
    p.add_argument("--summary-json", type=Path, default=None, help="also write the summary as JSON here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_debug_flag(p)
    return p


def _requests(args: argparse.Namespace) -> list:
    """The trace window to replay; raises TraceError/OSError naming the file."""
    reqs = load_trace(args.trace)
    if args.duration is not None or args.start:
        to_end = max(reqs[-1].timestamp - args.start, 0.0) + 1.0  # time_window wants a finite length
        reqs = time_window(reqs, args.start, args.duration if args.duration is not None else to_end)
    try:
        reqs = scale_rate(reqs, args.speedup)
    except ValueError as exc:
        raise ValueError(f"--speedup {args.speedup:g}: {exc}") from None
    return clip_tokens(reqs, args.max_input_tokens, args.max_output_tokens)


def _check_outputs(args: argparse.Namespace) -> str | None:
    """Why --out or --summary-json cannot be written, or the event loop run, before anything is sent;
    None if they can."""
    if args.out.exists() and args.out.stat().st_size > 0 and not args.append:
        return f"--out {args.out} exists and is not empty; pass --append or choose another --out"
    problem = output_problem("--out", args.out, [args.trace])
    if problem is None and args.summary_json is not None:
        if same_file(args.summary_json, args.out):
            return f"--summary-json {args.summary_json} is the --out file; choose another path"
        problem = output_problem("--summary-json", args.summary_json, [args.trace])
    if problem is None and args.event_loop == "uvloop" and not _has_uvloop():
        return "--event-loop uvloop: the uvloop package is not installed (pip install uvloop, or use asyncio)"
    return problem


def _has_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401 - only whether it imports
    except ImportError:
        return False
    return True


def _on_disk(path: Path) -> int:
    """Whole records in the file (0 for a missing file or a device such as /dev/full)."""
    return len(read_records(path)) if path.is_file() else 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except (TraceError, OSError, ValueError, RuntimeError) as exc:
        if args.debug:
            raise
        return fail(PROG, str(exc))


def _run(args: argparse.Namespace) -> int:
    problem = _check_outputs(args)
    if problem:
        return fail(PROG, problem)
    reqs = _requests(args)
    if not reqs:
        return fail(PROG, f"--trace {args.trace}: no requests between {args.start} s and +{args.duration} s")
    stopped: str | None = None
    records: list[RequestRecord]
    earlier = _on_disk(args.out)  # --append keeps older runs
    try:
        records = replay_sync(args.url, reqs, ReplayOptions(
            out=args.out, model=args.model, tags=dict(args.tag), timeout_s=args.timeout,
            connect_timeout_s=args.connect_timeout, probe_timeout_s=args.probe_timeout,
            max_connections=args.max_connections, seed=args.seed, progress=not args.no_progress,
            vocab_size=args.vocab_size, dead_after=args.dead_after), event_loop=args.event_loop)
    except ServerNotReady as exc:  # nothing was sent; every request says so in --out
        return fail(PROG, f"--url {args.url}: {exc.reason}; nothing was sent, each of the {len(reqs)} "
                          f"requests is recorded as not sent in {args.out}")
    except ReplayStopped as exc:
        stopped, records = exc.reason, exc.records
    except KeyboardInterrupt as exc:
        stopped = str(exc) or "interrupted"
        records = read_records(args.out)[earlier:] if args.out.is_file() else []
    summary = summarize_records(records)
    print(format_summary(summary))
    unwritten = args.summary_json is not None and not _write_summary(args.summary_json, summary)
    on_disk = _on_disk(args.out) - earlier
    lost = f"; {len(records) - on_disk} of this run's {len(records)} records are not in it" \
        if on_disk < len(records) else ""
    print(f"records: {args.out} ({on_disk} lines from this run{lost})")
    if stopped is not None:
        print(f"{PROG}: stopped: {stopped}", file=sys.stderr)
        return 1
    return 0 if summary["failed"] == 0 and not unwritten else 1


def _write_summary(path: Path, summary: dict) -> bool:
    """Write --summary-json; False, said on stderr, when it cannot be (the replay's records are kept,
    so this is not the exit status of a bad input)."""
    try:
        write_atomic(path, json.dumps(summary, indent=2) + "\n")
    except OSError as exc:
        print(f"{PROG}: error: --summary-json {path}: not written: {exc.strerror or exc}", file=sys.stderr)
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
