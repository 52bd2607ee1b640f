"""The process kernels.counters runs under ncu: every measured call inside its own profiler range.

Per measurement (arm, op, rows, hidden): a first call outside any range (compiles, autotunes), then
`counters_marker` (grid: id + 1 blocks) in a range, one call outside (it warms L2 for the warm run),
and the measured call in a range. `ncu --profile-from-start off` profiles only the ranges.
"""

from __future__ import annotations

import hashlib
import math
import os
import sys
from pathlib import Path
from typing import Callable

import runtime_tables
from common.jsonfile import read_json, stored
from kernels.policy import calls_out, load_policy

EPS = 1e-6
VLLM_SO_ENV = "COUNTERS_VLLM_SO"  # path of vLLM's _C_stable_libtorch.abi3.so where vllm is not importable
VLLM_CUBIN_ENV = "COUNTERS_VLLM_CUBIN"  # or its sm_90 cubin of the layernorm kernels (cuobjdump -xelf)
# vLLM 0.26.0's bf16 kernels as its cubin names them (csrc/libtorch_stable/layernorm_kernels.cu)
RMS_KERNEL = "_ZN4vllm15rms_norm_kernelIN3c108BFloat16ELi{vec}ELi2ELb1EEEvPT_PKS3_lllllS6_lfii"
_ADD = ("_ZN4vllm25fused_add_rms_norm_kernelIN3c108BFloat16ELi{w}ELb1EEENSt9enable_ifIX{cond}EvE4type"
        "EPS4_lS7_PKS4_fii")
ADD_KERNEL = {8: _ADD.format(w=8, cond="aagtT0_Li0Esr4vllm12_typeConvertIT_EE6exists"),
              0: _ADD.format(w=0, cond="ooeqT0_Li0Entsr4vllm12_typeConvertIT_EE6exists")}
POLICY_FILE = runtime_tables.path("policy-h200.json")


def bench_file() -> Path:
    """The per-call figures of the benchmark POLICY_FILE was built from (kernel-calls-h200.json beside it,
    whose `source` names the benchmark)."""
    return calls_out(POLICY_FILE)


def fused_variant(op: str, rows: int, hidden: int, policy, bench_rows: list[dict]) -> tuple[str | None, str]:  # noqa: ANN001
    """(variant or None for the automatic shape, where it came from) for the fused arm."""
    choice = policy.choose(op, "bf16", rows, hidden)
    if choice.startswith("fused:"):
        return choice.split(":", 1)[1], "policy"
    key = (op, "bf16", rows, hidden)
    row = next((r for r in bench_rows if (r["op"], r["dtype"], r["rows"], r["hidden"]) == key), None)
    if row is not None:
        return row["variant"], "fastest candidate (policy: stock)"
    return None, "automatic shape (no policy entry)"


def planned_measurements(rows: list[int], hidden: list[int], arms: list[str], policy,  # noqa: ANN001
                         bench_rows: list[dict]) -> list[dict]:
    """The measurements, numbered: every arm (torch: rms_norm only) at every (op, hidden, rows), bf16."""
    out = []
    for op in ("rms_norm", "fused_add_rms_norm"):
        for h in hidden:
            for n in rows:
                for arm in arms:
                    if arm == "torch" and op != "rms_norm":
                        continue
                    m = {"id": len(out), "arm": arm, "op": op, "dtype": "bf16", "itemsize": 2, "rows": n,
                         "hidden": h, "variant": None, "variant_source": None}
                    if arm == "fused":
                        m["variant"], m["variant_source"] = fused_variant(op, n, h, policy, bench_rows)
                    out.append(m)
    return out


def load_vllm() -> tuple[tuple, dict]:
    """vLLM's (rms_norm, fused_add_rms_norm) ops and where they came from: `import vllm`, else the
    shared library named by $COUNTERS_VLLM_SO (the vLLM wheel's, loaded by path)."""
    import torch

    from kernels import stock

    rms, add, err = stock.vllm_ops()
    if rms is not None:
        return (rms, add), {"source": "import vllm", "vllm": stock.vllm_version()}
    path = os.environ.get(VLLM_SO_ENV)
    if not path and os.environ.get(VLLM_CUBIN_ENV):
        return cubin_ops(os.environ[VLLM_CUBIN_ENV])
    if not path:
        return (None, None), {"error": err}
    try:
        torch.ops.load_library(path)
        ops = (torch.ops._C.rms_norm, torch.ops._C.fused_add_rms_norm)
    except Exception as exc:  # recorded, the arm left out
        return (None, None), {"error": f"{err}; {path}: {type(exc).__name__}: {exc}"}
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return ops, {"source": f"torch.ops.load_library({Path(path).name})", "sha256": digest}


