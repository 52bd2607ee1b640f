"""The one command that validates and benchmarks the kernel on a GPU machine (e.g. OUT/h200.json).

Validation (full suite), both negative controls, compute-sanitizer memcheck, racecheck and initcheck
over the reduced suite (run beside validation, finished before any timing), the benchmark grid with every
stock arm, the policy table, and the targets.

    python -m kernels.suite --out OUT/h200.json --policy-out runtime_tables/policy-h200.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from common.cliargs import command_line, refuse_output
from common.jsonfile import project_relative, write_json
from kernels import bench, launch, policy, report, stock, validate
from kernels.cases import full_cases, negative_control_cases, reduced_cases
from kernels.environment import clocks, describe, gpu_missing, width_list

SCHEMA_VERSION = 2  # 2: launch-shape candidates per row, faithful Inductor arm, issue-10 targets, initcheck
SANITIZER_TOOLS = ("memcheck", "racecheck", "initcheck")
_SUMMARY = re.compile(r"(ERROR SUMMARY|RACECHECK SUMMARY): (\d+) (error|hazard)")

ROOT = Path(__file__).resolve().parents[1]  # the project: a source recorded relative to it


def start_sanitizer(tool: str, log_dir: Path, kernel_filter: bool = True) -> tuple[subprocess.Popen, Path]:
    """Start compute-sanitizer `tool` over the reduced suite (exact-size allocations, no caching)."""
    log = log_dir / f"sanitizer-{tool}.log"
    cmd = ["compute-sanitizer", "--tool", tool, "--print-limit", "20"]
    if tool == "initcheck":
        # every kernel instrumented (a filter hides the writes of PyTorch's fill and copy kernels, so
        # their buffers read as uninitialized), host-side copies by PyTorch not checked
        cmd += ["--check-api-memory-access", "no"]
    elif kernel_filter:
        cmd += ["--kernel-name", "kns=rmsnorm_kernel"]
    if tool == "memcheck":
        # cuda-bindings resolves driver entry points with cuGetProcAddress and probes versions the
        # driver lacks; each handled probe counts as an API error (34 on the H200, 2026-12-03), which
        # would hide the device-side memory errors this run is for
        cmd += ["--report-api-errors", "no"]
    cmd += [sys.executable, "-m", "kernels.validate", "--reduced", "--exact-alloc"]
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1")
    fh = log.open("w")
    fh.write(" ".join(cmd) + "\n")
    fh.flush()
    return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env), log


def finish_sanitizer(tool: str, proc: subprocess.Popen, log: Path, started: float, timeout_s: float) -> dict:
    """Wait for a sanitizer run and parse its summary line; clean = exit 0, 0 findings, suite passed."""
    try:
        rc = proc.wait(timeout=max(1.0, timeout_s - (time.perf_counter() - started)))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        rc = None
    text = log.read_text(errors="replace")
    m = _SUMMARY.search(text)
    findings = int(m.group(2)) if m else None
    return {"tool": tool, "exit_code": rc, "summary": m.group(0) if m else None, "findings": findings,
            "suite_passed": "validation PASSED" in text, "seconds": round(time.perf_counter() - started, 1),
            "clean": rc == 0 and findings == 0 and "validation PASSED" in text,
            "kernel_filter": "kns=rmsnorm_kernel" in text.splitlines()[0],
            "log_tail": text[-1500:]}


def run_sanitizers(log_dir: Path, timeout_s: float, validate_meanwhile) -> tuple[list[dict], dict]:  # noqa: ANN001
    """Both sanitizers in parallel while `validate_meanwhile()` runs here; retried unfiltered if the
    kernel filter option is refused."""
    started = time.perf_counter()
    procs = {t: start_sanitizer(t, log_dir) for t in SANITIZER_TOOLS}
    meanwhile = validate_meanwhile()
    results = []
    for tool, (proc, log) in procs.items():
        res = finish_sanitizer(tool, proc, log, started, timeout_s)
        if res["summary"] is None and res["exit_code"] not in (0, None) and "kernel-name" in res["log_tail"]:
            t0 = time.perf_counter()
            proc2, log2 = start_sanitizer(tool, log_dir, kernel_filter=False)
            res = finish_sanitizer(tool, proc2, log2, t0, timeout_s)
        results.append(res)
    return results, meanwhile


def validation_block(quick: bool, reduced: bool = False) -> dict:
    """Full suite (the reduced one where asked) and both negative controls."""
    def pick(cases: list) -> list:  # --quick: a smoke test over three widths, bf16 and fp32
        return [c for c in cases if c.hidden in (31, 4096, 8193) and c.dtype != "fp16"] if quick else cases

    main = validate.run_suite(pick(reduced_cases()) if quick
                              else reduced_cases() if reduced else full_cases())
    main["suite"] = "quick" if quick else "reduced" if reduced else "full"
    negatives = {}
    for name in ("epsilon", "tail"):
        s = validate.run_suite(pick(negative_control_cases()), negative=name)
        negatives[name] = {"failed_as_it_must": validate.control_caught(s), "cases_run": s["cases_run"],
                           "cases_failed": s["failures_total"],
                           "cases_failed_by_family": s["cases_failed_by_family"],
                           "first_failure": s["failures"][0] if s["failures"] else None}
    main["negative_controls"] = negatives
    return main


def finish(results: dict) -> dict:
    """Add the policy choice to every bench row and the targets block."""
    table = policy.build_table(results["bench"])
    pol = policy.Policy(table, source="bench")
    for row in results["bench"]:
        row["policy"] = pol.choose(row["op"], row["dtype"], row["rows"], row["hidden"])
        row["policy_evidence"] = policy.decide(row)[1]
    results["targets"] = report.targets(results)
    return results


def main(argv: list[str] | None = None) -> int:
    """CLI: run everything and write the results file and the policy table."""
    ap = argparse.ArgumentParser(
        prog="python -m kernels.suite", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="results JSON to write (e.g. OUT/h200.json)")
    ap.add_argument("--policy-out", help="policy table to write (default: runtime_tables/policy-<gpu>.json, "
                    "named by --out)")
    ap.add_argument("--log-dir", help="folder for sanitizer logs (default: beside --out)")
    ap.add_argument("--quick", action="store_true",
                    help="reduced validation and a few bench shapes (smoke test)")
    ap.add_argument("--reduced-validation", action="store_true",
                    help="validate with the reduced suite (what the sanitizers run) instead of the full one")
    ap.add_argument("--hidden", type=width_list,
                    help="comma list: benchmark only these hidden sizes (a partial grid, recorded in the "
                    "file as 'grid_widths')")
    ap.add_argument("--no-sanitizer", action="store_true",
                    help="skip compute-sanitizer (recorded as not run)")
    ap.add_argument("--sanitizer-timeout", type=float, default=300.0, help="seconds per sanitizer run")
    ap.add_argument("--seed", type=int, default=0, help="seed of the arm-order shuffle")
    args = ap.parse_args(argv)
    refuse_output(ap.prog, "--out", args.out)
    if gpu_missing(ap.prog):
        return 2
    widths = args.hidden
    out = Path(args.out)
    log_dir = Path(args.log_dir) if args.log_dir else out.parent
    log_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    vllm = stock.vllm_ops()
    env = describe(stock.vllm_version())
    env["vllm_c_error"] = vllm[2]
    env["clocks_before"] = clocks()
    env["launch_route"] = launch.route()  # 'driver': cuLaunchKernelEx, PDL builds launch with PDL
    if args.no_sanitizer:
        sanitizer, val = [{"tool": t, "clean": None, "not_run": "--no-sanitizer"} for t in SANITIZER_TOOLS], \
            validation_block(args.quick, args.reduced_validation)
    else:
        sanitizer, val = run_sanitizers(log_dir, args.sanitizer_timeout,
                                        lambda: validation_block(args.quick, args.reduced_validation))
    val["sanitizer"] = sanitizer
    print(json.dumps({"validation_passed": val["passed"], "cases": val["cases_run"],
                      "negative_controls": val["negative_controls"],
                      "sanitizer": [(s["tool"], s.get("clean"), s.get("summary")) for s in sanitizer],
                      "seconds": round(time.perf_counter() - t0, 1)}), flush=True)
    measured = bench.run(args.quick, args.seed, vllm, log=lambda s: print(s, flush=True), widths=widths)
    env["clocks_after"] = clocks()
    env["copy_bandwidth_bytes_per_s"] = measured["copy_bandwidth"]["before"]["bytes_per_s"]
    env["copy_bandwidth"] = measured["copy_bandwidth"]
    results = finish({"schema_version": SCHEMA_VERSION,
                      "command": command_line(ap.prog, argv),
                      "quick": args.quick, "grid_widths": sorted(widths) if widths else "all",
                      "environment": env, "validation": val,
                      "bench": measured["bench"], "inductor_graphs": measured["inductor_graphs"],
                      "seconds": round(time.perf_counter() - t0, 1)})
    write_json(out, results, allow_nan=True, indent=None)
    pol_path = Path(args.policy_out) if args.policy_out else policy.default_out(out)
    print(json.dumps(results["targets"], indent=1))
    try:
        write_json(pol_path, policy.table_document(results, project_relative(out, ROOT)), allow_nan=True)
        write_json(policy.calls_out(pol_path), policy.calls_document(results, project_relative(out, ROOT)),
                   allow_nan=True)
    except ValueError as exc:
        print(f"suite: wrote {out}, no policy table: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {out}, {pol_path} and {policy.calls_out(pol_path)} in {time.perf_counter() - t0:.0f} s")
    return 0 if val["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
