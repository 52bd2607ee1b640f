"""Benchmark the fused kernel against the stock arms over the (op, dtype, rows, hidden) grid.

Per shape: every arm is captured as a CUDA graph of many launches over rotating buffers (working
set above L2 where memory allows; `--l2 warm`: one buffer set, so every call finds its input in L2
as a norm right after a GEMM does inside a model), then replayed in two rounds of 8 timed replays, arms in a
seeded random order per round. The fused arms are the launch-shape candidates of the shape
(kernels.shapes.candidates: 1, 2 and 4 vectors per thread, from 256 rows on also the staged
builds with 4 and 8, each with and without programmatic dependent launch up to 1024 rows); the
row's variant is the fastest of them by median, and every candidate's samples are kept. The
run-to-run spread of an arm is the gap between its two rounds' medians.

    python -m kernels.bench --out bench.json [--quick] [--l2 warm]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from typing import Callable

import torch

from common.cliargs import command_line, refuse_output
from common.jsonfile import write_json
from kernels import rmsnorm, stock
from kernels.cases import TORCH_DTYPES
from kernels.environment import gpu_missing, width_list
from kernels.shapes import LaunchShape, auto_shape, candidates, vector_width
from kernels.timing import capture, copy_bandwidth, replay_us

EPS = 1e-6
ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
HIDDEN = (2048, 4096, 5120, 8192)
SUBSET_ROWS = (1, 16, 128, 1024, 8192)  # fp16 / fp32 at hidden 4096
# head norms (Qwen3's q/k norm, rms_norm over width 128): rows = tokens x heads, from 1 token x 8 kv
# heads to 8192 tokens x 32 q heads; 512 x 128 is the seed study's case
HEAD_WIDTH = 128
HEAD_ROWS = (8, 32, 64, 256, 512, 1024, 2048, 8192, 32768, 65536, 262144)
OPS = ("rms_norm", "fused_add_rms_norm")
ROUNDS, PER_ROUND = 2, 8  # 16 samples per arm and shape
WORKING_SET_TARGET = 1.5  # x L2 size
MEMORY_CAP = 8 << 30  # bytes of rotating buffers at most
L2_MODES = ("cold", "warm")
COPY_ARM = "copy"  # rms_norm rows: x.clone(), the bytes of the norm without its arithmetic


def grid(quick: bool = False, widths: set[int] | None = None) -> list[tuple[str, str, int, int]]:
    """(op, dtype, rows, hidden): bf16 over the whole grid, fp16/fp32 at hidden 4096 on a subset;
    `widths`: only those hidden sizes (a partial grid, recorded as such by the suite)."""
    if quick:
        return [(op, "bf16", r, 4096) for op in OPS for r in (1, 4096)]
    shapes = [(op, "bf16", r, h) for op in OPS for h in HIDDEN for r in ROWS]
    shapes += [("rms_norm", "bf16", r, HEAD_WIDTH) for r in HEAD_ROWS]
    shapes += [(op, dt, r, 4096) for dt in ("fp16", "fp32") for op in OPS for r in SUBSET_ROWS]
    return [s for s in shapes if widths is None or s[3] in widths]


def bytes_moved(op: str, rows: int, hidden: int, itemsize: int) -> int:
    """Fewest bytes a call must move: read x (and residual), write the output(s), read the weight."""
    tensors = 2 if op == "rms_norm" else 4
    return (tensors * rows * hidden + hidden) * itemsize


def sizing(op: str, rows: int, hidden: int, itemsize: int, l2_bytes: int,
           l2: str = "cold") -> tuple[int, int]:
    """(buffer sets, launches per graph): ~1.5 ms of work per replay; working set > L2 if it fits
    (``l2="cold"``), one buffer set (``"warm"``)."""
    if l2 not in L2_MODES:
        raise ValueError(f"l2 must be one of {L2_MODES}, got {l2!r}")
    per_call = bytes_moved(op, rows, hidden, itemsize)
    est_us = max(1.5, per_call / 3.5e6)
    n_calls = int(min(400, max(8, round(1500 / est_us))))
    if l2 == "warm":
        return 1, n_calls
    nbuf = math.ceil(WORKING_SET_TARGET * l2_bytes / per_call)
    nbuf = max(1, min(nbuf, n_calls, MEMORY_CAP // (2 * rows * hidden * itemsize)))
    return nbuf, n_calls


def _fused_arm(op: str, xs: list, rs: list, w: torch.Tensor, nbuf: int,
               variant: str) -> Callable[[int], object]:
    if op == "rms_norm":
        return lambda i: rmsnorm.rms_norm(xs[i % nbuf], w, EPS, variant=variant)
    return lambda i: rmsnorm.fused_add_rms_norm(xs[i % nbuf], rs[i % nbuf], w, EPS, variant=variant)


def _arms(op: str, x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, nbuf: int,
          variants: list[str], vllm: tuple) -> dict[str, Callable[[int], object]]:
    """Arm name -> call(i): 'fused:<variant>' per candidate, then the stock arms. Every rms_norm arm
    allocates its output per call (from the graph's pool under capture), as vLLM's ops do, so that no
    arm writes a rotating buffer the others don't."""
    xs, rs = list(x.unbind(0)), list(r.unbind(0))
    stock.mark_rows_dynamic(*xs, *rs)
    hidden = x.shape[-1]
    arms: dict[str, Callable[[int], object]] = {f"fused:{v}": _fused_arm(op, xs, rs, w, nbuf, v)
                                                for v in variants}
    comp = stock.inductor(op, x.dtype, hidden)
    if op == "rms_norm":
        arms["inductor"] = lambda i: comp(xs[i % nbuf], w, EPS)
        arms["torch"] = lambda i: torch.nn.functional.rms_norm(xs[i % nbuf], (hidden,), w, EPS)
        arms[COPY_ARM] = lambda i: xs[i % nbuf].clone()  # the same bytes, no arithmetic: not a stock arm
        if vllm[0] is not None:
            arms["vllm_c"] = lambda i: vllm[0](torch.empty_like(xs[i % nbuf]), xs[i % nbuf], w, EPS)
    else:
        arms["inductor"] = lambda i: comp(xs[i % nbuf], rs[i % nbuf], w, EPS)
        if vllm[1] is not None:
            arms["vllm_c"] = lambda i: vllm[1](xs[i % nbuf], rs[i % nbuf], w, EPS)
    return arms


def time_arms(arms: dict[str, Callable[[int], object]], n_calls: int, rng: random.Random) -> dict:
    """{arm: samples_us or error text}: capture each arm, then ROUNDS shuffled rounds of PER_ROUND."""
    graphs, out = {}, {}
    for name, call in arms.items():
        try:
            graphs[name] = capture(call, n_calls)
        except Exception as exc:  # recorded in the row, never dropped
            out[name] = f"{type(exc).__name__}: {exc}"
    samples: dict[str, list[float]] = {n: [] for n in graphs}
    for _ in range(ROUNDS):
        order = sorted(graphs)
        rng.shuffle(order)
        for name in order:
            samples[name] += replay_us(graphs[name], n_calls, PER_ROUND)
    out.update(samples)
    del graphs
    return out


def bench_shape(op: str, dtype: str, rows: int, hidden: int, l2_bytes: int, rng: random.Random,
                vllm: tuple, l2: str = "cold") -> dict:
    """One grid row: every fused candidate's and stock arm's samples, the fastest candidate's
    medians as the row's, roofline left for the caller."""
    tdt = TORCH_DTYPES[dtype]
    isz = torch.empty((), dtype=tdt).element_size()
    nbuf, n_calls = sizing(op, rows, hidden, isz, l2_bytes, l2)
    x = torch.randn(nbuf, rows, hidden, device="cuda").to(tdt)
    r = torch.randn(nbuf, rows, hidden, device="cuda").to(tdt)
    w = (1 + 0.5 * torch.randn(hidden, device="cuda")).to(tdt)
    vec = vector_width(isz, [hidden], [x.data_ptr(), r.data_ptr(), w.data_ptr()])
    variants = [s.name for s in candidates(rows, hidden, vec)]
    auto = auto_shape(rows, hidden, vec).name
    variants += [auto] if auto not in variants else []
    res = time_arms(_arms(op, x, r, w, nbuf, variants, vllm), n_calls, rng)
    copy = res.pop(COPY_ARM, None)
    del x, r
    torch.cuda.empty_cache()
    fused = {k.split(":", 1)[1]: res.pop(k) for k in list(res) if k.startswith("fused:")}
    failed = {k: v for k, v in fused.items() if isinstance(v, str)}
    timed = {k: v for k, v in fused.items() if isinstance(v, list)}
    if not timed:
        raise RuntimeError(f"every fused arm failed at {op} {dtype} {rows}x{hidden}: {failed}")
    best = min(timed, key=lambda k: statistics.median(timed[k]))
    ws = nbuf * bytes_moved(op, rows, hidden, isz)
    med = {k: (statistics.median(v) if isinstance(v, list) else None) for k, v in res.items()}
    return {"op": op, "dtype": dtype, "rows": rows, "hidden": hidden, "variant": best, "auto_variant": auto,
            "pdl": LaunchShape.parse(best).pdl, **summary(timed[best]), "samples_us": timed[best],
            "candidates_us": timed, "candidate_errors": failed, "samples_per_round": PER_ROUND,
            "buffers": nbuf, "launches_per_replay": n_calls, "working_set_bytes": ws,
            "l2": "cold" if ws > l2_bytes else "warm",
            "stock": {f"{k}_us": med.get(k) for k in ("inductor", "vllm_c", "torch")},
            "stock_samples_us": {k: v for k, v in res.items() if isinstance(v, list)},
            "stock_errors": {k: v for k, v in res.items() if isinstance(v, str)},
            **_copy_fields(copy)}


def _copy_fields(copy: list[float] | str | None) -> dict:
    """The same-size copy's samples (rms_norm rows): the launch and latency floor of moving those bytes."""
    if copy is None:
        return {}
    if isinstance(copy, str):
        return {"copy_error": copy}
    return {"copy_us": statistics.median(copy), "copy_samples_us": copy}


def summary(samples: list[float]) -> dict:
    """median, min and max of the samples (microseconds per call)."""
    return {"median_us": statistics.median(samples), "min_us": min(samples), "max_us": max(samples)}


def run(quick: bool, seed: int, vllm: tuple, log: Callable[[str], None] = print,
        widths: set[int] | None = None, l2_mode: str = "cold") -> dict:
    """Copy bandwidth, the grid and the launch-shape study; rows carry roofline_us (no policy yet)."""
    rng = random.Random(seed)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    bw = copy_bandwidth()
    shapes = grid(quick, widths)
    t0 = time.perf_counter()
    for op, dt in sorted({(op, dt) for op, dt, _, _ in shapes}):
        for h in sorted({h for o, d, _, h in shapes if (o, d) == (op, dt)}):
            stock.prepare_inductor(op, TORCH_DTYPES[dt], h)
    graphs = stock.compiled_graphs()
    log(f"inductor arms compiled in {time.perf_counter() - t0:.1f} s ({graphs} graphs)")
    rows = []
    for op, dt, r, h in shapes:
        row = bench_shape(op, dt, r, h, l2, rng, vllm, l2_mode)
        isz = TORCH_DTYPES[dt].itemsize
        row["roofline_us"] = bytes_moved(op, r, h, isz) / bw["bytes_per_s"] * 1e6
        rows.append(row)
        log(f"{op:18s} {dt} {r:6d}x{h:5d} {row['variant']:8s} fused {row['median_us']:8.2f} us  "
            + "  ".join(f"{k[:-3]} {v:8.2f}" for k, v in row["stock"].items() if v is not None))
    bw_after = copy_bandwidth()
    return {"copy_bandwidth": {"before": bw, "after": bw_after}, "bench": rows, "l2_mode": l2_mode,
            "inductor_graphs": {"after_prepare": graphs, "after_bench": stock.compiled_graphs()}}


def main(argv: list[str] | None = None) -> int:
    """CLI: benchmark only (no validation, no policy); see kernels.suite for the full results file."""
    ap = argparse.ArgumentParser(
        prog="python -m kernels.bench", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON file to write (bench rows and copy bandwidth)")
    ap.add_argument("--quick", action="store_true", help="a few shapes only (a smoke test)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the arm order shuffle")
    ap.add_argument("--no-vllm", action="store_true", help="leave out vLLM's CUDA kernels")
    ap.add_argument("--hidden", type=width_list,
                    help="comma list: only these hidden sizes (a partial grid)")
    ap.add_argument("--l2", choices=L2_MODES, default="cold",
                    help="cold (default; the suite's): inputs rotated past 1.5x L2; warm: one input set "
                         "in L2, as after a GEMM")
    args = ap.parse_args(argv)
    refuse_output(ap.prog, "--out", args.out)
    if gpu_missing(ap.prog):
        return 2
    vllm = (None, None, "left out (--no-vllm)") if args.no_vllm else stock.vllm_ops()
    widths = args.hidden
    result = run(args.quick, args.seed, vllm, widths=widths, l2_mode=args.l2)
    result.update(command=command_line(ap.prog, argv), vllm_c_error=vllm[2],
                  grid_widths=sorted(widths) if widths else "all")
    write_json(args.out, result, allow_nan=True, indent=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
