"""The server-instance floor under the committed served intervals, from the committed in-run A/A pairs.

    python -m research.instancefloor --out runtime_tables/instance-prior.json

The committed GPU runs of one server per arm give intervals over the cells of that one pair of
servers (a run of several instances per arm measures its instance variance itself, and is left out).
Each one's in-run A/A (a second baseline server, aa_in_run) differs from the baseline by the two
servers' instance effects plus the cells' noise: variance 2 s2_instance + se^2. Over the GPU runs of
one model the method of moments gives s2_instance = (var of the A/A estimates - mean se^2) / 2,
floored at 0, with Satterthwaite's degrees of freedom
(experiments.stats.instances.external_instance_var). Every run's paired-TPOT interval of each arm
against the baseline is then restated with 2 s2_instance added to its within-pair variance (Welch-
Satterthwaite, instances.with_external): an external estimate, from other runs than the one restated
(its own A/A among them). The plan (experiments.stats.design) is what +-PRECISION on an arm
difference over instances costs with these components and confirm3's timings (or, with --budget-min,
the narrowest interval a budget buys), the window length chosen with the request scatter of
confirm3's A/A. Writes the JSON and a markdown table beside it.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from pathlib import Path

from common.cliargs import OneLineParser, command_line, fail, positive_float
from common.jsonfile import ResultFileError, read_json, stored, write_json, write_text
from experiments.core.rundir import load_records
from experiments.core.runfile import read_run
from experiments.stats import design, goodput, instances
from experiments.stats.paired import pct
from research.cellnoise import paired_requests

RESULTS = Path(__file__).resolve().parent.parent / "experiments" / "results"
METRIC = "tpot_ms"
TIMING_RUN = "h200-llama8b-confirm3"  # the plan's costs and request scatter
WINDOW_CHOICES = (5.0, 10.0, 20.0, 30.0, 60.0)


def _entry(run: str, report: dict, arm: str, fit: dict) -> dict:
    lo, hi = fit["ci95_pct"]
    se = instances.se_from_interval(lo, hi, fit["df"])
    return {"run": run, "gpu": report["gpu"], "model": report["model"]["name"], "arm": arm,
            "baseline": fit["baseline"], "estimator": fit["estimator"], "cells": fit["n_cells"],
            "estimate_pct": fit["estimate_pct"], "ci95_pct": [lo, hi], "df": fit["df"],
            "se_pct": 100.0 * se, "excludes_zero": bool(lo > 0 or hi < 0)}


def read_runs(results: Path) -> tuple[list[dict], list[dict]]:
    """The GPU runs' in-run A/A pairs and every arm's paired comparison (one row each)."""
    aa, arms = [], []
    for path in sorted({stored(p.parent / "report.json") for p in results.glob("*/report.json*")}):
        report = read_json(path, 1, "report")
        if report.get("device") != "cuda" or instances.measured_own(report.get("over_instances")):
            continue
        twin = (report.get("aa_in_run") or {}).get("pair")
        for arm, metrics in report.get("paired_latency", {}).items():
            fit = metrics.get(METRIC) or {}
            if fit.get("ci95_pct") is None:
                continue
            row = _entry(path.parent.name, report, arm, fit)
            row["role"] = "aa" if (twin and arm == twin[1]) or report["aa"]["is_aa"] else \
                "planted" if arm.startswith("planted") else "patched"
            arms.append(row)
            if twin and arm == twin[1]:
                aa.append(row)
        arms += _planted_vs_reference(path.parent.name, report)
    return aa, arms


def _planted_vs_reference(run: str, report: dict) -> list[dict]:
    """The planted control against its reference arm (the report's planted reading), on the degrees of
    freedom of the planted arm's comparison with the baseline (the same cells, the same fit)."""
    out = []
    for p in report.get("planted") or []:
        fit = report["paired_latency"].get(p["arm"], {}).get(METRIC) or {}
        if p.get("ci95_pct") is None or fit.get("df") is None or p["reference"] == fit["baseline"]:
            continue
        row = _entry(run, report, p["arm"], {**fit, "baseline": p["reference"],
                                             "estimate_pct": p["measured_pct"], "ci95_pct": p["ci95_pct"]})
        out.append({**row, "arm": f"{p['arm']} vs {p['reference']}", "role": "planted"})
    return out


def floor_by_model(aa: list[dict]) -> dict[str, dict]:
    """Per (gpu, model) with 2+ A/A pairs: the external instance variance and the figures behind it."""
    out = {}
    for key in sorted({(r["gpu"], r["model"]) for r in aa}):
        rows = [r for r in aa if (r["gpu"], r["model"]) == key]
        if len(rows) < 2:
            continue
        est = instances.external_instance_var([math.log1p(r["estimate_pct"] / 100) for r in rows],
                                              [r["se_pct"] / 100 for r in rows])
        out[instances.floor_key(*key)] = {
            **est, "runs": [r["run"] for r in rows], "sd_estimates_pct": 100 * est["sd_estimates"],
            "rms_se_pct": 100 * math.sqrt(est["mean_se2"]),
            "instance_sd_pct": 100 * math.sqrt(est["instance_var"]),
            "pair_sd_pct": 100 * math.sqrt(2 * est["instance_var"]),
            "source": "external: the committed in-run A/A pairs of this GPU and model (method of moments)"}
    return out


def restate(arms: list[dict], floors: dict[str, dict]) -> list[dict]:
    """Each arm's interval with the instance variance of its GPU and model added (None where none)."""
    out = []
    for r in arms:
        f = floors.get(instances.floor_key(r["gpu"], r["model"]))
        row = {k: r[k] for k in ("run", "arm", "role", "cells", "estimate_pct", "ci95_pct", "df",
                                 "excludes_zero")}
        if f is None:
            out.append({**row, "over_instances_ci95_pct": None,
                        "reason": "fewer than 2 in-run A/A pairs of this GPU and model"})
            continue
        w = instances.with_external(math.log1p(r["estimate_pct"] / 100), r["se_pct"] / 100, r["df"],
                                    f["instance_var"], f["df"])
        lo, hi = pct(w["lo"]), pct(w["hi"])
        out.append({**row, "over_instances_ci95_pct": [lo, hi], "over_instances_df": w["df"],
                    "over_instances_excludes_zero": bool(lo > 0 or hi < 0)})
    return out


def prior(floor: dict, aa: list[dict], run_dir: Path) -> tuple[design.Components, design.Costs, dict]:
    """The plan's components (instance: the floor; cell: the A/A pairs' pooled per-cell variance less
    the request share; request: run_dir's A/A requests) and costs (run_dir's server starts and replays)."""
    rows = [r for r in aa if r["run"] in floor["runs"]]
    cell_var = sum((r["se_pct"] / 100) ** 2 * r["cells"] for r in rows) / len(rows)
    record = read_run(run_dir)
    base, twin = read_json(run_dir / "report.json", 1, "report")["aa_in_run"]["pair"]
    frame = goodput.records_frame(load_records(run_dir)[0], [])
    req = instances.request_component(paired_requests(frame, base, twin, METRIC).assign(instance=0))
    window_s = float(record.config["window_s"])
    cells = sum(1 for r in record.replays if r["phase"] == "measure") / len(record.servers)
    per_s = req["requests"] / cells / window_s
    measured = sorted(r["started_s"] for r in record.replays if r["phase"] == "measure")
    replay_s = (measured[-1] - measured[0]) / (len(measured) - 1)
    loads = [float(x) for x in record.loads]
    trace_s = sum(1 / x for x in loads) / len(loads)  # replay seconds per trace second, mean over loads
    first = min(r["started_s"] for r in record.replays)
    comps = design.Components(floor["instance_var"], max(cell_var - req["in_cell_median_var"], 0.0),
                              req["request_var"], per_s)
    costs = design.Costs(start_min=2 * first / len(record.servers) / 60,
                         overhead_s=max(replay_s - trace_s * window_s, 0.0), s_per_window_s=trace_s,
                         loads=len(loads))
    return comps, costs, {"cell_var_at_window": cell_var, "window_s": window_s, "timing_run": run_dir.name}


def markdown(doc: dict) -> str:
    """The restated intervals as a markdown table."""
    lines = [f"# The server-instance floor under the served intervals\n\nMade by `{doc['command']}`; "
             "figures in percent of paired TPOT against the baseline arm. The instance variance is an "
             "external estimate from the committed in-run A/A pairs (method of moments).\n"]
    for key, f in doc["instance"].items():
        lines.append(f"- {key}: {f['pairs']} A/A pairs, estimates' sd {f['sd_estimates_pct']:.3f}%, rms "
                     f"within-pair se {f['rms_se_pct']:.3f}%: instance sd {f['instance_sd_pct']:.3f}% per "
                     f"server, {f['pair_sd_pct']:.3f}% between two servers, on {f['df']:.1f} df")
    s = doc["aa_summary"]
    lines.append(f"- {s['exclude_zero']} of {s['pairs']} in-run A/A intervals exclude zero\n")
    lines.append("| run | arm | role | estimate | within one server pair | over instances |")
    lines.append("|---|---|---|---|---|---|")

    def iv(x: list | None) -> str:
        return "-" if x is None else f"[{x[0]:+.2f}, {x[1]:+.2f}]"
    for r in doc["restated"]:
        lines.append(f"| {r['run']} | {r['arm']} | {r['role']} | {r['estimate_pct']:+.2f}% | "
                     f"{iv(r['ci95_pct'])} "
                     f"({r['df']} df) | {iv(r['over_instances_ci95_pct'])}"
                     + (f" ({r['over_instances_df']:.0f} df) |" if r["over_instances_ci95_pct"] else " |"))
    p = doc["plan"]
    goal = f"+-{p['target_half_width_pct']:g}%" if "target_half_width_pct" in p else \
        f"{p['budget_gpu_minutes']:g} GPU minutes"
    lines.append(f"\nPlan for {goal} over instances: {p['instances']} instance pairs x "
                 f"{p['windows']} windows x {p['window_s']:g} s at {p['loads']} loads, "
                 f"{p['gpu_minutes']:.0f} GPU minutes (half-width {p['half_width_pct']:.3f}%, "
                 f"MDE {p['mde_pct']:.2f}%).")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: write the instance floor, the restated intervals and the plan."""
    ap = OneLineParser(prog="python -m research.instancefloor", description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=RESULTS, help="the run directories' parent")
    ap.add_argument("--out", type=Path, required=True, help="JSON to write (markdown beside it, .md)")
    ap.add_argument("--precision", type=positive_float, default=0.25,
                    help="wanted half-width in percent of an arm difference over instances (default 0.25)")
    ap.add_argument("--budget-min", type=positive_float,
                    help="GPU minutes to spend instead: the plan is the narrowest interval they buy")
    a = ap.parse_args(argv)
    try:
        aa, arms = read_runs(a.results)
        floors = floor_by_model(aa)
        key = next(k for k, f in floors.items() if TIMING_RUN in f["runs"])
        comps, costs, basis = prior(floors[key], aa, a.results / TIMING_RUN)
        if a.budget_min is None:
            plan = design.design_for_precision(comps, costs, a.precision, window_s=WINDOW_CHOICES)
        else:
            plan = design.design_for_budget(comps, costs, a.budget_min, window_s=WINDOW_CHOICES)
    except (OSError, ValueError, KeyError, StopIteration, ResultFileError) as exc:
        return fail(ap.prog, str(exc) or f"no A/A floor from {TIMING_RUN}")
    doc = {"schema_version": 1, "command": command_line(ap.prog, argv), "metric": METRIC,
           "aa_pairs": aa,
           "aa_summary": {"pairs": len(aa), "exclude_zero": sum(r["excludes_zero"] for r in aa)},
           "instance": floors, "restated": restate(arms, floors), "plan": {**plan, "basis": basis}}
    write_json(a.out, doc)
    write_text(a.out.with_suffix(".md"), markdown(doc))
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
