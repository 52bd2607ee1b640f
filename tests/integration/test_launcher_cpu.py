"""The arm launcher against a real vLLM CPU server."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from integration import arms
from integration.launcher import ServerConfig, VllmServer, server_command
from tests.conftest import TINY_MODEL, tiny_server_config


def test_arms_differ_only_in_kernel_selection() -> None:
    stock, patched = tiny_server_config("stock", port=8000), tiny_server_config("patched", port=8000)
    s_cmd, p_cmd = server_command(stock), server_command(patched)
    assert p_cmd[: len(s_cmd)] == s_cmd
    assert p_cmd[len(s_cmd):] == arms.get("patched").server_args(eager=False)
    assert "--host" in s_cmd and s_cmd[s_cmd.index("--host") + 1] == "127.0.0.1"


def test_bad_config_is_rejected(tmp_path) -> None:
    stock = arms.get("stock")
    with pytest.raises(TypeError, match=r"ServerConfig.arm: an integration.arms.Arm .*got 'stock'"):
        ServerConfig(model_dir=TINY_MODEL, arm="stock", port=1)  # a name is resolved where it is given
    with pytest.raises(FileNotFoundError, match="config.json"):
        ServerConfig(model_dir=tmp_path, arm=stock, port=1)
    with pytest.raises(ValueError, match="127.0.0.1"):
        ServerConfig(model_dir=TINY_MODEL, arm=stock, port=1, host="0.0.0.0")


@pytest.mark.e2e
def test_server_that_dies_surfaces_its_log(tmp_path) -> None:
    cfg = tiny_server_config("stock", extra_args=("--max-logprobs", "not-a-number"))
    server = VllmServer(cfg, tmp_path / "dead.log")
    with pytest.raises(RuntimeError, match="exited with code"):
        server.launch(timeout_s=300)
    assert not server.is_alive()


@pytest.mark.server
def test_stock_server_serves_exact_lengths(stock_server: VllmServer) -> None:
    async def ask() -> dict:
        async with aiohttp.ClientSession() as s:
            body = {"model": stock_server.model_name, "prompt": [11, 12, 13, 14], "max_tokens": 7,
                    "ignore_eos": True}
            async with s.post(f"{stock_server.url}/v1/completions", json=body) as r:
                assert r.status == 200, await r.text()
                return await r.json()

    reply = asyncio.run(ask())
    assert reply["usage"]["completion_tokens"] == 7
    assert reply["usage"]["prompt_tokens"] == 4


def test_model_directory_decides_how_vllm_loads_it(tmp_path) -> None:
    from integration.launcher import model_load_args

    (tmp_path / "config.json").write_text("{}")
    assert model_load_args(tmp_path) == ["--load-format", "dummy", "--skip-tokenizer-init"]  # random weights
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert model_load_args(tmp_path) == ["--skip-tokenizer-init"]  # its weights, token-id prompts
    (tmp_path / "tokenizer.json").write_text("{}")
    assert model_load_args(tmp_path) == []  # weights and tokenizer: a real model
    assert model_load_args(TINY_MODEL) == ["--load-format", "dummy", "--skip-tokenizer-init"]
