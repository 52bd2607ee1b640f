"""Validate the fused kernels against the float64 reference on the GPU.

    python -m kernels.validate                      # full suite
    python -m kernels.validate --reduced            # small suite (what compute-sanitizer runs)
    python -m kernels.validate --negative-control epsilon   # must FAIL
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter, defaultdict

import torch

from common.jsonfile import write_json
from kernels import rmsnorm
from kernels.cases import (
    EPS,
    INT_VIEW,
    TOLERANCES,
    TORCH_DTYPES,
    Case,
    full_cases,
    guarded,
    make_values,
    make_weight,
    negative_control_cases,
    reduced_cases,
)
from kernels.checks import UnsupportedInput
from kernels.environment import gpu_missing
from kernels.reference import fused_add_rms_norm_ref, rms_norm_ref
from kernels.shapes import LaunchShape


def tolerance_ratio(out: torch.Tensor, ref: torch.Tensor, dtype: str) -> tuple[float, float]:
    """(largest |out-ref| / (atol + rtol |ref|), largest |out-ref|) with ref rounded to `dtype`;
    NaN or inf counts as inf."""
    atol, rtol = TOLERANCES[dtype]
    ref = ref.to(TORCH_DTYPES[dtype]).to(torch.float64)  # the output's own final rounding
    diff = (out.to(torch.float64) - ref).abs()
    diff = torch.where(torch.isfinite(diff), diff, torch.full_like(diff, float("inf")))
    if diff.numel() == 0:
        return 0.0, 0.0
    ratio = diff / (atol + rtol * ref.abs())
    return float(ratio.max()), float(diff.max())


def run_case(case: Case, seed: int, guard: int) -> dict:
    """Run one case; returns its record (passed, errors against both rounding conventions, guards)."""
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(seed)
    rows = case.rows * case.heads
    x_vals = make_values(case.pattern, rows, case.hidden, case.dtype, gen, dev).view(case.shape)
    w = make_weight(case.hidden, case.dtype, gen, dev)
    x = guarded(case, dev, guard)
    x.view.copy_(x_vals)
    bufs = [x]
    try:
        if case.op == "rms_norm":
            out = guarded(case, dev, guard)
            bufs.append(out)
            rmsnorm.rms_norm(x.view, w, EPS, out=out.view, variant=case.variant)
            got = out.view
            refs = {c: rms_norm_ref(x_vals, w, EPS, c) for c in ("vllm", "fp32")}
            res_ok = True
        else:
            r_vals = make_values(case.pattern, rows, case.hidden, case.dtype, gen, dev).view(case.shape)
            res = guarded(case, dev, guard)
            res.view.copy_(r_vals)
            bufs.append(res)
            rmsnorm.fused_add_rms_norm(x.view, res.view, w, EPS, variant=case.variant)
            got = x.view
            refs, stored = {}, None
            for c in ("vllm", "fp32"):
                refs[c], stored = fused_add_rms_norm_ref(x_vals, r_vals, w, EPS, c, "stored")
            res_ok = bool(torch.equal(res.view.view(INT_VIEW[case.dtype]), stored.view(INT_VIEW[case.dtype])))
        torch.cuda.synchronize()
    except UnsupportedInput as exc:
        if case.variant is None:
            raise
        return {"case": case, "applicable": False, "reason": str(exc)}
    ratio, abs_err = tolerance_ratio(got, refs["vllm"], case.dtype)
    alt_ratio, _ = tolerance_ratio(got, refs["fp32"], case.dtype)
    guards_ok = all(b.untouched(INT_VIEW[case.dtype]) for b in bufs)
    passed = ratio <= 1.0 and alt_ratio <= 1.0 and guards_ok and res_ok
    return {"case": case, "applicable": True, "passed": passed, "ratio": ratio, "abs_err": abs_err,
            "alt_ratio": alt_ratio, "guards_ok": guards_ok, "residual_exact": res_ok}


def run_suite(cases: list[Case], seed: int = 0, guard: int = 64, negative: str | None = None) -> dict:
    """Run `cases` (optionally with a negative-control build) and summarise them per dtype."""
    t0 = time.perf_counter()
    records = []
    if negative:
        with rmsnorm.negative_control(negative):
            records = [run_case(c, seed + i, guard) for i, c in enumerate(cases)]
    else:
        records = [run_case(c, seed + i, guard) for i, c in enumerate(cases)]
    return validation_summary(records, time.perf_counter() - t0)


def validation_summary(records: list[dict], seconds: float) -> dict:
    """Counts, failures (first 20 listed) and the largest error per dtype."""
    ran = [r for r in records if r["applicable"]]
    failed = [r for r in ran if not r["passed"]]
    worst: dict[str, dict] = defaultdict(lambda: {"ratio": 0.0, "abs_err": 0.0, "alt_ratio": 0.0})
    for r in ran:
        w = worst[r["case"].dtype]
        for k in ("ratio", "abs_err", "alt_ratio"):
            w[k] = max(w[k], r[k])
    return {
        "cases_run": len(ran), "cases_passed": len(ran) - len(failed),
        "cases_not_applicable": len(records) - len(ran), "passed": not failed and bool(ran),
        "largest_error": {dt: {"tolerance_ratio": v["ratio"], "abs_err": v["abs_err"],
                               "tolerance_ratio_fp32_weight_convention": v["alt_ratio"],
                               "atol": TOLERANCES[dt][0], "rtol": TOLERANCES[dt][1]}
                          for dt, v in sorted(worst.items())},
        "failures": [_describe(r) for r in failed[:20]], "failures_total": len(failed),
        "cases_run_by_family": dict(Counter(build_family(r["case"]) for r in ran)),
        "cases_failed_by_family": dict(Counter(build_family(r["case"]) for r in failed)),
        "seconds": round(seconds, 2),
    }


def build_family(case: Case) -> str:
    """'staged' for a case run with a staged launch shape, else 'register' (automatic shapes included)."""
    return "staged" if case.variant and LaunchShape.parse(case.variant).staged else "register"


def control_caught(summary: dict) -> bool:
    """A negative control is caught when cases failed in every build family that ran (the register and
    the staged builds are separate code: a control caught in one says nothing of the other)."""
    ran = summary["cases_run_by_family"]
    return bool(ran) and all(summary["cases_failed_by_family"].get(f, 0) > 0 for f in ran)


def _describe(r: dict) -> str:
    c = r["case"]
    return (f"{c.op} {c.dtype} rows={c.rows} heads={c.heads} pad={c.pad} hidden={c.hidden} {c.pattern} "
            f"{c.layout} "
            f"variant={c.variant}: ratio={r['ratio']:.3g} guards_ok={r['guards_ok']} "
            f"residual_exact={r['residual_exact']}")


def main(argv: list[str] | None = None) -> int:
    """CLI; exit 0 when the outcome is the expected one (pass, or fail under a negative control)."""
    ap = argparse.ArgumentParser(
        prog="python -m kernels.validate", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reduced", action="store_true", help="run the small suite (for compute-sanitizer)")
    ap.add_argument("--negative-control", choices=sorted(rmsnorm.NEGATIVE_CONTROLS),
                    help="build a deliberately broken kernel; validation must then fail")
    ap.add_argument("--exact-alloc", action="store_true",
                    help="no guard regions: buffers end exactly at the data, so memcheck sees overruns")
    ap.add_argument("--seed", type=int, default=0, help="seed of the first case (case i uses seed+i)")
    ap.add_argument("--json", help="write the summary to this file")
    args = ap.parse_args(argv)
    if gpu_missing(ap.prog):
        return 2
    if args.negative_control:
        cases = negative_control_cases()
    else:
        cases = reduced_cases() if args.reduced else full_cases()
    summary = run_suite(cases, args.seed, 0 if args.exact_alloc else 64, args.negative_control)
    if args.negative_control:
        summary["negative_control"] = args.negative_control
        summary["failed_as_it_must"] = control_caught(summary)
    if args.json:
        write_json(args.json, summary, allow_nan=True)
    print(json.dumps({k: v for k, v in summary.items() if k != "failures"}, indent=1))
    for line in summary["failures"][:5]:
        print("FAIL", line)
    if args.negative_control:
        print("negative control", args.negative_control,
              "failed as it must" if summary["failed_as_it_must"] else "PASSED: the suite cannot see it")
        return 0 if summary["failed_as_it_must"] else 1
    print("validation", "PASSED" if summary["passed"] else "FAILED")
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
