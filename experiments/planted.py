"""The positive control's line: what a planted arm should change, and whether the run saw it.

A planted arm (`planted:<N>us`, integration/planted.py) spins N inside every norm call (on CUDA
the fused kernel at every call, built with the delay; on CPU stock plus a host busy-wait). Every
step makes the model's norm calls once (integration.proof.normcalls: 2L+1 hidden-size norms, plus
2L head norms with q/k norms), and each output token of a request waits one step, so a request's
TPOT grows by the mean time the delay adds to a step:

    predicted TPOT change at a load = added us per step at that load / baseline's median TPOT there,

averaged over loads in log space as the paired estimate averages its cells, and shown per load
beside the paired estimate of that load. The control is detected when the paired TPOT interval
excludes zero, and the prediction holds when it lies inside that interval.

The added time per norm call is, best first: the planted arm's own step time in vLLM (a graph-steps
file of integration.proof.graphtime given to the analysis: CUDA-graph replays at each decode size,
wall-clock steps at each prefill size above them; each bucket of the baseline's step-size histogram
at that load takes the cost at its size, linear in log tokens between measured sizes, weighted by
its steps). That cost also holds the fused kernel's own difference from stock at each size, and
it need not be flat: the first planted arm (a separate delay op after each stock norm) cost 1.2-2.2 us
per call in the decode graphs but 30 us in a 512-token prefill (piecewise graphs) on the H200. Else
the delay's cost per call beside plain fused calls in a graph (integration.proof.plantedcost, for the
run's GPU); else N alone (CPU, or nothing measured).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from experiments.attribution import histogram_points
from integration import arms
from integration.proof.normcalls import norm_shape
from integration.proof.plantedcost import added_us_per_call, result_path


def arm_definition(run: Mapping, label: str, name: str) -> arms.Arm | None:
    """The Arm of a label: run.json's recorded definition, else the built-in or parsed arm of that
    name (runs before arm definitions were recorded), else None."""
    recorded = (run.get("arm_definitions") or {}).get(label)
    if recorded:
        return arms.Arm.from_json({k: recorded[k] for k in arms.ARM_FIELDS if k in recorded},
                                  f"run.json arm_definitions[{label!r}]")
    try:
        return arms.get(name)
    except ValueError:
        return None


def planted_ns(arm: arms.Arm | None) -> int | None:
    """The planted delay per norm call (ns) of a planted arm, None for any other arm."""
    if arm is None or arm.provider != arms.PLANTED_PROVIDER:
        return None
    return int(dict(arm.extra_env)[arms.PLANTED_NS_ENV])


def has_planted_arm(run: Mapping) -> bool:
    """Whether any arm of the run after the baseline is a planted control."""
    return any(planted_ns(arm_definition(run, label, name)) is not None
               for label, name in zip(list(run["arm_labels"])[1:], list(run["arms"])[1:]))


def _baseline_tpot(latency: Sequence[Mapping], baseline: str) -> dict[float, float]:
    """load -> the baseline's median TPOT (ms) at that load."""
    return {float(r["load"]): float(r["tpot_p50_ms"]) for r in latency
            if r["arm"] == baseline and r.get("tpot_p50_ms")}


def _same_delay(name: str, ns: int) -> bool:
    try:
        return planted_ns(arms.get(name)) == ns
    except ValueError:
        return False


def cost_curve(graph: Mapping, ns: int) -> list[tuple[float, float]]:
    """(tokens per step, us added per norm call) of a planted delay of `ns` from a graph-steps
    document: decode sizes from CUDA-graph replays ("sizes"), then prefill sizes above the largest
    decode size from wall-clock steps ("prefill"); sorted by tokens, empty without that delay."""
    def points(rows: Sequence[Mapping]) -> dict[float, float]:
        return {float(row["batch_tokens"]): float(arm["change_per_norm_call_us"])
                for row in rows for name, arm in (row.get("arms") or {}).items()
                if _same_delay(name, ns) and arm.get("change_per_norm_call_us") is not None}
    decode = points(graph.get("sizes", []))
    top = max(decode, default=0.0)
    prefill = {t: c for t, c in points(graph.get("prefill", [])).items() if t > top}
    return sorted({**decode, **prefill}.items())


def cost_at(curve: Sequence[tuple[float, float]], tokens: float) -> float:
    """The curve's cost at `tokens`: linear in log tokens between measured sizes, the end values
    outside them (as the attribution interpolates its profile)."""
    xs = [math.log(t) for t, _ in curve]
    return float(np.interp(math.log(max(tokens, 1.0)), xs, [c for _, c in curve]))


def added_per_step(run: Mapping, baseline: str, loads: Sequence[float], calls: int,
                   curve: Sequence[tuple[float, float]], flat_us: float) -> dict[float, float]:
    """load -> us the delay adds to the mean step: with a cost curve and the baseline's step-size
    histogram at that load (run.json "step_histograms"), each bucket at its representative size,
    weighted by its steps; otherwise `flat_us` per call. Times `calls` norm calls per step."""
    hists = (run.get("step_histograms") or {}).get(baseline) or {}
    out = {}
    for load in loads:
        hist = next((h for key, h in hists.items() if float(key) == load), None)
        pts = histogram_points(hist) if curve and hist else []
        steps = sum(n for _, n in pts)
        per_call = sum(cost_at(curve, t) * n for t, n in pts) / steps if steps else flat_us
        out[load] = per_call * calls
    return out


