"""The planted control's prediction uses the delay's measured in-graph cost where the GPU has one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from common.jsonfile import write_json
from experiments.core.runfile import Run
from experiments.runner.config import make_config
from experiments.runner.runrecord import arm_records
from experiments.stats.plantedline import (
    added_fraction,
    decode_totals,
    planted_lines,
    planted_text,
    reference_comparisons,
    reference_label,
)
from integration.proof import plantedcost

TRACE = Path(__file__).resolve().parents[2] / "traces" / "chat.jsonl"


def _planted_run() -> Run:
    """run.json fields of a stock vs planted:500ns run of a 2-layer Llama (5 norm calls per step)."""
    cfg = make_config(TRACE, "cpu", arms=("stock", "planted:500ns"))
    return Run(arm_labels=list(cfg.labels), arms=list(cfg.arms), arm_definitions=arm_records(cfg),
               model={"config": {"architectures": ["LlamaForCausalLM"], "hidden_size": 256,
                                 "num_hidden_layers": 2, "num_attention_heads": 4}})


def test_prediction_counts_the_measured_launch_not_only_the_delay(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    run = _planted_run()
    latency = [{"arm": "stock", "load": 1.0, "tpot_p50_ms": 1.0}]
    paired = {"planted:500ns": {"tpot_ms": {"estimate_pct": 1.0, "ci95_pct": [0.5, 1.5]}}}
    monkeypatch.setattr(plantedcost, "TABLES_DIR", tmp_path)
    (alone,) = planted_lines(run, latency, paired, {"gpu": "testgpu"})  # no measurement: 0.5 us x 5 calls
    assert alone["predicted_pct"] == pytest.approx(0.25) and alone["per_call_source"] == "the delay alone"
    assert alone["prediction_inside"] is False and alone["reference"] == "stock"
    write_json(tmp_path / "testgpu-planted-cost.json",
               {"schema_version": plantedcost.SCHEMA_VERSION,
                "delays": [{"ns": 500, "added_us_per_call": 2.0}]})
    (p,) = planted_lines(run, latency, paired, {"gpu": "testgpu"})  # measured 2 us x 5 calls = 10 us of 1000
    assert p["added_us_per_decode_token"] == pytest.approx(10.0) and p["predicted_pct"] == pytest.approx(1.0)
    assert p["prediction_inside"] is True and "testgpu-planted-cost.json" in planted_text(p)
    # with the records' decode time per token (2 ms: 300 ms over 150 tokens) in place of the median TPOT
    (q,) = planted_lines(run, latency, paired, {"gpu": "testgpu"}, decode={("stock", 1.0): (300.0, 150)})
    assert q["predicted_pct"] == pytest.approx(0.5) and q["prediction_inside"] is True


def test_a_load_whose_median_tpot_is_zero_is_predicted_from_its_decode_time() -> None:
    # a CPU client that read most replies' chunks at one instant records TPOT 0 for them, and the median
    # TPOT at 2x is 0; the records still hold that load's decode time, and the prediction uses it
    run = _planted_run()
    latency = [{"arm": "stock", "load": 1.0, "tpot_p50_ms": 1.0},
               {"arm": "stock", "load": 2.0, "tpot_p50_ms": 0.0}]
    paired = {"planted:500ns": {"tpot_ms": {"estimate_pct": 1.0, "ci95_pct": [0.5, 1.5]}}}
    decode = {("stock", 1.0): (300.0, 150), ("stock", 2.0): (125.0, 250), ("planted:500ns", 2.0): (9.0, 9)}
    (p,) = planted_lines(run, latency, paired, {"gpu": "nogpu"}, decode=decode)  # 2.5 us per token
    assert set(p["by_load"]) == {"1", "2"} and p["by_load"]["2"]["stock_tpot_ms"] is None
    assert p["by_load"]["1"]["predicted_pct"] == pytest.approx(0.125)  # 2.5 us of 2 ms
    assert p["by_load"]["2"]["predicted_pct"] == pytest.approx(0.5)  # 2.5 us of 0.5 ms
    assert p["predicted_pct"] == pytest.approx(100 * (np.exp((np.log1p(0.00125) + np.log1p(0.005)) / 2) - 1))
    assert p["step_source"].startswith("stock's decode time per token (its records)")


def test_decode_steps_weigh_by_their_requests_over_the_decode_time(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    run = _planted_run()
    # stock ran, at 1x, 3 steps of 1 token and 2 steps of 2-4 tokens (midpoint 3) and one mixed step of
    # 200 tokens; the records hold 20 decode tokens (so 20 - 3 - 6 = 11 in the mixed step) over 40 ms
    hist = {"buckets": [1, 4, 16, 256, "+Inf"], "counts": [3, 2, 0, 1, 0]}
    run.step_histograms = {"stock": {"1.0": hist}}
    latency = [{"arm": "stock", "load": 1.0, "tpot_p50_ms": 1.0}]
    paired = {"planted:500ns": {"tpot_ms": {"estimate_pct": 0.9, "ci95_pct": [0.5, 1.5]}}}
    monkeypatch.setattr(plantedcost, "TABLES_DIR", tmp_path)  # no plain-graph measurement
    graph = {"sizes": [{"batch_tokens": 1, "arms": {"planted:500ns": {"change_per_norm_call_us": 2.0},
                                                    "planted:1us": {"change_per_norm_call_us": 9.0}}},
                       {"batch_tokens": 16, "arms": {"planted:500ns": {"change_per_norm_call_us": 1.0}}}],
             "prefill": [{"batch_tokens": 8, "arms": {"planted:500ns": {"change_per_norm_call_us": 50.0}}},
                         {"batch_tokens": 256, "arms": {"planted:500ns": {"change_per_norm_call_us": 10.0}}}]}
    (p,) = planted_lines(run, latency, paired, {"gpu": "testgpu"}, ("g.json", graph),
                         decode={("stock", 1.0): (40.0, 20)})
    # 3 tokens: log-linear between 2.0 us at 1 and 1.0 at 16; the mixed step, in the bucket up to 256
    # tokens, takes the prefill cost at 256 (10 us); the 8-token prefill lies inside the decode sizes
    # and is not used
    at_3 = 2.0 - (np.log(3) / np.log(16))
    added = (3 * 1 * 2.0 + 2 * 3 * at_3 + 11 * 10.0) * 5  # us over all decode tokens, x 5 calls
    assert p["by_load"]["1"]["added_us_per_decode_token"] == pytest.approx(added / 20)
    assert p["predicted_pct"] == pytest.approx(100 * added / 40_000)
    assert "g.json" in p["per_call_source"] and "prefill" in p["per_call_source"]
    other = {"sizes": [{"batch_tokens": 1, "arms": {"planted:1us": {"change_per_norm_call_us": 9.0}}}]}
    (q,) = planted_lines(run, latency, paired, {"gpu": "testgpu"}, ("g.json", other))  # another delay: unused
    assert q["per_call_source"] == "the delay alone"


def _twin_run() -> Run:
    """A CUDA run of stock, patched and planted:500ns whose policy fuses at 1-32 rows."""
    cfg = make_config(TRACE, "cpu", arms=("stock", "patched", "planted:500ns"))
    run = {"arm_labels": list(cfg.labels), "arms": list(cfg.arms), "arm_definitions": arm_records(cfg),
           "device": "cuda", "model": _planted_run().model,
           "patched_policy": {"segments": {"rms_norm": [[1, 32, True], [33, 16384, False]],
                                           "fused_add_rms_norm": [[1, 32, True], [33, 16384, False]]}}}
    run["step_histograms"] = {"patched": {"2.0": {"buckets": [1, 16, 64, "+Inf"], "counts": [4, 2, 1, 0]}}}
    return Run(**run)


def test_the_planted_arm_is_compared_with_its_twin_by_the_delay_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = _twin_run()
    assert reference_label(run, "planted:500ns") == "patched"
    latency = [{"arm": "patched", "load": 2.0, "tpot_p50_ms": 3.0}]
    by_load = {"2": {"estimate_pct": 0.3, "ci95_pct": [0.1, 0.5]}}
    twin = {"planted:500ns": {"estimate_pct": 0.3, "ci95_pct": [0.1, 0.5], "by_load": by_load}}
    paired = {"planted:500ns": {"tpot_ms": {"estimate_pct": 2.0, "ci95_pct": [1.0, 3.0]}}}
    graph = {"sizes": [{"batch_tokens": n, "arms": {"patched": {"change_per_norm_call_us": -0.5},
                                                    "planted:500ns": {"change_per_norm_call_us": c}}}
                       for n, c in ((1, 1.5), (64, 0.5))],
             "prefill": [{"batch_tokens": 512, "arms": {"planted:500ns": {"change_per_norm_call_us": 99.0}}}]}
    monkeypatch.setattr(plantedcost, "TABLES_DIR", tmp_path)
    (p,) = planted_lines(run, latency, paired, {"gpu": "testgpu"}, ("g.json", graph), twin,
                         decode={("patched", 2.0): (250.0, 100)})
    # per call planted - patched: 2.0 us at 1 token, 1.0 at 64; fused only at 1-32 tokens, so the
    # 17-64-token step (midpoint 40.5) adds nothing; 4 steps of 1 token, 2 of 2-16 (midpoint 9); the
    # records' 100 decode tokens over 250 ms: 2.5 ms per decode token
    at_9 = 2.0 - np.log(9) / np.log(64)
    added = (4 * 1 * 2.0 + 2 * 9 * at_9) * 5
    assert p["predicted_pct"] == pytest.approx(100 * added / 100 / 2500)
    assert p["measured_pct"] == 0.3 and p["detected"] is True and p["reference"] == "patched"
    assert p["vs_baseline"] == {"baseline": "stock", "estimate_pct": 2.0, "ci95_pct": [1.0, 3.0]}
    text = planted_text(p)
    assert "vs patched" in text and "minus patched's" in text
    assert "against stock +2.00% [+1.00, +3.00]%" in text
    earlier = "positive control: 500 ns of GPU delay inside every norm call (the fused kernel at every call)"
    run.arm_definitions["planted:500ns"]["description"] = earlier  # an earlier design, recorded so
    assert reference_label(run, "planted:500ns") == "stock"


def test_reference_comparisons_find_a_planted_effect_against_the_twin() -> None:
    run = _twin_run()
    rng = np.random.default_rng(3)
    rows = []
    for w in range(6):
        for i in range(40):
            base = rng.lognormal(np.log(8.0), 0.2)
            for arm, f in (("stock", 1.0), ("patched", 1.0), ("planted:500ns", 1.01)):
                rows.append({"arm": arm, "window": w, "load": 2.0, "index": i, "ok": True,
                             "due_ms": 25.0 * i, "input_tokens": 100, "output_tokens": 11,
                             "completion_tokens": 11, "tpot_ms": base * f * rng.lognormal(0, 0.002),
                             "ttft_ms": 50.0, "e2e_ms": 130.0})
    frame = pd.DataFrame(rows)
    orders = {(w, 2.0): ["stock", "patched", "planted:500ns"] for w in range(6)}
    (label, cmp), = reference_comparisons(frame, run, orders).items()
    assert label == "planted:500ns" and cmp["baseline"] == "patched"
    assert cmp["ci95_pct"][0] < 1.0 < cmp["ci95_pct"][1] and cmp["significant"] is True
    totals = decode_totals(frame)
    assert totals[("patched", 2.0)][1] == 6 * 40 * 10
    patched = frame[frame["arm"] == "patched"]
    assert totals[("patched", 2.0)][0] == pytest.approx(10 * patched["tpot_ms"].sum())


def test_the_committed_planted_step_time_is_found_by_gpu_and_model() -> None:
    from experiments.stats.plantedline import has_planted_arm
    from integration.proof import profiles

    found = profiles.default_planted_steps("h200", "llama-3.1-8b")
    assert found is not None and found.is_file()
    assert profiles.default_planted_steps("h200", "qwen3-8b") is None
    assert profiles.default_planted_steps(None, "llama-3.1-8b") is None
    assert has_planted_arm(_planted_run())
    assert not has_planted_arm(Run(arm_labels=["stock", "patched"], arms=["stock", "patched"]))


def test_a_bucket_after_an_empty_one_takes_its_own_midpoint() -> None:
    # two steps of 9-16 tokens, the bucket below them (2-8) empty: 12.5 decoding requests each
    hist = {"buckets": [1, 8, 16, 256, "+Inf"], "counts": [0, 0, 2, 0, 0]}
    frac, per_token = added_fraction(hist, None, 1.0, lambda tokens: tokens, calls=2, top=16.0)
    assert per_token == pytest.approx(12.5 * 2) and frac == pytest.approx(12.5 * 2 / 1000.0)
