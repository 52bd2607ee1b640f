"""The planted control's prediction re-made with the prefill feedback: the step simulation
(research.stepsim) of a run's own requests, beside the report's prediction and the measured change.

    python -m research.plantedsim experiments/results/h200-llama8b-confirm3 --arm planted:3us \\
        --out experiments/results/plantedsim/h200-llama8b-confirm3.json

reads the run's records and report.json (run experiments.analyze first), replays the reference arm's
requests of every cell (window, load) through the scheduler model twice: with the forward times of
`--step-times` (a graph-steps file of integration.proof.prove with CUDA-graph decode steps and
wall-clock prefill steps of the run's model and GPU) plus the fitted host overhead, and with the
planted delay added where the report's prediction adds it (experiments.stats.plantedline.call_cost). Per load
it prints the simulated change (median per-request log ratio per cell, mean over cells) beside the
report's prediction and the measured interval; the simulated and measured reference (median TPOT and
inter-token gap) as a check of the model; and where the time went: the change of the time requests
spent in short gaps (decode steps, up to twice the reference's median gap) and in long ones (steps
that carried a prefill), simulated and measured, with the same change between the run's two servers
of the baseline's code (its A/A pair, where it has one) for scale. A diagnosis beside the report, not
a verdict: the model's host overhead is fitted on the run it explains.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from common.cliargs import OneLineParser, command_line, fail
from common.jsonfile import ResultFileError, open_text, project_relative, read_json, stored, write_json
from experiments.core.rundir import load_records
from experiments.core.runfile import Run, read_run
from experiments.stats import plantedline
from integration.proof.normcalls import norm_shape
from integration.proof.profiles import PROJECT_ROOT as ROOT
from loadgen.records import RequestRecord, succeeded, tpot_ms
from research import stepsim

PROG = "python -m research.plantedsim"
STEP_TIMES = Path("integration/results/h200-llama8b-graph/h200-graph-steps.json")
SCHEMA_VERSION = 1
LONG_GAP = 2.0  # a gap longer than this many times the reference's median gap carried a prefill
RecordCells = dict[tuple[float, int], list[RequestRecord]]  # (load, window) -> records
Gaps = dict[tuple[str, float], np.ndarray]  # (arm, load) -> every inter-token gap (us)


KV_LINE = re.compile(r"GPU KV cache size: ([\d,]+) tokens")


def logged_kv_tokens(run_dir: Path, run: Run, label: str) -> int | None:
    """The KV cache size (tokens) the server of `label` logged (vLLM's 'GPU KV cache size: N tokens'),
    from its log as run.json names it, or compressed beside it; None where none holds that line."""
    name = (run.servers.get(label) or {}).get("log")
    path = stored(run_dir / name) if name else None
    if path is None or not path.is_file():
        return None
    with open_text(path, errors="replace") as f:
        found = next((m for m in map(KV_LINE.search, f) if m), None)
    return int(found.group(1).replace(",", "")) if found else None


def _measured(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    """The succeeded requests of the measured replays (loadgen.records.succeeded)."""
    return [r for r in records if r.tags.get("phase") == "measure" and succeeded(r)]


def reference_cells(records: Sequence[RequestRecord], arm: str) -> RecordCells:
    """(load, window) -> the succeeded measured records of `arm`, in due order."""
    cells: RecordCells = {}
    for r in _measured(records):
        if r.tags.get("arm") == arm:
            cells.setdefault((float(r.tags["load"]), int(r.tags["window"])), []).append(r)
    return {k: sorted(v, key=lambda r: r.due_ns) for k, v in sorted(cells.items())}


def requests_of(recs: Sequence[RequestRecord]) -> list[stepsim.Request]:
    """The simulation's requests: due time and the token counts the server reported (else asked)."""
    return [stepsim.Request(r.due_ns / 1000.0, r.prompt_tokens or r.input_tokens,
                            r.completion_tokens or r.output_tokens) for r in recs]


def forward_points(doc: Mapping, arm: str | None) -> list[tuple[float, float]]:
    """(tokens, us) forward times of a graph-steps document: decode sizes and prefill sizes, of `arm`
    where it was timed, else of stock (an arm's median over 1 + its change against stock)."""
    points = {}
    for row in [*doc.get("sizes", []), *doc.get("prefill", [])]:
        found = row.get("arms") or {}
        if arm in found and found[arm].get("median_us"):
            points[float(row["batch_tokens"])] = float(found[arm]["median_us"])
            continue
        other = next((a for a in found.values()
                      if a.get("median_us") and a.get("change_pct") is not None), None)
        if other is not None:
            points[float(row["batch_tokens"])] = float(other["median_us"]) / (1 + other["change_pct"] / 100)
    return sorted(points.items())


def measured_medians(cells: RecordCells) -> tuple[float, float | None]:
    """(median TPOT (loadgen.records.tpot_ms), median of each request's median inter-token gap; None
    without gap samples), us."""
    tpot = [1000.0 * t for recs in cells.values() for r in recs if (t := tpot_ms(r)) is not None]
    gaps = [float(np.median(r.itl_us)) for recs in cells.values() for r in recs if r.itl_us]
    return float(np.median(tpot)), (float(np.median(gaps)) if gaps else None)


def gap_split(gaps: np.ndarray, threshold_us: float) -> tuple[float, float]:
    """(time in gaps up to `threshold_us`, time in longer ones), seconds."""
    return float(gaps[gaps <= threshold_us].sum()) / 1e6, float(gaps[gaps > threshold_us].sum()) / 1e6


def gap_change(before: np.ndarray, after: np.ndarray, threshold_us: float) -> dict:
    """The change (%) from `before` to `after` gaps (us) of the time in short and in long gaps (longer
    than `threshold_us`) and of the number of long ones."""
    (b_short, b_long), (a_short, a_long) = gap_split(before, threshold_us), gap_split(after, threshold_us)
    return {"short": _pct(a_short, b_short), "long": _pct(a_long, b_long),
            "long_count": _pct(float((after > threshold_us).sum()), float((before > threshold_us).sum()))}


def _pct(new: float, old: float) -> float | None:
    return 100.0 * (new / old - 1.0) if old else None


def measured_gaps(records: Sequence[RequestRecord]) -> Gaps:
    """(arm, load) -> every inter-token gap (us; loadgen's itl_us, as vLLM's benchmark counts them) of
    the succeeded measured requests."""
    parts: dict[tuple[str, float], list] = {}
    for r in _measured(records):
        parts.setdefault((r.tags["arm"], float(r.tags["load"])), []).append(np.asarray(r.itl_us or (), float))
    return {k: np.concatenate(v) for k, v in parts.items()}


def measured_gap_change(gaps: Gaps, pair: tuple[str, str], load: float, threshold_us: float) -> dict | None:
    """The change (%) of the time the requests of pair[1] spent in short and in long gaps (longer
    than `threshold_us`) against pair[0]'s at `load`; None where either holds no gap samples."""
    a, b = (gaps.get((arm, load), np.array([])) for arm in pair)
    if not (a.size and b.size):
        return None
    return {"pair": list(pair), **gap_change(a, b, threshold_us)}


def _load_row(load: float, sims: Sequence[stepsim.Outcome], treats: Sequence[stepsim.Outcome],
              reqs: Sequence[Sequence[stepsim.Request]], medians: tuple[float, float | None], gaps: Gaps,
              ref: str, label: str, entry: Mapping, aa: tuple[str, str] | None) -> dict:
    logs = []
    for base, treat, rq in zip(sims, treats, reqs):
        a, b = base.tpot_us(rq), treat.tpot_us(rq)
        ok = np.isfinite(a) & np.isfinite(b) & (a > 0)
        logs.append(float(np.median(np.log(b[ok] / a[ok]))) if ok.any() else math.nan)
    tpot, gap = medians
    sim_gaps = np.concatenate([s.gaps_us() for s in sims])
    threshold = LONG_GAP * (gap if gap is not None else float(np.median(sim_gaps)))
    row: dict = {"load": load, "cells": len(logs), "cell_log_ratios": logs,
                 "simulated_pct": 100.0 * math.expm1(float(np.nanmean(logs))),
                 "reference": {"tpot_p50_us": {"simulated": float(np.nanmedian(np.concatenate(
                     [s.tpot_us(rq) for s, rq in zip(sims, reqs)]))), "measured": tpot},
                     "gap_p50_us": {"simulated": float(np.nanmedian(np.concatenate(
                         [s.median_gap_us() for s in sims]))), "measured": gap}},
                 "long_gap_us": threshold}
    treated_gaps = np.concatenate([t.gaps_us() for t in treats])
    row["gap_time_change_pct"] = {"simulated": gap_change(sim_gaps, treated_gaps, threshold)}
    for key, pair in (("measured", (ref, label)), ("aa_measured", aa)):
        change = measured_gap_change(gaps, pair, load, threshold) if pair else None
        if change is not None:
            row["gap_time_change_pct"][key] = change
    by_load = (entry.get("by_load") or {}).get(f"{load:g}") or {}
    ci = by_load.get("ci95_pct")
    row.update(report_predicted_pct=by_load.get("predicted_pct"), measured_pct=by_load.get("measured_pct"),
               ci95_pct=ci,
               simulated_inside=None if ci is None else bool(ci[0] <= row["simulated_pct"] <= ci[1]),
               report_inside=by_load.get("prediction_inside"))
    return row


def aa_pair(run: Run) -> tuple[str, str] | None:
    """(baseline, its A/A twin): the first later arm that runs the baseline's own arm; None without."""
    labels, names = list(run.arm_labels), list(run.arms)
    twin = next((lab for lab, name in zip(labels[1:], names[1:]) if name == names[0]), None)
    return (labels[0], twin) if twin else None


def simulate_run(run_dir: Path, label: str, step_times: Path, kv_tokens: int | None) -> dict:
    """The document `--out` holds (see the module text)."""
    run = read_run(run_dir)
    rep = read_json(run_dir / "report.json", None, "report")
    entry = next((p for p in rep.get("planted") or [] if p["arm"] == label), None)
    if entry is None or entry.get("norm_calls_per_step") is None:
        names = ", ".join(p["arm"] for p in rep.get("planted") or []) or "none"
        raise ValueError(f"--arm {label!r}: no planted control with a prediction in {run_dir}/report.json "
                         f"(planted arms: {names})")
    doc = read_json(step_times, None, "graph-steps file")
    model = run.model.get("name")
    if Path(str(doc.get("model", ""))).name != model:
        raise ValueError(f"--step-times {step_times} times model {doc.get('model')!r}, "
                         f"the run's is {model!r}")
    ref = entry["reference"]
    kv_source = "--kv-tokens"
    if kv_tokens is None:
        kv_tokens = logged_kv_tokens(run_dir, run, ref)
        kv_source = f"{ref}'s server log" if kv_tokens is not None else "none: unlimited"
    names = dict(zip(run.arm_labels, run.arms))
    steps_path = (rep.get("inputs") or {}).get("planted_steps")
    graph = (steps_path, read_json(ROOT / steps_path, None, "graph-steps file")) if steps_path else None
    cost, _, source = plantedline.call_cost(run, label, rep.get("attribution") or {}, graph)
    calls = sum(norm_shape(run.model.get("config") or {}).expected().values())
    points = forward_points(doc, names[ref] if names[ref] != "stock" else None)
    records, _ = load_records(run_dir)
    cells = reference_cells(records, ref)
    reqs = {k: requests_of(v) for k, v in cells.items()}
    loads = sorted({k[0] for k in cells})
    lowest = {k: v for k, v in reqs.items() if k[0] == loads[0]}
    medians = {load: measured_medians({k: v for k, v in cells.items() if k[0] == load}) for load in loads}
    tpot, gap = medians[loads[0]]
    target = ("median inter-token gap", gap, stepsim.median_gap) if gap is not None else \
        ("median TPOT", tpot, stepsim.median_tpot)
    overhead = stepsim.fit_overhead(lowest, points, target[1], target[2], kv_tokens=kv_tokens)
    base = stepsim.StepTime(tuple(points), overhead)

    def treated(tokens: int) -> float:
        return base(tokens) + calls * cost(tokens)

    gaps, aa = measured_gaps(records), aa_pair(run)
    rows = []
    for load in loads:
        keys = [k for k in reqs if k[0] == load]
        sims = [stepsim.simulate(reqs[k], base, kv_tokens=kv_tokens) for k in keys]
        treats = [stepsim.simulate(reqs[k], treated, kv_tokens=kv_tokens) for k in keys]
        rows.append(_load_row(load, sims, treats, [reqs[k] for k in keys], medians[load], gaps, ref, label,
                              entry, aa))
    return {"schema_version": SCHEMA_VERSION, "run": project_relative(run_dir, ROOT), "arm": label,
            "reference": ref, "step_times": project_relative(step_times, ROOT), "cost_source": source,
            "norm_calls_per_step": calls, "budget": stepsim.BUDGET, "kv_tokens": kv_tokens,
            "kv_tokens_from": kv_source,
            "calibration": {"target": target[0], "load": loads[0], "measured_us": target[1],
                            "overhead_us": overhead},
            "loads": rows}


def _gap_change_text(change: Mapping) -> str:
    return (f"{change['short']:+.2f}% / {change['long']:+.2f}% "
            f"(long ones {change['long_count']:+.2f}% in number)")


def print_summary(doc: Mapping) -> None:
    """The console lines of a document."""
    cal = doc["calibration"]
    kv = "unlimited" if doc["kv_tokens"] is None else f"{doc['kv_tokens']:,} tokens ({doc['kv_tokens_from']})"
    print(f"{doc['arm']} vs {doc['reference']} in {doc['run']}: step simulation, host overhead "
          f"{cal['overhead_us']:.0f} us per step (fitted to the {cal['target']} at {cal['load']:g}x, "
          f"{cal['measured_us']:.0f} us), KV cache {kv}")
    for r in doc["loads"]:
        ci = r["ci95_pct"]
        meas = "no interval" if ci is None else f"{r['measured_pct']:+.2f}% [{ci[0]:+.2f}, {ci[1]:+.2f}]%"
        ref = r["reference"]
        gap_m = ref["gap_p50_us"]["measured"]
        g = r["gap_time_change_pct"]
        line = (f"  {r['load']:g}x: simulated {r['simulated_pct']:+.2f}%, report's prediction "
                f"{r['report_predicted_pct']:+.2f}%, measured {meas}; reference TPOT p50 simulated "
                f"{ref['tpot_p50_us']['simulated'] / 1000:.2f} / measured "
                f"{ref['tpot_p50_us']['measured'] / 1000:.2f} ms, gap p50 "
                f"{ref['gap_p50_us']['simulated'] / 1000:.2f} / "
                + ("n/a" if gap_m is None else f"{gap_m / 1000:.2f}") + " ms; time in short / long gaps "
                f"simulated {_gap_change_text(g['simulated'])}")
        if "measured" in g:
            line += f", measured {_gap_change_text(g['measured'])}"
        if "aa_measured" in g:
            b, t = g["aa_measured"]["pair"]
            line += f"; {t} vs {b}, the same code on two servers: {_gap_change_text(g['aa_measured'])}"
        print(line)


def main(argv: Sequence[str] | None = None) -> int:
    ap = OneLineParser(prog=PROG, description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path, help="a run directory with run.json, its records and report.json")
    ap.add_argument("--arm", required=True, help="the planted arm's label, as the report names it")
    ap.add_argument("--step-times", type=Path, default=ROOT / STEP_TIMES,
                    help=f"graph-steps file of the run's model on its GPU (default: {STEP_TIMES})")
    ap.add_argument("--kv-tokens", type=int, default=None,
                    help="KV cache size in tokens (default: what the reference server logged, else "
                         "unlimited)")
    ap.add_argument("--out", type=Path, default=None, help="also write the document (JSON) here")
    a = ap.parse_args(argv)
    if a.kv_tokens is not None and a.kv_tokens < 1:
        return fail(PROG, f"--kv-tokens must be >= 1, got {a.kv_tokens}")
    if a.out is not None and not a.out.parent.is_dir():
        return fail(PROG, f"--out {a.out}: folder {a.out.parent} does not exist")
    try:
        doc = simulate_run(a.run, a.arm, a.step_times, a.kv_tokens)
    except (FileNotFoundError, ValueError, ResultFileError) as exc:
        return fail(PROG, str(exc))
    print_summary(doc)
    if a.out is not None:
        write_json(a.out, {**doc, "command": command_line(PROG, argv)})
        print(f"written: {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
