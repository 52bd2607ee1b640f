"""Targets and the README results table, computed from a results file's raw samples.

    python -m kernels.report --from kernels/results/h200.json [--readme kernels/README.md]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

BEGIN, END = "<!-- results:begin (python -m kernels.report) -->", "<!-- results:end -->"


def _stock_medians(row: dict) -> dict[str, float]:
    return {k: statistics.median(v) for k, v in row.get("stock_samples_us", {}).items() if v}


def speedups(row: dict) -> dict[str, float]:
    """Speedup of what the policy runs over each stock arm and over the best (stock = 1.0)."""
    meds = _stock_medians(row)
    fused = statistics.median(row["samples_us"])
    use_fused = row.get("policy", "stock") != "stock"
    out = {}
    for name, med in list(meds.items()) + [("best", min(meds.values()) if meds else math.nan)]:
        out[name] = med / fused if use_fused else 1.0
    return out


def geomean(values: list[float]) -> float:
    """Geometric mean of positive values (nan when empty)."""
    vals = [v for v in values if v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else math.nan


def targets(results: dict) -> dict:
    """The four targets of the benchmark, each with its measured value and met / missed."""
    rows = results["bench"]
    bf16 = [r for r in rows if r["dtype"] == "bf16"]
    fused_rows = [r for r in rows if r.get("policy", "stock") != "stock"]
    slower = [f"{r['op']} {r['dtype']} {r['rows']}x{r['hidden']}" for r in fused_rows
              if statistics.median(r["samples_us"]) >= min(_stock_medians(r).values())]
    gm = {k: geomean([speedups(r).get(k, math.nan) for r in bf16]) for k in ("best", "inductor", "vllm_c")}
    bw_rows = [r for r in bf16 if 256 <= r["rows"] <= 4096]
    fractions = [r["roofline_us"] / statistics.median(r["samples_us"]) for r in bw_rows]
    small = [statistics.median(r["samples_us"]) for r in bf16 if r["rows"] <= 128]
    return {
        "fused_faster_where_dispatched": {"met": not slower, "fused_shapes": len(fused_rows),
                                          "slower_shapes": slower},
        "geomean_speedup_bf16": {"met": gm["best"] >= 1.25, "vs_best_stock": gm["best"],
                                 "vs_inductor": gm["inductor"], "vs_vllm_c": gm["vllm_c"], "goal": 1.25},
        "copy_bandwidth_fraction_256_4096_rows": {
            "met": bool(fractions) and min(fractions) >= 0.85, "min": min(fractions, default=math.nan),
            "median": statistics.median(fractions) if fractions else math.nan, "goal": 0.85},
        "us_per_call_at_most_128_rows": {"met": bool(small) and max(small) <= 1.2,
                                         "max": max(small, default=math.nan),
                                         "median": statistics.median(small) if small else math.nan,
                                         "goal": 1.2},
    }


def table(results: dict) -> str:
    """Markdown table of every bench row: fused and stock medians, policy, speedup, bandwidth."""
    head = ("| op | dtype | rows | hidden | variant | fused us | inductor us | vllm_c us | torch us | "
            "policy | speedup vs best stock | % of copy BW |\n|" + "---|" * 12)
    lines = [head]
    for r in results["bench"]:
        s = r.get("stock", {})
        fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
        med = statistics.median(r["samples_us"])
        lines.append(
            f"| {r['op']} | {r['dtype']} | {r['rows']} | {r['hidden']} | {r['variant']} | {med:.2f} | "
            f"{fmt(s.get('inductor_us'))} | {fmt(s.get('vllm_c_us'))} | {fmt(s.get('torch_us'))} | "
            f"{r.get('policy', '-')} | {speedups(r)['best']:.2f} | {100 * r['roofline_us'] / med:.0f} |")
    return "\n".join(lines)


def study_table(results: dict) -> str:
    """Markdown table of the launch-shape study (threads per row, narrow vs wide rows)."""
    study = results.get("launch_shape_study", [])
    if not study:
        return ""
    names = [k for k in study[0] if k.startswith("t")]
    lines = ["| dtype | rows | hidden | " + " | ".join(f"{n} us" for n in names) + " | faster |",
             "|" + "---|" * (len(names) + 4)]
    for e in study:
        meds = {n: statistics.median(e[n]["samples_us"]) for n in names}
        lines.append(f"| {e['dtype']} | {e['rows']} | {e['hidden']} | "
                     + " | ".join(f"{meds[n]:.2f}" for n in names) + f" | {min(meds, key=meds.get)} |")
    return "\n".join(lines)


def render(results: dict) -> str:
    """The generated README section: targets, the grid table and the launch-shape study."""
    t = targets(results)
    env = results.get("environment", {})
    bw = results.get("environment", {}).get("copy_bandwidth_bytes_per_s")
    parts = [f"Generated from kernels/results/h200.json ({env.get('gpu')}, driver {env.get('driver')}, "
             f"torch {env.get('torch')}, CuPy {env.get('cupy')}, vLLM {env.get('vllm')}; copy bandwidth "
             f"{(bw or math.nan) / 1e12:.2f} TB/s).", "", "| target | goal | measured | met |", "|---|---|---|---|"]
    g = t["geomean_speedup_bf16"]
    parts.append(f"| geomean speedup, bf16 grid, policy applied | >= 1.25x | {g['vs_best_stock']:.3f}x vs best "
                 f"stock ({g['vs_inductor']:.3f}x vs Inductor, {g['vs_vllm_c']:.3f}x vs vLLM CUDA) | "
                 f"{'yes' if g['met'] else 'no'} |")
    f = t["fused_faster_where_dispatched"]
    parts.append(f"| fused faster than best stock wherever dispatched | all | {f['fused_shapes']} shapes fused, "
                 f"{len(f['slower_shapes'])} slower | {'yes' if f['met'] else 'no'} |")
    b = t["copy_bandwidth_fraction_256_4096_rows"]
    parts.append(f"| share of copy bandwidth, 256-4096 rows (bf16) | >= 85% | min {100 * b['min']:.0f}%, "
                 f"median {100 * b['median']:.0f}% | {'yes' if b['met'] else 'no'} |")
    s = t["us_per_call_at_most_128_rows"]
    parts.append(f"| us per call at <= 128 rows (graph replay, bf16) | <= 1.2 | max {s['max']:.2f}, median "
                 f"{s['median']:.2f} | {'yes' if s['met'] else 'no'} |")
    parts += ["", table(results), "", "Launch-shape study (rms_norm, fused kernel only):", "",
              study_table(results)]
    return "\n".join(parts)


def update_readme(readme: Path, section: str) -> None:
    """Replace the text between the results markers of `readme` with `section`."""
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        raise ValueError(f"{readme}: markers {BEGIN!r} and {END!r} not found")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{BEGIN}\n{section}\n{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    """CLI: print the generated section, or write it into a README between its markers."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--from", dest="source", required=True, help="results JSON (kernels/results/h200.json)")
    ap.add_argument("--readme", help="README whose marked results section is replaced")
    args = ap.parse_args(argv)
    section = render(json.loads(Path(args.source).read_text()))
    if args.readme:
        update_readme(Path(args.readme), section)
    else:
        print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
