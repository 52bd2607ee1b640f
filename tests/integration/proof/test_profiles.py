"""integration.proof.profiles: committed step profiles, found per GPU and read with their version checked."""

from __future__ import annotations

import json

import pytest

from common.jsonfile import ResultFileError
from integration.proof import profiles


def test_committed_h200_profile_is_read_as_written() -> None:
    path = profiles.PROJECT_ROOT / profiles.default_profile("h200", "compiled")
    raw = json.loads(path.read_text())["steps"]
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