def prediction(added: Mapping[float, float], tpot_ms: Mapping[float, float]) -> dict:
    """The predicted TPOT change (%): per load the added step time over the baseline's median TPOT
    there (each output token waits one step, so a request's TPOT grows by the mean added step time),
    averaged over loads in log space as the paired estimate averages its cells."""
    per_load = {load: 100.0 * added[load] / (1000.0 * tpot_ms[load]) for load in sorted(tpot_ms)
                if load in added}
    if not per_load:
        return {"predicted_pct": None, "by_load": {}}
    logs = [math.log1p(p / 100.0) for p in per_load.values()]
    return {"predicted_pct": 100.0 * math.expm1(sum(logs) / len(logs)),
            "by_load": {f"{load:g}": {"added_us_per_step": added[load], "stock_tpot_ms": tpot_ms[load],
                                      "predicted_pct": p} for load, p in per_load.items()}}


def _inside(ci: Sequence[float] | None, value: float | None) -> bool | None:
    return None if ci is None or value is None else bool(ci[0] <= value <= ci[1])


def planted_lines(run: Mapping, latency: Sequence[Mapping], paired_latency: Mapping,
                  attribution: Mapping, graph_steps: tuple[str, Mapping] | None = None) -> list[dict]:
    """One entry per planted arm: delay, norm calls per step, predicted and measured TPOT change
    (overall and per load), whether the control was detected and whether the prediction lies
    inside the interval. `graph_steps`: (path shown, document) of a graph-steps file with the
    planted arm's step time in vLLM."""
    labels, names = list(run["arm_labels"]), list(run["arms"])
    tpot_ms = _baseline_tpot(latency, labels[0])
    out = []
    for label, name in zip(labels[1:], names[1:]):
        ns = planted_ns(arm_definition(run, label, name))
        if ns is None:
            continue
        entry: dict = {"arm": label, "ns_per_call": ns}
        try:
            shape = norm_shape((run.get("model") or {}).get("config") or {})
        except ValueError as exc:
            out.append({**entry, "status": "no prediction", "reason": str(exc)})
            continue
        calls = sum(shape.expected().values())
        curve = cost_curve(graph_steps[1], ns) if graph_steps else []
        measured = added_us_per_call(attribution.get("gpu"), ns)
        if curve:
            flat, source = cost_at(curve, 1.0), (
                f"the planted arm's step time in vLLM ({graph_steps[0]}: CUDA-graph replays at decode "
                f"sizes, wall-clock prefill steps above), per step size as {labels[0]} ran them")
        elif measured is not None:
            flat, source = measured, f"measured in a CUDA graph ({result_path(attribution['gpu']).name})"
        else:
            flat, source = ns / 1000.0, "the delay alone"
        added = added_per_step(run, labels[0], sorted(tpot_ms), calls, curve, flat)
        pred = prediction(added, tpot_ms)
        mean_added = sum(added.values()) / len(added) if added else flat * calls
        entry.update(norm_calls_per_step=calls, added_us_per_call=mean_added / calls, per_call_source=source,
                     added_us_per_step=mean_added, predicted_pct=pred["predicted_pct"],
                     step_source=f"{labels[0]}'s median TPOT per load, measured in this run")
        tpot = (paired_latency.get(label) or {}).get("tpot_ms") or {}
        ci = tpot.get("ci95_pct")
        for load, row in pred["by_load"].items():
            m = (tpot.get("by_load") or {}).get(load) or {}
            row.update(measured_pct=m.get("estimate_pct"), ci95_pct=m.get("ci95_pct"),
                       prediction_inside=_inside(m.get("ci95_pct"), row["predicted_pct"]))
        entry.update(by_load=pred["by_load"], measured_pct=tpot.get("estimate_pct"), ci95_pct=ci,
                     detected=None if ci is None else bool(ci[0] > 0 or ci[1] < 0),
                     prediction_inside=_inside(ci, entry["predicted_pct"]),
                     status="compared" if ci is not None else "no interval",
                     reason=None if ci is not None else tpot.get("reason"))
        out.append(entry)
    return out


def planted_text(p: Mapping) -> str:
    """The report line of one planted arm."""
    head = f"planted control {p['arm']} ({p['ns_per_call'] / 1000:g} us per norm call"
    if p.get("norm_calls_per_step") is None:
        return f"{head}): no prediction ({p.get('reason')})"
    per_call = p.get("added_us_per_call", p["ns_per_call"] / 1000)
    head += (f", {per_call:.3g} us added per call from {p.get('per_call_source', 'the delay alone')}"
             f" x {p['norm_calls_per_step']} calls per step = {p['added_us_per_step']:.4g} us per step)")
    pred = p.get("predicted_pct")
    pred_text = "n/a" if pred is None else f"{pred:+.2f}%"
    text = f"{head}: predicted TPOT {pred_text} (stock step time from {p['step_source']})"
    if p.get("ci95_pct") is None:
        return text + f"; measured: no interval ({p.get('reason')})"
    lo, hi = p["ci95_pct"]
    text += f"; measured {p['measured_pct']:+.2f}% [{lo:+.2f}, {hi:+.2f}]%"
    text += " — detected" if p["detected"] else " — NOT detected (the interval includes 0)"
    if p.get("prediction_inside") is not None:
        text += (", prediction inside the interval" if p["prediction_inside"]
                 else ", prediction outside the interval")
    loads = [f"{load}x predicted {row['predicted_pct']:+.2f}%, measured " + (
        f"{row['measured_pct']:+.2f}% [{row['ci95_pct'][0]:+.2f}, {row['ci95_pct'][1]:+.2f}]% ("
        f"{'inside' if row['prediction_inside'] else 'outside'})" if row.get("ci95_pct") else "no interval")
        for load, row in (p.get("by_load") or {}).items()]
    return text + (f"; per load: {'; '.join(loads)}" if len(loads) > 1 else "")
