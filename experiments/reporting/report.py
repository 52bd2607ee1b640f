"""report.json (docs/DESIGN.md contract plus detail) and report.md (verdict first) from an analysis."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from common.jsonfile import stored, write_text
from experiments.core.runfile import Run
from experiments.core.slo import SLO
from experiments.reporting.report_latency import aa_floor_text
from experiments.reporting.report_md import render_markdown
from experiments.reporting.schema import REPORT_SCHEMA_VERSION, Report, write_report_json
from experiments.stats import comparisons
from experiments.stats import intervals as stats

NEAR_BOUND = 0.1  # a request is near an SLO bound when its TTFT or TPOT is within 10% of it


@dataclass
class Analysis:
    """Everything analyze_run computed, handed to the report writers."""

    run: Run
    env: dict
    slos: list[SLO]
    per_slo: list[dict]  # from analyze._per_slo, for the primary pair
    secondary: dict  # metric -> goodput.paired_relative result, primary pair
    latency: list[dict]
    attribution: dict
    missing: list[dict]
    warnings: list[dict]
    excluded: dict[str, int]  # phase -> records not compared (warmup, burnin)
    n_records: int
    source: str | None
    pair: list[str]  # [baseline, primary treatment]
    paired_latency: dict  # treatment label -> metric -> experiments.stats.paired.compare_metric result
    in_run_floor: dict | None  # the interleaved A/A pair's goodput and per-window comparisons
    burnin: list[dict]
    drift: dict
    knee: dict | None  # experiments.stats.knee.summary
    planted: list[dict] | None = None  # experiments.stats.plantedline.planted_lines
    over_instances: dict | None = None  # analyze._over_instances: intervals that carry the instance variance
    slow_host: dict | None = None  # experiments.stats.hostslow.episodes (None: a run without host signals)
    damage: tuple[str, ...] = ()  # what the records' integrity checks found (analysed anyway when set)


def aa_reason(run: Run) -> str | None:
    """Why this run is A/A (every arm the same kernel), or None for an A/B run."""
    arms = list(run.arms)
    if run.mode_note:
        return str(run.mode_note)
    if len(arms) >= 2 and len(set(arms)) == 1:
        return f"every arm is {arms[0]!r}"
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
    if not entry.get("stressed", True):
        all_met = entry[b]["attainment"] == 1.0 and entry[t]["attainment"] == 1.0
        every = " and every request met it" if all_met else ""
        return text + (f" — never stressed at these loads ({entry.get('n_near_bound')} of "
                       f"{entry.get('n_requests')} requests within {100 * NEAR_BOUND:.0f}% of a bound"
                       f"{every}): "
                       "no interval and no window count")
    if entry["ci95_pct"] is None:
        return text + f" over {n} paired window{'s' * (n != 1)} — no interval or verdict ({entry['reason']})"
    lo, hi = entry["ci95_pct"]
    text += f", 95% t CI [{lo:+.1f}, {hi:+.1f}]% over {n} paired windows"
    mde = f"MDE {_fmt_pct(entry['mde_pct'], signed=False)}"
    if entry["significant"]:
        direction = "higher" if entry["delta_goodput_pct"] > 0 else "lower"
        return text + f" — {t} {direction}, interval excludes 0 ({mde})"
    return text + f" — no detectable difference ({mde})"


def _slo_entry(item: Mapping, pair: list[str]) -> dict:
    slo: SLO = item["slo"]
    comp = item["paired"]["comparison"]
    entry = {**slo.to_json(), "bounds": slo.describe(), "baseline": pair[0], "treatment": pair[1]}
    for arm in pair:
        entry[arm] = item["arms"][arm]
    sd = comp["sd"]
    entry.update({
        "delta_goodput_pct": comp["mean"], "ci95_pct": comp["t_ci95"],
        "bootstrap_ci95_pct": comp["bootstrap_ci95"],
        "median_diff_pct": comp["median"], "sd_diff_pct": sd, "n_paired": comp["n"],
        "significant": comp["significant"], "mde_pct": comp["mde"], "reason": comp["reason"],
        "n_requests": item["n_requests"], "n_near_bound": item["n_near_bound"],
        "stressed": bool(item["n_near_bound"] > 0 or (sd is not None and sd > 0)),
        "goodput_definition": "attainment x offered rate (met requests over the nominal window at that "
                              "load); achieved_goodput_rps divides by the replays' real duration",
        "per_window": item["paired"]["diffs"], "unpaired": item["paired"]["unpaired"],
        "undefined": item["paired"]["undefined"], "per_load": item["per_load"],
        "capacity_per_window": item["capacity"],
        "by_load": {str(load): stats.compare_paired([d["diff_pct"] for d in item["paired"]["diffs"]
                                                     if d["load"] == load]).to_json()
                    for load in sorted({d["load"] for d in item["paired"]["diffs"]})},
    })
    if comp["n"] == 0 and item["paired"]["undefined"]:
        n_undefined = len(item["paired"]["undefined"])
        entry["reason"] = (f"{pair[0]} goodput is 0 in all {n_undefined} paired windows, "
                           "so a relative change is undefined")
    if not entry["stressed"] and comp["n"] > 0:
        entry.update(ci95_pct=None, bootstrap_ci95_pct=None, mde_pct=None, significant=None,
                     reason="never stressed at these loads: no request near a bound and no spread")
    entry["verdict"] = verdict(entry)
    return entry


def _with_floor(entry: dict, floor: Mapping | None, pair: list[str]) -> None:
    """Add the same tier's goodput change between the run's interleaved A/A pair (`pair`: baseline,
    control) to an entry that has an interval, and to its verdict: a tier that moves between two
    servers of one arm says so there."""
    if not floor or entry.get("ci95_pct") is None or floor.get("t_ci95") is None or not floor.get("sd"):
        return
    entry["aa_floor"] = {"pair": list(pair), **floor}
    entry["verdict"] += aa_floor_text(pair, floor["mean"], floor["t_ci95"], digits=1)


def _at_knee(entry: dict | None, chosen: Mapping) -> None:
    """Add the goodput change at the two knee loads (the loads chosen, less the lowest) to the entry of
    the tier the knee search measured, and to its verdict."""
    if entry is None or not chosen.get("loads"):
        return
    loads = sorted(chosen["loads"])[1:]
    comp = stats.compare_paired([d["diff_pct"] for d in entry["per_window"] if d["load"] in loads]).to_json()
    entry["at_knee"] = {"loads": loads, "knee": chosen.get("knee"), **comp}
    where = ", ".join(f"{x:g}x" for x in loads)
    if comp["t_ci95"] is not None:
        lo, hi = comp["t_ci95"]
        entry["verdict"] += (f"; at the knee ({chosen['knee']:.3g}x, measured at {where}): "
                             f"{comp['mean']:+.1f}%, 95% t CI [{lo:+.1f}, {hi:+.1f}]% "
                             f"over {comp['n']} windows")
    elif comp["mean"] is not None:
        entry["verdict"] += f"; at the knee ({where}): {comp['mean']:+.1f}% ({comp['reason']})"


def _design(run: Run, pair: list[str]) -> dict:
    adjusted = "GPU" if run.layout == "duet" else "order"
    return {
        "windows": run.windows, "loads": run.loads, "warmup": run.warmup,
        "clipping": run.clipping, "order_method": (run.order or {}).get(
            "method", "alternating AB/BA (runs before the randomised order)"),
        "order": [{"window": e["window"], "load": e["load"], "order": e.get("order")}
                  for e in run.schedule],
        "burnin": run.burnin,
        "fingerprint": comparisons.fingerprint(run),
        "pairing": f"per (window, load) cell: every arm replays the same requests; {pair[1]} is compared "
                   f"with {pair[0]} request by request (log ratio, median per cell, {adjusted}-adjusted t "
                   "over cells: the primary interval) and per cell (goodput, per-window medians: % of the "
                   "baseline's mean at that load, Student-t over paired cells)",
        **({"placement": run.placement} if run.placement else {}),  # runner.placement's levers
        **({"resident_sets": run.resident_sets, "not_measured_together": comparisons.not_measured(run)}
           if run.resident_sets else {}),  # --resident: which arms shared the GPU, what never did
    }


def _floor_comparisons(a: Analysis) -> dict | None:
    """The interleaved A/A pair's comparisons, as report.json keeps them (schema.AAInRun)."""
    f = a.in_run_floor
    if f is None:
        return None
    ctrl = f["pair"][1]
    return {"pair": f["pair"], "paired_latency": a.paired_latency.get(ctrl),
            "goodput": {name: p["comparison"] for name, p in f["goodput"].items()},
            "secondary": {m: p["comparison"] for m, p in f["secondary"].items()}}


