"""Turn the four engine results of integration/prove.py into the evidence and profile JSON files."""

from __future__ import annotations

import statistics
from typing import Any

NEAR_TIE_PERCENTILE = 5.0  # a divergence counts as a near tie below this percentile of margins
PAIRS = [("stock-compiled", "patched-compiled"), ("stock-eager", "patched-eager"),
         ("stock-compiled", "stock-eager")]  # the last is the baseline: two stock kernels


def _percentile_rank(values: list[float], v: float) -> float:
    vals = [x for x in values if x is not None]
    return 100.0 * sum(1 for x in vals if x <= v) / len(vals) if vals else float("nan")


def compare_greedy(ref: list[dict], other: list[dict]) -> dict:
    """Per prompt: identical tokens, first divergence, the reference's top-1/top-2 margin there (and its
    percentile among all its margins), and the largest chosen-token logprob gap before it."""
    all_margins = [m for r in ref for m in r["margin"] if m is not None]
    per = []
    for r, o in zip(ref, other):
        n = min(len(r["tokens"]), len(o["tokens"]))
        first = next((i for i in range(n) if r["tokens"][i] != o["tokens"][i]), None)
        upto = n if first is None else first
        gaps = [abs(x - y) for x, y in zip(r["logprob"][:upto], o["logprob"][:upto])]
        item = {"tokens": n, "identical_prefix": upto, "first_divergence": first,
                "max_abs_logprob_diff_before": max(gaps) if gaps else 0.0}
        if first is not None and r["margin"][first] is not None:
            item["ref_margin_at_divergence"] = r["margin"][first]
            item["margin_percentile"] = _percentile_rank(all_margins, r["margin"][first])
        per.append(item)
    identical = all(p["first_divergence"] is None for p in per)
    near_ties = all(p["first_divergence"] is None or p.get("margin_percentile", 100) <= NEAR_TIE_PERCENTILE
                    for p in per)
    return {"identical": identical, "divergences_at_near_ties": near_ties,
            "tokens_compared": sum(p["tokens"] for p in per),
            "identical_prefix_tokens": sum(p["identical_prefix"] for p in per),
            "median_ref_margin": statistics.median(all_margins) if all_margins else None, "prompts": per}


def _proof(res: dict | None) -> dict | None:
    if not res:
        return None
    steps = res["proof"]["traced_steps"]
    return {"decode_batch": res["proof"]["batch_tokens"], "traced_steps": len(steps),
            "norm_calls_per_step": [s["norm_calls"] for s in steps],
            "norm_by_kind_per_step": [s["norm_by_kind"] for s in steps],
            "fused_kernels_from_cuda_graph_replay": sum(s["fused_from_graph"] for s in steps),
            "fused_kernels_launched_directly": sum(s["fused_direct"] for s in steps),
            "kernels_from_cuda_graph_replay": sum(s["graph_launched_kernels"] for s in steps),
            "norm_kernel_names": res["proof"]["norm_kernel_names"]}


