"""Targets and the README results table, computed from a results file's raw samples.

    python -m kernels.report --from RESULTS/h200.json [--readme kernels/README.md]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

from common.cliargs import fail
from common.jsonfile import ResultFileError, read_json, write_text
from kernels.shapes import LaunchShape

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


def _med(row: dict) -> float:
    return statistics.median(row["samples_us"])


def _policy_us(row: dict) -> float:
    """Per-call time of what the policy runs at this shape (fused variant or the best stock arm)."""
    stock = _stock_medians(row)
    return _med(row) if row.get("policy", "stock") != "stock" else min(stock.values(), default=math.nan)


def _same_size_copy(sel: list[dict]) -> dict:
    """How far a device copy of the same bytes gets at these shapes: its own share of copy bandwidth and
    the policy's time against it (rows timed with a copy arm only; none gives nothing)."""
    timed = [r for r in sel if r.get("copy_samples_us")]
    if not timed:
        return {}
    copy_share = [r["roofline_us"] / statistics.median(r["copy_samples_us"]) for r in timed]
    vs_copy = [statistics.median(r["copy_samples_us"]) / _policy_us(r) for r in timed]
    return {"copy_share_min": min(copy_share), "copy_share_median": statistics.median(copy_share),
            "policy_vs_copy_min": min(vs_copy), "policy_vs_copy_median": statistics.median(vs_copy)}


def targets(results: dict) -> dict:
    """The benchmark targets of issue 10, each with its measured value and met / missed."""
    rows = results["bench"]
    bf16 = [r for r in rows if r["dtype"] == "bf16"]
    slower = [f"{r['op']} {r['dtype']} {r['rows']}x{r['hidden']}" for r in rows
              if _stock_medians(r) and _policy_us(r) > min(_stock_medians(r).values())]
    grid = [r for r in bf16 if r["rows"] <= 8192 and r["hidden"] in (2048, 4096, 8192)]
    gm = {k: geomean([speedups(r).get(k, math.nan) for r in grid]) for k in ("best", "inductor", "vllm_c")}
    small = {f"{r['op']} {r['rows']}": _policy_us(r)
             for r in bf16 if r["rows"] <= 128 and r["hidden"] == 4096}
    fused_small = {f"{r['op']} {r['rows']}": _med(r)
                   for r in bf16 if r["rows"] <= 128 and r["hidden"] == 4096}

    def bandwidth(lo: int, hi: int, goal: float) -> dict:
        sel = [r for r in bf16 if r["op"] == "rms_norm" and lo <= r["rows"] <= hi and r["hidden"] >= 1024]
        frac = {f"{r['rows']}x{r['hidden']}": r["roofline_us"] / _policy_us(r) for r in sel}
        return {"met": bool(frac) and min(frac.values()) >= goal, "min": min(frac.values(), default=math.nan),
                "median": statistics.median(frac.values()) if frac else math.nan, "goal": goal,
                "fused_min": min((r["roofline_us"] / _med(r) for r in sel), default=math.nan),
                "per_shape": frac, **_same_size_copy(sel)}

    return {
        "policy_never_slower_than_best_stock": {"met": not slower, "slower_shapes": slower,
                                                "fused_shapes": sum(r.get("policy", "stock") != "stock"
                                                                    for r in rows)},
        "geomean_speedup_bf16_rows_1_8192_hidden_2048_4096_8192": {
            "met": gm["best"] >= 1.25, "vs_best_stock": gm["best"], "vs_inductor": gm["inductor"],
            "vs_vllm_c": gm["vllm_c"], "goal": 1.25, "shapes": len(grid)},
        "us_per_call_at_most_128_rows_hidden_4096": {
            "met": bool(small) and max(small.values()) <= 1.2, "max": max(small.values(), default=math.nan),
            "fused_max": max(fused_small.values(), default=math.nan), "goal": 1.2, "per_shape": small},
        "copy_bandwidth_rms_norm_256_2048_rows": bandwidth(256, 2048, 0.90),
        "copy_bandwidth_rms_norm_8192_rows_and_more": bandwidth(8192, 1 << 30, 0.95),
    }


def staged_study(results: dict) -> dict:
    """Staged builds (cp.async, persistent grid) against the register builds, from every row that timed
    both: the shapes where a staged build was the fastest candidate, and best register median / best
    staged median (> 1: staged faster). Empty where no row timed a staged build."""
    ratio: dict[str, float] = {}
    for r in results["bench"]:
        cand = {k: statistics.median(v) for k, v in r.get("candidates_us", {}).items() if v}
        staged = [v for k, v in cand.items() if LaunchShape.parse(k).staged]
        plain = [v for k, v in cand.items() if not LaunchShape.parse(k).staged]
        if staged and plain:
            ratio[f"{r['op']} {r['dtype']} {r['rows']}x{r['hidden']}"] = min(plain) / min(staged)
    if not ratio:
        return {}
    vals = list(ratio.values())
    return {"shapes": len(ratio), "staged_fastest": sorted(k for k, v in ratio.items() if v > 1),
            "ratio_min": min(vals), "ratio_median": statistics.median(vals), "ratio_max": max(vals),
            "per_shape": ratio}


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


