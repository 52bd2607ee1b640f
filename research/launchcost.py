"""CPU cost of one fused-norm call outside a CUDA graph, layer by layer of its call path.

    python -m research.launchcost --out OUT/launch-cost.json

Above vLLM's CUDA-graph sizes every norm call of the patched arm runs through Python: the op
(torch.ops.rmsnorm_fused.fused_add_rms_norm, torch.library.Library define/impl), integration.ops
(policy answer, counters), kernels.rmsnorm (launch-plan lookup) and the prebuilt launch
(cuLaunchKernelEx, or CuPy where cuda-bindings is missing). This times each layer on the CPU:
batches of calls with the GPU work queued, perf_counter_ns around the batch, a synchronize after it
(outside the timing); rows=1 keeps the GPU far ahead of the CPU, so a batch measures launch cost.
Every layer runs under torch.inference_mode(), as vLLM's model runner calls the model
(execute_model is decorated with it), except `library_op_grad_mode`, the same op call with autograd's
dispatch keys in the way, for reference. `library_op_default` calls the op's overload
(`.default`), as the code Inductor generates does; `library_op` the overload packet, as Python code
does. A plain PyTorch in-place add is the reference for one aten kernel launch. It also writes the
cProfile of one batch through the custom op. Needs CUDA and CuPy; every sample is kept.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from typing import Callable

import torch

from common.cliargs import command_line, refuse_output
from common.jsonfile import write_json


def _layers(x: torch.Tensor, res: torch.Tensor, w: torch.Tensor,
            eps: float) -> dict[str, Callable[[], object]]:
    from integration import ops
    from kernels import rmsnorm

    rmsnorm.fused_add_rms_norm(x, res, w, eps)  # makes the plan
    before = set(rmsnorm.PLANS._plans)
    rmsnorm.fused_add_rms_norm(x, res, w, eps, variant="t512r1p")
    (pdl_key,) = set(rmsnorm.PLANS._plans) - before
    launch = rmsnorm.PLANS.get(pdl_key)
    xp, rp, wp = x.data_ptr(), res.data_ptr(), w.data_ptr()
    op = torch.ops.rmsnorm_fused.fused_add_rms_norm
    return {
        "library_op_default": lambda: op.default(x, res, w, eps),
        "library_op": lambda: op(x, res, w, eps),
        "integration_ops": lambda: ops.run_fused_add_rms_norm(x, res, w, eps, "compiled"),
        "kernels_rmsnorm": lambda: rmsnorm.fused_add_rms_norm(x, res, w, eps),
        "kernels_rmsnorm_pdl": lambda: rmsnorm.fused_add_rms_norm(x, res, w, eps, variant="t512r1p"),
        "prebuilt_launch_only": lambda: launch(0, xp, rp, wp, eps),
        "aten_add_reference": lambda: x.add_(res),
    }


def time_batches(fn: Callable[[], object], calls: int, batches: int, inference: bool = True) -> list[float]:
    """Per-call CPU microseconds of each batch of `calls` calls (under torch.inference_mode() unless
    `inference` is False)."""
    out = []
    with torch.inference_mode(inference):
        for _ in range(batches):
            torch.cuda.synchronize()
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                fn()
            out.append((time.perf_counter_ns() - t0) / 1e3 / calls)
        torch.cuda.synchronize()
    return out


def profile_text(fn: Callable[[], object], calls: int, top: int = 25) -> str:
    """cProfile of `calls` calls, sorted by cumulative time."""
    prof = cProfile.Profile()
    with torch.inference_mode():
        prof.enable()
        for _ in range(calls):
            fn()
        prof.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(top)
    return buf.getvalue()


def measure(rows: int, hidden: int, calls: int, batches: int) -> dict:
    """Per-layer samples at one shape (bf16, 16-byte aligned, contiguous: what vLLM passes)."""
    g = torch.Generator(device="cuda").manual_seed(rows)
    x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16, generator=g)
    res = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.ones(hidden, device="cuda", dtype=torch.bfloat16)
    layers = _layers(x, res, w, 1e-5)
    for fn in layers.values():  # builds, caches, first-call costs
        time_batches(fn, 20, 1)
    samples = {name: time_batches(fn, calls, batches) for name, fn in layers.items()}
    samples["library_op_grad_mode"] = time_batches(layers["library_op"], calls, batches, inference=False)
    return {"rows": rows, "hidden": hidden, "dtype": "bf16", "calls_per_batch": calls,
            "per_call_us": samples,
            "median_per_call_us": {k: sorted(v)[len(v) // 2] for k, v in samples.items()},
            "cprofile_library_op_default": profile_text(layers["library_op_default"], calls)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m research.launchcost", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="JSON file for the samples and the cProfile text")
    p.add_argument("--rows", default="1,2048", help="row counts (comma list; default 1,2048)")
    p.add_argument("--hidden", type=int, default=4096, help="hidden size (default 4096, the 8B shape)")
    p.add_argument("--calls", type=int, default=200, help="calls per timed batch (default 200)")
    p.add_argument("--batches", type=int, default=15, help="timed batches per layer (default 15)")
    a = p.parse_args(argv)
    refuse_output(p.prog, "--out", a.out)
    from kernels import environment as kernel_env

    if kernel_env.gpu_missing(p.prog):
        return 2

    shapes = [measure(int(r), a.hidden, a.calls, a.batches) for r in a.rows.split(",") if r]
    from kernels import launch

    doc = {"schema_version": 3, "launch_route": launch.route(), "goal_us_per_fused_call": 12.0,
           "command": command_line(p.prog, argv),
           "torch": torch.__version__, "gpu": kernel_env.smi("name,driver_version"), "shapes": shapes}
    write_json(a.out, doc, allow_nan=True)
    for s in shapes:
        print(f"rows={s['rows']}: "
              + ", ".join(f"{k} {v:.1f} us" for k, v in s["median_per_call_us"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
