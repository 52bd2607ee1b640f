"""What a report says of a duet run: the layout, the placement balance, the GPU bias and the A/A
half-width, with the GPU time it cost. Pure functions of run.json and the report dict; a `turns`
run's report has no "layout" entry, so its report.json and report.md are as before the duet.
"""

from __future__ import annotations

import math

from experiments.core.runfile import Run
from experiments.reporting.schema import Report
from experiments.stats.paired import METRICS


def is_duet(run: Run) -> bool:
    """Whether run.json says the duet layout (runs before it, and turns runs, do not)."""
    return run.layout == "duet"


def gpu_minutes(run: Run) -> float | None:
    """GPU-minutes of the measured replays at their nominal length (window / load; warm-up, burn-in
    and server starts not counted): turns, one GPU per arm's replay of a cell, in turn; duet, every GPU
    of the layout for each cell, all arms at once. From the schedule's done lists, so runs of either
    layout and of any age compare; None when no cell was done."""
    durations = {int(w["id"]): float(w["duration_s"]) for w in run.windows}
    n_gpus = len((run.duet or {}).get("gpus") or [])
    total = 0.0
    for e in run.schedule:
        done = len(e.get("done") or [])
        if done:
            total += durations[int(e["window"])] / float(e["load"]) * (n_gpus if is_duet(run) else done)
    return total / 60.0 if total else None


def aa_half_width(report: Report, metric: str = "tpot_ms") -> tuple[float | None, str | None]:
    """(half-width in % of the paired A/A 95% interval of `metric`, where it comes from): this run when
    it is A/A (or holds an interleaved A/A arm), else the applied --aa-report floor; (None, None)."""
    if report.aa.is_aa:
        ci = (report.paired_latency.get(report.treatment) or {}).get(metric, {}).get("ci95_pct")
        return (None, None) if not ci else ((ci[1] - ci[0]) / 2, "this run (A/A)")
    if report.aa_in_run:
        ci = ((report.aa_in_run.paired_latency or {}).get(metric) or {}).get("ci95_pct")
        return (None, None) if not ci else ((ci[1] - ci[0]) / 2, "this run's interleaved A/A arm")
    nf = report.noise_floor or {}
    band = (nf.get("band_pct") or {}).get(f"paired:{metric}")
    return (band[1], str(nf.get("source"))) if nf.get("applied") and band else (None, None)


def layout_entry(report: Report, run: Run) -> dict:
    """report.json "layout" of a duet run: GPUs, placement balance, note (CPU slots), the GPU bias
    per metric of the primary comparison, the A/A half-width, and the GPU time."""
    d = run.duet or {}
    lat = report.paired_latency.get(report.treatment) or {}
    bias = {m: {"pct": (lat.get(m) or {}).get("gpu_bias_pct"), "ci95_pct": (lat.get(m) or {}).get(
        "gpu_bias_ci95_pct"), "reason": (lat.get(m) or {}).get("gpu_bias_reason")} for m in METRICS}
    half, source = aa_half_width(report)
    minutes = gpu_minutes(run)
    return {"name": "duet", "gpus": d.get("gpus"), "balance": (d.get("schedule") or {}).get("balance"),
            "seed": (d.get("schedule") or {}).get("seed"), "note": d.get("note"), "gpu_bias": bias,
            "aa_half_width_tpot_pct": half, "aa_half_width_source": source, "gpu_minutes": minutes,
            # a half-width shrinks as 1 / sqrt(time): times sqrt(GPU-minutes) it compares designs at
            # equal cost
            "aa_half_width_x_sqrt_gpu_minutes": None if half is None or not minutes
            else half * math.sqrt(minutes)}


def layout_lines(r: Report) -> list[str]:
    """The report.md lines of the layout (none for a turns run)."""
    lay = r.layout
    if not lay:
        return []
    balance = "; ".join(f"{arm} " + ", ".join(f"GPU {g} x{n}" for g, n in per.items())
                        for arm, per in (lay.get("balance") or {}).items())
    gpus = ", ".join(map(str, lay["gpus"] or []))
    out = [f"**Duet layout** — every arm at once on a GPU of its own (GPUs {gpus}), each window "
           f"replayed to all arms together, the arms swapped across GPUs per window by a seeded Latin-square "
           f"crossover (seed {lay['seed']}; windows per arm and GPU: {balance}); the GPU is the covariate "
           "of the paired comparison." + (f" {lay['note']}" if lay.get("note") else "") + "  "]
    t = lay["gpu_bias"]["tpot_ms"]
    if t.get("pct") is not None:
        lo, hi = t["ci95_pct"]
        out.append(f"- GPU bias on TPOT (beta: a later GPU of a window's placement vs an earlier one): "
                   f"{t['pct']:+.2f}% [{lo:+.2f}, {hi:+.2f}]%, removed from the estimate")
    else:
        out.append(f"- GPU bias on TPOT: not estimated ({t.get('reason') or 'no paired cells'})")
    half = lay.get("aa_half_width_tpot_pct")
    if half is None:
        out.append("- A/A duet half-width of the paired TPOT interval: not known (no A/A arm in this run and "
                   "no --aa-report of an A/A duet)")
    else:
        cost = ("" if lay.get("gpu_minutes") is None else
                f" over {lay['gpu_minutes']:.2f} GPU-minutes of replay (x sqrt(GPU-minutes): "
                f"{lay['aa_half_width_x_sqrt_gpu_minutes']:.3f}, comparable across designs at equal cost)")
        out.append(f"- A/A duet half-width of the paired TPOT 95% interval: +-{half:.2f}% "
                   f"({lay['aa_half_width_source']}){cost}")
    return out
