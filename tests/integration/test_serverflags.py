"""What a server's arguments set, read as vLLM's own parser reads them: where it listens is the kit's
alone, whatever an arm or --server-arg spells."""

from __future__ import annotations

import argparse

import pytest

from integration import arms, serverflags
from integration.launcher import RUN_FLAGS, server_command
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


def test_every_spelling_vllm_takes_for_a_shared_flag_counts_as_that_flag(
        vllm_parser: argparse.ArgumentParser) -> None:
    assert vllm_parser.parse_args(KIT_FLAGS + ["--max-model=4096"]).max_model_len == 4096
    assert vllm_parser.parse_args(KIT_FLAGS + ["-tp", "2"]).tensor_parallel_size == 2
    owned = {**{f: arms.SHARED_FLAGS for f in arms.SHARED_FLAGS}, **{f: RUN_FLAGS for f in RUN_FLAGS}}
    for action in vllm_parser._actions:
        names = [s for s in action.option_strings if s in owned]
        for spelling in action.option_strings:  # an alias of a listed flag is that flag
            assert not names or serverflags.setting([spelling], owned[names[0]]) == [spelling], spelling
            for end in range(3, len(spelling)):
                if names and spelling.startswith("--"):
                    assert serverflags.setting([spelling[:end] + "=1"], owned[names[0]]), spelling[:end]
        if not names:  # a flag of its own is never taken for a listed one
            assert not any(arms.is_shared_flag(s) for s in action.option_strings), action.option_strings


def test_the_run_flags_are_every_flag_a_server_command_sets() -> None:
    cfg = tiny_server_config("patched", gpu_memory_utilization=0.5, kv_cache_memory_bytes=1 << 30,
                             max_num_seqs=4, eager=True)
    set_here = {serverflags.flag_name(w) for w in server_command(cfg)[3:] if serverflags.flag_name(w)}
    assert set_here <= set(RUN_FLAGS) and {"--max-model-len", "--ir-op-priority"} <= set_here
