"""Speedups, geometric mean and targets against literal numbers."""

from __future__ import annotations

import math

import pytest

from kernels.report import geomean, main, render, speedups, staged_study, targets


def _row(rows: int, fused: float, inductor: float, vllm_c: float, policy: str, roofline: float = 1.0) -> dict:
    return {"op": "rms_norm", "dtype": "bf16", "rows": rows, "hidden": 4096, "policy": policy,
            "samples_us": [fused] * 16, "roofline_us": roofline, "variant": "t512r1",
            "stock_samples_us": {"inductor": [inductor] * 16, "vllm_c": [vllm_c] * 16}}


def test_geomean_literal() -> None:
    assert geomean([1.0, 4.0]) == pytest.approx(2.0)
    assert geomean([2.0, 2.0, 2.0]) == pytest.approx(2.0)
    assert math.isnan(geomean([]))


def test_speedups_follow_the_policy() -> None:
    fused = speedups(_row(1, 1.0, 2.0, 1.5, "fused:t512r1"))
    assert fused == {"inductor": 2.0, "vllm_c": 1.5, "best": 1.5}
    assert speedups(_row(1, 1.0, 2.0, 1.5, "stock"))["best"] == 1.0


def test_targets_literal() -> None:
    rows = [_row(1, 1.0, 2.0, 2.25, "fused:t512r1"), _row(512, 10.0, 9.0, 9.5, "stock", roofline=8.1),
            _row(8192, 100.0, 98.0, 99.0, "stock", roofline=96.0)]
    t = targets({"bench": rows})
    g = t["geomean_speedup_bf16_rows_1_8192_hidden_2048_4096_8192"]
    assert g["vs_best_stock"] == pytest.approx(2.0 ** (1 / 3)) and g["met"] is True
    assert t["policy_never_slower_than_best_stock"] == {"met": True, "slower_shapes": [], "fused_shapes": 1}
    assert t["copy_bandwidth_rms_norm_256_2048_rows"]["min"] == pytest.approx(0.9)  # stock 9.0 us
    assert t["copy_bandwidth_rms_norm_256_2048_rows"]["fused_min"] == pytest.approx(0.81)
    assert t["copy_bandwidth_rms_norm_8192_rows_and_more"]["min"] == pytest.approx(96 / 98)
    small = t["us_per_call_at_most_128_rows_hidden_4096"]
    assert small["max"] == 1.0 and small["met"]


def test_a_fused_choice_slower_than_stock_is_named() -> None:
    t = targets({"bench": [_row(4, 2.0, 1.5, 1.8, "fused:t512r1p")]})
    assert t["policy_never_slower_than_best_stock"]["slower_shapes"] == ["rms_norm bf16 4x4096"]


def test_same_size_copy_reads_against_the_policy() -> None:
    row = _row(512, 10.0, 9.0, 9.5, "stock", roofline=4.0) | {"copy_samples_us": [5.0] * 16}
    b = targets({"bench": [row]})["copy_bandwidth_rms_norm_256_2048_rows"]
    assert b["copy_share_min"] == pytest.approx(0.8)  # 4.0 us of bytes at copy bandwidth / 5.0 us
    assert b["policy_vs_copy_min"] == pytest.approx(5.0 / 9.0)  # stock 9.0 us is what the policy runs
    assert "copy_share_min" not in targets({"bench": [_row(512, 10.0, 9.0, 9.5, "stock")]})[
        "copy_bandwidth_rms_norm_256_2048_rows"]


def test_staged_study_compares_the_best_of_each_family() -> None:
    plain = _row(512, 10.0, 9.0, 9.5, "stock") | {
        "candidates_us": {"t512r1": [10.0] * 4, "t256r1p": [9.0] * 4}}
    staged = _row(8192, 100.0, 98.0, 99.0, "stock") | {
        "candidates_us": {"t512r1": [100.0] * 4, "t64r2s": [80.0] * 4, "t128r1s": [90.0] * 4}}
    st = staged_study({"bench": [plain | {"candidates_us": {**plain["candidates_us"], "t64r2sp": [12.0] * 4}},
                                 staged]})
    assert st["shapes"] == 2 and st["staged_fastest"] == ["rms_norm bf16 8192x4096"]
    assert st["ratio_min"] == pytest.approx(9.0 / 12.0) and st["ratio_max"] == pytest.approx(100.0 / 80.0)
    assert "were the fastest candidate at 1" in render({"bench": [staged]}, "OUT/h200.json")
    assert staged_study({"bench": [plain]}) == {}
    assert "Staged builds" not in render({"bench": [plain]}, "OUT/h200.json")


def test_the_section_names_its_source_and_a_missing_vllm_arm() -> None:
    row = {"op": "rms_norm", "dtype": "bf16", "rows": 1, "hidden": 4096, "variant": "t128r1",
           "samples_us": [1.0, 1.0], "stock_samples_us": {"inductor": [2.0, 2.0], "torch": [3.0, 3.0]},
           "stock": {"inductor_us": 2.0, "torch_us": 3.0}, "roofline_us": 0.01, "policy": "fused:t128r1"}
    text = render({"bench": [row]}, "kernels/results/h100-staged/h100-80gb-hbm3.json")
    assert text.startswith("Generated from kernels/results/h100-staged/h100-80gb-hbm3.json (")
    assert "vLLM CUDA arm not timed" in text and "nanx" not in text


def test_cli_names_a_missing_results_file(tmp_path, capsys: pytest.CaptureFixture) -> None:
    assert main(["--from", str(tmp_path / "nope.json")]) == 2
    assert "nope.json: no such kernel results file" in capsys.readouterr().err
