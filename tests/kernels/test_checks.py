"""Every unsupported input gets a reason naming what is wrong (checked on CPU tensors)."""

from __future__ import annotations

import pytest
import torch

from kernels.checks import row_stride, unsupported_reason


def _reason(x, w, **kw):  # noqa: ANN001, ANN202
    return unsupported_reason(x, w, device_type="cpu", **kw)


def test_supported_inputs_have_no_reason() -> None:
    x = torch.zeros(4, 8, dtype=torch.bfloat16)
    w = torch.ones(8, dtype=torch.bfloat16)
    assert _reason(x, w) is None
    assert _reason(x, w, residual=torch.zeros_like(x)) is None
    assert _reason(torch.zeros(4, 16, dtype=torch.bfloat16)[:, :8], w) is None  # strided rows are fine


@pytest.mark.parametrize("x,w,kw,expect", [
    (torch.zeros(2, 8, dtype=torch.float64), torch.ones(8, dtype=torch.float64), {}, "dtype torch.float64 is not supported"),
    (torch.zeros(2, 8), torch.ones(8, dtype=torch.float16), {}, "weight dtype torch.float16 differs from x dtype torch.float32"),
    (torch.zeros(8, 2).t(), torch.ones(8), {}, "rows are not contiguous"),
    (torch.zeros(2, 8), torch.ones(7), {}, "weight shape (7,) does not match hidden size 8"),
    (torch.zeros(2, 8), torch.ones(16)[::2], {}, "weight is not contiguous"),
    (torch.zeros(2, 8), torch.ones(8), {"residual": torch.zeros(3, 8)}, "residual shape (3, 8) differs"),
    (torch.zeros(2, 8), torch.ones(8), {"residual": torch.zeros(2, 8, dtype=torch.float16)}, "residual dtype"),
    (torch.zeros(1, 70000), torch.ones(70000), {}, "hidden size 70000 exceeds 65536"),
    ("x", torch.ones(8), {}, "x is a str, not a torch.Tensor"),
])
def test_unsupported_reasons(x, w, kw, expect) -> None:  # noqa: ANN001
    assert expect in _reason(x, w, **kw)


def test_cpu_tensor_is_not_cuda() -> None:
    assert "x is on cpu, not a CUDA device" in unsupported_reason(torch.zeros(2, 8), torch.ones(8))


def test_out_must_not_be_x() -> None:
    x = torch.zeros(2, 8)
    assert "out is x" in _reason(x, torch.ones(8), out=x)


def test_row_stride_of_uniform_and_uneven_stacks() -> None:
    assert row_stride(torch.zeros(3, 5, 8)) == 8
    assert row_stride(torch.zeros(4, 24)[:, :8]) == 24
    assert row_stride(torch.zeros(1, 8)) == 8
    assert row_stride(torch.zeros(3, 6, 8)[:, :5, :]) is None  # rows 0..4 then a gap
