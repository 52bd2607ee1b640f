"""Policy table: parsing, bucket lookup, fallbacks, determinism."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import runtime_tables
from kernels.policy import (
    Policy,
    build_table,
    calls_document,
    calls_out,
    decide,
    default_out,
    load_policy,
    spread,
    table_document,
    unsupported_reason,
)
from kernels.policy import main as policy_main

TABLE = {"rms_norm/bf16/4096": [[1, "fused:t512r1"], [128, "fused:t512r1"], [1024, "stock"]],
         "fused_add_rms_norm/fp16/2048": [[8, "stock"], [64, "fused:t256r1"]]}


def _row(rows: int, fused: list[float], stock: dict[str, list[float]]) -> dict:
    return {"op": "rms_norm", "dtype": "bf16", "rows": rows, "hidden": 4096, "variant": "t512r1",
            "samples_us": fused, "samples_per_round": 2, "stock_samples_us": stock}


def test_bucket_lookup_uses_first_grid_rows_at_or_above() -> None:
    p = Policy(TABLE)
    assert p.choose("rms_norm", "bf16", 1, 4096) == "fused:t512r1"
    assert p.choose("rms_norm", "bf16", 100, 4096) == "fused:t512r1"  # bucket 128
    assert p.choose("rms_norm", "bf16", 129, 4096) == "stock"  # bucket 1024
    assert p.choose("rms_norm", "bf16", 10**6, 4096) == "stock"  # beyond the grid: the last bucket
    assert p.choose("rms_norm", torch.bfloat16, 2, 4096) == "fused:t512r1"
    assert p.choose("fused_add_rms_norm", torch.float16, 9, 2048) == "fused:t256r1"


def test_unknown_shapes_and_dtypes_fall_back_to_stock() -> None:
    p = Policy(TABLE)
    assert p.choose("rms_norm", "bf16", 1, 5120) == "stock"  # hidden not benchmarked
    assert p.choose("rms_norm", "fp32", 1, 4096) == "stock"
    assert p.choose("rms_norm", torch.float64, 1, 4096) == "stock"
    assert p.choose("rms_norm", "bf16", 0, 4096) == "stock"
    assert p.choose("gelu", "bf16", 1, 4096) == "stock"


@pytest.mark.parametrize("table,match", [
    ({"rms_norm/bf16": []}, "is not 'op/dtype/hidden'"),
    ({"rms_norm/fp64/4096": []}, "is not 'op/dtype/hidden'"),
    ({"layer_norm/bf16/4096": []}, "unknown op 'layer_norm'"),
    ({"rms_norm/bf16/4096": [[8, "stock"], [4, "stock"]]}, "strictly ascending"),
    ({"rms_norm/bf16/4096": [[8, "fast"]]}, "choice 'fast'"),
])
def test_bad_tables_are_rejected_with_the_reason(table: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Policy(table, source="t.json")


def test_load_policy_rejects_bad_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{\n  \"table\": \n")
    with pytest.raises(ValueError, match="bad.json:3: not valid JSON"):
        load_policy(bad)
    bad.write_text(json.dumps({"schema_version": 99, "table": {}}))
    with pytest.raises(ValueError, match="schema_version 99"):
        load_policy(bad)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_policy(tmp_path / "missing.json")


def test_shipped_table_loads_and_the_readme_counts_it() -> None:
    p = load_policy(runtime_tables.path("policy-h200.json"))  # the committed H200 table
    assert p.choose("rms_norm", "bf16", 1, 2048).startswith("fused:")
    table = json.loads(runtime_tables.path("policy-h200.json").read_text())["table"]
    fused = sum(1 for entries in table.values() for _, choice in entries if choice != "stock")
    total = sum(len(entries) for entries in table.values())
    readme = " ".join((Path(__file__).resolve().parents[2] / "kernels" / "README.md").read_text().split())
    assert f"{fused} of {total} shapes go to the fused kernel" in readme


def test_cli_names_a_missing_results_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert policy_main(["--from", str(tmp_path / "nope.json")]) == 2
    assert "nope.json: no such kernel results file" in capsys.readouterr().err


def test_spread_and_decision_from_raw_samples() -> None:
    assert spread([1.0, 1.0, 1.2, 1.2], 2) == pytest.approx(0.2 / 1.1)
    win = _row(1, [1.0] * 4, {"inductor": [2.0] * 4, "vllm_c": [1.5] * 4})
    choice, ev = decide(win)
    assert choice == "fused:t512r1" and ev["best_stock"] == "vllm_c" and ev["gain"] == pytest.approx(0.5)
    # a 2% win is below the 3% floor
    assert decide(_row(1, [1.0] * 4, {"vllm_c": [1.02] * 4}))[0] == "stock"
    # a 10% win inside a 12% run-to-run spread is not taken
    noisy = _row(1, [0.94, 0.94, 1.06, 1.06], {"vllm_c": [1.1] * 4})
    assert decide(noisy)[0] == "stock"
    assert decide(_row(1, [1.0] * 4, {}))[0] == "stock"


def test_build_table_is_deterministic_and_sorted() -> None:
    rows = [_row(64, [1.0] * 4, {"vllm_c": [2.0] * 4}), _row(1, [3.0] * 4, {"vllm_c": [2.0] * 4})]
    t1, t2 = build_table(rows), build_table(list(reversed(rows)))
    assert t1 == t2 == {"rms_norm/bf16/4096": [[1, "stock"], [64, "fused:t512r1"]]}
    assert table_document({"bench": rows}, "x.json")["table"] == t1


def test_unsupported_inputs_go_to_stock() -> None:
    assert "not a CUDA device" in unsupported_reason(torch.zeros(2, 8), torch.ones(8))


def test_decision_against_chosen_stock_arms() -> None:
    row = _row(1, [1.0] * 4, {"inductor": [2.0] * 4, "vllm_c": [1.01] * 4})
    assert decide(row)[0] == "stock"  # vLLM's CUDA kernel is within the margin
    choice, ev = decide(row, ("inductor",))  # a server under torch.compile runs Inductor's kernel
    assert choice == "fused:t512r1" and ev["best_stock"] == "inductor"


def test_cli_names_the_table_by_the_results_file_in_the_tables(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime_tables, "DIR", tmp_path / "runtime_tables")  # the package folder, in tmp
    (tmp_path / "runtime_tables").mkdir()
    rows = [_row(64, [1.0] * 4, {"vllm_c": [2.0] * 4})]
    source = tmp_path / "b200.json"
    source.write_text(json.dumps({"bench": rows}))
    assert policy_main(["--from", str(source)]) == 0
    table = tmp_path / "runtime_tables" / "policy-b200.json"
    assert load_policy(table).choose("rms_norm", "bf16", 64, 4096) == "fused:t512r1"
    assert default_out("OUT/h200.json.xz") == default_out("h200.json") == table.with_name("policy-h200.json")


def test_no_table_from_results_whose_validation_failed(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rows = [_row(1, [1.0, 1.0], {"inductor": [2.0, 2.0]})]
    ok = {"bench": rows, "validation": {"passed": True}}
    assert table_document(ok, "x.json")["table"] == table_document({"bench": rows}, "x.json")["table"]
    bad = {"bench": rows, "validation": {"passed": False, "cases_run": 10, "failures_total": 1,
                                         "failures": ["rms_norm bf16 rows=7 hidden=33 variant=t8r4s: r=9"]}}
    with pytest.raises(ValueError, match=r"x.json: validation did not pass \(1 of 10 cases failed, first: "
                                         r"rms_norm bf16 rows=7 hidden=33 variant=t8r4s"):
        table_document(bad, "x.json")
    src = tmp_path / "bad.json"
    src.write_text(json.dumps(bad))
    assert policy_main(["--from", str(src), "--out", str(tmp_path / "p.json")]) == 2
    assert "no policy table from a kernel that failed validation" in capsys.readouterr().err
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("gpu", ["h200", "h100-80gb-hbm3"])
def test_the_kernel_calls_table_is_the_benchmark_its_source_names(gpu: str) -> None:
    from common.jsonfile import read_json

    table = runtime_tables.path(f"policy-{gpu}.json")
    calls = read_json(calls_out(table), None, "kernel calls")
    source = read_json(table, None, "policy table")["source"]
    assert calls["source"] == source
    results = read_json(Path(__file__).resolve().parents[2] / source, None, "kernel results")
    assert calls == calls_document(results, source)
    assert calls["command"].startswith("python -m kernels.suite")
    assert len(calls["bench"]) == len(results["bench"])
    assert {k for row in calls["bench"] for k in row} == {"op", "dtype", "rows", "hidden", "variant",
                                                          "median_us", "stock", "policy"}
