"""Turn the four engine results of integration/proof/prove.py into the evidence and profile JSON files."""

from __future__ import annotations

import statistics
from typing import Any

from integration.proof import normcalls, profiles, steptrace

PAIRS = [("stock-compiled", "patched-compiled"), ("stock-eager", "patched-eager"),
         ("stock-compiled", "stock-eager")]  # the last is the baseline: two stock kernels
BASELINE = "stock-compiled vs stock-eager"
EVIDENCE_SCHEMA_VERSION = 1  # the <gpu>.json evidence file
TOLERANCE_FACTOR = 2.0  # "as close as the two stock norms are to each other", within this factor


def compare_greedy(ref: list[dict], other: list[dict]) -> dict:
    """Per prompt: identical tokens, the first divergence and the reference's top-1/top-2 logprob
    margin there, and the largest chosen-token logprob gap before it."""
    per = []
    for r, o in zip(ref, other):
        n = min(len(r["tokens"]), len(o["tokens"]))
        first = next((i for i in range(n) if r["tokens"][i] != o["tokens"][i]), None)
        upto = n if first is None else first
        gaps = [abs(x - y) for x, y in zip(r["logprob"][:upto], o["logprob"][:upto])]
        item = {"tokens": n, "identical_prefix": upto, "first_divergence": first,
                "max_abs_logprob_diff_before": max(gaps) if gaps else 0.0}
        if first is not None:
            item["ref_margin_at_divergence"] = r["margin"][first]
        per.append(item)
    margins = [m for r in ref for m in r["margin"] if m is not None]
    return {"identical": all(p["first_divergence"] is None for p in per),
            "first_token_identical": all(p["identical_prefix"] >= 1 for p in per),
            "tokens_compared": sum(p["tokens"] for p in per),
            "identical_prefix_tokens": sum(p["identical_prefix"] for p in per),
            "first_divergence": [p["first_divergence"] for p in per],
            "max_abs_logprob_diff_before": max(p["max_abs_logprob_diff_before"] for p in per),
            "median_ref_margin": statistics.median(margins) if margins else None, "prompts": per}


def judge(greedy: dict) -> dict:
    """Each pair against the baseline of two stock norms (Inductor vs vLLM's CUDA kernel): the first
    token (prefill only) must agree, and the chosen-token logprob gap before any divergence must
    stay within TOLERANCE_FACTOR of the baseline's. Identical tokens pass outright."""
    base = greedy.get(BASELINE)
    out = {}
    for name, g in greedy.items():
        if name == BASELINE:
            continue
        if g["identical"]:
            ok = True
        elif base is None:  # nothing to compare the gap with: no verdict
            ok = None
        else:
            ok = bool(g["first_token_identical"] and g["max_abs_logprob_diff_before"]
                      <= TOLERANCE_FACTOR * max(base["max_abs_logprob_diff_before"], 1e-6))
        out[name] = {"consistent_with_stock_variation": ok, "identical": g["identical"],
                     "first_divergence": g["first_divergence"],
                     "max_abs_logprob_diff_before": g["max_abs_logprob_diff_before"]}
        if ok is None:
            out[name]["why_no_verdict"] = (f"no baseline pair {BASELINE!r} (run both modes: "
                                           "--modes compiled,eager)")
    if base is not None:
        out[BASELINE + " (baseline)"] = {"identical": base["identical"],
                                         "first_divergence": base["first_divergence"],
                                         "max_abs_logprob_diff_before": base["max_abs_logprob_diff_before"]}
    return out


def model_norms(model: str) -> normcalls.NormShape | None:
    """The model's norm shape for the counts by kind (None where its config.json cannot be read), a
    run elsewhere read from the kit's copy of its model (normcalls.recorded_model_dir)."""
    try:
        return normcalls.norm_shape(normcalls.recorded_model_dir(model))
    except ValueError:
        return None


def _kinds(counts: dict[str, float], shape: normcalls.NormShape) -> dict[str, float]:
    out: dict[str, float] = {}
    for width, n in counts.items():
        kind = "untagged" if width == "untagged" else shape.kind(int(width))
        out[kind] = out.get(kind, 0) + n
    return out


