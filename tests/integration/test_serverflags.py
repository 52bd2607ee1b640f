"""What a server's arguments set, read as vLLM's own parser reads them: where it listens is the kit's
alone, whatever an arm or --server-arg spells."""

from __future__ import annotations

import argparse

import pytest

from integration import arms
from tests.conftest import tiny_server_config

KIT_FLAGS = ["--model", "m", "--host", "127.0.0.1", "--port", "8001"]
# --host and --port as vLLM takes them: whole, abbreviated (argparse's prefixes), with `=` or a word apart
LISTEN_SPELLINGS = ["--host=0.0.0.0", "--hos=0.0.0.0", "--ho", "--h", "--port=8002", "--por", "--po=8002",
                    "--host", "--port"]


@pytest.fixture(scope="module")
def vllm_parser() -> argparse.ArgumentParser:
    """The installed vLLM's OpenAI server parser, built as `python -m vllm.entrypoints.openai.api_server`
    builds it."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser  # vLLM 0.32
    except ImportError:
        from vllm.entrypoints.openai.cli_args import make_arg_parser  # vLLM 0.26
    return make_arg_parser(FlexibleArgumentParser())


@pytest.mark.parametrize("word", LISTEN_SPELLINGS)
def test_no_server_argument_moves_a_server_off_its_address(word: str) -> None:
    with pytest.raises(ValueError, match="127.0.0.1 only"):
        tiny_server_config("stock", extra_args=(word, "0.0.0.0"))
    with pytest.raises(ValueError, match="127.0.0.1 only"):
        tiny_server_config(arms.Arm("mine", extra_args=(word, "0.0.0.0")))


def test_vllm_takes_an_abbreviated_host_last_and_the_kit_refuses_every_spelling(
        vllm_parser: argparse.ArgumentParser) -> None:
    moved = vllm_parser.parse_args(KIT_FLAGS + ["--hos=0.0.0.0", "--por", "8002"])
    assert (moved.host, moved.port) == ("0.0.0.0", 8002)  # the hazard: after the kit's flags, they win
    listening = [s for a in vllm_parser._actions if a.dest in ("host", "port") for s in a.option_strings]
    taken = []
    for flag in listening:
        for end in range(3, len(flag) + 1):
            try:
                ns = vllm_parser.parse_args(KIT_FLAGS + [f"{flag[:end]}=8003"])
            except SystemExit:  # ambiguous: vLLM refuses it itself
                continue
            if (ns.host, ns.port) != ("127.0.0.1", 8001):
                taken.append(flag[:end])
    assert "--hos" in taken and "--por" in taken
    for word in taken:
        with pytest.raises(ValueError, match="127.0.0.1 only"):
            tiny_server_config("stock", extra_args=(f"{word}=8003",))
