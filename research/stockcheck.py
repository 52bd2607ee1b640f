"""Is the isolated Inductor arm what vLLM runs? Check a kernel results file against in-vLLM profiles.

    python -m research.stockcheck --results kernels/results/h200.json \\
        integration/results/h200-ingraph-all-fused/h200-profile.json \\
        integration/results/h200-ingraph-policy/h200-profile.json

For each step size a profile measured inside vLLM's compiled model, the stock norm time per call
(norm_us_stock / norm_calls: Inductor's kernels in vLLM's graph) is set beside the isolated Inductor
arm of the benchmark at the same rows and hidden size, weighted as the model calls the two ops (one
rms_norm, the rest fused_add_rms_norm: Llama's first input norm has no residual). Within 10% passes.
The check is written into the results file as "in_vllm_check"; it is a record, not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from common.cliargs import command_line, fail
from common.jsonfile import ResultFileError, read_json, write_json
from integration.proof.profiles import PROJECT_ROOT, load_profile

TOLERANCE = 0.10


def _hidden(model: str) -> int:
    """hidden_size of a profile's model directory (its path as recorded, under integration/models)."""
    parts = Path(model).parts
    if "integration" not in parts:
        return int(json.loads((Path(model) / "config.json").read_text())["hidden_size"])
    local = PROJECT_ROOT.joinpath(*parts[parts.index("integration"):])
    return int(json.loads((local / "config.json").read_text())["hidden_size"])


def _inductor_us(bench: list[dict], op: str, rows: int, hidden: int) -> float | None:
    for r in bench:
        if (r["op"], r["dtype"], r["rows"], r["hidden"]) == (op, "bf16", rows, hidden):
            samples = r.get("stock_samples_us", {}).get("inductor")
            return statistics.median(samples) if samples else None
    return None


def check(results: dict, profile_path: Path) -> list[dict]:
    """One entry per profiled step size: in-vLLM and isolated per-call times, their ratio, pass/fail."""
    raw = read_json(profile_path, 1, "step profile")
    hidden = _hidden(raw["model"])
    calls = {float(s["batch_tokens"]): float(s["norm_calls"]) for s in raw["steps"]}
    out = []
    for step in load_profile(profile_path):
        rows, n = int(step["batch_tokens"]), calls[step["batch_tokens"]]
        invllm = step["norm_stock_us"] / n
        rms = _inductor_us(results["bench"], "rms_norm", rows, hidden)
        add = _inductor_us(results["bench"], "fused_add_rms_norm", rows, hidden)
        entry = {"profile": str(profile_path.relative_to(PROJECT_ROOT) if profile_path.is_absolute()
                                else profile_path), "rows": rows, "hidden": hidden, "norm_calls": n,
                 "in_vllm_stock_us_per_call": invllm}
        if rms is None or add is None:
            entry.update(isolated_inductor_us_per_call=None, within_10pct=False, note="not benchmarked")
        else:
            iso = (rms + add * (n - 1)) / n
            entry.update(isolated_inductor_us_per_call=iso, ratio=iso / invllm,
                         within_10pct=abs(iso / invllm - 1) <= TOLERANCE)
        out.append(entry)
    return out


def main(argv: list[str] | None = None) -> int:
    """CLI: add the check to the results file; exit 2 on a bad file (one line naming it)."""
    ap = argparse.ArgumentParser(
        prog="python -m research.stockcheck", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", required=True, help="kernel results JSON (kernels/results/h200.json)")
    ap.add_argument("profiles", nargs="+", help="in-vLLM step profiles (integration.proof.prove)")
    a = ap.parse_args(argv)
    path = Path(a.results)
    try:
        results = read_json(path, None, "kernel results")
        sizes = [e for p in a.profiles for e in check(results, Path(p))]
    except (OSError, ValueError, KeyError, ResultFileError) as exc:
        return fail(ap.prog, str(exc))
    command = command_line(ap.prog, argv)
    results["in_vllm_check"] = {"command": command, "l2_mode": results.get("l2_mode", "cold"),
                                "tolerance": TOLERANCE, "sizes": sizes}
    write_json(path, results, allow_nan=True, indent=None)
    for e in sizes:
        iso = e["isolated_inductor_us_per_call"]
        print(f"{e['profile']}: rows {e['rows']}: in vLLM {e['in_vllm_stock_us_per_call']:.2f} us/call, "
              "isolated "
              + (f"{iso:.2f} ({e['ratio']:.3f}x) {'pass' if e['within_10pct'] else 'FAIL'}" if iso else "-"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