def norm_counts(traced: list[dict], shape: normcalls.NormShape | None) -> dict | None:
    """Per traced step, by kind (hidden/head from the row width): the IR-op norm calls (eager census;
    none under torch.compile, where the ops are lowered away) and the norm kernels and their GPU time
    (a kernel launched outside a width annotation, e.g. in a CUDA-graph replay, is 'untagged'); and
    whether every step's IR calls match the model's layers (None when no calls were seen)."""
    if shape is None:
        return None
    ir = []
    for st in traced:
        widths: dict[str, float] = {}
        for key, n in st.get("ir_calls", {}).items():
            width = key.split("/")[1]
            widths[width] = widths.get(width, 0) + n
        ir.append(_kinds(widths, shape))
    kernels = [_kinds({w: v["calls"] for w, v in st.get("norm_by_width", {}).items()}, shape)
               for st in traced]
    us = [_kinds({w: v["us"] for w, v in st.get("norm_by_width", {}).items()}, shape) for st in traced]
    seen = [c for c in ir if c]
    return {"expected_per_forward": shape.expected(), "ir_calls_by_kind": ir, "kernels_by_kind": kernels,
            "norm_us_by_kind": us,
            "ir_calls_match_layers": (all(normcalls.check(c, shape)["matches"] for c in seen)
                                      if seen else None)}


def _median_by_kind(per_step: list[dict[str, float]]) -> dict[str, float]:
    kinds = sorted({k for d in per_step for k in d})
    return {k: statistics.median(d.get(k, 0) for d in per_step) for k in kinds}


def _proof(res: dict | None, shape: normcalls.NormShape | None = None) -> dict | None:
    if not res:
        return None
    steps = res["proof"]["traced_steps"]
    return {"norms": norm_counts(steps, shape), "ir_lowered": res.get("ir_lowered"),
            "decode_batch": res["proof"]["batch_tokens"], "traced_steps": len(steps),
            "norm_calls_per_step": [s["norm_calls"] for s in steps],
            "norm_by_kind_per_step": [s["norm_by_kind"] for s in steps],
            "fused_kernels_from_cuda_graph_replay": sum(s["fused_from_graph"] for s in steps),
            "fused_kernels_launched_directly": sum(s["fused_direct"] for s in steps),
            "kernels_from_cuda_graph_replay": sum(s["graph_launched_kernels"] for s in steps),
            "norm_kernel_names": res["proof"]["norm_kernel_names"]}


def greedy_pairs(results: dict) -> list[tuple[str, str]]:
    """The engines whose greedy outputs are compared: PAIRS, and each replica of prove --replicas
    (a result whose label differs from its arm) against its arm's first engine in the same mode."""
    replicas = [(f"{r['arm']}-{r['mode']}", name) for name, r in results.items()
                if r and r.get("label", r["arm"]) != r["arm"]]
    return PAIRS + replicas


def build(results: dict, codes: dict, logs: dict, cmds: dict, ranges: list[int], env: dict,
             command: str, a: Any) -> dict:
    """h200.json: what ran, what the logs say, which kernels the traces saw, and output agreement."""
    arms = {}
    shape = model_norms(a.model)
    for name, res in results.items():
        arms[name] = {"exit_code": codes.get(name), "worker_command": cmds[name], "log_lines": logs[name]}
        if res:
            arms[name].update({k: res[k] for k in ("vllm", "torch", "build_s", "ir_priority", "providers",
                                                   "vllm_plugins_env", "python_calls")})
            arms[name]["proof"] = _proof(res, shape)
    versions = next((r["vllm"] for r in results.values() if r), None)
    greedy = {}
    for ref, other in greedy_pairs(results):
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
        "stock_fused_kernels": sum(
            (((arms.get(n) or {}).get("proof") or {}).get("fused_kernels_from_cuda_graph_replay", 0)
             + (((arms.get(n) or {}).get("proof") or {}).get("fused_kernels_launched_directly", 0)))
            for n in ("stock-compiled", "stock-eager")),
        "greedy": judge(greedy),
    }
    summary["norms_per_forward"] = shape.expected() if shape else None
    summary["ir_calls_match_layers"] = {n: ((arms[n].get("proof") or {}).get("norms") or {})
                                        .get("ir_calls_match_layers")
                                        for n in arms}
    return {"schema_version": EVIDENCE_SCHEMA_VERSION, "command": command, "model": a.model, "dtype": a.dtype,
            "vllm": versions, "environment": env, "compile_ranges_endpoints": ranges, "summary": summary,
            "greedy_settings": {"prompts": a.prompts, "steps": a.steps, "temperature": 0.0,
                                "weights": ("vLLM load_format=dummy (uniform +-1e-3, seed 1234 per parameter)"
                                            + (", then every weight redrawn N(0, 0.02), "
                                               "norm weights N(1, 0.1), "
                                               "seeded by parameter order (prove_arm.scaled_weights)"
                                               if a.weights == "scaled" else "")),
                                "tolerance": f"first token identical and chosen-token |logprob| gap before "
                                             f"any divergence <= {TOLERANCE_FACTOR} x that of {BASELINE}"},
            "greedy": greedy, "arms": arms,
            "raw": {n: ({k: v for k, v in r.items() if k != "steps"} if r else None)
                    for n, r in results.items()}}


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def mean_kernel_hist(traced: list[dict]) -> dict[str, tuple[float, float]]:
    """Per-step mean [calls, us] of each kernel base name over the traced steps."""
    tot: dict[str, list[float]] = {}
    for st in traced:
        for name, (c, us) in st["kernel_hist"].items():
            t = tot.setdefault(name, [0.0, 0.0])
            t[0] += c
            t[1] += us
    n = max(len(traced), 1)
    return {k: (c / n, us / n) for k, (c, us) in tot.items()}


