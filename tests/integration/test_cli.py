"""Every integration CLI explains its flags; no compile ranges without CUDA."""

from __future__ import annotations

import subprocess
import sys

import pytest

from integration import launcher
from tests.conftest import tiny_server_config


@pytest.mark.e2e
@pytest.mark.parametrize("module", ["integration.proof.prove", "integration.proof.prove_arm"])
def test_help(module: str) -> None:
    out = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    for flag in ("--out", "--model", "--steps", "--batch-sizes"):
        assert flag in out.stdout


def test_no_compile_ranges_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher, "_cuda_available", lambda: False)
    assert launcher.compile_range_args(tiny_server_config("patched")) == []
