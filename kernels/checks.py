"""Input checks shared by the kernel wrapper and the policy: what the fused kernel cannot take.

Imports torch only; no CUDA or CuPy needed, so the policy can decline inputs on any machine.
"""

from __future__ import annotations

import torch

from kernels.shapes import MAX_HIDDEN

DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
# the same dtypes as model configs and vLLM's --dtype spell them
CONFIG_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "half": "fp16",
                 "float": "fp32", "fp32": "fp32", "fp16": "fp16", "bf16": "bf16"}


class UnsupportedInput(ValueError):
    """The fused kernel cannot take these tensors; the message says which and why."""


def row_stride(t: torch.Tensor) -> int | None:
    """Stride between consecutive rows when `t` is a uniform stack of rows, else None."""
    if t.dim() <= 1:
        return t.shape[-1] if t.dim() == 1 else None
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        return None
    dims = [(n, s) for n, s in zip(t.shape[:-1], t.stride()[:-1]) if n != 1]
    if not dims:
        return t.shape[-1]
    step = dims[-1][1]
    expect = step
    for n, s in reversed(dims):
        if s != expect:
            return None
        expect = s * n
    return step


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
    if row_stride(t) is None:
        return f"{name} rows are not evenly spaced (shape {tuple(t.shape)}, strides {t.stride()})"
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
    if out is not None and out.numel() and out.data_ptr() == x.data_ptr():
        return "out is x: rms_norm writes a separate output (use fused_add_rms_norm for in place)"
    return None