def norm_kernels(traced: list[dict]) -> list[str]:
    """Names of the RMSNorm kernels (ours, vLLM's, Inductor's) a step ran: the patched arm runs
    Inductor's own norm in the compile ranges its policy declines."""
    return sorted(n for n in mean_kernel_hist(traced) if steptrace.norm_kind(n) is not None)


def stock_norm_kernels(stock: list[dict], patched: list[dict]) -> tuple[list[str], str]:
    """Names of the stock arm's RMSNorm kernels and how they were found: by name (vLLM's CUDA kernel,
    an Inductor kernel named after rsqrt), else as the kernels the patched graph no longer runs
    (fewer calls per step there), i.e. what the fused kernel replaced."""
    named = norm_kernels(stock)
    if named:
        return named, "name"
    hs, hp = mean_kernel_hist(stock), mean_kernel_hist(patched)
    gone = sorted(n for n, (c, _) in hs.items() if c > hp.get(n, (0.0, 0.0))[0] + 0.5)
    return gone, "replaced_in_patched"


def extra_kernels(stock: list[dict], patched: list[dict]) -> dict[str, float]:
    """Kernels (not ours) the patched step runs more often than the stock step, with their mean us
    per step: work Inductor had fused into a norm kernel that now runs on its own."""
    hs, hp = mean_kernel_hist(stock), mean_kernel_hist(patched)
    return {n: round(us - hs.get(n, (0.0, 0.0))[1], 3) for n, (c, us) in hp.items()
            if n != steptrace.FUSED_KERNEL and c > hs.get(n, (0.0, 0.0))[0] + 0.5}


def _norm_steps(traced: list[dict], names: list[str]) -> tuple[list[float], list[int]]:
    us = [sum(st["kernel_hist"].get(n, [0, 0.0])[1] for n in names) for st in traced]
    calls = [sum(st["kernel_hist"].get(n, [0, 0.0])[0] for n in names) for st in traced]
    return us, calls


def _arm_step(row: dict, norm_names: list[str]) -> dict:
    traced = row["traced_steps"]
    norm_us, norm_calls = _norm_steps(traced, norm_names)
    return {"step_wall_us": row["step_wall_us"], "norm_us": norm_us, "norm_calls": norm_calls,
            "gpu_busy_us": [s["gpu_busy_us"] for s in traced],
            "gpu_span_us": [s["gpu_span_us"] for s in traced],
            "kernels": [s["kernels"] for s in traced],
            "fused_from_graph": [s["fused_from_graph"] for s in traced],
            "kernel_hist_mean": {k: [round(c, 2), round(us, 3)]
                                 for k, (c, us) in mean_kernel_hist(traced).items()}}