def render(results: dict, source: str) -> str:
    """The generated README section of results file `source`: targets, the grid table and the
    launch-shape study."""
    t = targets(results)
    env = results.get("environment", {})
    bw = results.get("environment", {}).get("copy_bandwidth_bytes_per_s")
    parts = [f"Generated from {source} ({env.get('gpu')}, driver {env.get('driver')}, "
             f"torch {env.get('torch')}, CuPy {env.get('cupy')}, vLLM {env.get('vllm')}; copy bandwidth "
             f"{(bw or math.nan) / 1e12:.2f} TB/s).", "", "| target | goal | measured | met |",
             "|---|---|---|---|"]
    g = t["geomean_speedup_bf16_rows_1_8192_hidden_2048_4096_8192"]
    yes = lambda m: "yes" if m else "no"  # noqa: E731
    vllm_c = ("vLLM CUDA arm not timed: environment.vllm_c_error" if math.isnan(g["vs_vllm_c"])
              else f"{g['vs_vllm_c']:.3f}x vs vLLM CUDA")
    parts.append(f"| geomean speedup, bf16 rows 1-8192 x hidden 2048/4096/8192, policy applied | >= 1.25x | "
                 f"{g['vs_best_stock']:.3f}x vs best stock ({g['vs_inductor']:.3f}x vs Inductor, "
                 f"{vllm_c}) | {yes(g['met'])} |")
    f = t["policy_never_slower_than_best_stock"]
    parts.append(f"| policy's choice never slower than the best stock arm | every shape | "
                 f"{f['fused_shapes']} shapes fused, {len(f['slower_shapes'])} slower | {yes(f['met'])} |")
    s = t["us_per_call_at_most_128_rows_hidden_4096"]
    parts.append(f"| us per call at <= 128 rows, hidden 4096, both ops (graph of consecutive calls) | "
                 f"<= 1.2 | max {s['max']:.2f} (fused kernel alone: max {s['fused_max']:.2f}) | "
                 f"{yes(s['met'])} |")
    for key, label in (("copy_bandwidth_rms_norm_256_2048_rows", "256-2048 rows"),
                       ("copy_bandwidth_rms_norm_8192_rows_and_more", ">= 8192 rows")):
        b = t[key]
        copy = (f"; a copy of the same bytes reaches min {100 * b['copy_share_min']:.0f}%, median "
                f"{100 * b['copy_share_median']:.0f}%, and the policy runs at min "
                f"{100 * b['policy_vs_copy_min']:.0f}% of that copy's speed" if "copy_share_min" in b else "")
        parts.append(f"| share of copy bandwidth, rms_norm bf16, {label} | >= {100 * b['goal']:.0f}% | min "
                     f"{100 * b['min']:.0f}%, median {100 * b['median']:.0f}% (fused kernel alone: min "
                     f"{100 * b['fused_min']:.0f}%){copy} | {yes(b['met'])} |")
    check = results.get("in_vllm_check")
    if check:
        ok = sum(1 for c in check["sizes"] if c["within_10pct"])
        parts.append(f"| isolated Inductor arm within 10% of in-vLLM stock norm per call | "
                     f"every profiled size | {ok} of {len(check['sizes'])} sizes | "
                     f"{yes(ok == len(check['sizes']))} |")
    st = staged_study(results)
    if st:
        parts += ["", f"Staged builds (cp.async through shared memory, persistent grid) were timed beside "
                  f"the register builds at {st['shapes']} shapes and were the fastest candidate at "
                  f"{len(st['staged_fastest'])}; best register build / best staged build per shape: median "
                  f"{st['ratio_median']:.3f}, range {st['ratio_min']:.3f}-{st['ratio_max']:.3f} "
                  f"(> 1: staged faster)."]
    parts += ["", table(results)]
    return "\n".join(parts)


def update_readme(readme: Path, section: str) -> None:
    """Replace the text between the results markers of `readme` with `section`."""
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        raise ValueError(f"{readme}: markers {BEGIN!r} and {END!r} not found")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    write_text(readme, f"{head}{BEGIN}\n{section}\n{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    """CLI: print the generated section, or write it into a README between its markers."""
    ap = argparse.ArgumentParser(
        prog="python -m kernels.report", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--from", dest="source", required=True,
                    help="results JSON of kernels.suite (e.g. OUT/h200.json)")
    ap.add_argument("--readme", help="README whose marked results section is replaced")
    args = ap.parse_args(argv)
    try:
        results = read_json(args.source, None, "kernel results")
    except ResultFileError as exc:
        return fail(ap.prog, str(exc))
    section = render(results, args.source)
    if args.readme:
        update_readme(Path(args.readme), section)
    else:
        print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
