"""vLLM general plugin: the fused RMSNorm kernels as provider `cupy_fused` of vLLM's IR ops.

vLLM calls `register()` in every process it starts (entry point `rmsnorm_fused` in the group
`vllm.general_plugins`). It registers implementations of `vllm.ir.ops.rms_norm` and
`vllm.ir.ops.fused_add_rms_norm` with the native signatures; a server selects them with
`--ir-op-priority.rms_norm=cupy_fused,native --ir-op-priority.fused_add_rms_norm=cupy_fused,native`.

Where the shape policy says stock, the provider declines the call (`supports_args`) and vLLM takes
the next provider: in eager mode per call; under torch.compile once per compile range, from the
range vLLM is compiling (so the stock kernel there is Inductor's own). Without CUDA, CuPy or
kernels/ the provider registers as unsupported and vLLM skips it; a log line says so.
"""

from __future__ import annotations

import importlib.util
import logging

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from integration import choice
from integration import ops as fused_ops
from integration.arms import IR_OPS, PROVIDER
from kernels.checks import DTYPE_NAMES
logger = logging.getLogger("vllm.plugins.rmsnorm_fused")
_logged: set[tuple] = set()


class PluginError(RuntimeError):
    """The provider cannot be registered with this vLLM; the message says why."""


def platform_support() -> tuple[bool, str]:
    """(supported, reason): CUDA platform, CuPy, kernels/ and its policy table present.

    Starts no CUDA context. Raises PluginError where CUDA and CuPy are present but the policy table
    cannot be loaded: a patched arm that silently ran stock everywhere would be a wrong experiment."""
    from vllm.platforms import current_platform

    if not current_platform.is_cuda():
        return False, f"vLLM platform is {current_platform.device_name or 'unknown'}, not CUDA"
    for module in ("cupy", "kernels.rmsnorm", "kernels.policy"):
        if importlib.util.find_spec(module) is None:
            return False, f"{module} is not importable"
    try:
        sources = {mode: choice.policy(mode).source for mode in choice.MODES}
    except (choice.PolicyUnavailable, OSError, ValueError) as exc:
        raise PluginError(f"rmsnorm_fused: CUDA and CuPy are here but the shape policy cannot be "
                          f"loaded: {exc}") from exc
    return True, "CUDA platform, CuPy, kernels/; policy " + ", ".join(f"{m}: {p}" for m, p in sources.items())


def _log_once(key: tuple, msg: str, *args: object) -> None:
    if key not in _logged:
        _logged.add(key)
        logger.info(msg, *args)


def _compile_range() -> tuple[int, int] | None:
    """(start, end) of the compile range vLLM is lowering for, or None outside its passes."""
    try:
        from vllm.compilation.passes.inductor_pass import get_pass_context

        rng = get_pass_context().compile_range
    except (ImportError, AssertionError, AttributeError):
        return None
    return int(rng.start), int(rng.end)


def row_span(x: Tensor) -> tuple[int, int] | None:
    """Smallest and largest row count this call can have: exact for a concrete shape; for a symbolic
    one (torch.compile), the rows expression evaluated at the ends of the current compile range."""
    rows = x.shape[0]
    if isinstance(rows, int):
        return rows, rows
    rng = _compile_range()
    expr = getattr(getattr(rows, "node", None), "expr", None)
    if rng is None or expr is None or len(expr.free_symbols) != 1:
        return None
    (sym,) = expr.free_symbols
    try:
        lo, hi = int(expr.subs(sym, rng[0])), int(expr.subs(sym, rng[1]))
    except TypeError:
        return None
    return (lo, hi) if lo <= hi else None


def _layout_ok(x: Tensor, weight: Tensor | None, residual: Tensor | None) -> bool:
    """What the kernel takes, checked on concrete metadata only (safe on fake, symbolic tensors)."""
    if weight is None or x.dtype not in DTYPE_NAMES or x.device.type != "cuda" or x.dim() != 2:
        return False
    hidden = x.shape[1]
    if not isinstance(hidden, int) or x.stride(1) != 1 or not isinstance(x.stride(0), int):
        return False
    if weight.dtype != x.dtype or weight.device != x.device or tuple(weight.shape) != (hidden,):
        return False
    if weight.stride(0) != 1:
        return False
    if not isinstance(x, FakeTensor) and any(
            t is not None and t.data_ptr() % 16 for t in (x, weight, residual)):
        return False  # the policy was measured with 128-bit accesses
    if residual is not None:
        if residual.dtype != x.dtype or residual.dim() != 2 or residual.shape[1] != hidden:
            return False
        if residual.stride(1) != 1 or not isinstance(residual.stride(0), int):
            return False
    return True


