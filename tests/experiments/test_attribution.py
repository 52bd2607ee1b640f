import json

import pytest

import runtime_tables
from experiments.core.runfile import Run
from experiments.stats import attribution

HIST = {"buckets": [1, 64, 1024, "+Inf"], "counts": [10, 5, 1, 0]}
# the fields integration.proof.prove writes; patched extra kernels count as norm time
PROFILE = {"schema_version": 1, "steps": [
    {"batch_tokens": 1, "step_us_stock": 1000.0, "norm_us_stock": 50.0, "norm_us_patched": 39.0,
     "patched_extra_kernels_us": {"triton_poi_fused_embedding": 1.0}},
    {"batch_tokens": 64, "step_us_stock": 2000.0, "norm_us_stock": 100.0, "norm_us_patched": 80.0},
    {"batch_tokens": 1024, "step_us_stock": 10000.0, "norm_us_stock": 500.0, "norm_us_patched": 450.0,
     "patched_extra_kernels_us": {}},
]}


def bench_row(op, rows, stock_us, fused_us, policy):
    return {"op": op, "dtype": "bf16", "rows": rows, "hidden": 4096, "variant": "v1", "median_us": fused_us,
            "min_us": fused_us, "max_us": fused_us, "samples_us": [fused_us],
            "stock": {"inductor_us": stock_us, "vllm_c_us": stock_us + 1.0, "torch_us": 9.0},
            "roofline_us": 0.1, "policy": policy}


BENCH = {"schema_version": 1, "bench": [
    bench_row("rms_norm", 1, 2.0, 1.5, "fused:v1"), bench_row("rms_norm", 64, 3.0, 2.0, "fused:v1"),
    bench_row("rms_norm", 1024, 10.0, 12.0, "stock"),
    bench_row("fused_add_rms_norm", 1, 2.5, 2.0, "fused:v1"),
    bench_row("fused_add_rms_norm", 64, 4.0, 3.0, "fused:v1"),
    bench_row("fused_add_rms_norm", 1024, 20.0, 15.0, "fused:v1"),
]}


def run_json(device="cuda", hists=None):
    return {"device": device, "step_histograms": {"stock": hists if hists is not None else {"1.0": HIST}},
            "model": {"dtype": "bfloat16", "eager": False,
                      "config": {"hidden_size": 4096, "num_hidden_layers": 2}}}


@pytest.fixture
def files(tmp_path):
    (tmp_path / "profile.json").write_text(json.dumps(PROFILE))
    (tmp_path / "bench.json").write_text(json.dumps(BENCH))
    return tmp_path


def attribute(run, root, **kw):
    """attribution.attribute with the test's profile and kernel results as inputs."""
    return attribution.attribute(Run(**run), "stock", root, None, profile_path=root / "profile.json",
                                 kernel_path=root / "bench.json", **kw)


def test_prediction_known_answer(files):
    a = attribute(run_json(), files)
    assert a["status"] == "predicted" and a["upper_bound"] is True
    # saved 10*10 + 5*20 + 1*50 = 250 us over steps 10*1000 + 5*2000 + 1*10000 = 30000 us
    assert a["predicted_step_change_pct"] == pytest.approx(-100 * 250 / 30000)
    assert a["per_load_pct"]["1.0"] == pytest.approx(-100 * 250 / 30000)
    # kernel bench: per step 1 rms_norm + 4 fused_add calls; savings 2.5, 5, 20 us at 1, 64, 1024 tokens
    k = a["kernel_estimate"]
    assert k["status"] == "estimated" and k["stock_kernel"] == "inductor"
    assert k["norm_saved_us_per_step"] == pytest.approx((10 * 2.5 + 5 * 5 + 1 * 20) / 16)


def policy(fused_ranges):
    """choice.policy_record format: fused_add_rms_norm's [lo, hi, fused] over 1..2048."""
    segs, lo = [], 1
    for a, b in fused_ranges:
        if a > lo:
            segs.append([lo, a - 1, False])
        segs.append([a, b, True])
        lo = b + 1
    if lo <= 2048:
        segs.append([lo, 2048, False])
    return {"table": "t.json", "segments": {"fused_add_rms_norm": segs, "rms_norm": segs}}


def test_recorded_policy_limits_the_saving_to_fused_step_sizes(files):
    run = {**run_json(), "patched_policy": policy([(2, 64)])}  # 1 and 1024 tokens stay stock
    a = attribute(run, files)
    assert a["predicted_step_change_pct"] == pytest.approx(-100 * (5 * 20) / 30000)
    assert "recorded in run.json" in a["policy_note"]
    assert [b["fused"] for b in a["profile_detail"]["by_bucket"]] == [False, True, False]
    # kernel bench under the same policy: only the 64-token bucket saves (1 x 1.0 + 4 x 1.0 us)
    assert a["kernel_estimate"]["norm_saved_us_per_step"] == pytest.approx(5 * 5 / 16)


