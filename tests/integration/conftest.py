"""Fixtures of the plugin tests: a small real shape policy, fake CUDA tensors with symbolic rows."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from integration import choice

# rows <= 8: fused t256r1; 9..64: fused t128r1; >= 65: stock (kernels/policy.py bucket rule).
TABLE = {
    "rms_norm/bf16/4096": [[8, "fused:t256r1"], [64, "fused:t128r1"], [512, "stock"]],
    "fused_add_rms_norm/bf16/4096": [[8, "stock"], [64, "fused:t256r1"], [512, "stock"]],
}


def _clear() -> None:
    from integration import plugin

    choice.choose.cache_clear()
    choice.fused_over.cache_clear()
    plugin._fused_rows.cache_clear()


@pytest.fixture
def small_policy(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """kernels.policy.Policy over TABLE, installed as the policy integration/ consults."""
    from kernels.policy import Policy

    pol = Policy(TABLE, source="tests/integration/conftest.py")
    _clear()
    monkeypatch.setattr(choice, "policy", lambda mode="compiled": pol)
    yield pol
    _clear()


@pytest.fixture
def fake_cuda():
    """make(shape, dynamic_rows, dtype) -> a FakeTensor on cuda:0 (bf16 unless told); rows symbolic when
    asked. Works without a GPU: fake tensors carry metadata only. make.mode is their FakeTensorMode."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    mode = FakeTensorMode(shape_env=ShapeEnv())

    def make(shape: tuple[int, ...], dynamic_rows: bool = False,
             dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        real = torch.empty(shape, dtype=dtype)
        dims = [DimDynamic.DYNAMIC if (i == 0 and dynamic_rows) else DimDynamic.STATIC
                for i in range(len(shape))]
        fake = mode.from_tensor(real, symbolic_context=StatelessSymbolicContext(dynamic_sizes=dims))
        meta = torch.empty_strided(fake.shape, fake.stride(), dtype=fake.dtype, device="meta")
        return FakeTensor(mode, meta, torch.device("cuda", 0))

    make.mode = mode
    return make


@pytest.fixture
def fake_heads(fake_cuda):
    """make(tokens, heads, head_dim, token_stride, offset=0, dynamic=False) -> the [tokens, heads,
    head_dim] view of a [tokens, token_stride] buffer starting `offset` elements in, as Qwen3's q/k
    norms see the qkv output (FakeTensor on cuda:0, bf16; tokens symbolic when dynamic)."""

    def make(tokens: int, heads: int, head_dim: int, token_stride: int, offset: int = 0,
             dynamic: bool = False) -> torch.Tensor:
        base = fake_cuda((tokens, token_stride), dynamic_rows=dynamic)
        with fake_cuda.mode:
            return base.narrow(1, offset, heads * head_dim).view(base.shape[0], heads, head_dim)

    return make


@pytest.fixture
def warm_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """Records integration.ops.warm_builds calls instead of compiling (no CUDA here)."""
    from integration import ops

    calls: list[tuple] = []
    monkeypatch.setattr(ops, "warm_builds", lambda *a: calls.append(a) or 0)
    return calls
