"""Speedups, geometric mean and targets against literal numbers."""

from __future__ import annotations

import math

import pytest

from kernels.report import geomean, speedups, targets


def _row(rows: int, fused: float, inductor: float, vllm_c: float, policy: str, roofline: float = 1.0) -> dict:
    return {"op": "rms_norm", "dtype": "bf16", "rows": rows, "hidden": 4096, "policy": policy,
            "samples_us": [fused] * 16, "roofline_us": roofline,
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
    rows = [_row(1, 1.0, 2.0, 2.25, "fused:t512r1"), _row(512, 10.0, 9.0, 9.5, "stock", roofline=9.0)]
    t = targets({"bench": rows})
    assert t["geomean_speedup_bf16"]["vs_best_stock"] == pytest.approx(math.sqrt(2.0 * 1.0))
    assert t["geomean_speedup_bf16"]["met"] is True
    assert t["fused_faster_where_dispatched"] == {"met": True, "fused_shapes": 1, "slower_shapes": []}
    assert t["copy_bandwidth_fraction_256_4096_rows"]["min"] == pytest.approx(0.9)
    assert t["us_per_call_at_most_128_rows"]["max"] == 1.0 and t["us_per_call_at_most_128_rows"]["met"]