def accepts(op: str, x: Tensor, weight: Tensor | None, residual: Tensor | None,
           variance_size: int | None) -> bool:
    """True when cupy_fused takes this call (or, under torch.compile, this whole compile range).

    The policy (a cached lookup) is asked before the layout checks, so a declined eager call costs
    the stock arm as little extra CPU time as possible."""
    if variance_size is not None or weight is None or x.dtype not in DTYPE_NAMES or x.dim() != 2:
        return False
    hidden = x.shape[1]
    span = row_span(x) if isinstance(hidden, int) else None
    if span is None:
        return False
    dtype, eager = DTYPE_NAMES[x.dtype], _eager(x)
    fused = (choice.fused_over(op, dtype, span[0], span[1], hidden, "eager" if eager else "compiled")
             and _layout_ok(x, weight, residual))
    if fused and not eager and not torch.compiler.is_compiling():
        # vLLM's lowering pass (compile time): build the kernels now, before any graph capture
        fused_ops.warm_builds(op, dtype, hidden, fused_ops.default_vec(dtype, hidden), x.device.index or 0)
    if span[0] != span[1]:
        _log_once((op, dtype, hidden, span), "cupy_fused: %s %s hidden=%d rows %d-%d (compile range) -> %s",
                  op, dtype, hidden, span[0], span[1], "cupy_fused" if fused else "declined (stock)")
    else:
        _log_once((op, fused), "cupy_fused: %s %s hidden=%d rows=%d -> %s (first such call; "
                  "later ones are not logged)", op, dtype, hidden, span[0],
                  "cupy_fused" if fused else "declined (stock)")
    return fused


def rms_norm_supports(x: Tensor, weight: Tensor | None, epsilon: float,
                      variance_size: int | None = None) -> bool:
    """supports_args of rms_norm: the policy picks the fused kernel for this shape (or range)."""
    return accepts("rms_norm", x, weight, None, variance_size)


def fused_add_supports(x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float,
                       variance_size: int | None = None) -> bool:
    """supports_args of fused_add_rms_norm."""
    return accepts("fused_add_rms_norm", x, weight, x_residual, variance_size)


def _eager(x: Tensor) -> bool:
    """A plain tensor outside any tracing: call the kernel directly (the custom-op dispatcher costs
    several microseconds of CPU per call, which eager decode steps feel). Traced calls (fake
    tensors, Dynamo, make_fx in vLLM's lowering pass) go through the custom op instead."""
    return (type(x) is torch.Tensor and not torch.compiler.is_compiling()
            and not is_in_torch_dispatch_mode())


def rms_norm_impl(
    x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
) -> Tensor:
    """cupy_fused implementation of vllm.ir.ops.rms_norm (weight and no variance_size: see supports)."""
    assert weight is not None and variance_size is None
    if _eager(x):
        return fused_ops.run_rms_norm(x, weight, epsilon, "eager")
    return torch.ops.rmsnorm_fused.rms_norm(x, weight, epsilon)


def fused_add_rms_norm_impl(
    x: Tensor,
    x_residual: Tensor,
    weight: Tensor | None,
    epsilon: float,
    variance_size: int | None = None,
) -> tuple[Tensor, Tensor]:
    """cupy_fused implementation of vllm.ir.ops.fused_add_rms_norm, in place like vLLM's own."""
    assert weight is not None and variance_size is None
    if _eager(x):
        fused_ops.run_fused_add_rms_norm(x, x_residual, weight, epsilon, "eager")
    else:
        torch.ops.rmsnorm_fused.fused_add_rms_norm(x, x_residual, weight, epsilon)
    return x, x_residual


def _ir_ops() -> dict:
    try:
        from vllm import ir
        import vllm
    except ImportError as exc:
        raise PluginError(f"rmsnorm_fused: vLLM has no IR op package vllm.ir ({exc}); "
                          "the cupy_fused provider needs vLLM >= 0.26") from exc
    missing = [name for name in IR_OPS if not hasattr(ir.ops, name)]
    if missing:
        raise PluginError(f"rmsnorm_fused: vLLM {vllm.__version__} has no IR op(s) "
                          f"{', '.join('vllm.ir.ops.' + m for m in missing)}; cannot register {PROVIDER}")
    return {name: getattr(ir.ops, name) for name in IR_OPS}


def register() -> None:
    """Register provider cupy_fused for vllm.ir.ops.rms_norm and fused_add_rms_norm (idempotent).

    Raises PluginError when vLLM lacks the IR ops or rejects the implementations."""
    ops = _ir_ops()
    if all(PROVIDER in op.impls for op in ops.values()):
        return
    supported, reason = platform_support()
    try:
        ops["rms_norm"].register_impl(
            PROVIDER, supported=supported, supports_args=rms_norm_supports
        )(rms_norm_impl)
        ops["fused_add_rms_norm"].register_impl(
            PROVIDER, supported=supported, supports_args=fused_add_supports, inplace=True
        )(fused_add_rms_norm_impl)
    except (AssertionError, ValueError) as exc:
        raise PluginError(f"rmsnorm_fused: vLLM rejected the {PROVIDER} implementations: {exc}") from exc
    if supported:
        logger.info("rmsnorm_fused: registered provider %s for vllm.ir.ops.%s (supported: %s)",
                    PROVIDER, " and ".join(IR_OPS), reason)
    else:
        logger.warning("rmsnorm_fused: registered provider %s for vllm.ir.ops.%s as UNSUPPORTED (%s); "
                       "vLLM skips it and uses the next provider in --ir-op-priority (native)",
                       PROVIDER, " and ".join(IR_OPS), reason)
