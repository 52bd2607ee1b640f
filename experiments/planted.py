"""The positive control's line: what a planted arm should change, and whether the run saw it.

A planted arm (`planted:<N>us`, integration/planted.py) runs the stock kernels plus a busy-wait of
N per norm call. Every decode step makes the model's norm calls once (integration.proof.normcalls:
2L+1 hidden-size norms, plus 2L head norms with q/k norms), and a token costs one decode step, so

    predicted TPOT change = N x norm calls per step / stock step time,

with the stock step time from the in-graph step profile weighted by the step sizes the baseline ran
(the attribution's profile detail, on a GPU with a profile), else from what the run measured: the
baseline's median TPOT at each load, the prediction averaged over loads in log space as the paired
estimate averages cells. The control is detected when the paired TPOT interval excludes zero, and
the prediction holds when it lies inside that interval. On the GPU the delay also costs one kernel
launch per call: where integration.proof.plantedcost measured the delay's in-graph cost per call on
the run's GPU, N is that measured cost; elsewhere (CPU, or a delay not measured) it is N alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

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


def _step_from_profile(attribution: Mapping) -> float | None:
    """Histogram-weighted stock step time (us) of the attribution's profile detail, if it has one."""
    buckets = (attribution.get("profile_detail") or {}).get("by_bucket") or []
    steps = sum(b["steps"] for b in buckets)
    return sum(b["step_us"] * b["steps"] for b in buckets) / steps if steps else None


def _baseline_tpot(latency: Sequence[Mapping], baseline: str) -> dict[float, float]:
    """load -> the baseline's median TPOT (ms) at that load."""
    return {float(r["load"]): float(r["tpot_p50_ms"]) for r in latency
            if r["arm"] == baseline and r.get("tpot_p50_ms")}


def prediction(added_us: float, attribution: Mapping, latency: Sequence[Mapping], baseline: str) -> dict:
    """The predicted TPOT change (%) of `added_us` more per step, and what the step time came from."""
    step_us = _step_from_profile(attribution)
    if step_us:
        return {"predicted_pct": 100.0 * added_us / step_us, "stock_step_us": step_us,
                "step_source": f"in-graph step profile {attribution.get('profile')}, weighted by the "
                               f"step sizes {attribution.get('histogram_arm')} ran"}
    tpot = _baseline_tpot(latency, baseline)
    if not tpot:
        return {"predicted_pct": None, "stock_step_us": None,
                "step_source": f"no step profile and no median TPOT of {baseline}"}
    logs = [math.log1p(added_us / (1000.0 * ms)) for ms in tpot.values()]
    return {"predicted_pct": 100.0 * math.expm1(sum(logs) / len(logs)),
            "stock_step_us": {f"{load:g}": 1000.0 * ms for load, ms in sorted(tpot.items())},
            "step_source": f"{baseline}'s median TPOT per load, measured in this run (no step profile)"}


def planted_lines(run: Mapping, latency: Sequence[Mapping], paired_latency: Mapping,
                  attribution: Mapping) -> list[dict]:
    """One entry per planted arm: delay, norm calls per step, predicted and measured TPOT change,
    whether the control was detected and whether the prediction lies inside the interval."""
    labels, names = list(run["arm_labels"]), list(run["arms"])
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
        measured = added_us_per_call(attribution.get("gpu"), ns)
        per_call_us = ns / 1000.0 if measured is None else measured
        entry.update(norm_calls_per_step=calls, added_us_per_call=per_call_us,
                     per_call_source="the delay alone" if measured is None else
                     f"measured in a CUDA graph ({result_path(attribution['gpu']).name})",
                     added_us_per_step=per_call_us * calls,
                     **prediction(per_call_us * calls, attribution, latency, labels[0]))
        tpot = (paired_latency.get(label) or {}).get("tpot_ms") or {}
        ci = tpot.get("ci95_pct")
        pred = entry["predicted_pct"]
        entry.update(measured_pct=tpot.get("estimate_pct"), ci95_pct=ci,
                     detected=None if ci is None else bool(ci[0] > 0 or ci[1] < 0),
                     prediction_inside=None if ci is None or pred is None else bool(ci[0] <= pred <= ci[1]),
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
    return text