def test_an_all_stock_policy_explains_nothing_and_an_override_wins(files):
    run = {**run_json(), "patched_policy": policy([])}
    assert attribute(run, files)["predicted_step_change_pct"] == 0.0
    a = attribute(run, files, policy=policy([(1, 2048)]))
    assert a["predicted_step_change_pct"] == pytest.approx(-100 * 250 / 30000)
    assert "--patched-policy" in a["policy_note"]
    old = attribute(run_json(), files)
    assert "no patched_policy" in old["policy_note"]
    bad = attribute({**run_json(), "patched_policy": {"segments": {}}}, files)
    assert bad["status"] == "error" and "fused_add_rms_norm" in bad["reason"]


def test_cpu_run_predicts_exactly_zero(files):
    a = attribute(run_json(device="cpu"), files)
    assert a["predicted_step_change_pct"] == 0.0 and a["status"] == "cpu"
    assert "stock norm everywhere" in a["reason"]


def test_missing_profile_is_said_explicitly(tmp_path):
    a = attribute(run_json(), tmp_path)
    assert a["status"] == "no profile available" and a["predicted_step_change_pct"] is None
    assert "no profile available" in a["reason"]
    assert a["kernel_estimate"]["status"] == "unavailable"


def test_missing_histogram_and_bad_histogram(files):
    a = attribute(run_json(hists={}), files)
    assert a["status"] == "no histogram" and a["predicted_step_change_pct"] is None
    bad = attribute(run_json(hists={"1.0": {"buckets": [1, 2], "counts": [1]}}), files)
    assert bad["status"] == "error" and "equal-length" in bad["reason"]


def test_bad_profile_is_an_error_not_a_number(files):
    (files / "profile.json").write_text(json.dumps({"schema_version": 1, "steps": [{"batch_tokens": 1}]}))
    a = attribute(run_json(), files)
    assert a["status"] == "error" and "steps[0]" in a["reason"]
    assert a["predicted_step_change_pct"] is None


def test_histogram_points_inf_bucket_uses_last_finite_bound():
    points = attribution.histogram_points({"buckets": [8, 16, "+Inf"], "counts": [0, 3, 2]})
    assert points == [(16.0, 3), (16.0, 2)]


def test_profile_of_another_schema_version_is_refused(files):
    (files / "profile.json").write_text(json.dumps({**PROFILE, "schema_version": 99}))
    a = attribute(run_json(), files)
    assert a["status"] == "error" and "schema_version 99" in a["reason"] and "profile.json" in a["reason"]


def test_default_inputs_follow_the_runs_gpu(tmp_path):
    a = attribution.attribute(Run(**run_json()), "stock", tmp_path, "gpu-without-results")
    assert a["status"] == "no profile available" and "gpu-without-results" in a["reason"]
    assert a["kernel_results"] is None  # no isolated table names a benchmark of this GPU
    assert "runtime_tables/kernel-calls-gpu-without-results.json" in a["kernel_estimate"]["reason"]
    h200 = attribution.attribute(Run(**run_json()), "stock", tmp_path, "h200")  # per-call figures
    assert h200["kernel_results"] == str(runtime_tables.path("kernel-calls-h200.json"))


def test_graph_timed_decode_sizes_replace_the_profiles_norm_time(files):
    # graph replays at 1 and 64 tokens: stock 900 -> patched 870 us, 1800 -> 1810 us (slower)
    graph = {"sizes": [{"batch_tokens": 1, "baseline_median_us": 900.0,
                        "arms": {"patched": {"median_us": 870.0}}},
                       {"batch_tokens": 64, "baseline_median_us": 1800.0,
                        "arms": {"patched": {"median_us": 1810.0}}}]}
    (files / "graph.json").write_text(json.dumps(graph))
    a = attribute(run_json(), files, graph_path=files / "graph.json")
    # 10 x 30 + 5 x (-10) from the graphs, 1 x 50 from the profile above 64 tokens, over 30000 us
    assert a["predicted_step_change_pct"] == pytest.approx(-100 * (300 - 50 + 50) / 30000)
    assert [b.get("saving_from") for b in a["profile_detail"]["by_bucket"]] == ["graph replays"] * 2 + [None]
    assert a["graph_steps"].endswith("graph.json") and "graph replays" in a["reason"]
    run = {**run_json(), "patched_policy": policy([(2, 64)])}  # the policy still gates: 1 token stock
    b = attribute(run, files, graph_path=files / "graph.json")
    assert b["predicted_step_change_pct"] == pytest.approx(-100 * (5 * -10) / 30000)


def test_unreadable_kernel_results_are_named_relative_to_the_root(files):
    """A report made in one checkout must re-derive in another: the reason names the file by its
    path inside the project root, not by where the checkout lies."""
    (files / "bench.json").write_text(json.dumps({**BENCH, "schema_version": 99}))
    reason = attribute(run_json(), files)["kernel_estimate"]["reason"]
    assert reason.startswith("bench.json: ") and "schema_version 99" in reason
    assert str(files) not in reason
