"""A real patched vLLM CPU server: the plugin loads in every process, declines, and the model serves."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator

import aiohttp
import pytest

from integration.launcher import VllmServer
from tests.conftest import start_server, tiny_server_config

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def patched_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    log = tmp_path_factory.mktemp("patched-server") / "server.log"
    server = start_server(tiny_server_config("patched"), log)
    yield server
    server.stop()


async def _complete(server: VllmServer, prompt: list[int], max_tokens: int) -> dict:
    body = {"model": server.model_name, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
            "temperature": 0.0, "return_token_ids": True}
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{server.url}/v1/completions", json=body) as r:
            assert r.status == 200, await r.text()
            return await r.json()


def _log(server: VllmServer) -> str:
    return server.log_path.read_text(errors="replace")


def test_plugin_loads_in_every_vllm_process(patched_server: VllmServer) -> None:
    lines = [ln for ln in _log(patched_server).splitlines() if "rmsnorm_fused: registered provider" in ln]
    procs = {m.group(1) for ln in lines if (m := re.match(r"\((\w+)", ln))}
    assert "EngineCore" in procs, lines  # the process that owns the scheduler
    assert any(p.startswith("VllmWorker") or p == "EngineCore" for p in procs)
    assert all("UNSUPPORTED" in ln and "not CUDA" in ln for ln in lines)


def test_priority_names_the_provider_and_vllm_falls_back(patched_server: VllmServer) -> None:
    log = _log(patched_server)
    assert "rms_norm=['cupy_fused', 'native']" in log
    assert "fused_add_rms_norm=['cupy_fused', 'native']" in log


def test_patched_server_serves_exact_lengths(patched_server: VllmServer) -> None:
    reply = asyncio.run(_complete(patched_server, [11, 12, 13, 14, 15], 9))
    assert reply["usage"] == {**reply["usage"], "prompt_tokens": 5, "completion_tokens": 9}
    assert len(reply["choices"][0]["token_ids"]) == 9


def test_patched_matches_stock_token_for_token(patched_server: VllmServer, stock_server: VllmServer) -> None:
    prompt = [101, 202, 303, 404, 505, 606]
    got = asyncio.run(_complete(patched_server, prompt, 16))["choices"][0]["token_ids"]
    want = asyncio.run(_complete(stock_server, prompt, 16))["choices"][0]["token_ids"]
    assert got == want  # same seeded dummy weights, both native on CPU
