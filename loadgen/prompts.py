"""Deterministic prompts as token ids (the server runs with --skip-tokenizer-init), the default
prompt source of a replay (`PromptSource`; text prompts: loadgen.textprompts).

Request ``i`` of a replay gets ids from ``np.random.default_rng((seed, i))``, so every arm and
every repeat sees identical prompts. When a request carries Mooncake ``hash_ids``, block ``k`` of
the prompt (tokens ``k*512`` to ``k*512+511``) is drawn from a generator keyed by the hash id
instead, so requests that share a prefix in the trace share those tokens for real and the server's
prefix cache can hit as it did in production.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from traces.trace import MAX_TOKENS, TraceRequest

# (request index, request, seed) -> the prompt: token ids, or text for a server with a tokenizer
# (loadgen.textprompts.TextPrompts.text); one per replay, the same for every arm
PromptSource = Callable[[int, TraceRequest, int], "list[int] | str"]

# The stated ceiling on a vocabulary size: vLLM keeps token ids as int32 (its model runner's
# input_ids buffer), so every id drawn below it must fit one.
MAX_VOCAB_SIZE = 2**31
BLOCK_TOKENS = 512  # Mooncake's block size: one hash id per 512 prompt tokens
_BLOCK_STREAM = 1  # keeps block generators apart from per-request ones: (seed, 1, hash_id)


def _ids(rng: np.random.Generator, n: int, vocab_size: int) -> np.ndarray:
    return rng.integers(0, vocab_size, size=n, dtype=np.int64)


def check_vocab_size(vocab_size: int) -> int:
    """`vocab_size` when it is an int from 1 to MAX_VOCAB_SIZE; ValueError saying so otherwise."""
    if type(vocab_size) is not int or not 1 <= vocab_size <= MAX_VOCAB_SIZE:  # bool is no vocabulary size
        raise ValueError(f"vocab_size must be an integer from 1 to {MAX_VOCAB_SIZE:,} (vLLM keeps token ids "
                         f"as int32), got {vocab_size!r}")
    return vocab_size


def request_problem(req: TraceRequest) -> str | None:
    """Why a request's body cannot be built (token counts not from 1 to traces.trace.MAX_TOKENS, hash
    ids not ints >= 0), or None."""
    for key in ("input_tokens", "output_tokens"):
        v = getattr(req, key)
        if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= MAX_TOKENS:
            return f"{key} must be an int from 1 to {MAX_TOKENS:,}, got {v!r}"
    bad = [h for h in req.hash_ids or () if not isinstance(h, int) or isinstance(h, bool) or h < 0]
    if bad:
        return f"hash_ids must be ints >= 0, got {bad[0]!r}"
    return None


def prompt_token_ids(index: int, req: TraceRequest, *, seed: int = 0, vocab_size: int = 32000) -> list[int]:
    """The ``req.input_tokens`` prompt ids of request ``index`` (seeded; shared blocks by hash id)."""
    check_vocab_size(vocab_size)
    if index < 0 or seed < 0:
        raise ValueError(f"index and seed must be >= 0, got index={index} seed={seed}")
    n = req.input_tokens
    parts: list[np.ndarray] = []
    for hash_id in (req.hash_ids or ())[: -(-n // BLOCK_TOKENS)]:
        if hash_id < 0:
            raise ValueError(f"request {index}: hash_ids must be >= 0, got {hash_id}")
        parts.append(_ids(np.random.default_rng((seed, _BLOCK_STREAM, hash_id)), BLOCK_TOKENS, vocab_size))
    have = len(parts) * BLOCK_TOKENS
    if have < n:  # no hash ids, or fewer blocks than the prompt needs: the rest is the request's own
        parts.append(_ids(np.random.default_rng((seed, index)), n - have, vocab_size))
    return np.concatenate(parts)[:n].tolist()


def token_id_prompts(vocab_size: int = 32000) -> PromptSource:
    """The default prompt source: prompt_token_ids with ids below `vocab_size`."""
    check_vocab_size(vocab_size)
    return lambda index, req, seed: prompt_token_ids(index, req, seed=seed, vocab_size=vocab_size)
