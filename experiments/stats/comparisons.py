"""Which arms a run compares, the arm order of each cell, the design's fingerprint, the burn-in and
drift summaries. Pure functions of run.json (a core.runfile.Run) and records frames (goodput.records_frame).

Every arm is compared with the first (the baseline). An arm that runs the baseline's kernel on a
second server (the interleaved A/A arm, e.g. "stock-b") is the run's own noise floor; the primary
comparison is the first arm that is not such a control, or, in a pure A/A run, the A/A pair itself.
A planted arm is compared with its twin too (experiments.stats.plantedline). In a run of resident sets
(--resident) two labels are compared only where they replayed cells together; every pair the report
would compare and that never did is named (`not_measured`).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from experiments.core.runfile import Run
from experiments.stats import duet, paired, plantedline


def arm_roles(run: Run) -> dict:
    """{"baseline", "primary" (the compared label), "controls" (A/A labels), "treatments" (all but the
    baseline), "pure_aa"}."""
    labels = list(run.arm_labels)
    arms = run.arm_of()
    base = labels[0]
    others = labels[1:]
    controls = [lab for lab in others if arms[lab] == arms[base]]
    pure_aa = len(controls) == len(others)
    primary = others[0] if pure_aa else next(lab for lab in others if lab not in controls)
    return {"baseline": base, "primary": primary, "controls": [] if pure_aa else controls,
            "treatments": others, "pure_aa": pure_aa}


def cell_orders(run: Run) -> dict[tuple[int, float], list[str]]:
    """(window, load) -> the arm order that cell was replayed in (run.json's schedule)."""
    return {(int(e["window"]), float(e["load"])): list(e.get("order") or []) for e in run.schedule}


def cell_arms(run: Run) -> dict[tuple[int, float], list[str]]:
    """(window, load) -> the labels that replay that cell: its order in a run of resident sets, else
    every label."""
    labels = list(run.arm_labels)
    orders = cell_orders(run)
    return {(int(w["id"]), float(load)): orders.get((int(w["id"]), float(load)), labels)
            if run.resident_sets else labels for w in run.windows for load in run.loads}


def required_pairs(run: Run) -> list[tuple[str, str]]:
    """(reference, arm) of every comparison that must be measured together: the baseline with the
    primary arm and with every arm but a planted one that has a twin, and such a planted arm with its
    twin. `run` needs arm_labels, arms and arm_definitions (run.json's, or the same made from a config)."""
    labels = list(run.arm_labels)
    out = [(labels[0], arm_roles(run)["primary"])]
    for label in labels[1:]:
        pair = (plantedline.reference_label(run, label), label)
        if pair not in out:
            out.append(pair)
    return out


def reported_pairs(run: Run) -> list[tuple[str, str]]:
    """(reference, arm) of every comparison a report makes: the baseline with every other arm, and a
    planted arm with its twin."""
    base = run.arm_labels[0]
    return list(dict.fromkeys([(base, lab) for lab in run.arm_labels[1:]] + required_pairs(run)))


def together(run: Run) -> set[frozenset[str]]:
    """Every pair of labels that replayed a cell together: every pair, unless the run had resident sets
    (then from the schedule's cell orders)."""
    orders = cell_orders(run).values() if run.resident_sets else [run.arm_labels]
    return {frozenset(p) for order in orders for p in itertools.combinations(order, 2)}


def not_measured(run: Run) -> list[list[str]]:
    """[reference, arm] of every comparison of `reported_pairs` that was never measured together."""
    shared = together(run)
    return [list(p) for p in reported_pairs(run) if frozenset(p) not in shared]


def fingerprint(run: Run) -> dict:
    """What an A/A floor must share with a run to be its noise floor: device, model, servers (a duet's
    GPUs, sleep mode), loads, windows, clipping. The number of resident servers counts the third server
    of `--with-aa` runs."""
    servers = run.servers
    command = [str(c) for c in (run.command or [])]
    n_servers = len(servers) + (1 if "--with-aa" in command else 0)
    model, config, clip = run.model, run.config, run.clipping or {}
    layout = {"layout": "duet", "gpus": len((run.duet or {}).get("gpus") or [])} if run.layout == "duet" \
        else {}  # absent for turns runs, whose fingerprints stay as they were
    if config.get("sleep_mode"):  # one server awake at a time, a sleep and a wake before each replay
        layout["sleep_mode"] = True
    return {
        **layout,
        "device": run.device, "model": model.get("name"), "dtype": model.get("dtype"),
        "eager": model.get("eager"), "resident": run.resident, "resident_servers": n_servers,
        "gpu_memory_utilization": sorted({s.get("gpu_memory_utilization") for s in servers.values()},
                                         key=str),
        "kv_cache_memory_bytes": sorted({s.get("kv_cache_memory_bytes") for s in servers.values()}, key=str),
        "max_num_seqs": config.get("max_num_seqs"), "loads": sorted(float(x) for x in run.loads),
        "window_s": sorted({float(w["duration_s"]) for w in run.windows}),
        "max_input_tokens": clip.get("max_input_tokens"), "max_output_tokens": clip.get("max_output_tokens"),
        "trace_sha256": run.trace.get("sha256"),
        **({"resident_sets": run.resident_sets} if run.resident_sets else {}),
    }


def fingerprint_differences(this: Mapping, other: Mapping | None) -> list[dict]:
    """[{key, this, floor}] where two fingerprints differ; one entry with key None when other is None."""
    if not other:
        return [{"key": None, "this": None, "floor": "the A/A report records no design fingerprint"}]
    return [{"key": k, "this": this.get(k), "floor": other.get(k)} for k in sorted(set(this) | set(other))
            if this.get(k) != other.get(k)]


def paired_latency(measured: pd.DataFrame, run: Run, seed: int = 0) -> dict[str, dict]:
    """treatment label -> experiments.stats.paired.compare_all against the baseline, for every other arm;
    for a duet run experiments.stats.duet.compare, the GPU placement in place of the arm order."""
    p = arm_roles(run)
    if run.layout == "duet":
        sched = duet.from_record(run.duet["schedule"])
        return {lab: duet.compare(measured, p["baseline"], lab, sched, run.loads, seed)
                for lab in p["treatments"]}
    orders, shared = cell_orders(run), together(run)
    return {lab: paired.compare_all(measured, p["baseline"], lab, orders, seed) for lab in p["treatments"]
            if frozenset((p["baseline"], lab)) in shared}


def burnin_summary(df: pd.DataFrame, measured: pd.DataFrame) -> list[dict]:
    """Per burn-in replay (phase "burnin"): arm, window, load, median TPOT and p90 TTFT, and their
    change (%) against the same arm's measured replay of that window at that load (the same requests):
    how much slower a fresh server ran."""
    burn = df[(df["phase"] == "burnin") & df["ok"]]
    out = []
    for (arm, window, load), g in burn.groupby(["arm", "window", "load"], sort=True):
        m = measured[(measured["arm"] == arm) & (measured["window"] == window) & (measured["load"] == load)
                     & measured["ok"]]
        row = {"arm": arm, "window": int(window), "load": float(load), "n": len(g),
               "tpot_p50_ms": _q(g["tpot_ms"], 0.5), "ttft_p90_ms": _q(g["ttft_ms"], 0.9)}
        for key, q in (("tpot_p50_ms", 0.5), ("ttft_p90_ms", 0.9)):
            ref = _q(m[key[:4] + "_ms"], q)
            row[f"{key}_vs_measured_pct"] = (None if ref in (None, 0) or row[key] is None
                                             else 100.0 * (row[key] / ref - 1.0))
        out.append(row)
    return out


def _q(values: pd.Series, q: float) -> float | None:
    v = values.dropna()
    return float(v.quantile(q)) if len(v) else None


def drift(measured: pd.DataFrame, run: Run) -> dict:
    """Trend of the baseline's per-cell median TPOT (in % of its load's mean) over the run, and of the
    primary comparison's per-cell median log TPOT ratio (%): slope per minute of replay start time
    (run.json "replays"), or per cell in schedule order for runs that predate that record."""
    p = arm_roles(run)
    base, treat = p["baseline"], p["primary"]
    starts = {(r["arm"], int(r["window"]), float(r["load"])): r["started_s"]
              for r in run.replays if r.get("phase") == "measure"}
    seq = {(int(e["window"]), float(e["load"])): i for i, e in enumerate(run.schedule)}
    ok = measured[(measured["arm"] == base) & measured["ok"]]
    med = ok.groupby(["window", "load"], sort=True)["tpot_ms"].median().dropna()
    if med.empty:
        return {"unit": None, "baseline": paired.trend([], []), "paired": paired.trend([], [])}
    rel = 100.0 * (med / med.groupby(level="load").transform("mean") - 1.0)
    use_time = all((base, w, ld) in starts for w, ld in med.index)
    x = [starts[(base, w, ld)] / 60.0 if use_time else seq.get((w, ld), 0) for w, ld in med.index]
    out = {"unit": "per minute" if use_time else "per cell (schedule order)", "baseline_arm": base,
           "baseline": paired.trend(rel.to_numpy(), x)}
    cells = paired.cell_medians(paired.request_pairs(measured, base, treat, "tpot_ms"))
    xs = [starts.get((base, w, ld), 0.0) / 60.0 if use_time else seq.get((w, ld), 0)
          for w, ld in zip(cells["window"], cells["load"])]
    out["paired"] = paired.trend(100.0 * cells["median_log_ratio"].to_numpy(), xs)
    out["paired_arms"] = [base, treat]
    return out


def near_bound(measured: pd.DataFrame, ttft_ms: float, tpot_ms: float, arms: Sequence[str],
               tolerance: float = 0.1) -> int:
    """Succeeded requests of ``arms`` with TTFT or TPOT within +-tolerance of the bound."""
    m = measured[measured["arm"].isin(list(arms)) & measured["ok"]]
    r = np.column_stack([m["ttft_ms"] / ttft_ms, m["tpot_ms"] / tpot_ms]) if len(m) else np.empty((0, 2))
    return int((np.abs(r - 1.0) <= tolerance).any(axis=1).sum())
