"""loadgen.textprompts: text prompts of exactly the trace's token count under a real tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadgen.textprompts import TextPrompts
from tests.realmodel import train_tokenizer
from traces.trace import TraceRequest


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> TextPrompts:
    out = tmp_path_factory.mktemp("tokenizer")
    train_tokenizer(out)
    return TextPrompts(out)


@pytest.mark.parametrize("n", [1, 2, 7, 300, 4000])
def test_prompt_has_exactly_the_traces_token_count(prompts: TextPrompts, n: int) -> None:
    text = prompts.text(3, TraceRequest(0.0, n, 5), seed=1)
    assert prompts.count(text) == n
    assert prompts.special_tokens == 1  # the BOS the tokenizer adds


def test_prompts_are_seeded_and_shared_prefixes_stay_shared(prompts: TextPrompts) -> None:
    a = TraceRequest(0.0, 1200, 5, hash_ids=(7, 8, 9))
    b = TraceRequest(1.0, 1100, 5, hash_ids=(7, 8, 10))
    assert prompts.text(0, a, seed=2) == prompts.text(0, a, seed=2)
    assert prompts.text(0, a, seed=2) != prompts.text(0, a, seed=3)
    ta, tb = prompts.text(0, a, seed=2), prompts.text(1, b, seed=2)
    shared = prompts.tokenizer(ta).input_ids[:1025], prompts.tokenizer(tb).input_ids[:1025]
    assert shared[0] == shared[1]  # BOS + two 512-token blocks of the same hash ids


def test_a_tokenizer_without_enough_words_is_refused(tmp_path: Path) -> None:
    train_tokenizer(tmp_path, vocab=270)  # little beyond the byte alphabet
    with pytest.raises(ValueError, match="single-token words"):
        TextPrompts(tmp_path)
