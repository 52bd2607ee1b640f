"""The positive control's line: what a planted arm should change, and whether the run saw it.

A planted arm (`planted:<N>us`, integration/plantedprovider.py) is the patched arm with N of GPU spin inside
every fused norm call (on CPU: stock plus a host busy-wait at every call). It is compared with its
twin, the run's patched arm, from which it differs by the delay alone (the same provider, policy
table, compile ranges and compiled graphs; at step sizes the policy leaves to stock both run the same
code), and beside that with the baseline as every arm is. Without a patched arm in the run, and for
the earlier planted designs a run records (follows_policy), the reference is the baseline.

Each output token of a decoding request waits one step, so over the requests of a load the delay
adds sum over steps (decoding requests in the step x time added to the step) to a total decode time
sum over requests (last token - first token):

    predicted TPOT change at a load = added decode-wait time / the reference's total decode time,

the steps from the reference's step-size histogram at that load (run.json "step_histograms"; a step
of up to the largest decode size measured counts its tokens, at the bucket's midpoint, as decoding
requests; the larger, mixed steps share the rest of the decoding tokens the records hold) and the
decode times and tokens from its records. Loads are averaged in log space as the paired estimate
averages its cells and shown per load beside it. The control is detected when the paired TPOT
interval excludes zero, and the prediction holds when it lies inside that interval.

The time added per norm call is, best first: the planted arm's step time in vLLM minus its
reference's (a graph-steps file of integration.proof.graphtime: CUDA-graph replays at each decode
size, both arms against stock in the same rounds), zero at step sizes where the planted arm's policy
leaves the call to stock; else the delay's cost per call beside plain fused calls in a graph
(integration.proof.plantedcost, for the run's GPU); else N alone (CPU, or nothing measured).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from experiments.core.runfile import Run
from experiments.stats import paired
from experiments.stats.attribution import histogram_points
from integration import arms
from integration.names import PLANTED_NS_ENV, POLICY_ENV, POLICY_ENV_COMPILED, PROVIDER
from integration.proof.normcalls import norm_shape
from integration.proof.plantedcost import added_us_per_call, result_path


def planted_ns(arm: arms.Arm | None) -> int | None:
    """The planted delay per norm call (ns) of a planted arm ($RMSNORM_PLANTED_NS in its environment,
    today's and every earlier design), None for any other arm."""
    if arm is None or not arms.is_planted(arm):
        return None
    return int(dict(arm.extra_env)[PLANTED_NS_ENV])


def has_planted_arm(run: Run) -> bool:
    """Whether any arm of the run after the baseline is a planted control."""
    return any(planted_ns(run.arm(label)) is not None
               for label in run.arm_labels[1:])


def _decode_time(decode: Mapping[tuple[str, float], tuple[float, int]] | None,
                 arm: str) -> dict[float, tuple[float, int]]:
    """load -> (decode ms, decode tokens) of `arm` where its records hold decode time: the
    denominator of a prediction at that load, whether or not the latency table has a median TPOT
    for it."""
    return {ld: (ms, n) for (a, ld), (ms, n) in (decode or {}).items() if a == arm and n > 0 and ms > 0}


def _baseline_tpot(latency: Sequence[Mapping], baseline: str) -> dict[float, float]:
    """load -> the baseline's median TPOT (ms) at that load."""
    return {float(r["load"]): float(r["tpot_p50_ms"]) for r in latency
            if r["arm"] == baseline and r.get("tpot_p50_ms")}


def _same_delay(name: str, ns: int) -> bool:
    try:
        return planted_ns(arms.get(name)) == ns
    except ValueError:
        return False


DECODE_TOP = 256.0  # without decode sizes measured, steps up to this many tokens count as decode steps


def follows_policy(run: Run, label: str) -> bool:
    """Whether the planted arm `label` is the patched arm plus the delay in its fused calls: its
    recorded description says so (arms.PLANTED_TWIN: today's arm, and the first twin, which had a
    provider of its own). Earlier planted arms (a delay op after every stock norm; the fused kernel
    at every call) delayed every call and are compared with the baseline, as they were."""
    arm = run.arm(label)
    return planted_ns(arm) is not None and arm.description.startswith(arms.PLANTED_TWIN)


def reference_label(run: Run, label: str) -> str:
    """The arm the planted arm `label` is compared with: its twin, the run's first other arm on the
    kit's provider with the planted arm's policy variables and no delay (patched: the same policy, as
    shipped or fused at every call), else the baseline (and always the baseline for an earlier planted
    design)."""
    labels = list(run.arm_labels)
    if not follows_policy(run, label):
        return labels[0]
    keys = (POLICY_ENV, POLICY_ENV_COMPILED, PLANTED_NS_ENV)

    def policy_and_delay(arm: arms.Arm) -> tuple:
        return tuple(dict(arm.extra_env).get(k) for k in keys)

    twin = (*policy_and_delay(run.arm(label))[:2], None)
    for lab in labels[1:]:  # the twin: the same policy, no delay
        arm = run.arm(lab)
        if lab != label and arm is not None and arm.provider == PROVIDER and \
                policy_and_delay(arm) == twin:
            return lab
    return labels[0]


Orders = Mapping[tuple[int, float], Sequence[str]]  # (window, load) -> the arms' replay order


def reference_comparisons(measured: pd.DataFrame, run: Run, orders: Orders,
                          seed: int = 0) -> dict[str, dict]:
    """planted label -> the paired TPOT comparison (experiments.stats.paired.compare_metric) with its
    twin, for every planted arm whose reference is not the baseline (that one is in the report's
    paired latency already)."""
    labels = list(run.arm_labels)
    out = {}
    for label in labels[1:]:
        if planted_ns(run.arm(label)) is None:
            continue
        ref = reference_label(run, label)
        if ref != labels[0]:
            out[label] = paired.compare_metric(measured, ref, label, "tpot_ms", orders, seed)
    return out


def decode_totals(frame: pd.DataFrame) -> dict[tuple[str, float], tuple[float, int]]:
    """(arm, load) -> (decode time in ms, decode tokens) summed over the succeeded requests with at
    least two output tokens: TPOT x (tokens - 1) and tokens - 1 (goodput.records_frame columns)."""
    ok = frame[frame["ok"] & (frame["completion_tokens"].fillna(0) >= 2) & frame["tpot_ms"].notna()]
    steps = ok["completion_tokens"].astype(float) - 1.0
    g = pd.DataFrame({"arm": ok["arm"], "load": ok["load"].astype(float), "ms": ok["tpot_ms"] * steps,
                      "tokens": steps}).groupby(["arm", "load"])
    return {(str(a), float(ld)): (float(r["ms"]), int(r["tokens"])) for (a, ld), r in g.sum().iterrows()}


def cost_curve(graph: Mapping, ns: int, reference: str | None = None,
               prefill: bool = True) -> list[tuple[float, float]]:
    """(tokens per step, us added per norm call) of a planted delay of `ns` from a graph-steps
    document: at the decode sizes ("sizes", CUDA-graph replays) its change per call against stock
    minus `reference`'s in the same rounds (none: against stock); with `prefill`, then the prefill
    sizes above the largest decode size ("prefill", wall-clock steps). Sorted by tokens, empty without
    that delay (or without the reference where one is named)."""
    def points(rows: Sequence[Mapping]) -> dict[float, float]:
        out = {}
        for row in rows:
            found = row.get("arms") or {}
            mine = next((a for name, a in found.items() if _same_delay(name, ns)
                         and a.get("change_per_norm_call_us") is not None), None)
            ref = (found.get(reference) or {}).get("change_per_norm_call_us") if reference else 0.0
            if mine is not None and ref is not None:
                out[float(row["batch_tokens"])] = float(mine["change_per_norm_call_us"]) - float(ref)
        return out
    decode = points(graph.get("sizes", []))
    top = max(decode, default=0.0)
    later = {t: c for t, c in points(graph.get("prefill", [])).items() if t > top} if prefill else {}
    return sorted({**decode, **later}.items())


def cost_at(curve: Sequence[tuple[float, float]], tokens: float) -> float:
    """The curve's cost at `tokens`: linear in log tokens between measured sizes, the end values
    outside them (as the attribution interpolates its profile)."""
    xs = [math.log(t) for t, _ in curve]
    return float(np.interp(math.log(max(tokens, 1.0)), xs, [c for _, c in curve]))


def fused_sizes(run: Run, label: str) -> list[tuple[int, int]] | None:
    """The step sizes (token ranges) where the planted arm's norm calls run the fused kernel and so
    carry the delay: None for every size (CPU, where the host delay follows every call; an earlier
    planted arm, which delayed every call; or a run that records no policy)."""
    policy = run.patched_policy or {}
    if run.device != "cuda" or not follows_policy(run, label) or not policy.get("segments"):
        return None
    return sorted({(int(lo), int(hi)) for segs in policy["segments"].values() for lo, hi, fused in segs
                   if fused})


def _steps(hist: Mapping | None, top: float) -> list[tuple[float, int, bool]]:
    """(tokens, count, decode-sized) per histogram bucket: the bucket's midpoint for buckets up to
    `top` tokens (their tokens are the decoding requests), its upper bound above."""
    if not hist:
        return []
    bounds = [float(b) for b in hist["buckets"]]
    out = []
    for bound, count in histogram_points(hist):
        low = max((b for b in bounds if b < bound), default=0.0)  # the bucket below, empty or not
        small = bound <= top
        out.append(((low + 1.0 + bound) / 2.0 if small else bound, count, small))
    return out


def added_fraction(hist: Mapping | None, decode: tuple[float, int] | None, step_ms: float,
                   cost: Callable[[float], float], calls: int, top: float) -> tuple[float, float]:
    """(predicted TPOT change as a fraction, us added per decode token) at one load: `cost(tokens)`
    us per norm call x `calls` per step, weighted by the decoding requests of each step of `hist`
    (flat per token without a histogram), over the total decode time `decode` (ms, tokens) or, without
    it, over `step_ms` per decode token."""
    steps = _steps(hist, top)
    small = sum(t * n for t, n, s in steps if s)
    per_token = cost(1.0) * calls
    if steps and small:
        total_tokens = decode[1] if decode else small
        big_steps = sum(n for _, n, s in steps if not s)
        big_cost = sum(cost(t) * n for t, n, s in steps if not s) / big_steps if big_steps else 0.0
        big = max(total_tokens - small, 0.0)
        added = sum(cost(t) * t * n for t, n, s in steps if s) + big_cost * big
        per_token = added * calls / (small + big)
    ms_per_token = decode[0] / decode[1] if decode and decode[1] else step_ms
    return per_token / (1000.0 * ms_per_token), per_token


def _inside(ci: Sequence[float] | None, value: float | None) -> bool | None:
    return None if ci is None or value is None else bool(ci[0] <= value <= ci[1])


def _log_mean_pct(per_load: Sequence[float]) -> float | None:
    logs = [math.log1p(p / 100.0) for p in per_load]
    return 100.0 * math.expm1(sum(logs) / len(logs)) if logs else None


def _per_call(sizes: list[tuple[int, int]] | None, ns: int, ref_name: str | None, attribution: Mapping,
              graph_steps: tuple[str, Mapping] | None) -> tuple[list[tuple[float, float]], float, str]:
    """(cost curve, flat us per call, where the cost comes from) of one planted arm whose delay
    follows its fused calls at `sizes` (fused_sizes)."""
    curve = cost_curve(graph_steps[1], ns, ref_name, prefill=sizes is None) if graph_steps else []
    if curve:
        against = f"minus {ref_name}'s" if ref_name else "against stock"
        return curve, cost_at(curve, 1.0), (
            f"the planted arm's step time in vLLM {against} ({graph_steps[0]}: CUDA-graph replays at "
            "decode sizes" + (", wall-clock prefill steps above)" if sizes is None else ")"))
    measured = added_us_per_call(attribution.get("gpu"), ns)
    if measured is not None:
        return [], measured, f"measured in a CUDA graph ({result_path(attribution['gpu']).name})"
    return [], ns / 1000.0, "the delay alone"


def call_cost(run: Run, label: str, attribution: Mapping, graph_steps: tuple[str, Mapping] | None
              ) -> tuple[Callable[[float], float], float, str]:
    """(us the planted arm `label` adds per norm call at a step of n tokens, the flat cost per call
    where no curve was measured, where the cost comes from): zero at the step sizes its policy leaves
    to stock (planted and reference run the same code there)."""
    labels, names = list(run.arm_labels), list(run.arms)
    ref = reference_label(run, label)
    ref_name = names[labels.index(ref)] if ref != labels[0] else None
    sizes = fused_sizes(run, label)
    curve, flat, source = _per_call(sizes, planted_ns(run.arm(label)),
                                    ref_name, attribution, graph_steps)

    def cost(tokens: float) -> float:
        if sizes is not None and not any(lo <= tokens <= hi for lo, hi in sizes):
            return 0.0
        return cost_at(curve, tokens) if curve else flat
    return cost, flat, source


def planted_lines(run: Run, latency: Sequence[Mapping], paired_latency: Mapping,
                  attribution: Mapping, graph_steps: tuple[str, Mapping] | None = None,
                  reference: Mapping[str, Mapping] | None = None,
                  decode: Mapping[tuple[str, float], tuple[float, int]] | None = None) -> list[dict]:
    """One entry per planted arm: delay, reference arm, norm calls per step, predicted and measured
    TPOT change against the reference (overall and per load), whether the control was detected and
    whether the prediction lies inside the interval, and the change against the baseline.
    `graph_steps`: (path shown, document) of a graph-steps file with the planted arm's step time in
    vLLM; `reference`: reference_comparisons; `decode`: decode_totals of the run's records."""
    labels, out = list(run.arm_labels), []
    for label in labels[1:]:
        arm = run.arm(label)
        ns = planted_ns(arm)
        if ns is None:
            continue
        ref = reference_label(run, label)
        entry: dict = {"arm": label, "ns_per_call": ns, "reference": ref}
        try:
            shape = norm_shape(run.model.get("config") or {})
        except ValueError as exc:
            out.append({**entry, "status": "no prediction", "reason": str(exc)})
            continue
        calls = sum(shape.expected().values())
        sizes = fused_sizes(run, label)
        cost, flat, source = call_cost(run, label, attribution, graph_steps)
        top = max((float(r["batch_tokens"]) for r in graph_steps[1].get("sizes", [])), default=DECODE_TOP) \
            if graph_steps else DECODE_TOP
        hists = run.step_histograms
        tpot_ms = _baseline_tpot(latency, ref) or _baseline_tpot(latency, labels[0])
        totals = _decode_time(decode, ref)
        by_load, added = {}, []
        for load in sorted(set(tpot_ms) | set(totals)):
            hist = next((h for key, h in (hists.get(ref) or hists.get(labels[0]) or {}).items()
                         if float(key) == load), None)
            frac, per_token = added_fraction(hist, totals.get(load), tpot_ms.get(load, 0.0), cost, calls, top)
            added.append(per_token)
            by_load[f"{load:g}"] = {"added_us_per_decode_token": per_token,
                                    "stock_tpot_ms": tpot_ms.get(load), "predicted_pct": 100.0 * frac}
        tpot = ((reference or {}).get(label) if ref != labels[0] else
                (paired_latency.get(label) or {}).get("tpot_ms")) or {}
        vs_base = (paired_latency.get(label) or {}).get("tpot_ms") or {}
        mean_added = sum(added) / len(added) if added else flat * calls
        entry.update(delay_at="every norm call" if sizes is None else "every fused norm call",
                     norm_calls_per_step=calls, added_us_per_call=mean_added / calls, per_call_source=source,
                     added_us_per_decode_token=mean_added,
                     predicted_pct=_log_mean_pct([r["predicted_pct"] for r in by_load.values()]),
                     step_source=f"{ref}'s " + ("decode time per token (its records)" if totals
                                                else "median TPOT")
                     + " at each load, measured in this run")
        for load, row in by_load.items():
            m = (tpot.get("by_load") or {}).get(load) or {}
            row.update(measured_pct=m.get("estimate_pct"), ci95_pct=m.get("ci95_pct"),
                       prediction_inside=_inside(m.get("ci95_pct"), row["predicted_pct"]))
        ci = tpot.get("ci95_pct")
        entry.update(by_load=by_load, measured_pct=tpot.get("estimate_pct"), ci95_pct=ci,
                     detected=None if ci is None else bool(ci[0] > 0 or ci[1] < 0),
                     prediction_inside=_inside(ci, entry["predicted_pct"]),
                     status="compared" if ci is not None else "no interval",
                     reason=None if ci is not None else tpot.get("reason"),
                     vs_baseline={"baseline": labels[0], "estimate_pct": vs_base.get("estimate_pct"),
                                  "ci95_pct": vs_base.get("ci95_pct")} if ref != labels[0] else None)
        out.append(entry)
    return out


def _us(v: float) -> str:
    """Three significant digits below 1000, whole units above (not 1e+03)."""
    return f"{v:.3g}" if abs(v) < 999.5 else f"{v:.0f}"


def planted_text(p: Mapping) -> str:
    """The report line of one planted arm."""
    ref = p.get("reference")
    head = f"planted control {p['arm']}" + (f" vs {ref}" if ref else "") + f" ({p['ns_per_call'] / 1000:g} us"
    if p.get("norm_calls_per_step") is None:
        return f"{head} per norm call): no prediction ({p.get('reason')})"
    head += (f" at {p['delay_at']}; {_us(p['added_us_per_call'])} us added per call from "
             f"{p['per_call_source']} x {p['norm_calls_per_step']} calls per step = "
             f"{p['added_us_per_decode_token']:.4g} us per decode token, mean over loads)")
    pred = p.get("predicted_pct")
    text = f"{head}: predicted TPOT {'n/a' if pred is None else f'{pred:+.2f}%'} (from {p['step_source']})"
    if p.get("ci95_pct") is None:
        text += f"; measured: no interval ({p.get('reason')})"
    else:
        lo, hi = p["ci95_pct"]
        text += f"; measured {p['measured_pct']:+.2f}% [{lo:+.2f}, {hi:+.2f}]%"
        text += " — detected" if p["detected"] else " — NOT detected (the interval includes 0)"
        if p.get("prediction_inside") is not None:
            text += (", prediction inside the interval" if p["prediction_inside"]
                     else ", prediction outside the interval")
        loads = [f"{load}x predicted {row['predicted_pct']:+.2f}%, measured " + (
            f"{row['measured_pct']:+.2f}% [{row['ci95_pct'][0]:+.2f}, {row['ci95_pct'][1]:+.2f}]% ("
            f"{'inside' if row['prediction_inside'] else 'outside'})" if row.get("ci95_pct")
            else "no interval") for load, row in (p.get("by_load") or {}).items()]
        text += f"; per load: {'; '.join(loads)}" if len(loads) > 1 else ""
    base = p.get("vs_baseline") or {}
    if base.get("ci95_pct"):
        text += (f"; against {base['baseline']} {base['estimate_pct']:+.2f}% "
                 f"[{base['ci95_pct'][0]:+.2f}, {base['ci95_pct'][1]:+.2f}]%")
    return text
