"""The float64 reference against hand-computed numbers, both rounding conventions."""

from __future__ import annotations

import math

import pytest
import torch

from kernels.reference import fused_add_rms_norm_ref, rms_norm_ref


def test_rms_norm_fp32_literal() -> None:
    # mean(3^2, 4^2) = 12.5; 1/sqrt(12.5) = 0.28284271...
    out = rms_norm_ref(torch.tensor([[3.0, 4.0]]), torch.tensor([1.0, 2.0]), 0.0)
    assert out.dtype == torch.float64
    assert out[0, 0].item() == pytest.approx(3 / math.sqrt(12.5), rel=1e-6)
    assert out[0, 1].item() == pytest.approx(8 / math.sqrt(12.5), rel=1e-6)


def test_bf16_weight_rounding_conventions_differ_by_one_rounding() -> None:
    x = torch.tensor([[3.0, 4.0]], dtype=torch.bfloat16)
    w = torch.tensor([1.0, 1.5], dtype=torch.bfloat16)
    vllm = rms_norm_ref(x, w, 0.0, "vllm")
    fp32 = rms_norm_ref(x, w, 0.0, "fp32")
    # 3/sqrt(12.5) = 0.848528...; bf16 keeps 8 significant bits: 217/256 = 0.84765625
    assert vllm[0, 0].item() == 0.84765625
    assert fp32[0, 0].item() == pytest.approx(0.8485281374, rel=1e-9)
    # 4/sqrt(12.5) = 1.131370... -> bf16 1.1328125 (145/128), times 1.5 = 1.69921875
    assert vllm[0, 1].item() == 1.69921875
    assert fp32[0, 1].item() == pytest.approx(1.5 * 1.1313708499, rel=1e-9)


def test_eps_enters_under_the_root() -> None:
    out = rms_norm_ref(torch.zeros(1, 4), torch.ones(4), 1e-6)
    assert torch.equal(out, torch.zeros(1, 4, dtype=torch.float64))
    tiny = rms_norm_ref(torch.full((1, 2), 1e-20, dtype=torch.float64), torch.ones(2), 1e-6)
    assert tiny[0, 0].item() == pytest.approx(1e-20 / math.sqrt(1e-40 + 1e-6), rel=1e-12)


def test_fused_add_residual_rounding_conventions() -> None:
    # fp16: 2048 + 1 = 2049 is not representable (spacing 2 above 2048): stored residual rounds to 2048
    x = torch.tensor([[2048.0, 1.0]], dtype=torch.float16)
    r = torch.tensor([[1.0, 0.0]], dtype=torch.float16)
    w = torch.ones(2, dtype=torch.float16)
    out_stored, stored = fused_add_rms_norm_ref(x, r, w, 0.0, "fp32", "stored")
    out_exact, stored2 = fused_add_rms_norm_ref(x, r, w, 0.0, "fp32", "exact")
    assert stored.dtype == torch.float16 and stored.tolist() == [[2048.0, 1.0]] == stored2.tolist()
    rms_stored = math.sqrt((2048.0**2 + 1.0) / 2)
    rms_exact = math.sqrt((2049.0**2 + 1.0) / 2)
    assert out_stored[0, 0].item() == pytest.approx(2048.0 / rms_stored, rel=1e-12)
    assert out_exact[0, 0].item() == pytest.approx(2049.0 / rms_exact, rel=1e-12)


def test_unknown_convention_is_named() -> None:
    with pytest.raises(ValueError, match="weight_rounding 'fp64'"):
        rms_norm_ref(torch.ones(1, 2), torch.ones(2), 0.0, "fp64")
    with pytest.raises(ValueError, match="residual_rounding 'none'"):
        fused_add_rms_norm_ref(torch.ones(1, 2), torch.ones(1, 2), torch.ones(2), 0.0, "vllm", "none")
