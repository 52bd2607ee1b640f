"""Input checks shared by the kernel wrapper and the policy: what the fused kernel cannot take.

Imports torch only; no CUDA or CuPy needed, so the policy can decline inputs on any machine.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.shapes import MAX_HIDDEN

DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


class UnsupportedInput(ValueError):
    """The fused kernel cannot take these tensors; the message says which and why."""


@dataclass(frozen=True)
class RowLayout:
    """Where row r of a [..., width] tensor starts: (r // inner) * outer_stride + (r % inner) * inner_stride
    elements in. One stride between rows is inner = 1; a [tokens, heads, width] view of a wider buffer
    (vLLM's q/k head norms) is inner = heads, outer_stride = the token stride, inner_stride = width."""

    inner: int
    outer_stride: int
    inner_stride: int


def row_groups(t: torch.Tensor) -> list[tuple[int, int]] | None:
    """The leading dims of `t` (size-1 dims dropped) merged where one stride steps over them:
    [(count, stride)], outermost first; None when the last dim is not contiguous."""
    if t.dim() == 0 or (t.shape[-1] > 1 and t.stride(-1) != 1):
        return None
    groups: list[tuple[int, int]] = []
    for n, s in reversed([(n, s) for n, s in zip(t.shape[:-1], t.stride()[:-1]) if n != 1]):
        if groups and s == groups[-1][1] * groups[-1][0]:
            groups[-1] = (groups[-1][0] * n, groups[-1][1])
        else:
            groups.append((n, s))
    return groups[::-1]


def row_layout(t: torch.Tensor, inner: int | None = None) -> RowLayout | None:
    """The RowLayout of `t` (with `inner` rows per outer step where given), None where its rows need more
    than two strides, its last dim is not contiguous, or its grouping cannot have that `inner`."""
    groups = row_groups(t)
    if groups is None or len(groups) > 2:
        return None
    if len(groups) == 2:
        (_, s0), (n1, s1) = groups
        return RowLayout(n1, s0, s1) if inner in (None, n1) else None
    step = groups[0][1] if groups else t.shape[-1]
    k = inner or 1
    return RowLayout(k, k * step, step)


def common_layouts(tensors: list[torch.Tensor]) -> list[RowLayout] | None:
    """One RowLayout per tensor (same shape), all with the same rows per outer step; None if none exists."""
    inners = {len(g) == 2 and g[-1][0] for g in map(row_groups, tensors) if g is not None} - {False}
    if len(inners) > 1:
        return None
    inner = inners.pop() if inners else 1
    out = [row_layout(t, inner) for t in tensors]
    return None if any(lay is None for lay in out) else out  # type: ignore[return-value]


def _tensor_reason(name: str, t: object, ref: torch.Tensor | None, device_type: str) -> str | None:
    if not isinstance(t, torch.Tensor):
        return f"{name} is a {type(t).__name__}, not a torch.Tensor"
    if t.device.type != device_type:
        return f"{name} is on {t.device}, not a CUDA device"
    if t.dtype not in DTYPE_NAMES:
        return f"{name} dtype {t.dtype} is not supported (bfloat16, float16, float32)"
    if ref is not None:
        if t.dtype != ref.dtype:
            return f"{name} dtype {t.dtype} differs from x dtype {ref.dtype}"
        if t.device != ref.device:
            return f"{name} is on {t.device} but x is on {ref.device}"
    return None


def _rows_reason(name: str, t: torch.Tensor) -> str | None:
    if t.dim() == 0:
        return f"{name} is a 0-d tensor; expected [..., hidden]"
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        return f"{name} rows are not contiguous (stride of the last dim is {t.stride(-1)}, must be 1)"
    if row_layout(t) is None:
        return (f"{name} rows are not evenly spaced in at most two strides (shape {tuple(t.shape)}, "
                f"strides {t.stride()})")
    return None


def unsupported_reason(
    x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None, device_type: str = "cuda",
) -> str | None:
    """None when the fused kernel takes these tensors; otherwise the reason it cannot.

    device_type is "cuda" for real use; tests pass "cpu" to reach the checks after the device one.
    """
    reason = _tensor_reason("x", x, None, device_type)
    if reason is None:
        reason = _rows_reason("x", x)
    if reason is not None:
        return reason
    hidden = x.shape[-1]
    if hidden > MAX_HIDDEN:
        return f"hidden size {hidden} exceeds {MAX_HIDDEN}, the widest row the fused kernel handles"
    if x.numel() // max(hidden, 1) >= 2**31:
        return f"{x.numel() // hidden} rows exceed the kernel's int32 row index"
    reason = _tensor_reason("weight", weight, x, device_type)
    if reason is not None:
        return reason
    if weight.dim() != 1 or weight.shape[0] != hidden:
        return f"weight shape {tuple(weight.shape)} does not match hidden size {hidden}"
    if hidden > 1 and weight.stride(0) != 1:
        return f"weight is not contiguous (stride {weight.stride(0)})"
    for name, t in (("residual", residual), ("out", out)):
        if t is None:
            continue
        reason = _tensor_reason(name, t, x, device_type) or _rows_reason(name, t)
        if reason is not None:
            return reason
        if tuple(t.shape) != tuple(x.shape):
            return f"{name} shape {tuple(t.shape)} differs from x shape {tuple(x.shape)}"
    given = [t for t in (residual, out) if t is not None]
    if given and common_layouts([x, *given]) is None:
        return (f"x strides {x.stride()} and {'residual' if residual is not None else 'out'} strides "
                f"{given[0].stride()} split the rows differently (shape {tuple(x.shape)})")
    if out is not None and out.numel() and out.data_ptr() == x.data_ptr():
        return "out is x: rms_norm writes a separate output (use fused_add_rms_norm for in place)"
    return None
