"""How much end-to-end change can the kernel explain? A step-time prediction weighted by real shapes.

Inputs:
- the tokens-per-step histogram the baseline server actually ran (run.json "step_histograms",
  from vLLM's ``vllm:iteration_tokens_total``; per-bucket counts, bucket = upper bound of tokens),
- the in-model step profile of the run's GPU and mode (``integration.proof.profiles``: found by
  ``default_profile``, read by ``load_profile``),
- the kernel benchmark of the run's GPU, the one its isolated table ``runtime_tables/policy-<gpu>.json`` was
  built from, as its per-call figures ``runtime_tables/kernel-calls-<gpu>.json``
  (``default_kernel_results``; docs/DESIGN.md format, the "bench" rows only): per-shape medians of
  the fused kernel and of the stock kernels,
- the policy the patched arm dispatched by (run.json "patched_policy": row ranges per op), so a
  step size the policy left to stock saves nothing; a run.json without it (older runs) is read as
  fused at every size, and the result says so,
- optionally a graph-steps file (integration.proof.graphtime, a prove run with the fused kernel at
  every size): at the decode sizes it timed, the step's saving is stock's minus patched's median
  replay time, which counts what the profile's kernel durations miss (PDL overlap, Inductor's
  fusions); above them the profile's norm time is used.

Predicted change in step time = -(sum over steps of norm time saved) / (sum of step times), an upper
bound on the magnitude since the norm overlaps other work. Negative means faster.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

import runtime_tables
from common.jsonfile import ResultFileError, project_relative, read_json, stored
from experiments.core.runfile import Run
from integration import arms
from integration.proof import profiles

POLICY_OP = "fused_add_rms_norm"  # 64 of the 65 norm calls of a Llama step: its answer stands for the step
# the kernel results of kernels.suite: version 2 added launch-shape candidates, the faithful
# Inductor arm and the targets; what is read here (op, dtype, rows, hidden, median_us, stock, policy)
# is in both
KERNEL_SCHEMA_VERSIONS = (1, 2)


def histogram_points(hist: Mapping) -> list[tuple[float, int]]:
    """(representative tokens, step count) per bucket: the bucket's upper bound; +Inf takes the last
    finite one."""
    buckets, counts = hist.get("buckets"), hist.get("counts")
    if not isinstance(buckets, list) or not isinstance(counts, list) or len(buckets) != len(counts):
        raise ValueError(f"step histogram needs equal-length 'buckets' and 'counts' lists, got {hist!r}")
    points: list[tuple[float, int]] = []
    last_finite = 1.0
    for bound, count in zip(buckets, counts):
        b = float(bound)
        if math.isfinite(b):
            last_finite = b
        if count:
            points.append((last_finite if not math.isfinite(b) else b, int(count)))
    return points


def merge_histograms(per_load: Mapping[str, Mapping]) -> list[tuple[float, int]]:
    """Sum of per-load histograms as (tokens, count) points."""
    total: dict[float, int] = {}
    for hist in per_load.values():
        for tokens, count in histogram_points(hist):
            total[tokens] = total.get(tokens, 0) + count
    return sorted(total.items())


def _interp(x: float, xs: list[float], ys: list[float]) -> float:
    """Linear in log(tokens), clamped to the measured range."""
    return float(np.interp(math.log(x), [math.log(v) for v in xs], ys))


def fused_at(policy: Mapping | None) -> Callable[[float], bool]:
    """tokens -> does the patched arm's policy send a step of that size to the fused kernel
    (POLICY_OP's row ranges; None: no policy recorded, fused everywhere)."""
    if policy is None:
        return lambda tokens: True
    try:
        segs = [(int(lo), int(hi), bool(f)) for lo, hi, f in policy["segments"][POLICY_OP]]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"patched_policy: need segments[{POLICY_OP!r}] as [lo, hi, fused] rows "
                         f"({exc!r})") from None
    top = max((hi for _, hi, _ in segs), default=0)
    return lambda tokens: any(lo <= min(int(tokens), top) <= hi and f for lo, hi, f in segs)


def graph_saving(graph: Mapping | None) -> Callable[[float], float | None]:
    """tokens -> us a step saves with the fused kernel, from a graph-steps document (stock's minus
    patched's median replay time, linear in log tokens between the measured decode sizes); None
    above the largest measured size (not graph-timed) or without a document."""
    pts = sorted((float(r["batch_tokens"]), float(r["baseline_median_us"]) - float(p["median_us"]))
                 for r in (graph or {}).get("sizes", [])
                 if (p := (r.get("arms") or {}).get("patched") or {}).get("median_us") is not None
                 and r.get("baseline_median_us") is not None)
    if not pts:
        return lambda tokens: None
    xs, ys = [x for x, _ in pts], [y for _, y in pts]
    return lambda tokens: _interp(tokens, xs, ys) if tokens <= xs[-1] else None


