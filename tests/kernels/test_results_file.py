"""Integrity of the committed H200 results file and the policy table made from it."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

import runtime_tables
from common.jsonfile import read_json
from kernels import policy, report
from kernels.bench import HEAD_ROWS, HEAD_WIDTH, HIDDEN, OPS, ROWS
from kernels.suite import SCHEMA_VERSION

pytestmark = pytest.mark.evidence  # re-derives committed files (make test-fast leaves it out)

RESULTS = Path(__file__).resolve().parents[2] / "kernels" / "results" / "h200.json"


@pytest.fixture(scope="module")
def results() -> dict:
    return read_json(RESULTS, None, "kernel results")


@pytest.fixture(scope="module")
def v2(results: dict) -> dict:
    """The results file when it has the current format (schema 2); a schema-1 file (kernel v1) skips."""
    if results["schema_version"] < SCHEMA_VERSION:
        pytest.skip(f"{RESULTS.name} is schema {results['schema_version']} (kernel v1, before launch-shape "
                    "candidates and the issue-10 targets); python -m kernels.suite on the H200 "
                    "regenerates it")
    return results


def test_schema_and_environment(results: dict) -> None:
    assert results["schema_version"] in (1, SCHEMA_VERSION)
    env = results["environment"]
    for key in ("gpu", "driver", "cuda", "torch", "cupy", "vllm", "clocks_before", "clocks_after",
                "copy_bandwidth_bytes_per_s"):
        assert env[key], key
    assert "H200" in env["gpu"] and not results["quick"]


def test_every_row_has_raw_samples_and_consistent_statistics(results: dict) -> None:
    for row in results["bench"]:
        s = row["samples_us"]
        assert len(s) >= 15
        assert row["median_us"] == pytest.approx(statistics.median(s))
        assert row["min_us"] == min(s) and row["max_us"] == max(s)
        for arm, samples in row["stock_samples_us"].items():
            assert len(samples) >= 15, arm
            assert row["stock"][f"{arm}_us"] == pytest.approx(statistics.median(samples))
        assert row["roofline_us"] > 0 and set(row["stock"]) == {"inductor_us", "vllm_c_us", "torch_us"}


def test_bf16_grid_is_complete(v2: dict) -> None:
    results = v2
    got = {(r["op"], r["rows"], r["hidden"]) for r in results["bench"] if r["dtype"] == "bf16"}
    want = {(op, r, h) for op in OPS for r in ROWS for h in HIDDEN}
    assert got == want | {("rms_norm", r, HEAD_WIDTH) for r in HEAD_ROWS}


def test_row_variant_is_the_fastest_candidate(v2: dict) -> None:
    results = v2
    for row in results["bench"]:
        meds = {v: statistics.median(s) for v, s in row["candidates_us"].items()}
        assert row["variant"] == min(meds, key=meds.get)
        assert row["samples_us"] == row["candidates_us"][row["variant"]]


def test_policy_rows_follow_from_the_samples(results: dict) -> None:
    table = policy.build_table(results["bench"])
    shipped = policy.load_policy(runtime_tables.path("policy-h200.json"))
    assert shipped.table == table
    for row in results["bench"]:
        assert row["policy"] == shipped.choose(row["op"], row["dtype"], row["rows"], row["hidden"])
        if row["policy"] != "stock":
            assert row["policy"] == f"fused:{row['variant']}"
            best = min(statistics.median(v) for v in row["stock_samples_us"].values())
            assert statistics.median(row["samples_us"]) < best


def test_validation_passed_controls_failed_sanitizer_clean(v2: dict) -> None:
    results = v2
    val = results["validation"]
    assert val["passed"] and val["cases_run"] >= 1000 and val["failures_total"] == 0
    for name in ("epsilon", "tail"):
        assert val["negative_controls"][name]["failed_as_it_must"], name
    assert {s["tool"] for s in val["sanitizer"]} == {"memcheck", "racecheck", "initcheck"}
    assert all(s["clean"] and s["findings"] == 0 for s in val["sanitizer"])


def test_targets_block_recomputes_from_samples(v2: dict) -> None:
    results = v2
    again = report.targets(results)
    stored = results["targets"]
    for target, values in again.items():
        assert values["met"] == stored[target]["met"], target
        for key, v in values.items():
            if isinstance(v, float):
                assert v == pytest.approx(stored[target][key], nan_ok=True), (target, key)
