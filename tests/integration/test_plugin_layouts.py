"""The plugin takes exactly the layouts the kernel takes: Qwen3's strided [tokens, heads, head_dim] views of
the qkv output, concrete and with symbolic tokens, and declines (logged once) what the kernel cannot run."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import torch

from integration import choice, names, plugin
from kernels.checks import unsupported_reason

pytest.importorskip("vllm.ir")
HEAD_DIMS = (64, 128, 256)


@pytest.fixture
def all_fused(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A policy that sends every bf16 call of widths 64/128/256 and 4096 to the fused kernel."""
    from kernels.policy import Policy

    table = {f"{op}/bf16/{w}": [[1 << 30, "fused:auto"]] for op in names.IR_OPS for w in HEAD_DIMS + (4096,)}
    pol = Policy(table, source="test: all fused")
    monkeypatch.setattr(choice, "policy", lambda mode="compiled": pol)
    for f in (choice.choose, choice.fused_over, plugin._fused_rows):
        f.cache_clear()
    yield
    for f in (choice.choose, choice.fused_over, plugin._fused_rows):
        f.cache_clear()


@pytest.fixture
def declines() -> Iterator[list[str]]:
    """The plugin's 'declined, the kernel cannot take it' log lines of this test."""
    lines: list[str] = []

    class Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "cannot take it" in record.getMessage():
                lines.append(record.getMessage())

    h, level = Handler(), plugin.logger.level
    plugin.logger.addHandler(h)
    plugin.logger.setLevel(logging.INFO)
    plugin._logged.clear()
    yield lines
    plugin.logger.removeHandler(h)
    plugin.logger.setLevel(level)


def _kernel_takes(tokens: int, heads: int, head_dim: int, token_stride: int, offset: int) -> bool:
    """What the kernel's own checks say about the same view of a real (CPU) buffer."""
    buf = torch.empty(tokens, token_stride, dtype=torch.bfloat16)
    view = buf.narrow(1, offset, heads * head_dim).view(tokens, heads, head_dim)
    return unsupported_reason(view, torch.empty(head_dim, dtype=torch.bfloat16), device_type="cpu") is None


def _strides(heads: int, head_dim: int) -> list[tuple[int, int]]:
    """(token stride, offset) of a `heads`-head view: contiguous; as q of a qkv output with 8 kv heads; as
    k of a qkv output with 32 q heads and `heads` kv heads; padded by 8 elements."""
    n = heads * head_dim
    return [(n, 0), (n + 2 * 8 * head_dim, 0), (32 * head_dim + 2 * n, 32 * head_dim), (n + 8, 0)]


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("heads", (1, 8, 64))
@pytest.mark.parametrize("tokens", (1, 7))
def test_concrete_head_views_follow_the_kernel(all_fused, fake_cuda, fake_heads, warm_calls, declines,
                                               head_dim: int, heads: int, tokens: int) -> None:
    w = fake_cuda((head_dim,))
    for token_stride, offset in _strides(heads, head_dim):
        x = fake_heads(tokens, heads, head_dim, token_stride, offset)
        want = _kernel_takes(tokens, heads, head_dim, token_stride, offset)
        assert plugin.rms_norm_supports(x, w, 1e-6) is want, (tokens, heads, head_dim, token_stride, offset)
        assert want  # one or two strides between rows: the kernel takes every one of these views


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("heads", (1, 8, 64))
def test_symbolic_tokens_follow_the_kernel_over_the_compile_range(all_fused, fake_cuda, fake_heads,
                                                                  warm_calls, head_dim: int,
                                                                  heads: int) -> None:
    from vllm.compilation.passes.inductor_pass import pass_context
    from vllm.config.utils import Range

    w = fake_cuda((head_dim,))
    for token_stride, offset in _strides(heads, head_dim):
        x = fake_heads(16, heads, head_dim, token_stride, offset, dynamic=True)
        assert not isinstance(x.shape[0], int) and x.stride(0) == token_stride
        for lo, hi in ((1, 1), (1, 64), (2, 64)):
            want = all(_kernel_takes(t, heads, head_dim, token_stride, offset) for t in range(lo, hi + 1))
            with pass_context(Range(start=lo, end=hi)):
                assert plugin.row_range(x) == (lo * heads, hi * heads, heads if hi > lo else 1)
                got = plugin.rms_norm_supports(x, w, 1e-6)
            assert got is want, (heads, head_dim, token_stride, offset, lo, hi)


