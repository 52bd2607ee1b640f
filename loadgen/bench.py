"""Benchmark of the replayer itself: can it keep an open-loop schedule, and at what client CPU cost?

    python -m loadgen.bench                  # 200 req/s for 30 s, constant rate
    python -m loadgen.bench --arrivals poisson --out /tmp/bench.json
    python -m loadgen.bench --arrivals bursty --input-tokens 4000 --speedup 8   # 20 at once every 3 s / 8
    python -m loadgen.bench --streams 2 [--threads]   # two servers at once, 200 req/s each (the duet)

A fake /v1/completions server (loadgen.fakeserver) runs in its own process, so it does not share the
client's event loop; it streams ``--tokens`` SSE chunks per request at a fixed pace and the final
usage chunk. The schedule goes through the real replay() code. The output JSON keeps every request's
send lateness as raw samples; the targets are achieved rate >= 99% of offered and lateness p99 <= 2 ms.
With ``--streams N`` the same schedule goes to N fake servers (one process each) at once from one
t0 (loadgen.together): on one event loop, or with ``--threads`` one thread and loop per stream.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import platform
import resource
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path

import aiohttp
import numpy as np

from common.cliargs import output_problem
from common.jsonfile import write_json
from loadgen.fakeserver import FakeServerConfig, serve_forever
from loadgen.records import LATENESS_TARGET_P99_MS, lateness_ms, ttft_ms
from loadgen.replay import EVENT_LOOPS, ReplayOptions, replay_sync
from loadgen.summary import percentiles, summarize_records
from loadgen.together import Stream, replay_together_sync
from traces.trace import TraceRequest, scale_rate

SCHEMA_VERSION = 1
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "bench-cpu.json.xz"
TARGET_RATE_FRACTION = 0.99


def schedule(rate: float, duration_s: float, arrivals: str, input_tokens: int, tokens: int,
             seed: int, burst: int = 20, tick_s: float = 3.0) -> list[TraceRequest]:
    """Requests for `duration_s`: at `rate` per second evenly spaced or Poisson (seeded), or, for
    "bursty", `burst` requests at one timestamp every `tick_s` seconds (as conversation traces tick)."""
    n = int(rate * duration_s)
    if arrivals == "constant":
        times = np.arange(n) / rate
    elif arrivals == "bursty":
        times = np.repeat(np.arange(0.0, duration_s, tick_s), burst)
    else:
        times = np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, size=n))
        times = times[times < duration_s] - times[0]
    return [TraceRequest(round(float(t), 9), input_tokens, tokens) for t in times]


def _serve_in_own_session(cfg: FakeServerConfig, port: int) -> None:
    """The server process, in its own session as integration.launcher starts vLLM (with kernel
    autogroup scheduling, CPU is then shared between client and server as in a real run)."""
    os.setsid()
    serve_forever(cfg, port)


def wake_up_delays_ms(seconds: float = 2.0, sleep_s: float = 0.005) -> list[float]:
    """How late a bare time.sleep(5 ms) wakes on this machine now: the noise floor others' load sets."""
    out: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        time.sleep(sleep_s)
        out.append((time.perf_counter() - t - sleep_s) * 1e3)
    return out


def _canary(seconds: float, conn: Connection) -> None:
    """A process that only sleeps 5 ms at a time during the run: its wake-up delays are the
    stalls the machine imposes on any process, which the client's lateness cannot beat."""
    os.setsid()
    conn.send(wake_up_delays_ms(seconds))
    conn.close()


def _delay_summary(samples: list[float]) -> dict:
    return {**percentiles(samples), "max": max(samples), "count": len(samples)}


def _cpu_pressure() -> str | None:
    try:
        return Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except OSError:
        return None


def _wait_ready(url: str, timeout_s: float = 30.0) -> None:
    async def probe() -> bool:
        try:
            async with aiohttp.ClientSession() as s, s.get(f"{url}/v1/models") as r:
                return r.status == 200
        except aiohttp.ClientError:
            return False

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if asyncio.run(probe()):
            return
        time.sleep(0.1)
    raise TimeoutError(f"fake server at {url} not ready after {timeout_s} s")


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def environment(event_loop: str) -> dict:
    """What the figures depend on: machine, versions, and how busy the machine was."""
    return {
        "python": sys.version.split()[0], "platform": platform.platform(), "machine": platform.machine(),
        "cpu_count": os.cpu_count(), "aiohttp": aiohttp.__version__, "numpy": np.__version__,
        "event_loop": event_loop, "git_commit": _git("rev-parse", "HEAD"),
        "loadgen_uncommitted_changes": bool(_git("status", "--porcelain", "--", ".", ":(exclude)results")),
        "loadavg_1_5_15_before": os.getloadavg(),
        "cpu_pressure_before": _cpu_pressure(),
    }


