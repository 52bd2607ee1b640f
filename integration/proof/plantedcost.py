"""What the planted control really adds per norm call inside a CUDA graph, measured on the GPU.

The planted arm (integration/plantedprovider.py) runs the fused kernel built to spin N ns in each call
(kernels.rmsnorm.planted). This module measures that the way a decode step runs it, in isolation: a
CUDA graph of `calls` consecutive fused rms_norm calls of [rows, hidden] bf16, plain and planted
builds, replayed many times, interleaved. The added time per call is the difference of per-call
medians, with every raw sample kept. What a whole step in vLLM gains is measured by
integration.proof.prove --planted (graph-steps), which the prediction prefers.

    python -m integration.proof.plantedcost --ns 200,500,1000 --out runtime_tables/h200-planted-cost.json

experiments/ reads the result through `added_us_per_call(gpu, ns)` (versioned), to predict what a
planted arm should change where no step measurement exists.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

import runtime_tables
from common.cliargs import refuse_output
from common.jsonfile import ResultFileError, read_json, write_json

SCHEMA_VERSION = 2  # 1 measured a separate spin kernel after each stock norm (no longer the arm)
TABLES_DIR = runtime_tables.DIR  # where a GPU's measurement is read from (the runtime_tables package)
CALLS = 65  # norm calls per decode step of the 8B Llama shape (2 x 32 layers + the final norm)


def result_path(gpu: str) -> Path:
    """Where the measurement for a GPU (short name, e.g. h200) is kept."""
    return TABLES_DIR / f"{gpu}-planted-cost.json"


def added_us_per_call(gpu: str | None, ns: int, path: Path | None = None) -> float | None:
    """The measured in-graph cost (us) that a planted delay of `ns` adds per norm call on `gpu`;
    None where no measurement of that delay exists. ResultFileError for a damaged file."""
    path = path or (result_path(gpu) if gpu else None)
    if path is None or not path.is_file():
        return None
    rows = read_json(path, SCHEMA_VERSION, "planted-cost measurement").get("delays")
    if not isinstance(rows, list):
        raise ResultFileError(f"{path}: expected a 'delays' list")
    for i, row in enumerate(rows):
        try:
            if int(row["ns"]) == ns:
                return float(row["added_us_per_call"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ResultFileError(f"{path}: delays[{i}]: need ns and added_us_per_call ({exc!r})") from None
    return None


def measure(ns_list: Sequence[int], rows: int = 32, hidden: int = 4096, calls: int = CALLS,
             samples: int = 200) -> dict:
    """Per-call graph replay time of the fused kernel, plain and planted builds (GPU only)."""
    import torch

    from kernels import rmsnorm
    from kernels.plantedbounds import check_ns
    from kernels.timing import capture

    for ns in ns_list:
        check_ns(ns)
    x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
    outs = [torch.empty_like(x) for _ in range(calls)]

    def call(i: int) -> None:
        rmsnorm.rms_norm(x, w, 1e-6, out=outs[i % calls])

    graphs = {"fused": capture(call, calls)}
    for ns in ns_list:
        with rmsnorm.planted(ns):
            graphs[f"planted:{ns}"] = capture(call, calls)
    for g in graphs.values():  # warm the clocks
        for _ in range(20):
            g.replay()
    events = {k: [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(samples)] for k in graphs}
    for s in range(samples):  # interleaved: every graph once per round
        for k, g in graphs.items():
            start, end = events[k][s]
            start.record()
            g.replay()
            end.record()
    torch.cuda.synchronize()
    raw = {k: [a.elapsed_time(b) * 1000.0 / calls for a, b in events[k]] for k in graphs}
    base = statistics.median(raw["fused"])
    delays = [{"ns": ns, "added_us_per_call": statistics.median(raw[f"planted:{ns}"]) - base,
               "planted_us_per_call_p50": statistics.median(raw[f"planted:{ns}"])} for ns in ns_list]
    return {"schema_version": SCHEMA_VERSION, "rows": rows, "hidden": hidden, "dtype": "bf16",
            "calls_per_graph": calls, "samples": samples, "fused_us_per_call_p50": base,
            "delays": delays, "raw_us_per_call": raw,
            "gpu": torch.cuda.get_device_name(torch.cuda.current_device())}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m integration.proof.plantedcost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ns", required=True, help="planted delays to measure, comma-separated ns (e.g. 200,500)")
    p.add_argument("--rows", type=int, default=32, help="rows per norm call (decode tokens; default 32)")
    p.add_argument("--hidden", type=int, default=4096, help="hidden size (default 4096, the 8B shape)")
    p.add_argument("--samples", type=int, default=200, help="graph replays per arm (default 200)")
    p.add_argument("--out", type=Path, required=True, help="JSON result file to write")
    args = p.parse_args(argv)
    refuse_output(p.prog, "--out", args.out)
    try:
        ns_list = [int(v) for v in args.ns.split(",") if v.strip()]
    except ValueError:
        p.error(f"--ns {args.ns!r}: expected comma-separated integers")
    from kernels.environment import gpu_missing

    if gpu_missing(p.prog):
        return 2
    result = measure(ns_list, rows=args.rows, hidden=args.hidden, samples=args.samples)
    words = sys.argv[1:] if argv is None else argv
    result["command"] = ["python", "-m", "integration.proof.plantedcost", *words]
    write_json(args.out, result)
    for d in result["delays"]:
        print(f"planted {d['ns']} ns: +{d['added_us_per_call']:.3f} us per call in a graph "
              f"(fused kernel alone {result['fused_us_per_call_p50']:.3f} us per call)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