def evidence(results: dict, codes: dict, logs: dict, cmds: dict, ranges: list[int], env: dict,
             command: str, a: Any) -> dict:
    """h200.json: what ran, what the logs say, which kernels the traces saw, and output agreement."""
    arms = {}
    for name, res in results.items():
        arms[name] = {"exit_code": codes.get(name), "worker_command": cmds[name], "log_lines": logs[name]}
        if res:
            arms[name].update({k: res[k] for k in ("vllm", "torch", "build_s", "ir_priority", "providers",
                                                   "vllm_plugins_env", "python_calls")})
            arms[name]["proof"] = _proof(res)
    versions = next((r["vllm"] for r in results.values() if r), None)
    greedy = {}
    for ref, other in PAIRS:
        if results.get(ref) and results.get(other):
            greedy[f"{ref} vs {other}"] = compare_greedy(results[ref]["greedy"], results[other]["greedy"])
    summary = {
        "all_exit_zero": all(c == 0 for c in codes.values()),
        "patched_priority": (arms.get("patched-compiled") or {}).get("ir_priority"),
        "fused_in_graph_replay": (((arms.get("patched-compiled") or {}).get("proof") or {})
                                  .get("fused_kernels_from_cuda_graph_replay")),
        "fused_in_eager": (((arms.get("patched-eager") or {}).get("proof") or {})
                           .get("fused_kernels_launched_directly")),
        "fused_in_graph_replay_profile_steps": sum(
            s["fused_from_graph"] for row in (results.get("patched-compiled") or {}).get("steps", [])
            for s in row["traced_steps"]),
        "stock_fused_kernels": sum((((arms.get(n) or {}).get("proof") or {}).get("fused_kernels_from_cuda_graph_replay", 0)
                                    + (((arms.get(n) or {}).get("proof") or {}).get("fused_kernels_launched_directly", 0)))
                                   for n in ("stock-compiled", "stock-eager")),
        "greedy": {k: {"identical": v["identical"], "divergences_at_near_ties": v["divergences_at_near_ties"],
                       "identical_prefix_tokens": v["identical_prefix_tokens"],
                       "tokens_compared": v["tokens_compared"]} for k, v in greedy.items()},
    }
    return {"schema_version": 1, "command": command, "model": a.model, "dtype": a.dtype, "vllm": versions,
            "environment": env, "compile_ranges_endpoints": ranges, "summary": summary,
            "greedy_settings": {"prompts": a.prompts, "steps": a.steps, "temperature": 0.0,
                                "dummy_weights": "vLLM load_format=dummy, uniform(-1e-3, 1e-3), seed 1234 per parameter",
                                "near_tie_percentile": NEAR_TIE_PERCENTILE},
            "greedy": greedy, "arms": arms,
            "raw": {n: ({k: v for k, v in r.items() if k != "steps"} if r else None) for n, r in results.items()}}


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _arm_step(row: dict) -> dict:
    traced = row["traced_steps"]
    return {"step_wall_us": row["step_wall_us"], "norm_us": [s["norm_us"] for s in traced],
            "norm_calls": [s["norm_calls"] for s in traced], "gpu_busy_us": [s["gpu_busy_us"] for s in traced],
            "gpu_span_us": [s["gpu_span_us"] for s in traced],
            "norm_by_kind": [s["norm_by_kind"] for s in traced],
            "fused_from_graph": [s["fused_from_graph"] for s in traced]}


def profile(results: dict, model: str, ranges: list[int], command: str, env: dict) -> dict:
    """h200-profile.json: per batch size, step and norm time stock vs patched, with raw samples."""
    stock = {r["batch_tokens"]: r for r in (results.get("stock-compiled") or {}).get("steps", [])}
    patched = {r["batch_tokens"]: r for r in (results.get("patched-compiled") or {}).get("steps", [])}
    steps = []
    for n in sorted(set(stock) & set(patched)):
        s, p = _arm_step(stock[n]), _arm_step(patched[n])
        row = {"batch_tokens": n,
               "step_us_stock": _median(s["step_wall_us"]), "step_us_patched": _median(p["step_wall_us"]),
               "norm_us_stock": _median(s["norm_us"]), "norm_us_patched": _median(p["norm_us"]),
               "norm_calls": _median(s["norm_calls"]), "norm_calls_patched": _median(p["norm_calls"]),
               "gpu_busy_us_stock": _median(s["gpu_busy_us"]), "gpu_busy_us_patched": _median(p["gpu_busy_us"]),
               "samples": {"stock": s, "patched": p},
               "norm_kernel_names": {"stock": stock[n]["norm_kernel_names"],
                                     "patched": patched[n]["norm_kernel_names"]}}
        if row["step_us_stock"] and row["norm_us_stock"] is not None:
            row["norm_share_stock"] = row["norm_us_stock"] / row["step_us_stock"]
        if row["step_us_patched"] and row["norm_us_patched"] is not None:
            row["norm_share_patched"] = row["norm_us_patched"] / row["step_us_patched"]
        steps.append(row)
    return {"schema_version": 1, "model": model, "mode": "compiled", "command": command, "environment": env,
            "compile_ranges_endpoints": ranges,
            "definitions": {
                "step_us": "median wall time of one LLMEngine.step() (in-process engine, synchronous "
                           "scheduling) over the timed decode steps; every request in decode",
                "norm_us": "median over traced steps of the summed GPU time of RMSNorm kernels "
                           "(ours: rmsnorm_kernel; Inductor: triton_* kernels with rsqrt; vLLM: *rms_norm_kernel*)",
                "norm_calls": "median RMSNorm kernels per traced step (stock arm)",
                "gpu_busy_us": "summed GPU kernel time per traced step"},
            "steps": steps}
