"""Shared fixtures: a real vLLM server (the CPU build) on 127.0.0.1 with a tiny random-weight Llama."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from integration import arms
from integration.launcher import MODELS_DIR, ServerConfig, VllmServer, free_port

REPO = Path(__file__).resolve().parent.parent
TINY_MODEL = MODELS_DIR / "tiny-llama"
# A tiny model needs little KV cache; keep the CPU server's memory small (GiB).
CPU_SERVER_ENV = (("VLLM_CPU_KVCACHE_SPACE", "1"), ("OMP_NUM_THREADS", str(min(2, os.cpu_count() or 1))))


def tiny_server_config(arm: str | arms.Arm = "stock", **overrides) -> ServerConfig:
    """The CPU test server of `arm` (an Arm, or the name of one): tiny Llama, float32, dummy weights,
    short context."""
    fields = dict(model_dir=TINY_MODEL, arm=arms.get(arm) if isinstance(arm, str) else arm, port=free_port(),
                  dtype="float32", max_model_len=4096, extra_env=CPU_SERVER_ENV)
    fields.update(overrides)
    return ServerConfig(**fields)


def start_server(cfg: ServerConfig, log_path: Path, timeout_s: float = 900.0) -> VllmServer:
    """Start a server and wait for health; on failure, stop it and fail with its log tail."""
    return VllmServer(cfg, log_path).launch(timeout_s)


@pytest.fixture(scope="session")
def stock_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """A real stock vLLM CPU server shared by every test of the session."""
    log = tmp_path_factory.mktemp("stock-server") / "server.log"
    server = start_server(tiny_server_config("stock"), log)
    yield server
    server.stop()
