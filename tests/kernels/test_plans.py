"""Launch planning and the plan cache, pure Python on CPU tensors (kernels.plans, kernels.rmsnorm)."""

from __future__ import annotations

import pytest
import torch

from kernels import plans, rmsnorm
from kernels.checks import UnsupportedInput
from kernels.plans import BuildKey, PlanCache, build_key, launch_shape, plan_spec
from kernels.shapes import LaunchShape

BF16 = torch.bfloat16


def _spec(op: str, x: torch.Tensor, other: torch.Tensor | None = None, variant: str | None = None,
          pdl_ok: bool = True) -> plans.LaunchSpec:
    w = torch.ones(x.shape[-1], dtype=x.dtype)
    res, out = (other, None) if op == "fused_add_rms_norm" else (None, other)
    return plan_spec(op, x, w, res, out, variant, 132, pdl_ok)


def test_contiguous_rows_plan_one_stride() -> None:
    x = torch.zeros(64, 4096, dtype=BF16)
    s = _spec("rms_norm", x, torch.empty_like(x))
    assert s.key == BuildKey("bf16", False, 8, 512, 1, 1)
    assert (s.grid, s.block, s.rows, s.inner, s.hidden) == (64, 512, 64, 1, 4096)
    assert s.strides == (4096, 4096, 4096, 4096, 0, 0)


def test_head_view_plans_two_strides_and_the_residual_its_own() -> None:
    qkv = torch.zeros(7, 48 * 128, dtype=BF16)
    q = qkv[:, :32 * 128].view(7, 32, 128)
    s = _spec("fused_add_rms_norm", q, torch.zeros(7, 32, 128, dtype=BF16))
    assert (s.rows, s.inner) == (7 * 32, 32)
    assert s.strides == (0, 0, 48 * 128, 128, 32 * 128, 128)  # out unused; x: token stride, head stride


def test_pdl_variant_builds_pdl_only_where_it_can_launch() -> None:
    x = torch.zeros(8, 4096, dtype=BF16)
    assert _spec("rms_norm", x, torch.empty_like(x), "t512r1p").key.pdl is True
    assert _spec("rms_norm", x, torch.empty_like(x), "t512r1p", pdl_ok=False).key.pdl is False
    assert _spec("rms_norm", x, torch.empty_like(x), "t512r1").key.pdl is False


def test_misaligned_pointer_or_odd_stride_narrows_the_vector() -> None:
    buf = torch.zeros(9 * 4096 + 1, dtype=BF16)
    x = buf[1:].view(9, 4096)  # 2 bytes off 16-byte alignment
    assert _spec("rms_norm", x, torch.empty(9, 4096, dtype=BF16)).key.vec == 1
    y = torch.zeros(5, 4100, dtype=BF16)[:, :4096]
    assert _spec("rms_norm", y, torch.empty(5, 4096, dtype=BF16)).key.vec == 4


def test_unrunnable_shape_names_the_limit() -> None:
    with pytest.raises(UnsupportedInput, match="needs 128 row values per thread"):
        launch_shape(1, 4096, 8, "t32r4", 132)
    with pytest.raises(ValueError, match="expected 't<threads per row>r<rows per block>"):
        launch_shape(1, 4096, 8, "fast", 132)


def test_build_key_of_warm_and_of_a_call_agree() -> None:
    x = torch.zeros(300, 2048, dtype=BF16)
    shape = launch_shape(300, 2048, 8, None, 132)
    want = _spec("rms_norm", x, torch.empty_like(x)).key
    assert build_key("rms_norm", "bf16", 2048, 8, shape, True) == want
    assert build_key("rms_norm", "bf16", 2048, 8, LaunchShape(64, 2, True), False).pdl is False


def test_staged_variant_plans_a_persistent_grid_and_its_shared_memory() -> None:
    x = torch.zeros(8192, 4096, dtype=BF16)
    s = _spec("fused_add_rms_norm", x, torch.zeros_like(x), "t64r2s")
    assert s.key == BuildKey("bf16", True, 8, 64, 2, 8, staged=True)
    assert "-DSTAGED=1" in s.key.options() and "-DSTAGED=0" in BuildKey("bf16", True, 8, 64, 2, 8).options()
    assert (s.smem, s.block, s.grid) == (64 * 1024, 128, 3 * 132)  # 4096 row groups, 3 CTAs per SM
    small = _spec("rms_norm", x[:9], torch.empty(9, 4096, dtype=BF16), "t64r2s")
    assert (small.smem, small.grid) == (32 * 1024, 5)
    assert _spec("rms_norm", x[:9], torch.empty(9, 4096, dtype=BF16), "t64r2").smem == 0


def test_staged_variant_refuses_rows_over_the_shared_memory_limit() -> None:
    x = torch.zeros(4, 65536, dtype=torch.float32)
    with pytest.raises(UnsupportedInput, match=r"t1024r1s stages 1048576 bytes .* over the 232448"):
        _spec("fused_add_rms_norm", x, torch.zeros_like(x), "t1024r1s")


def test_cache_keeps_plans_until_full_then_starts_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plans, "MAX_PLANS", 2)
    cache = PlanCache()
    assert cache.get(("a",)) is None
    assert cache.put(("a",), "plan a") == "plan a" and cache.get(("a",)) == "plan a"
    cache.put(("b",), "plan b")
    assert len(cache) == 2 and cache.builds == 2
    cache.put(("c",), "plan c")  # full: starts afresh with c
    assert ("a",) not in cache and cache.get(("c",)) == "plan c" and cache.resets == 1


def test_unsupported_inputs_raise_and_cache_nothing() -> None:
    before = len(rmsnorm.PLANS)
    with pytest.raises(UnsupportedInput, match="x is on cpu, not a CUDA device"):
        rmsnorm.rms_norm(torch.zeros(4, 64, dtype=BF16), torch.ones(64, dtype=BF16), 1e-6)
    with pytest.raises(UnsupportedInput, match="x is a str"):
        rmsnorm.fused_add_rms_norm("x", torch.zeros(4, 64), torch.ones(64), 1e-6)  # type: ignore[arg-type]
    assert len(rmsnorm.PLANS) == before
