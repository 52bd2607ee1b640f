"""Every integration CLI explains its flags; the launcher's arm flags and plugin check."""

from __future__ import annotations

import subprocess
import sys

import pytest

from integration import launcher
from tests.conftest import tiny_server_config


@pytest.mark.parametrize("module", ["integration.proof.prove", "integration.proof.prove_arm"])
def test_help(module: str) -> None:
    out = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for flag in ("--out", "--model", "--steps", "--batch-sizes"):
        assert flag in out.stdout


def test_patched_arm_falls_back_to_what_stock_runs() -> None:
    assert launcher.arm_args("patched") == [
        "--ir-op-priority.rms_norm=cupy_fused,native", "--ir-op-priority.fused_add_rms_norm=cupy_fused,native"]
    assert launcher.arm_args("patched", eager=True) == [
        "--ir-op-priority.rms_norm=cupy_fused,vllm_c,native",
        "--ir-op-priority.fused_add_rms_norm=cupy_fused,vllm_c,native"]
    assert launcher.arm_args("stock", eager=True) == []


def test_no_compile_ranges_without_cuda() -> None:
    assert launcher.compile_range_args(tiny_server_config("patched")) == []


def test_plugin_entry_point_check(monkeypatch: pytest.MonkeyPatch) -> None:
    launcher.check_plugin_installed()  # installed editable in this venv
    monkeypatch.setattr(launcher.importlib.metadata, "entry_points", lambda group: [])
    with pytest.raises(RuntimeError, match="pip install -e"):
        launcher.check_plugin_installed()
