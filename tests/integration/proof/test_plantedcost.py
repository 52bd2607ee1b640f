"""The planted delay's measured in-graph cost: read back by GPU and delay, version-checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.jsonfile import ResultFileError, write_json
from integration.proof import plantedcost


def _write(path: Path, delays: list) -> None:
    write_json(path, {"schema_version": plantedcost.SCHEMA_VERSION, "delays": delays})


def test_added_cost_is_found_by_gpu_and_delay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plantedcost, "TABLES_DIR", tmp_path)
    _write(tmp_path / "testgpu-planted-cost.json", [{"ns": 200, "added_us_per_call": 1.41},
                                                    {"ns": 500, "added_us_per_call": 1.72}])
    assert plantedcost.added_us_per_call("testgpu", 500) == pytest.approx(1.72)
    assert plantedcost.added_us_per_call("testgpu", 300) is None  # a delay never measured
    assert plantedcost.added_us_per_call("othergpu", 500) is None  # no file for that GPU
    assert plantedcost.added_us_per_call(None, 500) is None  # CPU runs


def test_damaged_files_are_named(tmp_path: Path) -> None:
    path = tmp_path / "x-planted-cost.json"
    _write(path, [{"ns": 200}])
    with pytest.raises(ResultFileError, match="delays\\[0\\]: need ns and added_us_per_call"):
        plantedcost.added_us_per_call("x", 200, path)
    write_json(path, {"schema_version": 99, "delays": []})
    with pytest.raises(ResultFileError, match="x-planted-cost.json"):
        plantedcost.added_us_per_call("x", 200, path)


def test_cli_without_a_gpu_says_so(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert plantedcost.main(["--ns", "200", "--out", str(tmp_path / "o.json")]) == 2
    assert "plantedcost: error: no CUDA GPU visible" in capsys.readouterr().err
    with pytest.raises(SystemExit) as got:
        plantedcost.main(["--ns", "2x", "--out", str(tmp_path / "o.json")])
    assert got.value.code == 2