def _row(kind: str, n: int, srow: dict, prow: dict, shape: normcalls.NormShape | None = None) -> dict:
    names, how = stock_norm_kernels(srow["traced_steps"], prow["traced_steps"])
    s = _arm_step(srow, names)
    p = _arm_step(prow, sorted(set(norm_kernels(prow["traced_steps"])) | {steptrace.FUSED_KERNEL}))
    row = {"kind": kind, "batch_tokens": n,
           "step_us_stock": _median(s["step_wall_us"]), "step_us_patched": _median(p["step_wall_us"]),
           "norm_us_stock": _median(s["norm_us"]), "norm_us_patched": _median(p["norm_us"]),
           "norm_calls": _median(s["norm_calls"]), "norm_calls_patched": _median(p["norm_calls"]),
           "fused_calls_patched": _median(_norm_steps(prow["traced_steps"], [steptrace.FUSED_KERNEL])[1]),
           "gpu_busy_us_stock": _median(s["gpu_busy_us"]), "gpu_busy_us_patched": _median(p["gpu_busy_us"]),
           "stock_norm_kernels": names, "stock_norm_kernels_found_by": how,
           "samples": {"stock": s, "patched": p}}
    row["patched_extra_kernels_us"] = extra_kernels(srow["traced_steps"], prow["traced_steps"])
    for arm, r in (("stock", srow), ("patched", prow)):
        counts = norm_counts(r["traced_steps"], shape)
        if counts is not None:
            row[f"norm_calls_by_kind_{arm}"] = _median_by_kind(counts["ir_calls_by_kind"])
            row[f"norm_kernels_by_kind_{arm}"] = _median_by_kind(counts["kernels_by_kind"])
            row[f"norm_us_by_kind_{arm}"] = _median_by_kind(counts["norm_us_by_kind"])
            row[f"norm_calls_match_layers_{arm}"] = counts["ir_calls_match_layers"]
    if row["norm_us_stock"] and row["norm_us_patched"]:
        extra = sum(row["patched_extra_kernels_us"].values())
        patched_total = row["norm_us_patched"] + extra
        row["norm_speedup"] = row["norm_us_stock"] / patched_total
        row["patched_faster_every_step"] = max(p["norm_us"]) + extra < min(s["norm_us"])
        row["patched_slower_every_step"] = min(p["norm_us"]) + extra > max(s["norm_us"])
        if row["step_us_stock"]:
            row["predicted_step_change_pct"] = (100.0 * (patched_total - row["norm_us_stock"])
                                                / row["step_us_stock"])
    if row["step_us_stock"] and row["step_us_patched"]:
        row["patched_step_not_slower"] = row["step_us_patched"] <= row["step_us_stock"]
    for arm in ("stock", "patched"):
        if row[f"step_us_{arm}"] and row[f"norm_us_{arm}"] is not None:
            row[f"norm_share_{arm}"] = row[f"norm_us_{arm}"] / row[f"step_us_{arm}"]
            if row[f"gpu_busy_us_{arm}"]:
                row[f"norm_share_gpu_busy_{arm}"] = row[f"norm_us_{arm}"] / row[f"gpu_busy_us_{arm}"]
    return row