def vllm_launch(op: str, rows: int, hidden: int, stride: int, aligned16: bool) -> tuple[str, int, int]:
    """(kernel name, grid, block) as vLLM's host code launches its bf16 kernel for contiguous 2-D rows."""
    max_block = 1024 if rows < 256 else 256
    if op == "rms_norm":
        vec = math.gcd(8, hidden)
        return RMS_KERNEL.format(vec=vec), rows, min(hidden // vec, max_block)
    width = 8 if aligned16 and hidden % 8 == 0 and stride % 8 == 0 else 0
    return ADD_KERNEL[width], rows, min(hidden, max_block)


def cubin_ops(path: str) -> tuple[tuple, dict]:
    """vLLM's bf16 kernels from its cubin, launched with vLLM's grid, block and arguments."""
    import cupy
    import numpy as np

    module = cupy.RawModule(path=path)
    i64, i32 = np.int64, np.int32

    def ptr(t) -> np.uint64:  # noqa: ANN001
        return np.uint64(t.data_ptr())

    def rms(out, x, w, eps):  # noqa: ANN001, ANN202
        name, grid, block = vllm_launch("rms_norm", x.shape[0], x.shape[1], x.stride(0), True)
        args = (ptr(out), ptr(x), i64(x.stride(0)), i64(0), i64(0), i64(0), i64(0), ptr(w), i64(0),
                np.float32(eps), i32(x.shape[0]), i32(x.shape[1]))
        module.get_function(name)((grid,), (block,), args)

    def add(x, r, w, eps):  # noqa: ANN001, ANN202
        aligned = all(t.data_ptr() % 16 == 0 for t in (x, r, w))
        name, grid, block = vllm_launch("fused_add_rms_norm", x.shape[0], x.shape[1], x.stride(0), aligned)
        args = (ptr(x), i64(x.stride(0)), ptr(r), ptr(w), np.float32(eps), i32(x.shape[0]), i32(x.shape[1]))
        module.get_function(name)((grid,), (block,), args)

    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return (rms, add), {"source": f"vLLM's sm_90 cubin {Path(path).name}, launched as vLLM's host code does",
                        "sha256": digest}


def _call(m: dict, vllm: tuple, x, r, w, out) -> Callable[[], object]:  # noqa: ANN001
    import torch

    from kernels import rmsnorm, stock

    fused_add = m["op"] == "fused_add_rms_norm"
    arm, h = m["arm"], m["hidden"]
    if arm == "fused":
        if fused_add:
            return lambda: rmsnorm.fused_add_rms_norm(x, r, w, EPS, variant=m["variant"])
        return lambda: rmsnorm.rms_norm(x, w, EPS, out=out, variant=m["variant"])
    if arm == "vllm_c":
        return (lambda: vllm[1](x, r, w, EPS)) if fused_add else (lambda: vllm[0](out, x, w, EPS))
    if arm == "inductor":
        comp = stock.inductor(m["op"], x.dtype, h)
        return (lambda: comp(x, r, w, EPS)) if fused_add else (lambda: comp(x, w, EPS))
    return lambda: torch.nn.functional.rms_norm(x, (h,), w, EPS)


def run(measurements: list[dict], log: Callable[[str], None]) -> dict:
    """Run every measurement (module docstring); returns what the manifest records of this process."""
    import cupy
    import torch

    from kernels import stock
    from kernels.environment import clocks, describe
    from kernels.shapes import auto_shape, vector_width

    vllm, vllm_info = load_vllm()
    if vllm[0] is None:
        measurements = [m for m in measurements if m["arm"] != "vllm_c"]
        log(f"vLLM's CUDA kernels left out: {vllm_info['error']}")
    marker = cupy.RawKernel(f'extern "C" __global__ void {_marker_name()}() {{}}', _marker_name())
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for op, h in sorted({(m["op"], m["hidden"]) for m in measurements if m["arm"] == "inductor"}):
        stock.prepare_inductor(op, torch.bfloat16, h)
    env = describe(vllm_info.get("vllm"))
    env["clocks_before"] = clocks()
    torch.manual_seed(0)  # the same inputs in the cold and the warm run
    for m in measurements:
        x = torch.randn(m["rows"], m["hidden"], device="cuda").to(torch.bfloat16)
        r = torch.randn_like(x)
        w = (1 + 0.5 * torch.randn(m["hidden"], device="cuda")).to(torch.bfloat16)
        out = torch.empty_like(x)
        if m["arm"] == "inductor":
            stock.mark_rows_dynamic(x, r)
        if m["arm"] == "fused" and m["variant"] is None:
            vec = vector_width(2, [m["hidden"]], [x.data_ptr(), r.data_ptr(), w.data_ptr()])
            m["variant"] = auto_shape(m["rows"], m["hidden"], vec, sms).name
        call = _call(m, vllm, x, r, w, out)
        x0, r0 = x.clone(), r.clone()
        got = call()
        torch.cuda.synchronize()
        m["max_abs_err"] = _error(m, got, x, out, x0, r0, w)
        torch.cuda.profiler.start()
        marker((m["id"] + 1,), (32,), ())
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        call()  # the warm run's L2 state: this call's rows were just read and written
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        call()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        log(f"{m['id']:3d} {m['arm']:8s} {m['op']:18s} {m['rows']:6d}x{m['hidden']}")
        del x, r, w, out
    env["clocks_after"] = clocks()
    return {"measurements": measurements, "environment": env, "vllm_c": vllm_info}


def _error(m: dict, got, x, out, x0, r0, w) -> float:  # noqa: ANN001
    """Max |output - vLLM's native formula| of the first call: each arm computed the norm."""
    from kernels import stock

    if m["op"] == "rms_norm":
        want = stock.rms_native(x0, w, EPS)
        have = out if m["arm"] in ("fused", "vllm_c") else got
    else:
        want = stock.add_rms_native(x0, r0, w, EPS)[0]
        have = got[0] if m["arm"] == "inductor" else x
    return float((have.float() - want.float()).abs().max())


def _marker_name() -> str:
    from kernels.ncu import MARKER

    return MARKER


def main(manifest: str, rows: list[int], hidden: list[int], arms: list[str]) -> int:
    """Plan, run, write the manifest (JSON) kernels.counters reads back."""
    import json

    bench = bench_file()
    bench_rows = read_json(bench, None, "kernel results")["bench"] if stored(bench).is_file() else []
    measurements = planned_measurements(rows, hidden, arms, load_policy(POLICY_FILE), bench_rows)
    result = run(measurements, lambda s: print(s, file=sys.stderr, flush=True))
    result.update(policy_file=POLICY_FILE.name, bench_file=bench.name if bench_rows else None)
    Path(manifest).write_text(json.dumps(result, indent=1))
    return 0
