"""Per-step kernel statistics from a torch.profiler (Kineto) Chrome trace of vLLM engine steps.

Each profiled engine step is wrapped in `torch.profiler.record_function("step_<i>")`. A GPU kernel
belongs to the step whose annotation holds the CPU call that launched it (matched by the CUPTI
correlation id); kernels replayed from a CUDA graph correlate to the `cudaGraphLaunch` call. In eager
mode each IR-op norm call can carry a `norm:<op>:<width>` annotation (integration.proof.normcalls);
a norm kernel launched inside one is counted under that row width (`norm_by_width`), every other
norm kernel (CUDA-graph replays, Inductor's code) under "untagged".
"""

from __future__ import annotations

import bisect
import json
import re
from collections import defaultdict
from pathlib import Path

from integration.proof.normcalls import TAG_PREFIX

FUSED_KERNEL = "rmsnorm_kernel"  # kernels/rmsnorm.cu, kernels/rmsnorm_staged.cu
STEP_PREFIX = "step_"
GRAPH_LAUNCH = "cudaGraphLaunch"


def norm_kind(name: str) -> str | None:
    """Which RMSNorm a kernel name is: 'fused' (ours), 'vllm_c', 'inductor', or None (not a norm)."""
    if FUSED_KERNEL in name:
        return "fused"
    if "rms_norm_kernel" in name:  # vLLM's rms_norm_kernel / fused_add_rms_norm_kernel templates
        return "vllm_c"
    # Inductor names kernels after their ops
    if name.startswith("triton_") and ("rsqrt" in name or "rms" in name):
        return "inductor"
    return None


def base_name(name: str) -> str:
    """A kernel name without Inductor's trailing index (triton_..._12 -> triton_...), max 240 chars."""
    return re.sub(r"_\d+$", "", name)[:240]


def load_profiler_trace(path: str | Path) -> list[dict]:
    """The traceEvents of a Chrome trace JSON written by torch.profiler."""
    with open(path) as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def _steps(events: list[dict]) -> list[tuple[str, float, float]]:
    spans = [(e["name"], float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))
             for e in events
             if e.get("cat") == "user_annotation" and e.get("name", "").startswith(STEP_PREFIX)]
    return sorted(spans, key=lambda s: s[1])


def _tags(events: list[dict]) -> tuple[list[float], list[tuple[float, str]]]:
    """Start times and (end, width) of the norm:<op>:<width> annotations, sorted by start."""
    spans = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), e["name"].rsplit(":", 1)[-1])
                   for e in events if e.get("cat") == "user_annotation"
                   and e.get("name", "").startswith(TAG_PREFIX))
    return [s for s, _, _ in spans], [(t, w) for _, t, w in spans]


def _width_at(tags: tuple[list[float], list[tuple[float, str]]], ts: float) -> str:
    """The width of the norm annotation holding CPU time ts, or 'untagged'."""
    i = bisect.bisect_right(tags[0], ts) - 1
    return tags[1][i][1] if i >= 0 and ts <= tags[1][i][0] else "untagged"


def _launchers(events: list[dict]) -> dict[int, tuple[str, float]]:
    out: dict[int, tuple[str, float]] = {}
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            out[int(e["args"]["correlation"])] = (e["name"], float(e["ts"]))
    return out


def _empty_step(name: str, cpu_us: float) -> dict:
    return {"step": name, "cpu_us": cpu_us, "kernels": 0, "gpu_busy_us": 0.0, "gpu_span_us": 0.0,
            "norm_us": 0.0, "norm_calls": 0, "norm_by_kind": defaultdict(lambda: {"calls": 0, "us": 0.0}),
            "norm_by_width": defaultdict(lambda: {"calls": 0, "us": 0.0}),
            "graph_launched_kernels": 0, "fused_from_graph": 0, "fused_direct": 0,
            "kernel_hist": defaultdict(lambda: [0, 0.0]), "_first": None, "_last": None}


def step_stats(events: list[dict]) -> list[dict]:
    """One dict per annotated step: kernel count, GPU busy and span time, norm time and calls (by
    kind and by the row width of the norm annotation that launched them), how many fused-norm kernels
    came from a CUDA-graph replay vs a direct launch, and a histogram {kernel base name: [calls, us]}."""
    steps = _steps(events)
    launch = _launchers(events)
    tags = _tags(events)
    stats = [_empty_step(name, end - start) for name, start, end in steps]
    for e in events:
        if e.get("cat") != "kernel":
            continue
        corr = e.get("args", {}).get("correlation")
        who = launch.get(int(corr)) if corr is not None else None
        if who is None:
            continue
        idx = next((i for i, (_, s, t) in enumerate(steps) if s <= who[1] <= t), None)
        if idx is None:
            continue
        st, ts, dur = stats[idx], float(e["ts"]), float(e.get("dur", 0))
        st["kernels"] += 1
        st["gpu_busy_us"] += dur
        st["_first"] = ts if st["_first"] is None else min(st["_first"], ts)
        st["_last"] = ts + dur if st["_last"] is None else max(st["_last"], ts + dur)
        from_graph = who[0] == GRAPH_LAUNCH
        st["graph_launched_kernels"] += int(from_graph)
        hist = st["kernel_hist"][base_name(e.get("name", ""))]
        hist[0] += 1
        hist[1] += dur
        kind = norm_kind(e.get("name", ""))
        if kind is None:
            continue
        st["norm_us"] += dur
        st["norm_calls"] += 1
        st["norm_by_kind"][kind]["calls"] += 1
        st["norm_by_kind"][kind]["us"] += dur
        width = st["norm_by_width"][_width_at(tags, who[1])]
        width["calls"] += 1
        width["us"] += dur
        if kind == "fused":
            st["fused_from_graph" if from_graph else "fused_direct"] += 1
    for st in stats:
        first, last = st.pop("_first"), st.pop("_last")
        st["gpu_span_us"] = (last - first) if first is not None else 0.0
        st["norm_by_kind"] = {k: dict(v) for k, v in st["norm_by_kind"].items()}
        st["norm_by_width"] = {k: dict(v) for k, v in st["norm_by_width"].items()}
        st["kernel_hist"] = {k: [c, round(us, 3)] for k, (c, us) in sorted(st["kernel_hist"].items())}
    return stats


def kernel_names(events: list[dict], kind: str) -> list[str]:
    """Distinct names of the norm kernels of one kind in a trace (for the evidence file)."""
    return sorted({e["name"] for e in events if e.get("cat") == "kernel" and norm_kind(e["name"]) == kind})