def profile_from_raw(raw: dict, mode: str = "compiled") -> dict:
    """The profile of one mode (h200-profile.json for compiled) from the engines' raw results
    (raw-steps.json.xz written by prove)."""
    res = raw["results"]
    def keyed(name: str) -> dict:
        return {(r.get("kind", "decode"), r["batch_tokens"]): r
                for r in (res.get(name) or {}).get("steps", [])}

    stock, patched = keyed(f"stock-{mode}"), keyed(f"patched-{mode}")
    order = sorted(set(stock) & set(patched), key=lambda k: (k[0] != "decode", k[1]))
    shape = model_norms(raw["model"])
    steps = [_row(kind, n, stock[kind, n], patched[kind, n], shape) for kind, n in order]
    return {"schema_version": profiles.SCHEMA_VERSION, "model": raw["model"], "mode": mode,
            "command": raw["command"], "environment": raw["environment"], "policy": raw.get("policy"),
            "compile_ranges_endpoints": raw["ranges"],
            "norm_shape": shape.__dict__ if shape else None,
            "norms_per_forward": shape.expected() if shape else None,
            "definitions": {
                "kind": "decode: batch_tokens requests, every one in decode (full CUDA graph); "
                        "prefill: one request prefilling batch_tokens tokens in one step (no graph "
                        "above the capture sizes)",
                "step_us": "median wall time of one LLMEngine.step() (in-process engine, synchronous "
                           "scheduling) over the timed steps",
                "norm_us": "median over traced steps of the summed GPU time of RMSNorm kernels: patched "
                           "= rmsnorm_kernel plus any Inductor norm (declined ranges); stock = "
                           "stock_norm_kernels (see stock_norm_kernels_found_by)",
                "fused_calls_patched": "median rmsnorm_kernel launches per traced patched step",
                "patched_faster_every_step": "every traced patched step's norm time (+ extra kernels) is "
                                             "below every stock step's (exact Mann-Whitney U = 0)",
                "patched_slower_every_step": "the reverse: every patched step above every stock step",
                "patched_step_not_slower": "step_us_patched <= step_us_stock (medians of the timed steps: "
                                           "wall time, so the CPU cost of launching the kernel counts)",
                "norm_calls": "median RMSNorm kernels per traced step (stock arm)",
                "norm_calls_by_kind_*": "median IR-op norm calls per traced step by kind (hidden: rows "
                                        "of hidden_size, head: rows of head_dim); eager only, empty "
                                        "when compiled",
                "norm_kernels_by_kind_*": "median norm kernels per traced step by the kind of the call that "
                                          "launched them ('untagged': launched outside an eager IR-op call)",
                "norm_us_by_kind_*": "median GPU time of those kernels per traced step, by kind",
                "norm_calls_match_layers_*": "every traced step's IR-op calls equal norms_per_forward",
                "gpu_busy_us": "summed GPU kernel time per traced step",
                "norm_share_*": "norm_us / step_us; norm_share_gpu_busy_*: norm_us / gpu_busy_us",
                "patched_extra_kernels_us": "kernels the patched step runs more often than stock "
                                            "(ours aside), mean us per step: work Inductor fused into its "
                                            "norm kernel",
                "norm_speedup": "norm_us_stock / (norm_us_patched + patched_extra_kernels_us), > 1: faster",
                "predicted_step_change_pct": "(norm_us_patched + patched_extra_kernels_us - norm_us_stock) / "
                                             "step_us_stock, in percent"},
            "steps": steps}


def regreedy(evidence: dict) -> dict:
    """Recompute an h200.json's output comparison from its raw greedy outputs (in place)."""
    raw = evidence["raw"]
    greedy = {f"{ref} vs {other}": compare_greedy(raw[ref]["greedy"], raw[other]["greedy"])
              for ref, other in PAIRS if raw.get(ref) and raw.get(other)}
    evidence["greedy"] = greedy
    evidence["summary"]["greedy"] = judge(greedy)
    evidence["greedy_settings"]["tolerance"] = (f"first token identical and chosen-token |logprob| gap "
                                                f"before any divergence <= {TOLERANCE_FACTOR} x "
                                                f"that of {BASELINE}")
    return evidence


def main(argv: list[str] | None = None) -> int:
    """CLI: rebuild h200-profile.json from raw-steps.json.xz, or an h200.json's output comparison."""
    import argparse
    import json

    from common.cliargs import refuse_output
    from common.jsonfile import ResultFileError, read_json, write_json

    ap = argparse.ArgumentParser(
        prog="python -m integration.proof.evidence", description=main.__doc__)
    ap.add_argument("--raw", help="raw-steps.json.xz written by python -m integration.proof.prove")
    ap.add_argument("--out",
                    help="profile JSON to write from --raw (e.g. OUT/h200-profile.json)")
    ap.add_argument("--mode", choices=("compiled", "eager"), default="compiled",
                    help="which pair of engines of --raw to profile (default compiled)")
    ap.add_argument("--evidence", help="an h200.json whose greedy comparison to recompute in place")
    args = ap.parse_args(argv)
    refuse_output(ap.prog, "--out", args.out, [args.raw, args.evidence])
    if bool(args.raw) != bool(args.out) or not (args.raw or args.evidence):
        ap.error("give --raw with --out, and/or --evidence")
    if args.raw:
        try:
            raw = read_json(args.raw, None, "raw-steps")
        except ResultFileError as exc:
            ap.error(f"--raw: {exc}")
        prof = profile_from_raw(raw, args.mode)
        write_json(args.out, prof, allow_nan=True)
    if args.evidence:
        with open(args.evidence) as f:
            ev = regreedy(json.load(f))
        write_json(args.evidence, ev, allow_nan=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
