"""Stock arms the fused kernel is timed against, in the same process.

- vllm_c:   vLLM's CUDA kernels, torch.ops._C.rms_norm / fused_add_rms_norm (registered by
            `import vllm._C_stable_libtorch` in vLLM 0.26, `vllm._C` before)
- inductor: torch.compile of vLLM's native formula (what vLLM runs under torch.compile), compiled once
            per (op, dtype, hidden) with the row dim marked dynamic (torch._dynamo.mark_dynamic on dim 0,
            as vLLM marks the token dim) and hidden static: Dynamo's automatic dynamic shapes are off,
            so a second hidden size compiles a graph of its own instead of making hidden symbolic
            (that recompile ran 1.5-1.7x slower at >= 1024 rows on the H200,
            ../shared/data/h200-stock-vs-fused-2026-12-02.json)
- torch:    torch.nn.functional.rms_norm (rms_norm only; torch has no fused add-norm)
"""

from __future__ import annotations

import importlib
from typing import Callable

import torch

_VLLM_ERROR: str | None = None


def _setup_dynamo() -> None:
    # Every (op, dtype, hidden) gets its own graph under one code object: raise the recompile limits
    # so that Dynamo never falls back to eager silently, and keep hidden static (no automatic dynamic).
    cfg = torch._dynamo.config
    for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                 "accumulated_recompile_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, 4096)
    cfg.automatic_dynamic_shapes = False


def rms_native(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """vLLM's native RMSNorm: fp32 variance, round to x.dtype, then multiply by the weight."""
    orig = x.dtype
    xf = x.float()
    var = xf.pow(2).mean(dim=-1, keepdim=True)
    xf = xf * torch.rsqrt(var + eps)
    return xf.to(orig) * weight


def add_rms_native(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                   eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's native fused add: fp32 sum (stored rounded as the residual), norm of the fp32 sum."""
    orig = x.dtype
    xf = x.float() + residual.float()
    new_residual = xf.to(orig)
    var = xf.pow(2).mean(dim=-1, keepdim=True)
    out = (xf * torch.rsqrt(var + eps)).to(orig) * weight
    return out, new_residual


_COMPILED: dict[str, Callable] = {}


def inductor(op: str, dtype: torch.dtype, hidden: int) -> Callable:
    """The torch.compile'd native function for (op, dtype, hidden), compiled at its first call
    (prepare_inductor makes that call with the rows marked dynamic)."""
    key = f"{op}/{dtype}/{hidden}"
    fn = _COMPILED.get(key)
    if fn is None:
        _setup_dynamo()
        fn = torch.compile(rms_native if op == "rms_norm" else add_rms_native, fullgraph=True)
        _COMPILED[key] = fn
    return fn


def compiled_graphs() -> int:
    """Graphs Dynamo compiled in this process so far (one per (op, dtype, hidden), plus one per
    row count that a dynamic graph's guards refuse, such as a single row)."""
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def mark_rows_dynamic(*tensors: torch.Tensor) -> None:
    """Mark the row dim dynamic where it may be (a call's tensors; a single row stays static)."""
    for t in tensors:
        torch._dynamo.maybe_mark_dynamic(t, 0)


def prepare_inductor(op: str, dtype: torch.dtype, hidden: int, rows: int = 8192) -> None:
    """Compile (and autotune) the Inductor arm for (op, dtype, hidden) at `rows` rows with the row dim
    marked dynamic (torch._dynamo.mark_dynamic, as vLLM marks the token dim), as vLLM's profiling run
    compiles at its largest batch."""
    x = torch.randn(rows, hidden, device="cuda").to(dtype)
    r = torch.randn(rows, hidden, device="cuda").to(dtype)
    w = torch.ones(hidden, device="cuda", dtype=dtype)
    for t in (x, r):
        torch._dynamo.mark_dynamic(t, 0)
    if op == "rms_norm":
        inductor(op, dtype, hidden)(x, w, 1e-6)
    else:
        inductor(op, dtype, hidden)(x, r, w, 1e-6)
    torch.cuda.synchronize()


def vllm_ops() -> tuple[Callable | None, Callable | None, str | None]:
    """(rms_norm, fused_add_rms_norm, error): vLLM's CUDA ops, or None and why they are missing."""
    global _VLLM_ERROR
    errors = []
    # vLLM 0.26 registers torch.ops._C from vllm._C_stable_libtorch; older releases from vllm._C.
    for module in ("vllm._C_stable_libtorch", "vllm._C"):
        try:
            importlib.import_module(module)
            return torch.ops._C.rms_norm, torch.ops._C.fused_add_rms_norm, None
        except Exception as exc:  # ImportError, a missing op, or an incompatible shared library
            errors.append(f"{module}: {type(exc).__name__}: {exc}")
    _VLLM_ERROR = "; ".join(errors)
    return None, None, _VLLM_ERROR


def vllm_version() -> str | None:
    """vLLM's version string, or None when vLLM is not importable."""
    try:
        import vllm
        return str(vllm.__version__)
    except Exception:
        return None
