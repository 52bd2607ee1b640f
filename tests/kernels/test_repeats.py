"""The repeat runs' README (kernels/results/h200-repeats-2026-12-05) re-derives from the files."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest

from common.jsonfile import read_json

RESULTS = Path(__file__).resolve().parents[2] / "kernels/results"
REPEATS = RESULTS / "h200-repeats-2026-12-05"


def _bench(path: Path) -> dict[tuple, dict]:
    return {(r["op"], r["dtype"], r["rows"], r["hidden"]): r
            for r in read_json(path, None, "kernel results")["bench"]}


def test_repeats_agree_with_the_full_run_as_the_readme_says() -> None:
    full = _bench(RESULTS / "h200.json")
    pairs = [(full[k], r) for name in ("h200-h4096.json", "h200-h2048-8192.json")
             for k, r in _bench(REPEATS / name).items()]
    assert len(pairs) == 160
    ratios = [r["median_us"] / f["median_us"] for f, r in pairs]
    assert min(ratios) == pytest.approx(0.96, abs=0.005) and max(ratios) == pytest.approx(1.05, abs=0.005)
    assert statistics.median(ratios) == pytest.approx(1.00, abs=0.005)
    differ = [(f, r) for f, r in pairs if f["policy"] != r["policy"]]
    assert len(differ) == 7
    flips = [(f["op"], f["rows"], f["hidden"]) for f, r in differ
             if (f["policy"] == "stock") != (r["policy"] == "stock")]
    assert flips == [("fused_add_rms_norm", 2048, 2048)]
    gains = {k: f["policy_evidence"]["gain"] for k, f in full.items()
             if f["policy"] != "stock" and f["dtype"] == "bf16"}
    assert min(gains, key=gains.get) == ("fused_add_rms_norm", "bf16", 2048, 2048)


def test_the_geomean_target_repeats() -> None:
    part = read_json(REPEATS / "h200-h2048-8192.json", None, "kernel results")["targets"]
    whole = read_json(RESULTS / "h200.json", None, "kernel results")["targets"]
    key = "geomean_speedup_bf16_rows_1_8192_hidden_2048_4096_8192"
    assert round(part[key]["vs_best_stock"], 3) == 1.291 and round(whole[key]["vs_best_stock"], 3) == 1.292
    assert all(read_json(REPEATS / n, None, "kernel results")["validation"]["passed"]
               for n in ("h200-h4096.json", "h200-h2048-8192.json"))
    assert not math.isnan(part[key]["vs_vllm_c"])
