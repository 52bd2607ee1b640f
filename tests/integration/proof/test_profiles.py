"""integration.proof.profiles: committed step profiles, found per GPU and read with their version checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import runtime_tables
from common.jsonfile import ResultFileError, read_json
from integration import calibrate
from integration.proof import profiles


def test_committed_h200_profile_is_read_as_written() -> None:
    path = profiles.default_profile("h200", "compiled")
    raw = read_json(path, None, "step profile")["steps"]
    rows = profiles.load_profile(path)
    assert [r["batch_tokens"] for r in rows] == sorted(float(s["batch_tokens"]) for s in raw)
    for row, step in zip(rows, sorted(raw, key=lambda s: s["batch_tokens"])):
        extra = sum(step["patched_extra_kernels_us"].values())
        assert row["norm_patched_us"] == pytest.approx(step["norm_us_patched"] + extra)
        # the profile's own prediction is the same arithmetic
        assert 100 * (row["norm_patched_us"] - row["norm_stock_us"]) / row["step_us"] == pytest.approx(
            step["predicted_step_change_pct"])


def test_every_indexed_profile_exists_and_loads() -> None:
    index = json.loads(profiles.INDEX.read_text())["profiles"]
    for gpu, modes in index.items():
        for mode in modes:
            assert profiles.load_profile(profiles.default_profile(gpu, mode))


def test_unknown_gpu_has_no_default_profile() -> None:
    assert profiles.default_profile("b200", "compiled") is None
    assert profiles.default_profile(None, "eager") is None


def test_wrong_version_and_truncated_files_name_the_file(tmp_path) -> None:
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"schema_version": 0, "steps": []}))
    with pytest.raises(ResultFileError, match=r"old.json: step profile schema_version 0"):
        profiles.load_profile(old)
    cut = tmp_path / "cut.json"
    cut.write_text('{"schema_version": 1, "steps": [')
    with pytest.raises(ResultFileError, match=r"cut.json:1: step profile is not valid JSON"):
        profiles.load_profile(cut)


def test_graph_step_times_come_from_the_index_else_the_gpus_calibration_record() -> None:
    # H200 files were made by hand and are indexed; the H100's calibration kept its own beside its record
    assert profiles.default_graph_steps("h200", "llama-3.1-8b") == runtime_tables.path(
        "graph-steps-h200-llama-3.1-8b.json")
    record = json.loads(calibrate.record_path("h100-80gb-hbm3").read_text())
    model = record["key"]["model"]["name"]
    found = profiles.default_graph_steps("h100-80gb-hbm3", model)
    assert found == calibrate.graph_steps_table("h100-80gb-hbm3", model) and found.is_file()
    assert model in json.loads(found.read_text())["model"]
    assert profiles.default_graph_steps("h100-80gb-hbm3", "a-model-never-calibrated") is None
    assert profiles.default_graph_steps("b200", "llama-3.1-8b") is None
    assert profiles.default_graph_steps(None, "llama-3.1-8b") is None


def test_every_indexed_graph_steps_file_has_stock_decode_steps() -> None:
    for gpu, models in json.loads(profiles.INDEX.read_text())["graph_steps"].items():
        for model in models:
            doc = json.loads((profiles.default_graph_steps(gpu, model)).read_text())
            assert model in doc["model"] and all(s["baseline"] == "stock" for s in doc["sizes"])


def test_every_indexed_file_is_the_prove_run_it_was_copied_from() -> None:
    index = json.loads(profiles.INDEX.read_text())
    named = {name for section in ("profiles", "planted_steps", "graph_steps")
             for by_gpu in index[section].values() for name in by_gpu.values()}
    copied = index["copied_from"]
    assert named <= set(copied)
    root = Path(__file__).resolve().parents[3]
    for name, evidence in copied.items():
        assert read_json(runtime_tables.path(name), None, name) == read_json(root / evidence, None, evidence)
