"""Float64 reference for RMSNorm and fused residual-add + RMSNorm (torch, any device).

Two places where implementations round differently, both selectable:
- `weight_rounding`: "vllm" rounds norm(x) to the storage dtype before the multiply by the weight
  (vLLM's CUDA kernel and its native op: `x.to(orig_dtype) * weight`); "fp32" multiplies by the
  weight at full precision and rounds once (QuACK, FlashInfer). The fused kernel matches "vllm".
- `residual_rounding` (fused add only): "stored" takes the variance from the sum rounded to the
  storage dtype, the value written back as the residual (vLLM's CUDA kernel; the fused kernel
  matches this); "exact" takes it from the unrounded sum (vLLM's native op under Inductor).
The returned output is float64 and not rounded at the end: comparisons allow for that last rounding.
"""

from __future__ import annotations

import torch

WEIGHT_ROUNDINGS = ("vllm", "fp32")
RESIDUAL_ROUNDINGS = ("stored", "exact")


def _round(t64: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Round float64 values to `dtype` (round to nearest even) and back to float64."""
    return t64.to(dtype).to(torch.float64)


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float,
                 weight_rounding: str = "vllm", dtype: torch.dtype | None = None) -> torch.Tensor:
    """Float64 RMSNorm of x's last dim; `dtype` is the storage dtype (defaults to x.dtype)."""
    if weight_rounding not in WEIGHT_ROUNDINGS:
        raise ValueError(f"weight_rounding {weight_rounding!r}: choose one of {WEIGHT_ROUNDINGS}")
    dtype = dtype or x.dtype
    xd = x.to(torch.float64)
    inv = torch.rsqrt(xd.square().mean(dim=-1, keepdim=True) + eps)
    normed = xd * inv
    if weight_rounding == "vllm":
        normed = _round(normed, dtype)
    return normed * weight.to(torch.float64)


def fused_add_rms_norm_ref(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                           weight_rounding: str = "vllm", residual_rounding: str = "stored",
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """(output float64, new residual in x.dtype) of residual <- x + residual; x <- norm(residual)."""
    if residual_rounding not in RESIDUAL_ROUNDINGS:
        raise ValueError(f"residual_rounding {residual_rounding!r}: choose one of {RESIDUAL_ROUNDINGS}")
    exact = x.to(torch.float64) + residual.to(torch.float64)
    stored = exact.to(x.dtype)
    source = stored.to(torch.float64) if residual_rounding == "stored" else exact
    return rms_norm_ref(source, weight, eps, weight_rounding, dtype=x.dtype), stored
