"""Text prompts whose token count under a model's own tokenizer is exactly the trace's.

For a server that loads a real model with its tokenizer, prompts are text. Each request's seeded
token ids (loadgen.prompts, so every arm sees the same prompts and Mooncake `hash_ids` prefixes
stay shared) pick words from the tokenizer's *safe words*: vocabulary entries that decode to a
space and letters and encode back to exactly that one token. Byte-level and whitespace
pre-tokenizers split text at those spaces, so a string of safe words encodes to one token per word;
the special tokens the tokenizer adds (a BOS) are counted in. Every prompt is checked by encoding it
when it is made (before the schedule starts), and the server's `usage.prompt_tokens` is recorded
beside the asked count.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from loadgen.prompts import prompt_token_ids
from traces.trace import TraceRequest

_WORD = re.compile(r"^ [A-Za-z]+$")
MIN_SAFE_WORDS = 64  # fewer distinct words would make prompts too repetitive to mean anything


class TextPrompts:
    """Exact-length text prompts for one tokenizer (a model directory or a tokenizer name)."""

    def __init__(self, tokenizer_dir: str | Path) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        vocab = self.tokenizer.get_vocab()
        words = []
        for token_id in sorted(vocab.values()):
            text = self.tokenizer.decode([token_id])
            if _WORD.match(text) and self.tokenizer.encode(text, add_special_tokens=False) == [token_id]:
                words.append(text)
        if len(words) < MIN_SAFE_WORDS:
            raise ValueError(f"tokenizer {tokenizer_dir}: only {len(words)} single-token words "
                             f"(need {MIN_SAFE_WORDS}) to build exact-length text prompts")
        self.words = words
        self.special_tokens = len(self.tokenizer("").input_ids)  # what it adds to every prompt (a BOS)

    def count(self, text: str) -> int:
        """Tokens the server will see for `text` (special tokens included)."""
        return len(self.tokenizer(text).input_ids)

    def text(self, index: int, req: TraceRequest, seed: int = 0) -> str:
        """The prompt of request `index`: `req.input_tokens` tokens in this tokenizer, exactly.

        ValueError when the prompt cannot be that short (fewer tokens than the tokenizer adds) or
        when its encoding differs from the count asked (a tokenizer this scheme does not fit)."""
        n_words = req.input_tokens - self.special_tokens
        if n_words < 0:
            raise ValueError(f"request {index}: {req.input_tokens} prompt tokens is fewer than the "
                             f"{self.special_tokens} special tokens the tokenizer adds")
        ids = prompt_token_ids(index, dataclasses.replace(req, input_tokens=n_words), seed=seed,
                               vocab_size=len(self.words)) if n_words else []
        text = "".join(self.words[i] for i in ids)
        got = self.count(text)
        if got != req.input_tokens:
            raise ValueError(f"request {index}: the text prompt encodes to {got} tokens, not "
                             f"{req.input_tokens}; this tokenizer does not split at spaces")
        return text
