"""Every unsupported input gets a reason naming what is wrong (checked on CPU tensors)."""

from __future__ import annotations

import pytest
import torch

from kernels.checks import RowLayout, common_layouts, row_layout, unsupported_reason


def _reason(x, w, **kw):  # noqa: ANN001, ANN202
    return unsupported_reason(x, w, device_type="cpu", **kw)


def test_supported_inputs_have_no_reason() -> None:
    x = torch.zeros(4, 8, dtype=torch.bfloat16)
    w = torch.ones(8, dtype=torch.bfloat16)
    assert _reason(x, w) is None
    assert _reason(x, w, residual=torch.zeros_like(x)) is None
    assert _reason(torch.zeros(4, 16, dtype=torch.bfloat16)[:, :8], w) is None  # strided rows are fine


@pytest.mark.parametrize("x,w,kw,expect", [
    (torch.zeros(2, 8, dtype=torch.float64), torch.ones(8, dtype=torch.float64), {},
     "dtype torch.float64 is not supported"),
    (torch.zeros(2, 8), torch.ones(8, dtype=torch.float16), {},
     "weight dtype torch.float16 differs from x dtype torch.float32"),
    (torch.zeros(8, 2).t(), torch.ones(8), {}, "rows are not contiguous"),
    (torch.zeros(2, 8), torch.ones(7), {}, "weight shape (7,) does not match hidden size 8"),
    (torch.zeros(2, 8), torch.ones(16)[::2], {}, "weight is not contiguous"),
    (torch.zeros(2, 8), torch.ones(8), {"residual": torch.zeros(3, 8)}, "residual shape (3, 8) differs"),
    (torch.zeros(2, 8), torch.ones(8), {"residual": torch.zeros(2, 8, dtype=torch.float16)},
     "residual dtype"),
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


def test_row_layout_of_one_and_two_strides() -> None:
    assert row_layout(torch.zeros(3, 5, 8)) == RowLayout(1, 8, 8)
    assert row_layout(torch.zeros(4, 24)[:, :8]) == RowLayout(1, 24, 24)
    assert row_layout(torch.zeros(1, 8)) == RowLayout(1, 8, 8)
    assert row_layout(torch.zeros(3, 6, 8)[:, :5, :]) == RowLayout(5, 48, 8)  # 5 rows, then a gap
    assert row_layout(torch.zeros(2, 3, 6, 8)[:, :, :5, :]) == RowLayout(5, 48, 8)  # outer dims merge
    assert row_layout(torch.zeros(2, 4, 6, 8)[:, :3, :5, :]) is None  # three strides
    assert row_layout(torch.zeros(8, 2).t()) is None  # columns are not rows


def test_qwen3_head_views_take_two_strides() -> None:
    qkv = torch.zeros(7, (32 + 16) * 128, dtype=torch.bfloat16)
    q = qkv[:, :32 * 128].view(7, 32, 128)
    k = qkv[:, 32 * 128:40 * 128].view(7, 8, 128)
    w = torch.ones(128, dtype=torch.bfloat16)
    assert row_layout(q) == RowLayout(32, 48 * 128, 128) and row_layout(k) == RowLayout(8, 48 * 128, 128)
    assert _reason(q, w) is None and _reason(k, w) is None
    assert _reason(q, w, out=torch.empty(q.shape, dtype=q.dtype)) is None  # out: one stride, same split


def test_common_layouts_split_every_tensor_alike() -> None:
    x = torch.zeros(4, 6, 8)[:, :3, :]  # groups of 3 rows
    out = torch.zeros(4, 3, 8)
    assert common_layouts([x, out]) == [RowLayout(3, 48, 8), RowLayout(3, 24, 8)]
    x4 = torch.zeros(6, 5, 8)[:, :4, :].view(2, 3, 4, 8)  # groups of 4 rows (12 tokens of 4 heads)
    r4 = torch.zeros(2, 13, 4, 8)[:, :3]  # groups of 12 rows, same shape
    assert row_layout(x4) == RowLayout(4, 40, 8) and row_layout(r4) == RowLayout(12, 416, 8)
    assert common_layouts([x4, r4]) is None
    assert "split the rows differently" in _reason(x4, torch.ones(8), residual=r4)
