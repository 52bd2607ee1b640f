"""integration.calibrate: what a calibration is keyed on, when a record is reused and when the kit
recalibrates (saying which part changed), and the steps it runs for a model shape."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.jsonfile import write_json
from integration import calibrate
from integration.launcher import MODELS_DIR

KEY = {"gpu": "NVIDIA H100 80GB HBM3", "memory_bytes": 85520809984, "driver": "580.82.07",
       "torch": "2.11.0+cu130", "vllm": "0.26.0", "cupy": "14.2.0", "kernel_source_sha256": "ab" * 32,
       "model": {"name": "llama-3.1-8b", "dtype": "bf16", "norm_widths": [4096],
                 "architecture": "LlamaForCausalLM"}}


def _record(tmp_path: Path, key: dict, outputs: list[str]) -> Path:
    path = tmp_path / "calibration-h100.json"
    write_json(path, {"schema_version": calibrate.SCHEMA_VERSION, "key": key,
                      "steps": [{"name": "s", "command": "c", "seconds": 1.0, "outputs": outputs}]})
    return path


def test_the_same_key_with_its_outputs_is_reused(tmp_path: Path) -> None:
    out = tmp_path / "table.json"
    out.write_text("{}")
    ok, why = calibrate.reusable(_record(tmp_path, KEY, [str(out)]), KEY)
    assert ok, why


@pytest.mark.parametrize("field, value, named", [
    ("driver", "590.1", "driver"), ("vllm", "0.27.0", "vllm"), ("kernel_source_sha256", "cd" * 32,
                                                                "kernel_source_sha256"),
    ("model", {**KEY["model"], "norm_widths": [128, 4096]}, "model.norm_widths"),
    ("model", {**KEY["model"], "dtype": "fp16"}, "model.dtype"),
    ("memory_bytes", 150_000_000_000, "memory_bytes")])
def test_a_changed_key_recalibrates_and_names_the_part(tmp_path: Path, field: str, value: object,
                                                       named: str) -> None:
    ok, why = calibrate.reusable(_record(tmp_path, KEY, []), {**KEY, field: value})
    assert not ok and why == f"the key changed: {named}"


def test_an_output_committed_compressed_is_there(tmp_path: Path) -> None:
    write_json(tmp_path / "h100.json.xz", {"schema_version": 2})  # a benchmark committed .xz
    ok, why = calibrate.reusable(_record(tmp_path, KEY, [str(tmp_path / "h100.json")]), KEY)
    assert ok, why


def test_a_missing_output_or_record_recalibrates(tmp_path: Path) -> None:
    ok, why = calibrate.reusable(_record(tmp_path, KEY, [str(tmp_path / "gone.json")]), KEY)
    assert not ok and "outputs missing" in why and "gone.json" in why
    ok, why = calibrate.reusable(tmp_path / "none.json", KEY)
    assert not ok and "no usable record" in why


def test_the_key_holds_every_norm_width_of_the_model() -> None:
    assert calibrate.model_key(MODELS_DIR / "llama-3.1-8b", "bfloat16")["norm_widths"] == [4096]
    qwen = calibrate.model_key(MODELS_DIR / "qwen3-8b", "bfloat16")
    assert qwen["norm_widths"] == [128, 4096] and qwen["dtype"] == "bf16"


def test_the_source_hash_follows_the_kernel_source() -> None:
    assert len(calibrate.kernel_source_hash()) == 64
    assert calibrate.kernel_source_hash() == calibrate.kernel_source_hash()


def test_the_steps_write_the_files_the_plugin_and_the_planted_control_read(tmp_path: Path) -> None:
    steps = calibrate.steps("h100-80gb-hbm3", MODELS_DIR / "qwen3-8b", "bfloat16", [128, 4096],
                            tmp_path / "evidence")
    assert [s.args[0] for s in steps] == ["kernels.suite", "integration.proof.prove",
                                          "integration.proof.ingraph", "integration.proof.plantedcost"]
    outputs = {str(p) for s in steps for p in s.outputs}
    assert "runtime_tables/policy-h100-80gb-hbm3-in-graph.json" in outputs  # integration.names.TABLES
    assert "runtime_tables/h100-80gb-hbm3-planted-cost.json" in outputs  # plantedcost.result_path
    assert str(tmp_path / "evidence" / "h100-80gb-hbm3.json") in outputs  # the benchmark: evidence
    policy_out = steps[0].args[steps[0].args.index("--policy-out") + 1]
    assert policy_out == "runtime_tables/policy-h100-80gb-hbm3.json"
    assert steps[0].args[steps[0].args.index("--hidden") + 1] == "128,4096"


def test_without_a_gpu_it_says_so_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    assert calibrate.main([]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"{calibrate.PROG}: error: no CUDA GPU visible")


def test_the_estimate_is_the_last_calibrations_measured_time(tmp_path: Path) -> None:
    steps = calibrate.steps("h100", MODELS_DIR / "llama-3.1-8b", "bfloat16", [4096], tmp_path)
    path = tmp_path / "calibration-h100.json"
    write_json(path, {"schema_version": calibrate.SCHEMA_VERSION, "key": KEY,
                      "steps": [{"name": steps[1].name, "command": "c", "seconds": 123.4, "outputs": []}]})
    est = calibrate.estimates(steps, path)
    assert est[1] == 123.4 and est[0] == steps[0].estimate_s
