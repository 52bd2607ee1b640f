"""environment.json: every field the contract names, found or null, never guessed."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from experiments.runner.environment import capture_environment, module_version, package_versions
from integration.launcher import MODELS_DIR
from traces.trace import file_sha256

REPO = Path(__file__).resolve().parents[2]
TRACE = REPO / "traces" / "chat.jsonl"


def test_environment_has_every_contract_field() -> None:
    env = json.loads(json.dumps(capture_environment(TRACE, MODELS_DIR / "tiny-llama")))
    for key in ("gpu", "driver", "cuda", "torch", "vllm", "cupy", "clocks", "python", "platform", "git",
                "trace", "model", "cpu_count"):
        assert key in env, key
    assert env["trace"]["sha256"] == file_sha256(TRACE)
    assert env["model"]["config"]["hidden_size"] == 256
    assert env["cpu_count"] == os.cpu_count()
    assert env["torch"]["version"] and env["packages"]["torch"]
    assert env["git"]["commit"] is None or len(env["git"]["commit"]) == 40
    if shutil.which("nvidia-smi") is None:
        assert env["gpu"] is None and env["clocks"] is None and env["driver"] is None


def test_missing_packages_are_null() -> None:
    assert package_versions(("no-such-package-xyz",)) == {"no-such-package-xyz": None}
    assert module_version("no_such_module_xyz") is None
    assert module_version("aiohttp") is not None
