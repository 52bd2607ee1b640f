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
launch per call, and inside vLLM's compiled graph whatever Inductor no longer fuses around the op.
N is, best first: the planted arm's own step time in vLLM's CUDA graphs (a graph-steps file of
integration.proof.graphtime given to the analysis: the added time per norm call at each measured
decode size, each step-size bucket of the run taking the nearest measured size, weighted by its
steps); else the delay's cost per call beside plain norms in a graph
(integration.proof.plantedcost, for the run's GPU); else N alone (CPU, or nothing measured).
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


def has_planted_arm(run: Mapping) -> bool:
    """Whether any arm of the run after the baseline is a planted control."""
    return any(planted_ns(arm_definition(run, label, name)) is not None
               for label, name in zip(list(run["arm_labels"])[1:], list(run["arms"])[1:]))


def _step_from_profile(attribution: Mapping) -> float | None:
    """Histogram-weighted stock step time (us) of the attribution's profile detail, if it has one."""
    buckets = (attribution.get("profile_detail") or {}).get("by_bucket") or []
    steps = sum(b["steps"] for b in buckets)
    return sum(b["step_us"] * b["steps"] for b in buckets) / steps if steps else None


def _baseline_tpot(latency: Sequence[Mapping], baseline: str) -> dict[float, float]:
    """load -> the baseline's median TPOT (ms) at that load."""
    return {float(r["load"]): float(r["tpot_p50_ms"]) for r in latency
            if r["arm"] == baseline and r.get("tpot_p50_ms")}


def graph_cost_per_call(graph: Mapping, ns: int, attribution: Mapping) -> float | None:
    """us added per norm call by a planted delay of `ns`, from a graph-steps document: per measured
    decode size the planted arm's change per call against stock; each bucket of the attribution's
    step-size histogram takes the nearest measured size (in log rows), weighted by its steps (the
    median over sizes without a histogram). None if the document has no arm with that delay."""
    per_size = {}
    for row in graph.get("sizes", []):
        for name, arm in (row.get("arms") or {}).items():
            try:
                same = planted_ns(arms.get(name)) == ns
            except ValueError:
                same = False
            if same and arm.get("change_per_norm_call_us") is not None:
                per_size[int(row["batch_tokens"])] = float(arm["change_per_norm_call_us"])
    if not per_size:
        return None
    buckets = (attribution.get("profile_detail") or {}).get("by_bucket") or []
    if not buckets:
        vals = sorted(per_size.values())
        return vals[len(vals) // 2]

    def nearest(tokens: float) -> float:
        return per_size[min(per_size, key=lambda n: abs(math.log(n) - math.log(max(tokens, 1.0))))]

    steps = sum(b["steps"] for b in buckets)
    return sum(nearest(b["tokens"]) * b["steps"] for b in buckets) / steps


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
                  attribution: Mapping, graph_steps: tuple[str, Mapping] | None = None) -> list[dict]:
    """One entry per planted arm: delay, norm calls per step, predicted and measured TPOT change,
    whether the control was detected and whether the prediction lies inside the interval.
    `graph_steps`: (path shown, document) of a graph-steps file with the planted arm's step time."""
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
        in_vllm = graph_cost_per_call(graph_steps[1], ns, attribution) if graph_steps else None
        measured = added_us_per_call(attribution.get("gpu"), ns)
        if in_vllm is not None:
            per_call_us = in_vllm
            source = (f"the planted arm's step time in vLLM's CUDA graphs ({graph_steps[0]}), per step "
                      f"size as {attribution.get('histogram_arm') or 'the run'} ran them")
        elif measured is not None:
            per_call_us = measured
            source = f"measured in a CUDA graph ({result_path(attribution['gpu']).name})"
        else:
            per_call_us, source = ns / 1000.0, "the delay alone"
        entry.update(norm_calls_per_step=calls, added_us_per_call=per_call_us, per_call_source=source,
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