def arm_details(run: Run, env: Mapping) -> dict[str, dict]:
    """label -> the arm's definition (run.json's record, else the built-in of that name), its
    difference from the first arm, who started its server and, for an endpoint, what it said."""
    labels, names = list(run.arm_labels), list(run.arms)
    recorded = run.arm_definitions
    defs = {lab: run.arm(lab) for lab in labels}
    base = defs[labels[0]]
    out = {}
    for lab in labels:
        arm, rec = defs[lab], recorded.get(lab) or {}
        out[lab] = {**(arm.to_json() if arm else {"name": names[labels.index(lab)]}),
                    "vs_baseline": arm.differences_from(base) if arm and base else None,
                    "shared_flags_set": arm.shared_flags_set() if arm else [],
                    "endpoint": rec.get("endpoint"), "identity": rec.get("identity"),
                    "recorded": bool(rec), "said_of_itself": (env.get("endpoints") or {}).get(lab)}
    return out


def build_report(a: Analysis) -> Report:
    """The report (docs/DESIGN.md contract keys first); analyze adds the entries it derives from it
    (noise floor, host-bound guard, layout, inputs, plots)."""
    run, labels = a.run, list(a.run.arm_labels)
    slos = [_slo_entry(item, a.pair) for item in a.per_slo]
    status = "complete" if run.status == "complete" and not a.missing else "partial"
    status = "damaged" if a.damage else status
    aa = aa_reason(run)
    secondary = {m: {"comparison": r["comparison"], "per_window": r["diffs"], "unpaired": r["unpaired"]}
                 for m, r in a.secondary.items()}
    primary = a.paired_latency.get(a.pair[1]) or {}
    if a.in_run_floor:
        for e in slos:
            _with_floor(e, (a.in_run_floor["goodput"].get(e["name"]) or {}).get("comparison"),
                        a.in_run_floor["pair"])
    if a.knee and a.knee["chosen"].get("tier"):
        _at_knee(next((e for e in slos if e["name"] == a.knee["chosen"]["tier"]), None), a.knee["chosen"])
    return Report.from_json({
        "trace": run.trace,
        "model": {k: v for k, v in run.model.items() if k != "config"},
        "gpu": a.env.get("gpu") or a.env.get("GPU") or run.device, "arms": run.arms,
        "arm_labels": labels,
        "comparison": a.pair, "design": _design(run, a.pair), "slos": slos,
        "attribution": {**a.attribution, "measured_tpot_p50_change_pct": secondary.get(
            "tpot_p50_ms", {}).get("comparison", {}).get("mean"),
            "measured_tpot_paired_change_pct": (primary.get("tpot_ms") or {}).get("estimate_pct"),
            "measured_tpot_paired_ci95_pct": (primary.get("tpot_ms") or {}).get("ci95_pct")},
        "schema_version": REPORT_SCHEMA_VERSION, "tool_version": run.tool_version,
        "device": run.device, "aa": {"is_aa": aa is not None, "why": aa, "controls": [
            lab for lab in labels[1:] if a.in_run_floor and lab == a.in_run_floor["pair"][1]]},
        "status": status, "run_status": run.status, "stopped_reason": run.stopped_reason,
        "missing": a.missing, "warnings": a.warnings,
        "records": {"file": a.source, "total": a.n_records, "warmup_excluded": a.excluded.get("warmup", 0),
                    "burnin_excluded": a.excluded.get("burnin", 0), **({"damage": list(a.damage)} if a.damage
                                                                        else {})},
        "arm_definitions": arm_details(run, a.env), "prompts": {**(run.prompts or {}),
                                                                 "check": run.prompt_tokens},
        "planted": a.planted or [],
        "paired_latency": a.paired_latency, "aa_in_run": _floor_comparisons(a),
        "burnin": a.burnin, "drift": a.drift, "knee": a.knee,
        "latency": a.latency, "secondary": secondary,
        "mde_pct": {"paired": {m: c.get("mde_pct") for m, c in primary.items()},
                    "goodput": {s["name"]: s["mde_pct"] for s in slos},
                    **{m: r["comparison"]["mde"] for m, r in a.secondary.items()}},
        "command": run.command,
        **({"over_instances": a.over_instances} if a.over_instances else {}),
        **({"slow_host": a.slow_host} if a.slow_host else {}),
    })


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


def write_report(run_dir: Path, report: Report) -> None:
    """Write report.json and report.md atomically (common.jsonfile); report.json JSON-safe (NaN written
    as null) and compressed where the folder keeps it compressed."""
    write_report_json(stored(run_dir / "report.json"), Report.from_json(_clean(report.to_json())))
    write_text(run_dir / "report.md", render_markdown(report))