def _replay_streams(args: argparse.Namespace, urls: list[str], reqs: list[TraceRequest]) -> list[list]:
    """Every stream's records: one plain replay_sync for one stream on the shared loop, else
    loadgen.together (one loop, or a thread and loop per stream with --threads)."""
    options = ReplayOptions(progress=False, seed=args.seed, timeout_s=60.0)
    if len(urls) == 1 and not args.threads:
        return [replay_sync(urls[0], reqs, options, event_loop=args.event_loop)]
    outcomes = replay_together_sync([Stream(u, reqs, options) for u in urls], threads=args.threads)
    for o in outcomes:
        if isinstance(o, BaseException):
            raise o
    return outcomes


def run_bench(args: argparse.Namespace) -> dict:
    """Start the server processes, replay the schedule to each, return the result document."""
    cfg = FakeServerConfig(ttft_s=args.ttft_ms / 1e3, itl_s=args.itl_ms / 1e3)
    reqs = scale_rate(schedule(args.rate, args.duration * args.speedup, args.arrivals, args.input_tokens,
                               args.tokens, args.seed, args.burst, args.tick_s), args.speedup)
    env = environment(args.event_loop)
    idle_probe = wake_up_delays_ms()
    ctx = mp.get_context("spawn")
    ports = [args.port + k for k in range(args.streams)]
    servers = [ctx.Process(target=_serve_in_own_session, args=(cfg, port), daemon=True) for port in ports]
    for server in servers:
        server.start()
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    canary_rx, canary_tx = ctx.Pipe(duplex=False)
    try:
        for url in urls:
            _wait_ready(url)
        canary = ctx.Process(target=_canary, args=(args.duration, canary_tx), daemon=True)
        canary.start()
        ru0, cpu0, wall0 = resource.getrusage(resource.RUSAGE_SELF), time.process_time(), time.perf_counter()
        per_stream = _replay_streams(args, urls, reqs)
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        canary_ms = canary_rx.recv()
        canary.join(10)
    finally:
        for server in servers:
            server.terminate()
            server.join(10)
    records = [r for stream in per_stream for r in stream]
    env["loadavg_1_5_15_after"] = os.getloadavg()
    env["cpu_pressure_after"] = _cpu_pressure()
    env["sleep_5ms_wake_delay_ms_before"] = _delay_summary(idle_probe)
    env["sleep_5ms_wake_delay_ms_during"] = _delay_summary(canary_ms)
    s = summarize_records(records)
    spreads = burst_spreads_ms(records) if args.streams == 1 else burst_spreads_ms(per_stream[0])
    fraction = s["achieved_rate_rps"] / s["offered_rate_rps"]
    met = fraction >= TARGET_RATE_FRACTION and s["lateness_ms"]["p99"] <= LATENESS_TARGET_P99_MS
    doc = {
        "schema_version": SCHEMA_VERSION, "tool": "loadgen.bench", "environment": env,
        "config": {**vars(args), "out": str(args.out), "server": "loadgen.fakeserver in a separate process"
                   + (" per stream" if args.streams > 1 else "")},
        "results": {
            **{k: s[k] for k in ("requests", "completed", "failed", "offered_rate_rps", "achieved_rate_rps",
                                 "peak_in_flight", "lateness_ms", "ttft_ms", "tpot_ms", "top_errors")},
            "achieved_fraction": fraction,
            "burst_send_spread_ms": _delay_summary(spreads) if spreads else None,
            "client_cpu_s": {"process_time": cpu, "user": ru1.ru_utime - ru0.ru_utime,
                             "system": ru1.ru_stime - ru0.ru_stime},
            "client_cpu_per_wall": cpu / wall, "wall_s": wall,
            # preemptions of the client by other processes: high on a busy machine
            "client_context_switches": {"voluntary": ru1.ru_nvcsw - ru0.ru_nvcsw,
                                        "involuntary": ru1.ru_nivcsw - ru0.ru_nivcsw},
            "targets": {"achieved_fraction_min": TARGET_RATE_FRACTION,
                        "lateness_p99_ms_max": LATENESS_TARGET_P99_MS, "met": met},
        },
        "samples": {"lateness_ms": [lateness_ms(r) for r in records],
                    "ttft_ms": [ttft_ms(r) for r in records],
                    "burst_send_spread_ms": spreads,
                    "canary_sleep_5ms_wake_delay_ms": canary_ms},
    }
    if args.streams > 1:
        doc["results"]["per_stream_lateness_ms"] = [
            {**percentiles([lateness_ms(r) for r in st]), "max": max(lateness_ms(r) for r in st)}
            for st in per_stream]
        doc["results"]["pair_send_gap_ms"] = _delay_summary(pair_send_gaps_ms(per_stream))
        doc["samples"]["stream"] = [k for k, st in enumerate(per_stream) for _ in st]
    return doc


