"""The planted control's prediction uses the delay's measured in-graph cost where the GPU has one."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.config import make_config
from experiments.planted import planted_lines, planted_text
from experiments.runrecord import arm_records
from integration.proof import plantedcost
from kernels.resultfile import write_json

TRACE = Path(__file__).resolve().parents[2] / "traces" / "chat.jsonl"


def _planted_run() -> dict:
    """run.json fields of a stock vs planted:500ns run of a 2-layer Llama (5 norm calls per step)."""
    cfg = make_config(TRACE, "cpu", arms=("stock", "planted:500ns"))
    return {"arm_labels": list(cfg.labels), "arms": list(cfg.arms), "arm_definitions": arm_records(cfg),
            "model": {"config": {"architectures": ["LlamaForCausalLM"], "hidden_size": 256,
                                 "num_hidden_layers": 2, "num_attention_heads": 4}}}


def test_prediction_counts_the_measured_launch_not_only_the_delay(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    run = _planted_run()
    latency = [{"arm": "stock", "load": 1.0, "tpot_p50_ms": 1.0}]
    paired = {"planted:500ns": {"tpot_ms": {"estimate_pct": 1.0, "ci95_pct": [0.5, 1.5]}}}
    profile = {"steps": 1, "step_us": 1000.0}
    attribution = {"gpu": "testgpu", "profile": "p.json", "histogram_arm": "stock",
                   "profile_detail": {"by_bucket": [profile]}}
    monkeypatch.setattr(plantedcost, "RESULTS_DIR", tmp_path)
    (alone,) = planted_lines(run, latency, paired, attribution)  # no measurement: 0.5 us x 5 calls
    assert alone["predicted_pct"] == pytest.approx(0.25) and alone["per_call_source"] == "the delay alone"
    assert alone["prediction_inside"] is False
    write_json(tmp_path / "testgpu-planted-cost.json",
               {"schema_version": plantedcost.SCHEMA_VERSION,
                "delays": [{"ns": 500, "added_us_per_call": 2.0}]})
    (p,) = planted_lines(run, latency, paired, attribution)  # measured 2 us x 5 calls = 10 us of 1000
    assert p["added_us_per_step"] == pytest.approx(10.0) and p["predicted_pct"] == pytest.approx(1.0)
    assert p["prediction_inside"] is True and "testgpu-planted-cost.json" in planted_text(p)


def test_prediction_uses_the_planted_arms_step_time_in_vllm_per_load_and_step_size(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = _planted_run()
    # stock ran 3 steps of 1 token and 1 of 4 tokens at 1x; 1 step of 1 and 1 of 64 at 2x (upper bounds)
    buckets = [1, 4, 16, 64, "+Inf"]
    run["step_histograms"] = {"stock": {"1.0": {"buckets": buckets, "counts": [3, 1, 0, 0, 0]},
                                        "2.0": {"buckets": buckets, "counts": [1, 0, 0, 1, 0]}}}
    latency = [{"arm": "stock", "load": 1.0, "tpot_p50_ms": 1.0},
               {"arm": "stock", "load": 2.0, "tpot_p50_ms": 2.0}]
    by_load = {"1": {"estimate_pct": 0.8, "ci95_pct": [0.6, 1.2]},
               "2": {"estimate_pct": 0.9, "ci95_pct": [0.1, 0.3]}}
    paired = {"planted:500ns": {"tpot_ms": {"estimate_pct": 0.9, "ci95_pct": [0.5, 1.5], "by_load": by_load}}}
    monkeypatch.setattr(plantedcost, "RESULTS_DIR", tmp_path)  # no plain-graph measurement
    graph = {"sizes": [{"batch_tokens": 1, "arms": {"planted:500ns": {"change_per_norm_call_us": 2.0},
                                                    "planted:1us": {"change_per_norm_call_us": 9.0}}},
                       {"batch_tokens": 16, "arms": {"planted:500ns": {"change_per_norm_call_us": 1.0}}}],
             "prefill": [{"batch_tokens": 8, "arms": {"planted:500ns": {"change_per_norm_call_us": 50.0}}},
                         {"batch_tokens": 256, "arms": {"planted:500ns": {"change_per_norm_call_us": 10.0}}}]}
    (p,) = planted_lines(run, latency, paired, {"gpu": "testgpu"}, ("g.json", graph))
    # 4 tokens lie halfway between 1 and 16 in log tokens: 1.5 us; 64 halfway between 16 and 256: 5.5 us
    # (the 8-token prefill lies inside the decode sizes and is not used); x 5 calls per step
    at_1x, at_2x = (3 * 2.0 + 1.5) / 4 * 5, (2.0 + 5.5) / 2 * 5
    assert p["by_load"]["1"]["added_us_per_step"] == pytest.approx(at_1x)
    assert p["by_load"]["2"]["added_us_per_step"] == pytest.approx(at_2x)
    pct_1x, pct_2x = 100 * at_1x / 1000, 100 * at_2x / 2000
    assert p["by_load"]["1"]["predicted_pct"] == pytest.approx(pct_1x)
    assert p["predicted_pct"] == pytest.approx(100 * (((1 + pct_1x / 100) * (1 + pct_2x / 100)) ** 0.5 - 1))
    assert p["by_load"]["1"]["prediction_inside"] is True and p["by_load"]["2"]["prediction_inside"] is False
    assert p["prediction_inside"] is True and "g.json" in p["per_call_source"]
    assert "1x predicted" in planted_text(p) and "(outside)" in planted_text(p)
    other = {"sizes": [{"batch_tokens": 1, "arms": {"planted:1us": {"change_per_norm_call_us": 9.0}}}]}
    (q,) = planted_lines(run, latency, paired, {"gpu": "testgpu"}, ("g.json", other))  # another delay: unused
    assert q["per_call_source"] == "the delay alone"


def test_the_committed_planted_step_time_is_found_by_gpu_and_model() -> None:
    from experiments.planted import has_planted_arm
    from integration.proof import profiles

    found = profiles.default_planted_steps("h200", "llama-3.1-8b")
    assert found is not None and (profiles.PROJECT_ROOT / found).is_file()
    assert profiles.default_planted_steps("h200", "qwen3-8b") is None
    assert profiles.default_planted_steps(None, "llama-3.1-8b") is None
    assert has_planted_arm(_planted_run())
    assert not has_planted_arm({"arm_labels": ["stock", "patched"], "arms": ["stock", "patched"]})
