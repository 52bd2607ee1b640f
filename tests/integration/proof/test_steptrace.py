"""Per-step kernel statistics from a Kineto Chrome trace, and the greedy-output comparison."""

from __future__ import annotations

import json

from integration.proof import evidence, steptrace


def _trace() -> list[dict]:
    ev = [
        {"cat": "user_annotation", "name": "step_0", "ts": 0, "dur": 100},
        {"cat": "user_annotation", "name": "step_1", "ts": 200, "dur": 100},
        {"cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 10, "dur": 5, "args": {"correlation": 1}},
        {"cat": "cuda_driver", "name": "cuLaunchKernel", "ts": 210, "dur": 5, "args": {"correlation": 2}},
        {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 220, "dur": 5, "args": {"correlation": 3}},
        {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 500, "dur": 5, "args": {"correlation": 4}},
        # step 0: replayed graph with our norm, an Inductor norm and a GEMM
        {"cat": "kernel", "name": "rmsnorm_kernel", "ts": 20, "dur": 2.0, "args": {"correlation": 1}},
        {"cat": "kernel", "name": "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "ts": 23, "dur": 3.0,
         "args": {"correlation": 1}},
        {"cat": "kernel", "name": "nvjet_tst_128x64", "ts": 27, "dur": 10.0, "args": {"correlation": 1}},
        # step 1: direct launches (eager): ours via the driver API, vLLM's CUDA kernel
        {"cat": "kernel", "name": "rmsnorm_kernel", "ts": 230, "dur": 1.5, "args": {"correlation": 2}},
        {"cat": "kernel", "name": "void vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(...)", "ts": 240,
         "dur": 2.5, "args": {"correlation": 3}},
        # outside every step: ignored
        {"cat": "kernel", "name": "rmsnorm_kernel", "ts": 510, "dur": 9.0, "args": {"correlation": 4}},
    ]
    return ev


def test_norm_kinds() -> None:
    assert steptrace.norm_kind("rmsnorm_kernel") == "fused"
    assert steptrace.norm_kind("void vllm::rms_norm_kernel<float>(...)") == "vllm_c"
    assert steptrace.norm_kind("triton_per_fused__to_copy_mean_mul_pow_rsqrt_3") == "inductor"
    assert steptrace.norm_kind("triton_poi_fused_mul_silu_1") is None
    assert steptrace.norm_kind("flash_fwd_kernel") is None


def test_step_stats_attribute_kernels_to_steps_and_launch_paths(tmp_path) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": _trace()}))
    s0, s1 = steptrace.step_stats(steptrace.load_profiler_trace(path))
    assert (s0["kernels"], s0["norm_calls"], s0["fused_from_graph"], s0["fused_direct"]) == (3, 2, 1, 0)
    assert s0["norm_us"] == 5.0 and s0["gpu_busy_us"] == 15.0 and s0["gpu_span_us"] == 17.0
    assert s0["graph_launched_kernels"] == 3
    assert s0["norm_by_kind"] == {"fused": {"calls": 1, "us": 2.0}, "inductor": {"calls": 1, "us": 3.0}}
    assert (s1["kernels"], s1["norm_calls"], s1["fused_from_graph"], s1["fused_direct"]) == (2, 2, 0, 1)
    assert s1["norm_by_kind"]["vllm_c"] == {"calls": 1, "us": 2.5}
    assert steptrace.kernel_names(_trace(), "fused") == ["rmsnorm_kernel"]


def _run(tokens: list[int], margins: list[float]) -> dict:
    return {"prompt_len": 4, "tokens": tokens, "logprob": [-1.0] * len(tokens), "margin": margins}


def test_compare_greedy_finds_the_first_divergence_and_its_margin() -> None:
    ref = [_run([1, 2, 3, 4], [0.5, 0.4, 0.001, 0.3]), _run([5, 6], [0.2, 0.2])]
    same = evidence.compare_greedy(ref, [_run([1, 2, 3, 4], [0.5] * 4), _run([5, 6], [0.2, 0.2])])
    assert same["identical"] and same["identical_prefix_tokens"] == 6
    other = [_run([1, 2, 9, 9], [0.5] * 4), _run([5, 6], [0.2, 0.2])]
    other[0]["logprob"] = [-1.0, -1.25, -1.0, -1.0]
    diff = evidence.compare_greedy(ref, other)
    assert not diff["identical"] and diff["first_token_identical"]
    assert diff["first_divergence"] == [2, None] and diff["prompts"][0]["ref_margin_at_divergence"] == 0.001
    assert diff["max_abs_logprob_diff_before"] == 0.25 and diff["identical_prefix_tokens"] == 4


def test_judge_against_the_two_stock_norms() -> None:
    def g(identical: bool, first_ok: bool, gap: float) -> dict:
        return {"identical": identical, "first_token_identical": first_ok, "first_divergence": [None],
                "max_abs_logprob_diff_before": gap}

    verdict = evidence.judge({evidence.BASELINE: g(False, True, 0.1), "a vs b": g(False, True, 0.19),
                             "c vs d": g(False, True, 0.21), "e vs f": g(False, False, 0.0),
                             "g vs h": g(True, True, 0.0)})
    assert verdict["a vs b"]["consistent_with_stock_variation"]
    assert not verdict["c vs d"]["consistent_with_stock_variation"]  # beyond 2x the baseline
    assert not verdict["e vs f"]["consistent_with_stock_variation"]  # prefill already differs
    assert verdict["g vs h"]["consistent_with_stock_variation"]
    assert evidence.BASELINE + " (baseline)" in verdict
    alone = evidence.judge({"a vs b": g(False, True, 0.19), "g vs h": g(True, True, 0.0)})
    assert alone["a vs b"]["consistent_with_stock_variation"] is None  # no baseline, no verdict
    assert "--modes compiled,eager" in alone["a vs b"]["why_no_verdict"]
    assert alone["g vs h"]["consistent_with_stock_variation"] is True


def _step(hist: dict) -> dict:
    return {"kernel_hist": hist}


def test_stock_norm_kernels_by_name_or_by_what_the_patched_graph_replaced() -> None:
    stock = [_step({"triton_red_fused_add_mean_mul_pow_rsqrt": [64, 128.0], "nvjet_gemm": [128, 900.0]})]
    patched = [_step({"rmsnorm_kernel": [64, 120.0], "nvjet_gemm": [128, 900.0]})]
    assert (evidence.stock_norm_kernels(stock, patched)
            == (["triton_red_fused_add_mean_mul_pow_rsqrt"], "name"))
    stock = [_step({"triton_red_fused_0": [65, 130.0], "triton_poi_fused_1": [32, 40.0], "gemm": [1, 9.0]})]
    patched = [_step({"rmsnorm_kernel": [65, 120.0], "triton_poi_fused_1": [32, 40.0], "gemm": [1, 9.0]})]
    assert evidence.stock_norm_kernels(stock, patched) == (["triton_red_fused_0"], "replaced_in_patched")
    stock = [_step({"triton_red_fused__to_copy_embedding_rms_norm": [1, 3.0]})]
    patched = [_step({"rmsnorm_kernel": [1, 2.0], "triton_poi_fused__to_copy_embedding": [1, 1.5]})]
    assert evidence.extra_kernels(stock, patched) == {"triton_poi_fused__to_copy_embedding": 1.5}
    assert steptrace.base_name("triton_red_fused_add_mean_12") == "triton_red_fused_add_mean"
