"""report.json (docs/DESIGN.md contract plus detail) and report.md (verdict first) from an analysis."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from experiments import stats
from experiments.report_md import render_markdown
from kernels.resultfile import read_json, write_json, write_text
from experiments.slo import SLO

REPORT_SCHEMA_VERSION = 1
# docs/DESIGN.md: the end-to-end effect to detect is about 0.5% (of TPOT); windows needed for a +-0.5% interval
TARGET_HALF_WIDTH_PCT = 0.5


@dataclass
class Analysis:
    """Everything analyze_run computed, handed to the report writers."""

    run: dict
    env: dict
    slos: list[SLO]
    per_slo: list[dict]  # from analyze._per_slo
    secondary: dict  # metric -> goodput.paired_relative result
    latency: list[dict]
    attribution: dict
    missing: list[dict]
    warnings: list[dict]
    n_warmup: int
    n_records: int
    source: str | None


def aa_reason(run: Mapping) -> str | None:
    """Why this run is A/A (both arms the same kernel), or None for an A/B run."""
    arms = list(run.get("arms") or [])
    if run.get("mode_note"):
        return str(run["mode_note"])
    if len(arms) == 2 and arms[0] == arms[1]:
        return f"both arms are {arms[0]!r}"
    return None


def _fmt_pct(x: float | None, signed: bool = True) -> str:
    if x is None:
        return "n/a"
    return f"{x:+.1f}%" if signed else f"{x:.1f}%"


def verdict(entry: Mapping) -> str:
    """One sentence: the SLO, the goodput change of treatment vs baseline, its 95% CI and what it means."""
    head = f"{entry['name']} ({entry['bounds']}): "
    b, t, n = entry["baseline"], entry["treatment"], entry["n_paired"]
    if entry["delta_goodput_pct"] is None:
        return head + f"no goodput comparison of {t} vs {b} — {entry['reason'] or 'no paired windows'}"
    text = head + f"{t} goodput {_fmt_pct(entry['delta_goodput_pct'])} vs {b}"
    if entry["ci95_pct"] is None:
        return text + f" over {n} paired window{'s' * (n != 1)} — no interval or verdict ({entry['reason']})"
    lo, hi = entry["ci95_pct"]
    text += f", 95% CI [{lo:+.1f}, {hi:+.1f}]% over {n} paired windows"
    if entry["sd_diff_pct"] == 0.0:
        if entry[b]["attainment"] == 1.0 and entry[t]["attainment"] == 1.0:
            return text + " — every request met this SLO in both arms: these loads do not reach its limit"
        return text + " — the same difference in every window (no spread, so no MDE)"
    mde = f"MDE {_fmt_pct(entry['mde_pct'], signed=False)}"
    if entry["significant"]:
        direction = "higher" if entry["delta_goodput_pct"] > 0 else "lower"
        return text + f" — {t} {direction}, interval excludes 0 ({mde})"
    return text + f" — no detectable difference ({mde})"


def _slo_entry(item: Mapping, labels: list[str]) -> dict:
    slo: SLO = item["slo"]
    comp = item["paired"]["comparison"]
    entry = {**slo.to_json(), "bounds": slo.describe(), "baseline": labels[0], "treatment": labels[1]}
    for arm in labels:
        entry[arm] = item["arms"][arm]
    entry.update({
        "delta_goodput_pct": comp["mean"], "ci95_pct": comp["t_ci95"], "bootstrap_ci95_pct": comp["bootstrap_ci95"],
        "median_diff_pct": comp["median"], "sd_diff_pct": comp["sd"], "n_paired": comp["n"],
        "significant": comp["significant"], "mde_pct": comp["mde"], "reason": comp["reason"],
        "per_window": item["paired"]["diffs"], "unpaired": item["paired"]["unpaired"],
        "undefined": item["paired"]["undefined"], "per_load": item["per_load"],
        "by_load": {str(load): stats.compare_paired([d["diff_pct"] for d in item["paired"]["diffs"]
                                                     if d["load"] == load]).to_json()
                    for load in sorted({d["load"] for d in item["paired"]["diffs"]})},
    })
    if comp["n"] == 0 and item["paired"]["undefined"]:
        entry["reason"] = (f"{labels[0]} goodput is 0 in all {len(item['paired']['undefined'])} paired windows, "
                           "so a relative change is undefined")
    entry["verdict"] = verdict(entry)
    return entry


def _design(run: Mapping) -> dict:
    return {
        "windows": run["windows"], "loads": run["loads"], "warmup": run.get("warmup"),
        "clipping": run.get("clipping"),
        "order": [{"window": e["window"], "load": e["load"], "order": e.get("order")} for e in run["schedule"]],
        "pairing": "per (window, load): both arms replay the same requests; differences in % of the "
                   "baseline's mean at that load; 95% CI is Student-t over paired windows",
    }


def build_report(a: Analysis) -> dict:
    """The report.json dict (docs/DESIGN.md contract keys first)."""
    run, labels = a.run, list(a.run["arm_labels"])
    slos = [_slo_entry(item, labels) for item in a.per_slo]
    status = "complete" if run.get("status") == "complete" and not a.missing else "partial"
    aa = aa_reason(run)
    secondary = {m: {"comparison": r["comparison"], "per_window": r["diffs"], "unpaired": r["unpaired"]}
                 for m, r in a.secondary.items()}
    return {
        "trace": run.get("trace"), "model": {k: v for k, v in (run.get("model") or {}).items() if k != "config"},
        "gpu": a.env.get("gpu") or a.env.get("GPU") or run.get("device"), "arms": run["arms"], "arm_labels": labels,
        "design": _design(run), "slos": slos,
        "attribution": {**a.attribution, "measured_tpot_p50_change_pct": secondary.get(
            "tpot_p50_ms", {}).get("comparison", {}).get("mean")},
        "schema_version": REPORT_SCHEMA_VERSION, "tool_version": run.get("tool_version"),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": run.get("device"), "aa": {"is_aa": aa is not None, "why": aa},
        "status": status, "run_status": run.get("status"), "stopped_reason": run.get("stopped_reason"),
        "missing": a.missing, "warnings": a.warnings,
        "records": {"file": a.source, "total": a.n_records, "warmup_excluded": a.n_warmup},
        "latency": a.latency, "secondary": secondary,
        "mde_pct": {"goodput": {s["name"]: s["mde_pct"] for s in slos},
                    **{m: r["comparison"]["mde"] for m, r in a.secondary.items()}},
        "command": run.get("command"),
    }


def per_window_sd(report: Mapping) -> dict[str, float | None]:
    """sd (%) of the per-window paired differences of each compared metric, keyed like the plots."""
    out: dict[str, float | None] = {f"goodput:{s['name']}": s["sd_diff_pct"] for s in report["slos"]}
    out.update({m: sec["comparison"]["sd"] for m, sec in report["secondary"].items()})
    return out


def noise_floor(report: Mapping, aa_report: Path | None) -> dict:
    """A/A per-window sd per metric (from this run when it is A/A, else from ``aa_report``), and the
    paired windows a +-TARGET_HALF_WIDTH_PCT interval needs at that sd."""
    if report["aa"]["is_aa"]:
        source, sd = "this run (A/A)", per_window_sd(report)
    elif aa_report is not None:
        other = read_json(aa_report, REPORT_SCHEMA_VERSION, "A/A report")
        if not (other.get("aa") or {}).get("is_aa"):
            raise ValueError(f"{aa_report}: not the report of an A/A run (aa.is_aa is not true)")
        source, sd = str(aa_report), per_window_sd(other)
    else:
        return {"source": None, "sd_pct": {}, "windows_needed": {},
                "reason": "A/B run and no A/A report given (--aa-report)"}
    needed = {k: stats.windows_needed(v, TARGET_HALF_WIDTH_PCT) for k, v in sd.items()
              if v is not None and math.isfinite(v)}
    return {"source": source, "sd_pct": sd, "target_half_width_pct": TARGET_HALF_WIDTH_PCT,
            "windows_needed": needed}


def _clean(x):
    """JSON-safe copy: NaN/inf -> None, tuples -> lists, numpy scalars -> Python."""
    if isinstance(x, Mapping):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def write_report(run_dir: Path, report: dict) -> None:
    """Write report.json and report.md atomically (kernels.resultfile)."""
    write_json(run_dir / "report.json", _clean(report))
    write_text(run_dir / "report.md", render_markdown(report))