def predict_from_profile(points: list[tuple[float, int]], profile: list[dict],
                         fused: Callable[[float], bool] = lambda tokens: True,
                         graph: Callable[[float], float | None] = lambda tokens: None) -> dict:
    """Step-time change (%) of a step histogram under the per-step saving, counted only for step
    sizes the policy sends to the fused kernel: `graph`'s where it has one, else the profile's norm
    time saving."""
    xs = [r["batch_tokens"] for r in profile]
    saved = total = 0.0
    table = []
    for tokens, count in points:
        step = _interp(tokens, xs, [r["step_us"] for r in profile])
        saving = [r["norm_stock_us"] - r["norm_patched_us"] for r in profile]
        timed = graph(tokens) if fused(tokens) else None
        delta = timed if timed is not None else _interp(tokens, xs, saving) if fused(tokens) else 0.0
        saved += count * delta
        total += count * step
        row = {"tokens": tokens, "steps": count, "step_us": step, "fused": fused(tokens),
               "norm_saved_us": delta}
        if timed is not None:
            row["saving_from"] = "graph replays"
        table.append(row)
    return {"predicted_step_change_pct": 0.0 - 100.0 * saved / total if total else None,  # 0.0 - : no "-0"
            "steps": int(sum(c for _, c in points)), "profiled_tokens": [min(xs), max(xs)],
            "by_bucket": table}


def kernel_saving_per_call(bench: list[dict], op: str, dtype: str, hidden: int, eager: bool,
                           fused: Callable[[float], bool] | None = None) -> dict:
    """Per rows: stock time (vllm_c if eager else inductor) minus what the policy runs, in us
    (`fused`: the patched arm's policy; None: the benchmark's own table, its "policy" column)."""
    stock_key = "vllm_c_us" if eager else "inductor_us"
    rows = sorted((r for r in bench if r.get("op") == op and r.get("dtype") == dtype
                   and int(r.get("hidden", -1)) == hidden), key=lambda r: r["rows"])
    out: dict[int, float] = {}
    for r in rows:
        stock = (r.get("stock") or {}).get(stock_key)
        if stock is None:
            continue
        picked = fused(r["rows"]) if fused is not None else str(r.get("policy", "")).startswith("fused")
        patched = r["median_us"] if picked else stock
        out[int(r["rows"])] = float(stock) - float(patched)
    return out


def predict_from_kernels(points: list[tuple[float, int]], bench: list[dict], model: Mapping, eager: bool,
                         fused: Callable[[float], bool] | None = None) -> dict:
    """Norm time saved per step (us, histogram-weighted) from the kernel benchmark, Llama norm layout:
    one rms_norm and 2 * num_hidden_layers fused_add_rms_norm calls per forward step."""
    cfg = model.get("config") or {}
    hidden, layers = cfg.get("hidden_size"), cfg.get("num_hidden_layers")
    if not hidden or not layers:
        return {"status": "unavailable", "reason": "model config lacks hidden_size / num_hidden_layers"}
    dtype, _ = arms.model_shape(cfg, model.get("dtype") or "auto")
    calls = {"rms_norm": 1, "fused_add_rms_norm": 2 * int(layers)}
    per_op = {op: kernel_saving_per_call(bench, op, dtype, int(hidden), eager, fused) for op in calls}
    absent = [op for op, rows in per_op.items() if not rows]
    if absent:
        return {"status": "unavailable",
                "reason": f"no {dtype} x {hidden} rows for {absent} in kernel results"}
    saved = 0.0
    for tokens, count in points:
        for op, n_calls in calls.items():
            xs = sorted(per_op[op])
            saved += count * n_calls * _interp(tokens, [float(x) for x in xs], [per_op[op][x] for x in xs])
    steps = sum(c for _, c in points)
    return {"status": "estimated", "norm_saved_us_per_step": saved / steps if steps else None,
            "calls_per_step": calls, "dtype": dtype, "hidden": int(hidden),
            "stock_kernel": "vllm_c" if eager else "inductor"}


def default_kernel_results(gpu: str) -> Path | None:
    """The per-call figures of the benchmark the GPU's isolated table was built from
    (runtime_tables/kernel-calls-<gpu>.json, its `source` naming the benchmark); None where there are none."""
    path = runtime_tables.path(f"kernel-calls-{gpu}.json")  # kernels.policy.calls_out, by kernels.suite
    return path if stored(path).is_file() else None


def _kernel_bench(path: Path, shown: str) -> list[dict]:
    """The "bench" rows of a kernel results file (ResultFileError naming the file as `shown`
    otherwise, so a report's reason does not depend on where the checkout lies)."""
    try:
        rows = read_json(path, KERNEL_SCHEMA_VERSIONS, "kernel results").get("bench")
    except ResultFileError as exc:
        raise ResultFileError(str(exc).replace(str(path), shown, 1)) from None
    if not isinstance(rows, list):
        raise ResultFileError(f"{shown}: expected a 'bench' list")
    return rows


