"""integration.ops: the torch.library.Library ops (schemas, fake implementations) and the plan hook."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from integration import ops
from kernels import rmsnorm


def test_schemas_mark_the_in_place_tensors_mutated() -> None:
    fused = torch.ops.rmsnorm_fused.fused_add_rms_norm.default._schema
    written = [a.alias_info is not None and a.alias_info.is_write for a in fused.arguments]
    assert written == [True, True, False, False]
    plain = torch.ops.rmsnorm_fused.rms_norm.default._schema
    assert not any(a.alias_info for a in plain.arguments) and len(plain.returns) == 1


def test_fake_implementations_give_the_output_metadata() -> None:
    with FakeTensorMode():
        x = torch.empty(7, 8, 128, dtype=torch.bfloat16)
        w = torch.empty(128, dtype=torch.bfloat16)
        out = torch.ops.rmsnorm_fused.rms_norm(x, w, 1e-6)
        assert out.shape == x.shape and out.dtype == x.dtype
        assert torch.ops.rmsnorm_fused.fused_add_rms_norm(x, torch.empty_like(x), w, 1e-6) is None


def test_new_launch_plans_warm_through_the_ops_hook() -> None:
    assert ops._on_new_plan in rmsnorm.PLAN_HOOKS


def test_the_per_call_path_reuses_the_kernels_module_and_each_answers_variant() -> None:
    from integration import choice

    assert ops._kernels() is rmsnorm and ops._kernels() is ops._KERNELS[0]  # imported once
    for answer in ("fused:auto", "fused:", "fused:t512r1p", "fused:t128r4"):
        assert ops._variant(answer) == choice.variant_of(answer)
        assert answer in ops._VARIANTS  # split once, then looked up
    ops._VARIANTS["fused:t128r4"] = "cached"  # a cached answer is not split again
    try:
        assert ops._variant("fused:t128r4") == "cached"
    finally:
        del ops._VARIANTS["fused:t128r4"]
