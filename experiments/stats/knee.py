"""The knee search and capacity per window: pure functions.

Goodput only moves when requests sit near an SLO bound, so a run can first search speed-up factors
on the baseline arm alone (phase "knee": at each factor the windows `search_windows` picks by request count,
pooled, since one window does not stand for the run) and then measure where the
strictest tier it can reach crosses ATTAINMENT_TARGET: at two loads bracketing that knee plus one
latency-sensitive load (the lowest factor searched, or half the knee if lower). The search goes on
past the listed factors until a tier fails, the client can no longer send on time, or the maximum
factor is reached (`next_factor`). Capacity per arm and window is the load where that window's
attainment crosses the target, interpolated between the loads measured.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from experiments.core.runfile import Run
from experiments.core.schedule import KNEE_PROMPT_SEEDS
from experiments.core.slo import SLO
from experiments.stats import goodput
from experiments.stats import intervals as stats

BRACKET = 1.25  # the two knee loads: knee / BRACKET and knee * BRACKET
# The latency-sensitive load lies at most knee / LATENCY_RATIO: the lowest factor searched, unless
# that sits next to the knee's lower load (on the H200 the search 5x, 8x put the interactive knee
# at 6.77x, so the lowest factor, 5x, measured almost what 5.4x did: experiments/results/
# h200-llama8b-twin).
LATENCY_RATIO = 2.0
# Past the listed --knee factors, while every tier still meets the target at the highest factor
# searched, the search goes on at GROWTH times it, up to the run's maximum factor (--knee-max): on the
# H200 the pooled 15-s windows of the 8B shape met every tier at 3x-8x (experiments/results/
# h200-llama8b-planted-inkernel), and on the H100 the 1B shape met every tier up to 27x, where three
# extra factors ended the search (h100-llama1b-default), so a bounded list found no knee.
GROWTH = 1.5
# Why a search stopped (run.json "knee" "stopped" "reason"): a tier's attainment fell below the target
# at the last factor searched; the client sent that factor's replays late; the maximum factor was met.
KNEE, CLIENT, MAXIMUM = "knee", "client", "maximum"

# The windows the knee search pools: those at these quantiles of the measured windows' request
# counts. A run's pooled attainment is pulled down by its few heavy windows, which the quartiles
# (0.25, 0.5, 0.75) left out: over the five H200 runs whose measured windows located the interactive
# knee (h200-llama8b-confirm2, -confirm, -twin, -twin-aa, -knee) the quartile picks' pooled
# attainment was above all windows' at every load (+0.006 to +0.106, mean 0.056) and the knee they
# give 8-39% too high (9.67x against 6.94x in confirm2). Five quantiles from 0.1 to 0.9 give mean
# |bias| 0.029 with no consistent sign and knees within 10% of all windows'. Re-derived by
# `python -m research.kneewindows experiments/results/<run> ...` (experiments/results/README.md).
SEARCH_QUANTILES = (0.1, 0.3, 0.5, 0.7, 0.9)


def search_windows(request_counts: Sequence[int],
                   quantiles: Sequence[float] = SEARCH_QUANTILES) -> list[int]:
    """Indices of the windows the knee search replays and pools: those at `quantiles` of the measured
    windows' request counts (the earliest on ties), so the knee stands for the windows measured. One
    window alone does not: on the H200 the trace's first window put the interactive knee above 32x,
    and its median-count window above 12x, while the measured windows pooled crossed 90% at about
    5.7x (experiments/results/h200-llama8b-knee, -knee-search), their own attainment at 8x ranging
    from 0.41 to 1.0."""
    if not request_counts:
        raise ValueError("the knee search needs at least one window")
    ranked = sorted(range(len(request_counts)), key=lambda i: (request_counts[i], i))
    picks = {ranked[round(q * (len(ranked) - 1))] for q in quantiles}
    return sorted(picks)


def grown(last: float, max_factor: float) -> float:
    """The factor searched after `last` once the listed ones have run out: GROWTH x it, at most
    `max_factor`."""
    return min(_round(last * GROWTH), max_factor)


def possible_factors(listed: Sequence[float], max_factor: float) -> list[float]:
    """Every factor a search of `listed` may reach: the list, then `grown` ones up to `max_factor`."""
    out = list(listed)
    while out and out[-1] < max_factor:
        out.append(grown(out[-1], max_factor))
    return out


def highest_load(max_factor: float) -> float:
    """The highest load a run with a knee search may replay: the knee's upper load (knee x BRACKET)
    when the knee lies at `max_factor`."""
    return _round(max_factor * BRACKET)


def lateness_figures(replays: Sequence[Sequence[float]]) -> dict:
    """The send lateness of one searched factor from its replays' per-request lateness (ms, one list
    per replay): p99 of each replay, their median, the pooled p99 and the largest."""
    per = [stats.percentile(r, 0.99) for r in replays if len(r)]
    pooled = [x for r in replays for x in r]
    return {"replay_p99_ms": per, "median_replay_p99_ms": float(np.median(per)) if per else None,
            "p99_ms": stats.percentile(pooled, 0.99) if pooled else None,
            "max_ms": float(max(pooled)) if pooled else None}


def client_late(figures: Mapping, target_ms: float) -> bool:
    """True when most of a factor's replays were sent late: the median replay's lateness p99 above
    `target_ms`. One replay alone does not count: in six H200 runs one replay of a factor's three or
    five carried a 100-300 ms stall of the client (a run of consecutive requests sent late, e.g.
    h200-llama8b-confirm2 at 5x: p99 169 ms against 0.7 and 0.7 ms in the others), so the pooled p99
    would have stopped those six searches at a passing stall; this rule stops no committed search."""
    median = figures.get("median_replay_p99_ms")
    return median is not None and median > target_ms


def next_factor(factor: float, attainment: Mapping[str, float], late: bool, listed: Sequence[float],
                max_factor: float,
                target: float = goodput.ATTAINMENT_TARGET) -> tuple[float | None, str | None]:
    """After the search's replays at `factor` (each tier's pooled `attainment`; `late`: client_late):
    (the next factor, None), or (None, why it stops). It stops at the client's limit (CLIENT), once
    every tier is below `target` (KNEE), past the listed factors once any tier is below it (KNEE),
    or with every tier met at `max_factor` (MAXIMUM); past the list it goes on at `grown`."""
    if late:
        return None, CLIENT
    below = [a < target for a in attainment.values()]
    if below and all(below):
        return None, KNEE
    rest = [f for f in listed if f > factor]
    if rest:
        return rest[0], None
    if any(below):
        return None, KNEE
    if factor >= max_factor:
        return None, MAXIMUM
    return grown(factor, max_factor), None


def stop_line(stopped: Mapping, late: Mapping, target_ms: float) -> str:
    """Why the search stopped, as the report says it; `late`: the lateness_figures of the factor where
    it stopped (read only when the client was the limit)."""
    f = f"{stopped['factor']:g}x"
    if stopped["reason"] == CLIENT:
        replays = ", ".join(f"{x:.1f}" for x in late["replay_p99_ms"])
        return (f"The client, not the server, is the limit: at {f} the knee search's replays were sent "
                f"late (send lateness p99 per replay {replays} ms, median {late['median_replay_p99_ms']:.1f} "
                f"ms, above the client's {target_ms:g} ms target; pooled p99 {late['p99_ms']:.1f} ms, max "
                f"{late['max_ms']:.1f} ms), so the search stopped there and {f} does not place the knee.")
    if stopped["reason"] == KNEE:
        return f"The search stopped at {f}: a tier's attainment fell below 90% there."
    return f"The search stopped at its maximum factor, {f} (--knee-max), with every tier still met."


def strictness(slo: SLO) -> tuple[float, float]:
    """Sort key, strictest first: the TPOT bound, then the TTFT bound."""
    return (slo.tpot_ms, slo.ttft_ms)


def attainment_points(df: pd.DataFrame, slo: SLO) -> list[tuple[float, float]]:
    """(factor, attainment) per load of a records frame (goodput.records_frame), sorted by factor."""
    col = goodput.met_column(slo)
    return [(float(load), float(g[col].mean())) for load, g in df.groupby("load", sort=True)]


def knee(points: Sequence[tuple[float, float]], target: float = goodput.ATTAINMENT_TARGET) -> dict:
    """Where attainment falls through ``target`` (goodput.highest_passing_load on -attainment)."""
    loads, att = zip(*points) if points else ((), ())
    return goodput.highest_passing_load(list(loads), [-a for a in att], -target)


def _round(x: float) -> float:
    """Two significant figures: loads that read well in a report."""
    return float(f"{x:.2g}")


def choose_loads(knees: Mapping[str, dict], slos: Sequence[SLO], factors: Sequence[float]) -> dict:
    """The loads to measure at: the strictest tier whose knee lies inside the searched factors,
    bracketed (knee / BRACKET, knee * BRACKET), plus one latency-sensitive load, the lowest factor
    searched or knee / LATENCY_RATIO if that is lower. {"loads": None, "reason"} when no tier's knee
    was located."""
    for slo in sorted(slos, key=strictness):
        k = knees.get(slo.name) or {}
        if k.get("status") == "interpolated" and k.get("load"):
            bracket = {_round(k["load"] / BRACKET), _round(k["load"] * BRACKET)}
            low = min(float(min(factors)), _round(k["load"] / LATENCY_RATIO))
            loads = tuple(sorted(bracket | {low}))
            return {"tier": slo.name, "knee": k["load"], "loads": loads, "reason": None}
    return {"tier": None, "knee": None, "loads": None,
            "reason": "no tier's attainment crossed the target between the factors searched "
                      f"({', '.join(f'{f:g}x' for f in factors)})"}


def capacity_per_window(cells: pd.DataFrame, slo: str,
                        target: float = goodput.ATTAINMENT_TARGET) -> pd.DataFrame:
    """Per (arm, window): the load where that window's attainment crosses ``target`` (goodput.cell_table
    rows of one SLO), None unless it crosses between two measured loads."""
    rows = []
    c = cells[cells["slo"] == slo]
    for (arm, window), g in c.groupby(["arm", "window"], sort=True):
        k = knee(list(zip(g["load"], g["attainment"])), target)
        rows.append({"arm": arm, "window": int(window), "capacity": k["load"] if k["status"] == "interpolated"
                     else None, "status": k["status"]})
    return pd.DataFrame(rows, columns=["arm", "window", "capacity", "status"])


def compare_capacity(cells: pd.DataFrame, slo: str, baseline: str, treatment: str) -> dict:
    """Capacity per arm (mean over windows where it was located, t interval) and the paired change
    (% of the baseline's mean) over windows where both arms' capacity was located."""
    per = capacity_per_window(cells, slo)
    out: dict = {"slo": slo, "per_window": per.to_dict(orient="records"), "arms": {}}
    for arm in (baseline, treatment):
        v = per.loc[(per["arm"] == arm) & per["capacity"].notna(), "capacity"].astype(float).to_numpy()
        ci = stats.t_ci(v) if v.size >= 2 and np.ptp(v) > 0 else None
        out["arms"][arm] = {"n": int(v.size), "mean": float(v.mean()) if v.size else None,
                            "ci95": list(ci) if ci else None}
    wide = per.pivot(index="window", columns="arm", values="capacity") if len(per) else pd.DataFrame()
    if {baseline, treatment} <= set(wide.columns):
        both = wide[[baseline, treatment]].dropna().astype(float)
        scale = float(both[baseline].mean()) if len(both) else math.nan
        diffs = (100.0 * (both[treatment] - both[baseline]) / scale).tolist() if scale else []
    else:
        diffs = []
    out["paired"] = stats.compare_paired(diffs).to_json()
    return out


def beyond_listed(decided: Mapping) -> list[float]:
    """The factors a knee search ran past its --knee list (run.json "knee": "factors" searched,
    "listed"; runs before the extension record no "listed" and searched only their list)."""
    listed = decided.get("listed", decided.get("factors", []))
    return [f for f in decided.get("factors", []) if f not in listed]


def on_time(points: Mapping[str, Sequence], stopped: Mapping | None) -> dict[str, list]:
    """The points that place the knee: all of them, less the factor where the client was the limit
    (its attainment is the client's as much as the server's)."""
    drop = stopped["factor"] if stopped and stopped.get("reason") == CLIENT else None
    return {name: [p for p in pts if p[0] != drop] for name, pts in points.items()}


def lateness_per_factor(found: pd.DataFrame) -> dict[float, dict]:
    """lateness_figures of every searched factor of a records frame's phase "knee" rows."""
    out = {}
    for load, g in found.groupby("load", sort=True):
        replays = [w["lateness_ms"].dropna().tolist() for _, w in g.groupby("window", sort=True)]
        out[float(load)] = lateness_figures(replays)
    return out


def summary(df: pd.DataFrame, run: Run, slos: Sequence[SLO]) -> dict | None:
    """The knee search of a run re-derived from its records (phase "knee"), beside the choice run.json
    records; None for a run without one."""
    found = df[df["phase"] == "knee"]
    decided = run.knee
    if found.empty and not decided:
        return None
    points = {s.name: attainment_points(found, s) for s in slos}
    decided = decided or {}
    stopped = decided.get("stopped")
    out = {"arm": decided.get("arm"), "windows": decided.get("windows", [decided.get("window", 0)]),
           "points": points,
           "knees": {name: knee(p) for name, p in on_time(points, stopped).items()},
           "chosen": {k: decided.get(k) for k in ("tier", "knee", "loads", "reason", "loads_before")}}
    if len(out["windows"]) > 1 and decided.get("prompt_seeds") != KNEE_PROMPT_SEEDS:
        out["shared_prompts"] = True  # recorded before the search seeded each window: one seed per factor
    more = beyond_listed(decided)
    if more:  # only where the search went past its list
        out["beyond_listed"] = more
    if stopped:  # recorded since the search stops at the client's limit or --knee-max
        late = lateness_per_factor(found)
        out.update(stopped=stopped, max_factor=decided["max_factor"],
                   lateness_target_ms=decided["lateness_target_ms"],
                   lateness={f"{f:g}": v for f, v in late.items()})
    return out
