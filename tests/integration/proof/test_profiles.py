"""integration.proof.profiles: committed step profiles, found per GPU and read with their version checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.jsonfile import ResultFileError, read_json
from integration import calibrate
from integration.proof import profiles


def test_committed_h200_profile_is_read_as_written() -> None:
    path = profiles.PROJECT_ROOT / profiles.default_profile("h200", "compiled")
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
            assert profiles.load_profile(profiles.PROJECT_ROOT / profiles.default_profile(gpu, mode))


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
    # H200 files were made by hand and are indexed; the H100's calibration record names its own
    assert profiles.default_graph_steps("h200", "llama-3.1-8b") == Path(
        "integration/results/h200-llama8b-graph/h200-graph-steps.json")
    record = json.loads(calibrate.record_path("h100-80gb-hbm3").read_text())
    model = record["key"]["model"]["name"]
    found = profiles.default_graph_steps("h100-80gb-hbm3", model)
    assert found is not None and str(found) in [o for s in record["steps"] for o in s["outputs"]]
    assert (profiles.PROJECT_ROOT / found).is_file() and str(found).endswith("-graph-steps.json")
    assert profiles.default_graph_steps("h100-80gb-hbm3", "a-model-never-calibrated") is None
    assert profiles.default_graph_steps("b200", "llama-3.1-8b") is None
    assert profiles.default_graph_steps(None, "llama-3.1-8b") is None


def test_every_indexed_graph_steps_file_has_stock_decode_steps() -> None:
    for gpu, models in json.loads(profiles.INDEX.read_text())["graph_steps"].items():
        for model in models:
            doc = json.loads((profiles.PROJECT_ROOT / profiles.default_graph_steps(gpu, model)).read_text())
            assert model in doc["model"] and all(s["baseline"] == "stock" for s in doc["sizes"])