def _policy(run: Run, override: Mapping | None) -> tuple[Mapping | None, str]:
    """The patched arm's recorded policy (or the override) and a sentence saying which it is."""
    policy = override if override is not None else run.patched_policy
    if policy is None:
        return None, ("run.json records no patched_policy (an older run): the fused kernel is assumed at "
                      "every step size")
    source = "given with --patched-policy" if override is not None else "recorded in run.json"
    return policy, (f"patched arm's policy {policy.get('table', '?')} ({source}); unfused step sizes "
                    "save nothing")


def attribute(run: Run, baseline: str, root: Path, gpu: str | None, profile_path: Path | None = None,
              kernel_path: Path | None = None, policy: Mapping | None = None,
              graph_path: Path | None = None) -> dict:
    """Predicted step-time change (%) the kernel can explain for this run, with every input named.

    ``root`` is the project root where the default result files live; ``gpu`` the run's GPU (short
    name, e.g. h200), whose committed profile and kernel results are the defaults; ``policy``
    overrides the run's recorded patched_policy (arms.policy_record format); ``graph_path`` a
    graph-steps file whose decode step savings replace the profile's there. Never raises for a
    missing or unreadable input: the result's "status" and "reason" say what is missing.
    """
    eager = bool(run.model.get("eager"))
    if profile_path is None:
        found = profiles.default_profile(gpu, "eager" if eager else "compiled")
        profile_path = root / found if found else None
    if kernel_path is None and gpu is not None:
        kernel_path = default_kernel_results(gpu)
    base = {"upper_bound": True, "gpu": gpu,
            "profile": project_relative(profile_path, root) if profile_path else None,
            "kernel_results": project_relative(kernel_path, root) if kernel_path else None,
            "histogram_arm": baseline, "predicted_step_change_pct": None}
    if run.device == "cpu":
        return {**base, "status": "cpu", "predicted_step_change_pct": 0.0,
                "reason": "device is cpu: the patched arm runs the stock norm everywhere, so the kernel "
                          "explains exactly 0% change"}
    hists = run.step_histograms.get(baseline) or {}
    try:
        points = merge_histograms(hists)
        per_load_points = {load: histogram_points(h) for load, h in hists.items()}
        pol, policy_note = _policy(run, policy)
        fused = fused_at(pol)
    except ValueError as exc:
        return {**base, "status": "error", "reason": f"run.json: {exc}"}
    if not points:
        return {**base, "status": "no histogram",
                "reason": f"run.json has no step-size histogram for arm {baseline!r}: nothing to weight by"}
    result = {**base, "policy_note": policy_note, "histogram": [{"tokens": t, "steps": c} for t, c in points]}
    if kernel_path is None or not stored(kernel_path).is_file():
        where = kernel_path or f"no runtime_tables/kernel-calls-{gpu}.json"
        result["kernel_estimate"] = {"status": "unavailable",
                                     "reason": f"no kernel results for GPU {gpu} ({where})"}
    else:
        try:
            result["kernel_estimate"] = predict_from_kernels(
                points, _kernel_bench(kernel_path, project_relative(kernel_path, root)),
                run.model or {}, eager, fused if pol is not None else None)
        except (ValueError, KeyError, TypeError) as exc:
            result["kernel_estimate"] = {"status": "error", "reason": str(exc)}
    if profile_path is None or not stored(profile_path).is_file():
        where = profile_path or f"{project_relative(profiles.INDEX, root)} for GPU {gpu}"
        return {**result, "status": "no profile available",
                "reason": f"no profile available at {where}: no measured step time to divide by"}
    try:
        profile = profiles.load_profile(profile_path)
        graph = graph_saving(read_json(graph_path, None, "graph-steps file") if graph_path else None)
    except ValueError as exc:
        return {**result, "status": "error", "reason": str(exc)}
    overall = predict_from_profile(points, profile, fused, graph)
    per_load = {load: predict_from_profile(p, profile, fused, graph)["predicted_step_change_pct"]
                for load, p in per_load_points.items() if p}
    reason = ("norm time saved per step (profile, stock - patched) at the step sizes the policy sends to the "
              "fused kernel, weighted by the step-size histogram, over the histogram-weighted step time")
    if graph_path:
        result["graph_steps"] = project_relative(graph_path, root)
        reason += (f"; at the decode sizes {result['graph_steps']} timed, the step's saving from CUDA-graph "
                   "replays (stock - patched) instead")
    return {**result, "status": "predicted", "reason": reason,
            "predicted_step_change_pct": overall["predicted_step_change_pct"],
            "profile_detail": overall, "per_load_pct": per_load}
