"""What a server start and a sleep-mode switch cost on this GPU, for choosing a resident layout.

    python -m research.startcost --model integration/models/llama-3.1-8b --kv-gib 7 --out OUT.json

Stock servers of one model with the same explicit KV cache, on one GPU, in this order:

1. one server alone, its compile cache as it finds it (cold on a fresh machine);
2. two more at once beside it (three resident: whether they fit, and a wave's start with a warm cache);
3. a decode probe on the first server (16 requests at once, 512 prompt and 128 output tokens) while
   the other two idle, then the two stopped;
4. one server with `--enable-sleep-mode` (VLLM_SERVER_DEV_MODE=1) beside the first: its start, then
   `--cycles` rounds of probe, POST /sleep?level=1, the GPU's used memory, POST /wake_up, probe.

Every start's seconds to healthy, every sleep and wake's seconds, the GPU's used memory after each
stage (nvidia-smi) and every probe's raw inter-token intervals go into OUT.json. Needs CUDA and vLLM.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from common.cliargs import command_line
from common.jsonfile import write_json
from integration import arms
from integration.launcher import ServerConfig, VllmServer, free_port
from loadgen.replay import ReplayOptions, replay_sync
from traces.trace import TraceRequest

SCHEMA_VERSION = 1
GIB = 1 << 30
PROBE = [TraceRequest(0.0, 512, 128) for _ in range(16)]


def used_mib() -> int:
    """The GPU's used memory (MiB), from nvidia-smi."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


def server(args: argparse.Namespace, log_dir: Path, name: str, sleep_mode: bool = False) -> VllmServer:
    cfg = ServerConfig(Path(args.model), arms.get("stock"), free_port(), dtype="bfloat16",
                       gpu_memory_utilization=args.utilization, kv_cache_memory_bytes=args.kv_gib * GIB,
                       max_model_len=16384,
                       extra_args=("--enable-sleep-mode",) if sleep_mode else (),
                       extra_env=(("VLLM_SERVER_DEV_MODE", "1"),) if sleep_mode else ())
    return VllmServer(cfg, log_dir / f"{name}.log")


def start(servers: list[VllmServer]) -> list[float]:
    """Start `servers` at once; each one's seconds to healthy."""
    t0 = time.monotonic()
    for s in servers:
        s.start()
    out = []
    for s in servers:
        s.wait_healthy(900)
        out.append(round(time.monotonic() - t0, 2))
    return out


def probe(s: VllmServer, seed: int) -> dict:
    """The probe's inter-token intervals (us) and their median."""
    recs = replay_sync(f"{s.url}/v1", PROBE, ReplayOptions(seed=seed, progress=False, vocab_size=128000))
    itl = [x for r in recs for x in (r.itl_us or [])]
    median = statistics.median(itl) if itl else None
    return {"ok": sum(r.status == 200 for r in recs), "itl_median_us": median, "itl_us": itl}


def post(s: VllmServer, path: str) -> float:
    """POST `path` on the server; its seconds."""
    t0 = time.monotonic()
    urllib.request.urlopen(urllib.request.Request(f"{s.url}{path}", method="POST"), timeout=300).read()
    return round(time.monotonic() - t0, 3)


def run(args: argparse.Namespace) -> dict:
    log_dir = Path(args.out).with_suffix("")
    out: dict = {"schema_version": SCHEMA_VERSION, "command": command_line("python -m research.startcost"),
                 "model": Path(args.model).name, "kv_cache_bytes": args.kv_gib * GIB,
                 "gpu_memory_utilization": args.utilization, "used_mib": {"before": used_mib()}}
    first = server(args, log_dir, "first")
    out["first_ready_s"] = start([first])[0]
    out["used_mib"]["one"] = used_mib()
    pair = [server(args, log_dir, f"wave-{i}") for i in range(2)]
    try:
        out["wave_of_two_ready_s"] = start(pair)
        out["used_mib"]["three"] = used_mib()
        out["probe_three_resident"] = probe(first, 1)
    finally:
        for s in pair:
            s.stop()
    sleeper = server(args, log_dir, "sleep-mode", sleep_mode=True)
    try:
        out["sleep_mode_ready_s"] = start([sleeper])[0]
        cycles = []
        for k in range(args.cycles):
            c = {"probe_awake": probe(sleeper, 10 + k), "sleep_s": post(sleeper, "/sleep?level=1"),
                 "used_mib_asleep": used_mib(), "probe_other_while_asleep": probe(first, 20 + k)}
            c["wake_s"] = post(sleeper, "/wake_up")
            c["used_mib_awake"] = used_mib()
            c["probe_after_wake"] = probe(sleeper, 30 + k)
            cycles.append(c)
        out["sleep_cycles"] = cycles
    finally:
        sleeper.stop()
        first.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m research.startcost", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="model directory (config.json; random weights)")
    p.add_argument("--kv-gib", type=int, default=7, help="KV cache of every server, GiB (default 7)")
    p.add_argument("--utilization", type=float, default=0.31, help="--gpu-memory-utilization of each")
    p.add_argument("--cycles", type=int, default=3, help="sleep/wake rounds (default 3)")
    p.add_argument("--out", required=True, help="JSON written here; server logs beside it")
    args = p.parse_args(argv)
    write_json(Path(args.out), run(args))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