def test_range_scan_steps_by_heads(fake_cuda, fake_heads, warm_calls, monkeypatch) -> None:
    """A [tokens, 8, 64] view over 1-8 tokens has 8, 16, ..., 64 rows: the policy is asked at those only."""
    from vllm.compilation.passes.inductor_pass import pass_context
    from vllm.config.utils import Range

    from kernels.policy import Policy

    pol = Policy({"rms_norm/bf16/64": [[8, "fused:auto"], [15, "stock"], [64, "fused:auto"]]}, source="t")
    monkeypatch.setattr(choice, "policy", lambda mode="compiled": pol)
    for f in (choice.choose, choice.fused_over, plugin._fused_rows):
        f.cache_clear()
    x, w = fake_heads(4, 8, 64, 8 * 64, dynamic=True), fake_cuda((64,))
    with pass_context(Range(start=1, end=8)):
        assert plugin.rms_norm_supports(x, w, 1e-6)  # 8, 16, ..., 64 rows: never 9-15
    y = fake_cuda((4, 64), dynamic_rows=True)
    with pass_context(Range(start=8, end=64)):
        assert not plugin.rms_norm_supports(y, w, 1e-6)  # every row count 8-64: 9-15 are stock
    for f in (choice.choose, choice.fused_over, plugin._fused_rows):
        f.cache_clear()


def test_float32_weight_on_bf16_is_declined_and_said_once(all_fused, fake_cuda, fake_heads, warm_calls,
                                                          declines) -> None:
    w32 = fake_cuda((4096,), dtype=torch.float32)  # Gemma passes weight.float() + 1
    for rows in (1, 8, 64):
        assert not plugin.rms_norm_supports(fake_cuda((rows, 4096)), w32, 1e-6)
        x, r = fake_cuda((rows, 4096)), fake_cuda((rows, 4096))
        assert not plugin.fused_add_supports(x, r, w32, 1e-6)
    assert len(declines) == 2, declines  # once per op
    assert all("weight dtype torch.float32 on torch.bfloat16" in ln for ln in declines)
    assert {ln.split()[1] for ln in declines} == {"rms_norm", "fused_add_rms_norm"}


def test_other_declines_name_their_reason_once(all_fused, fake_cuda, fake_heads, warm_calls,
                                               declines) -> None:
    w = fake_cuda((4096,))
    assert not plugin.rms_norm_supports(fake_cuda((8, 4096)), None, 1e-6)
    assert not plugin.rms_norm_supports(fake_cuda((8, 4096)), w, 1e-6, 2048)
    assert not plugin.rms_norm_supports(fake_cuda((8, 4096), dtype=torch.float16), w, 1e-6)
    x = fake_heads(7, 8, 128, 8 * 128 + 2 * 8 * 128)  # two strides: the kernel takes them
    assert _kernel_takes(7, 8, 128, 8 * 128 + 2 * 8 * 128, 0)
    assert plugin.rms_norm_supports(x, fake_cuda((128,)), 1e-6)
    text = "\n".join(declines)
    assert "no weight" in text and "variance_size" in text and "torch.bfloat16 on torch.float16" in text
    assert sum("evenly spaced" in ln for ln in declines) <= 1  # one line for many shapes


def test_real_cpu_tensors_are_declined_by_the_kernel_checks(all_fused, declines) -> None:
    assert not plugin.rms_norm_supports(torch.randn(8, 4096).bfloat16(), torch.ones(4096).bfloat16(), 1e-6)
    assert any("not a CUDA device" in ln for ln in declines)