def pair_send_gaps_ms(per_stream: list[list]) -> list[float]:
    """Per request index sent by every stream: latest send - earliest send across the streams (ms),
    how far apart the 'same' request reached the servers."""
    sent = [{r.index: r.sent_ns for r in st if r.sent_ns is not None} for st in per_stream]
    common = set.intersection(*(set(s) for s in sent))
    return [(max(s[i] for s in sent) - min(s[i] for s in sent)) / 1e6 for i in sorted(common)]


def burst_spreads_ms(records: list) -> list[float]:
    """For every due time shared by several requests: last send - first send (ms)."""
    sends: dict[int, list[int]] = {}
    for r in records:
        if r.sent_ns is not None:
            sends.setdefault(r.due_ns, []).append(r.sent_ns)
    return [(max(v) - min(v)) / 1e6 for v in sends.values() if len(v) > 1]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadgen.bench", description=(
        "Replay a synthetic schedule against a local fake streaming server (separate process) and "
        "report achieved rate, send lateness and client CPU as JSON with raw samples."))
    p.add_argument("--rate", type=float, default=200.0, help="requests per second (200)")
    p.add_argument("--duration", type=float, default=30.0, help="schedule length in seconds (30)")
    p.add_argument("--arrivals", choices=("constant", "poisson", "bursty"), default="constant",
                   help="evenly spaced or Poisson arrivals at --rate, or bursts of --burst requests at one "
                        "timestamp every --tick-s (constant)")
    p.add_argument("--burst", type=int, default=20, help="bursty: requests per tick (20)")
    p.add_argument("--tick-s", type=float, default=3.0, help="bursty: seconds between ticks (3)")
    p.add_argument("--speedup", type=float, default=1.0,
                   help="replay the schedule this many times faster; --duration stays the replay's "
                        "length (1)")
    p.add_argument("--tokens", type=int, default=32, help="tokens streamed per request (32)")
    p.add_argument("--input-tokens", type=int, default=512, help="prompt length in tokens (512)")
    p.add_argument("--ttft-ms", type=float, default=10.0, help="fake server: delay to the first token (10)")
    p.add_argument("--itl-ms", type=float, default=10.0, help="fake server: delay between tokens (10)")
    p.add_argument("--port", type=int, default=18431, help="port of the fake server on 127.0.0.1 (18431)")
    p.add_argument("--seed", type=int, default=0, help="seed of Poisson arrivals and prompts (0)")
    p.add_argument("--streams", type=int, default=1,
                   help="replay the schedule to this many fake servers at once, from one t0 (1)")
    p.add_argument("--threads", action="store_true",
                   help="with --streams: one thread and event loop per stream instead of one shared loop")
    p.add_argument("--event-loop", choices=EVENT_LOOPS, default="asyncio", help="client event loop (asyncio)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT,
                   help="result JSON, xz if named .xz (default: loadgen/results/bench-cpu.json.xz, the "
                        "committed evidence)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.streams < 1:
        build_parser().error(f"--streams must be >= 1, got {args.streams}")
    if args.event_loop != "asyncio" and (args.streams > 1 or args.threads):
        build_parser().error("--streams/--threads run on the asyncio event loop only")
    try:
        args.out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        build_parser().error(f"--out {args.out}: cannot create its folder: {exc.strerror or exc}")
    problem = output_problem("--out", args.out)  # before the 30 s of benchmark, not after
    if problem:
        build_parser().error(problem)
    doc = run_bench(args)
    write_json(args.out, doc, allow_nan=True)  # xz where the name ends in .xz
    r = doc["results"]
    la = r["lateness_ms"]
    print(f"{r['requests']} requests, {r['completed']} completed, {r['failed']} failed; "
          f"rate offered {r['offered_rate_rps']:.2f}/s achieved {r['achieved_rate_rps']:.2f}/s "
          f"({100 * r['achieved_fraction']:.2f}%); lateness p50 {la['p50']:.3f} p99 {la['p99']:.3f} "
          f"max {la['max']:.3f} ms; a bare sleep(5 ms) process woke late by p99 "
          f"{doc['environment']['sleep_5ms_wake_delay_ms_during']['p99']:.2f} max "
          f"{doc['environment']['sleep_5ms_wake_delay_ms_during']['max']:.1f} ms during the run; "
          f"client CPU {r['client_cpu_s']['process_time']:.1f} s over "
          f"{r['wall_s']:.1f} s; targets met: {r['targets']['met']}; "
          f"load average before/after {doc['environment']['loadavg_1_5_15_before'][0]:.1f}/"
          f"{doc['environment']['loadavg_1_5_15_after'][0]:.1f}")
    if args.streams > 1:
        gap = r["pair_send_gap_ms"]
        print("per stream lateness p50/p99/max: " + "; ".join(
            f"{p['p50']:.3f}/{p['p99']:.3f}/{p['max']:.2f} ms" for p in r["per_stream_lateness_ms"])
            + f"; same request sent to the streams apart by p50 {gap['p50']:.3f} p99 {gap['p99']:.3f} "
              f"max {gap['max']:.2f} ms")
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
