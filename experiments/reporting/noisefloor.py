"""The A/A noise floor of a report: where it comes from, its spread per metric, and the windows a
+-TARGET_HALF_WIDTH_PCT interval needs (with the range the spread's own uncertainty implies).

Sources, best first: the run's interleaved A/A arm (a second stock server replayed in the same
randomised order, so the floor has the run's design, clocks and time); the run itself when it is an
A/A run; another run's A/A report (--aa-report), whose design must match this run's fingerprint or
the floor is flagged as not comparable and not applied.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

from common.tstats import t_interval
from experiments.reporting.schema import Report, read_report
from experiments.stats import comparisons
from experiments.stats import intervals as stats

# docs/DESIGN.md: the end-to-end effect to detect is well under 1% of TPOT; an A/A interval of
# +-0.25% resolves a 0.5% change
TARGET_HALF_WIDTH_PCT = 0.25


def _paired_latency(report: Report, which: str) -> Mapping:
    """metric -> paired.compare_metric result of one comparison ("primary" or "aa_in_run")."""
    if which == "primary":
        return report.paired_latency.get(report.treatment) or {}
    return (report.aa_in_run.paired_latency if report.aa_in_run else None) or {}


def spreads(report: Report, which: str = "primary") -> dict[str, dict]:
    """{metric key: {"sd", "n", "ci95"}} of the per-cell paired differences (%) of one comparison.

    ``which`` "primary": the report's main comparison; "aa_in_run": its interleaved A/A pair. Keys:
    paired:<metric> (per-request log ratio, median per cell; its sd is the primary fit's standard
    error x sqrt(cells), so that windows needed follow the interval the report gives), goodput:<slo>,
    and the per-window medians (tpot_p50_ms, ttft_p90_ms). A never-stressed SLO has sd None.
    """
    out: dict[str, dict] = {}
    lat = _paired_latency(report, which)
    if which == "primary":
        goodput = {s["name"]: {"sd": s["sd_diff_pct"] if s.get("stressed", True) else None,
                               "n": s["n_paired"], "ci95": s["ci95_pct"]} for s in report.slos}
        secondary = {m: sec["comparison"] for m, sec in report.secondary.items()}
    else:
        f = report.aa_in_run
        stressed = {s["name"]: s.get("stressed", True) for s in report.slos}
        goodput = {name: {"sd": c["sd"] if stressed.get(name, True) else None, "n": c["n"],
                          "ci95": c["t_ci95"]}
                   for name, c in (f.goodput if f else {}).items()}
        secondary = f.secondary if f else {}
    for m, c in lat.items():
        out[f"paired:{m}"] = {"sd": c.get("sd_cell_pct"), "n": c.get("n_cells"), "ci95": c.get("ci95_pct")}
    out.update({f"goodput:{k}": v for k, v in goodput.items()})
    out.update({m: {"sd": c.get("sd"), "n": c.get("n"), "ci95": c.get("t_ci95")}
                for m, c in secondary.items()})
    return out


def _needed(sp: Mapping[str, dict]) -> dict[str, dict]:
    out = {}
    for k, v in sp.items():
        sd, n = v.get("sd"), v.get("n") or 0
        if sd is None or not math.isfinite(sd) or sd == 0 or n < 2:
            out[k] = {"windows": None, "range": None,
                      "reason": "no spread measured (never stressed, or fewer than 2 cells)"}
        else:
            out[k] = stats.windows_needed_range(sd, n, TARGET_HALF_WIDTH_PCT)
    return out


def _bands(sp: Mapping[str, dict], this_n: Mapping[str, int], same_run: bool) -> dict[str, list[float]]:
    """Per metric, the interval an A/A comparison gives: the A/A pair's own t interval (same run), or
    +-t * sd / sqrt(n) at this run's number of cells (another run's floor)."""
    out = {}
    for k, v in sp.items():
        if same_run and v.get("ci95"):
            out[k] = list(v["ci95"])
        elif v.get("sd") and (this_n.get(k) or 0) >= 2:
            n = this_n[k]
            out[k] = list(t_interval(0.0, v["sd"] / math.sqrt(n), n - 1))
    return out


def tpot_by_load(report: Report, which: str = "primary") -> dict[str, dict]:
    """{load: {"n", "half_width_pct", "estimator"}} of the paired TPOT fit per load of one comparison
    (as spreads names them): which load the floor's noise comes from. Empty without intervals."""
    out = {}
    for load, e in ((_paired_latency(report, which).get("tpot_ms") or {}).get("by_load") or {}).items():
        if e.get("ci95_pct"):
            lo, hi = e["ci95_pct"]
            out[load] = {"n": e["n_cells"], "half_width_pct": (hi - lo) / 2, "estimator": e.get("estimator")}
    return out


def noise_floor(report: Report, aa_report: Path | None) -> dict:
    """The "noise_floor" entry of a report being written (see the module docstring)."""
    this = spreads(report)
    this_n = {k: v.get("n") or 0 for k, v in this.items()}
    base = {"target_half_width_pct": TARGET_HALF_WIDTH_PCT, "design_differences": [], "applied": True}
    if report.aa_in_run:
        pair = report.aa_in_run.pair
        sp, same = spreads(report, "aa_in_run"), True
        by_load = tpot_by_load(report, "aa_in_run")
        source = f"this run: {pair[1]} vs {pair[0]} (interleaved)"
    elif report.aa.is_aa:
        sp, source, same, by_load = this, "this run (A/A)", True, tpot_by_load(report)
    elif aa_report is not None:
        other = read_report(aa_report, "A/A report")
        if not other.aa.is_aa:
            raise ValueError(f"{aa_report}: not the report of an A/A run (aa.is_aa is not true)")
        sp, source, same, by_load = spreads(other), str(aa_report), False, tpot_by_load(other)
        diffs = comparisons.fingerprint_differences(report.design["fingerprint"],
                                                    other.design.get("fingerprint"))
        base.update(design_differences=diffs, applied=not diffs)
    else:
        return {**base, "source": None, "sd_pct": {}, "n": {}, "windows_needed": {}, "band_pct": {},
                "tpot_by_load": {}, "applied": False,
                "reason": "A/B run without an A/A arm and no A/A report given (--aa-report)"}
    return {**base, "source": source, "sd_pct": {k: v["sd"] for k, v in sp.items()},
            "n": {k: v.get("n") for k, v in sp.items()}, "windows_needed": _needed(sp),
            "tpot_by_load": by_load,
            "band_pct": _bands(sp, this_n, same) if base["applied"] else {}}
