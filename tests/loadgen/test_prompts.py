"""Prompts are deterministic per (seed, index) and share blocks where hash ids are shared."""

from __future__ import annotations

import pytest

from loadgen.prompts import BLOCK_TOKENS, prompt_token_ids
from traces.trace import TraceRequest


def test_same_seed_and_index_same_prompt():
    req = TraceRequest(0.0, 700, 5)
    a = prompt_token_ids(4, req, seed=7)
    assert len(a) == 700 and all(isinstance(t, int) for t in a)
    assert a == prompt_token_ids(4, req, seed=7)
    assert a != prompt_token_ids(5, req, seed=7)
    assert a != prompt_token_ids(4, req, seed=8)


def test_ids_stay_below_vocab_size():
    ids = prompt_token_ids(0, TraceRequest(0.0, 5000, 1), vocab_size=100)
    assert min(ids) >= 0 and max(ids) < 100
    assert len(set(ids)) == 100  # 5000 draws cover a 100-id vocabulary


def test_shared_hash_ids_share_prefix_blocks():
    a = prompt_token_ids(0, TraceRequest(0.0, 1200, 1, hash_ids=(10, 11, 12)), seed=1)
    b = prompt_token_ids(9, TraceRequest(1.0, 1100, 1, hash_ids=(10, 11, 99)), seed=1)
    assert a[: 2 * BLOCK_TOKENS] == b[: 2 * BLOCK_TOKENS]
    assert a[2 * BLOCK_TOKENS:1100] != b[2 * BLOCK_TOKENS:1100]
    # A shorter prompt on the same first block is a prefix of the longer one.
    c = prompt_token_ids(3, TraceRequest(2.0, 300, 1, hash_ids=(10,)), seed=1)
    assert c == a[:300]


def test_fewer_hash_ids_than_blocks_fills_from_request_generator():
    req = TraceRequest(0.0, 600, 1, hash_ids=(5,))
    ids = prompt_token_ids(2, req)
    assert len(ids) == 600
    assert ids[:BLOCK_TOKENS] == prompt_token_ids(0, TraceRequest(0.0, BLOCK_TOKENS, 1, hash_ids=(5,)))


@pytest.mark.parametrize("kw, msg", [({"vocab_size": 0}, "vocab_size"), ({"seed": -1}, "seed"),
                                     ({"vocab_size": 10**20}, "vocab_size must be an integer from 1 to")])
def test_bad_arguments_are_named(kw, msg):
    with pytest.raises(ValueError, match=msg):
        prompt_token_ids(0, TraceRequest(0.0, 3, 1), **kw)
