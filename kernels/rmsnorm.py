"""Fused RMSNorm (CuPy/NVRTC): compile cache, launch, and the public torch-facing wrappers.

    rms_norm(x, weight, eps, out=None, variant=None) -> Tensor
    fused_add_rms_norm(x, residual, weight, eps, variant=None) -> None   (in place, vLLM semantics)

Tensors go in and out by pointer (no copies); kernels launch on PyTorch's current CUDA stream, so
calls can be captured in a CUDA graph once each (dtype, shape) was run eagerly first (that compiles).
Rounding matches vLLM's CUDA kernels (see rmsnorm.cu and kernels/reference.py).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from kernels.checks import DTYPE_NAMES, UnsupportedInput, row_stride, unsupported_reason
from kernels.shapes import DTYPE_IDS, LaunchShape, auto_shape, iters_needed, shape_fits, vector_width

SOURCE_PATH = Path(__file__).with_name("rmsnorm.cu")
NEGATIVE_CONTROLS = {"epsilon": "NEG_DROP_EPS", "tail": "NEG_SKIP_LAST"}


@dataclass(frozen=True)
class BuildKey:
    """One compiled kernel: storage dtype, op, vector width, launch shape, extra -D flags."""

    dtype: str
    fused_add: bool
    vec: int
    tpr: int
    rpb: int
    iters: int
    flags: tuple[str, ...] = ()

    def options(self) -> tuple[str, ...]:
        defs = {
            "DTYPE_ID": DTYPE_IDS[self.dtype], "VEC": self.vec, "TPR": self.tpr, "RPB": self.rpb,
            "ITERS": self.iters, "FUSED_ADD": int(self.fused_add),
        }
        return ("-std=c++17",) + tuple(f"-D{k}={v}" for k, v in defs.items()) + tuple(
            f"-D{f}" for f in self.flags
        )


_KERNELS: dict[tuple[BuildKey, int], Any] = {}
_STREAMS: dict[int, Any] = {}
_SMS: dict[int, int] = {}
_flags: tuple[str, ...] = ()


def _cupy() -> Any:
    try:
        import cupy
    except ImportError as exc:
        raise RuntimeError(
            f"CuPy is not importable ({exc}); install cupy-cuda13x (CUDA 13) or cupy-cuda12x (CUDA 12)"
        ) from exc
    return cupy


def _require_gpu() -> None:
    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA GPU is visible to PyTorch (torch.cuda.is_available() is False)")


@contextlib.contextmanager
def negative_control(name: str) -> Iterator[None]:
    """Build and run the deliberately broken kernel `name` ('epsilon' or 'tail') inside the block."""
    global _flags
    if name not in NEGATIVE_CONTROLS:
        raise ValueError(f"negative control {name!r}: choose one of {sorted(NEGATIVE_CONTROLS)}")
    old, _flags = _flags, (NEGATIVE_CONTROLS[name],)
    try:
        yield
    finally:
        _flags = old


def compiled(key: BuildKey, device: int) -> Any:
    """The CuPy kernel function for `key` on `device`, compiled once (NVRTC) and cached."""
    fn = _KERNELS.get((key, device))
    if fn is None:
        cp = _cupy()
        with cp.cuda.Device(device):
            module = cp.RawModule(code=SOURCE_PATH.read_text(), options=key.options())
            fn = module.get_function("rmsnorm_kernel")
            fn.compile()  # compile and load now, never inside a CUDA-graph capture
        _KERNELS[(key, device)] = fn
    return fn


def _stream(device: int) -> Any:
    ptr = torch.cuda.current_stream(device).cuda_stream
    s = _STREAMS.get(ptr)
    if s is None:
        s = _cupy().cuda.ExternalStream(ptr, device)
        _STREAMS[ptr] = s
    return s


def _sm_count(device: int) -> int:
    n = _SMS.get(device)
    if n is None:
        n = _SMS[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return n


def plan(x: torch.Tensor, weight: torch.Tensor, tensors: list[torch.Tensor], fused_add: bool,
         variant: str | None) -> tuple[BuildKey, int, int]:
    """Build key, rows and grid size for a call (raises UnsupportedInput for a shape that can't run)."""
    hidden = x.shape[-1]
    rows = x.numel() // hidden if hidden else 0
    dtype = DTYPE_NAMES[x.dtype]
    strides = [row_stride(t) for t in tensors]
    vec = vector_width(x.element_size(), strides, [t.data_ptr() for t in tensors + [weight]])
    device = x.device.index if x.device.index is not None else torch.cuda.current_device()
    shape = LaunchShape.parse(variant) if variant else auto_shape(rows, hidden, vec, _sm_count(device))
    reason = shape_fits(shape, hidden, vec)
    if reason is not None:
        raise UnsupportedInput(reason)
    key = BuildKey(dtype, fused_add, vec, shape.tpr, shape.rpb, iters_needed(hidden, vec, shape.tpr), _flags)
    return key, rows, -(-rows // shape.rpb)


def _launch(key: BuildKey, rows: int, grid: int, hidden: int, eps: float, out: torch.Tensor | None,
            x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor) -> None:
    device = x.device.index if x.device.index is not None else torch.cuda.current_device()
    fn = compiled(key, device)

    def ptr(t: torch.Tensor | None) -> tuple[np.uint64, np.int64]:
        if t is None:
            return np.uint64(0), np.int64(0)
        return np.uint64(t.data_ptr()), np.int64(row_stride(t))

    args = (*ptr(out), *ptr(x), *ptr(residual), np.uint64(weight.data_ptr()), np.float32(eps),
            np.int32(rows), np.int32(hidden))
    with _cupy().cuda.Device(device):
        fn((grid,), (key.tpr * key.rpb,), args, stream=_stream(device))


def _check(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None,
           out: torch.Tensor | None) -> None:
    reason = unsupported_reason(x, weight, residual=residual, out=out)
    if reason is not None:
        raise UnsupportedInput(reason)
    _require_gpu()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None,
             variant: str | None = None) -> torch.Tensor:
    """y = T(x * rsqrt(mean(x^2) + eps)) * weight over the last dim; writes `out` (allocated if None).

    variant: a launch shape 't<threads per row>r<rows per block>' or None for the shape-based choice.
    """
    _check(x, weight, None, out)
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return out
    key, rows, grid = plan(x, weight, [x, out], False, variant)
    _launch(key, rows, grid, x.shape[-1], eps, out, x, None, weight)
    return out


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                       variant: str | None = None) -> None:
    """In place, as vLLM: residual <- T(x + residual); x <- rms_norm(residual) * weight."""
    _check(x, weight, residual, None)
    if x.numel() == 0:
        return
    if residual.data_ptr() == x.data_ptr():
        raise UnsupportedInput("residual is x: the two in-place buffers must be distinct")
    key, rows, grid = plan(x, weight, [x, residual], True, variant)
    _launch(key, rows, grid, x.shape[-1], eps, None, x, residual, weight)
