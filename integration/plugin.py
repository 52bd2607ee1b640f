"""vLLM general plugin: the fused RMSNorm kernels as provider `cupy_fused` of vLLM's IR ops.

vLLM calls `register()` in every process it starts (entry point `rmsnorm_fused` in the group
`vllm.general_plugins`); with $RMSNORM_PLANTED_NS set it is the planted control
(integration/plantedprovider.py).
It registers implementations of `vllm.ir.ops.rms_norm` and `vllm.ir.ops.fused_add_rms_norm` with
the native signatures; a server selects them with
`--ir-op-priority.rms_norm=cupy_fused,native --ir-op-priority.fused_add_rms_norm=cupy_fused,native`.

Where the shape policy says stock, the provider declines the call (`supports_args`) and vLLM takes
the next provider: in eager mode per call; under torch.compile once per compile range, from the
range vLLM is compiling (so the stock kernel there is Inductor's own). Without CUDA, CuPy or
kernels/ the provider registers as unsupported and vLLM skips it; a log line says so.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import re

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from integration import choice
from integration import ops as fused_ops
from integration.names import IR_OPS, PROVIDER
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


def _expr(n: object) -> object:
    """The sympy expression of a size or stride (an int stays an int); None if it has none."""
    return n if isinstance(n, int) else getattr(getattr(n, "node", None), "expr", None)


def _concrete(n: object, sym: object, value: int) -> int:
    """A size or stride at sym = value; TypeError where it stays symbolic."""
    e = _expr(n)
    if e is None:
        raise TypeError(f"{n!r} has no expression")
    if isinstance(e, int):
        return e
    return int(e.subs(sym, value) if sym is not None else e)


def _symbol(x: Tensor) -> tuple[object, tuple[int, int]] | None:
    """(the one free symbol of x's leading dims, the compile range's ends); None if not exactly one."""
    syms: set = set()
    for n in x.shape[:-1]:
        e = _expr(n)
        if e is None:
            return None
        if not isinstance(e, int):
            syms |= e.free_symbols
    rng = _compile_range()
    if len(syms) != 1 or rng is None:
        return None
    return next(iter(syms)), rng


def row_range(x: Tensor) -> tuple[int, int, int] | None:
    """(first, last, step) of the row counts (product of the leading dims) this call can have: exact for
    a concrete shape; for a symbolic one (torch.compile), evaluated over the current compile range, as
    first + k * step (a [tokens, heads, head_dim] view steps by heads). None where that is unknown."""
    if all(isinstance(n, int) for n in x.shape[:-1]):
        rows = 1
        for n in x.shape[:-1]:
            rows *= n
        return rows, rows, 1
    found = _symbol(x)
    if found is None:
        return None
    sym, (lo, hi) = found
    try:
        at = [_rows_at(x, sym, t) for t in (lo, min(lo + 1, hi), hi)]
    except TypeError:
        return None
    step = at[1] - at[0] if hi > lo else 1
    if step < 1 or at[2] != at[0] + step * (hi - lo):
        return None  # not linear in the tokens: no claim
    return at[0], at[2], step


def _rows_at(x: Tensor, sym: object, value: int) -> int:
    rows = 1
    for n in x.shape[:-1]:
        rows *= _concrete(n, sym, value)
    return rows


def row_span(x: Tensor) -> tuple[int, int] | None:
    """Smallest and largest row count this call can have (see row_range)."""
    rows = row_range(x)
    return None if rows is None else (rows[0], rows[1])


@functools.lru_cache(maxsize=4096)
def _fused_rows(op: str, dtype: str, rows: tuple[int, int, int], width: int, mode: str) -> bool:
    """The policy picks the fused kernel at every row count first, first + step, ..., last."""
    first, last, step = rows
    if step == 1:
        return choice.fused_over(op, dtype, first, last, width, mode)
    if first < 1 or (last - first) // step + 1 > choice.MAX_SCAN_ROWS:
        return False
    return all(choice.choose(op, dtype, r, width, mode) != "stock" for r in range(first, last + 1, step))


def _quick_reason(x: Tensor, weight: Tensor | None, variance_size: int | None) -> tuple | None:
    """Why the kernel cannot take this call, from cheap checks (a short key; see _REASONS)."""
    if weight is None:
        return ("no weight",)
    if variance_size is not None:
        return ("variance_size",)
    if x.dtype not in DTYPE_NAMES:
        return ("x dtype", x.dtype)
    if weight.dtype != x.dtype:
        return ("weight dtype", weight.dtype, x.dtype)
    if x.dim() == 0 or not isinstance(x.shape[-1], int):
        return ("width",)
    return None


_REASONS = {
    "no weight": "no weight (the kernel always multiplies by one)",
    "variance_size": "variance_size is set (the kernel takes the variance over the whole row)",
    "x dtype": "x dtype {} is not one of bfloat16, float16, float32",
    "weight dtype": "weight dtype {} on {} activations (the kernel reads the weight in x's dtype)",
    "width": "the row width is not a fixed size",
}


def _stand_in(t: Tensor | None, sym: object, value: int) -> Tensor | None:
    """A meta tensor with t's dtype, sizes, strides and offset at sym = value (concrete metadata)."""
    if t is None:
        return None
    sizes = [_concrete(n, sym, value) for n in t.shape]
    strides = [_concrete(s, sym, value) for s in t.stride()]
    offset = _concrete(t.storage_offset(), sym, value)
    return (torch.empty_strided(sizes, strides, dtype=t.dtype, device="meta")
            .as_strided(sizes, strides, offset))


def layout_reason(x: Tensor, weight: Tensor, residual: Tensor | None) -> str | None:
    """None when the fused kernel takes these tensors, else why not, as the kernel's own checks say
    (kernels.policy.unsupported_reason for real tensors; kernels.checks on meta stand-ins for fake,
    symbolic ones, at the compile range's first, second and last token count). Fake tensors have no
    address: their 16-byte alignment is read from the storage offset (vLLM's buffers are aligned)."""
    from kernels.checks import unsupported_reason as kernel_reason
    from kernels.policy import unsupported_reason as policy_reason

    if not isinstance(x, FakeTensor):
        return policy_reason(x, weight, residual)
    tensors = [("x", x), ("weight", weight), ("residual", residual)]
    for name, t in tensors:
        if t is not None and t.device != torch.device("cuda", x.device.index or 0):
            return f"{name} is on {t.device}, not the CUDA device of x"
    found = _symbol(x)
    sym, (lo, hi) = found if found is not None else (None, (0, 0))
    for value in sorted({lo, min(lo + 1, hi), hi}):
        try:
            mx, mw, mr = (_stand_in(t, sym, value) for _, t in tensors)
        except TypeError:
            return "a size or stride is symbolic outside the compile range's one token count"
        reason = kernel_reason(mx, mw, mr, device_type="meta")
        if reason is not None:
            return reason
        for name, t in (("x", mx), ("weight", mw), ("residual", mr)):
            if t is not None and t.storage_offset() * t.element_size() % 16:
                return f"{name} starts {t.storage_offset() * t.element_size()} bytes into its buffer, not " \
                       "16-byte aligned (the table was measured with 128-bit accesses)"
    return None


def _decline(op: str, reason: str) -> bool:
    """Log (once per op and kind of reason) why the kernel cannot take a call; returns False."""
    key = (op, "declines", re.split(r"[\d(]", reason, maxsplit=1)[0])
    _log_once(key, "cupy_fused: %s declined, the kernel cannot take it: %s (logged once per op and reason)",
              op, reason)
    return False


def accepts(op: str, x: Tensor, weight: Tensor | None, residual: Tensor | None,
            variance_size: int | None) -> bool:
    """True when cupy_fused takes this call (or, under torch.compile, this whole compile range).

    Eager calls ask the policy (a cached lookup) before the layout checks, so a declined eager call
    costs the stock arm as little extra CPU time as possible; vLLM's lowering pass (once per graph
    node and compile range) runs the layout checks always, so their verdict is logged."""
    quick = _quick_reason(x, weight, variance_size)
    if quick is not None:
        return _decline(op, _REASONS[quick[0]].format(*quick[1:]))
    width = x.shape[-1]
    rows = row_range(x)
    if rows is None:
        return False  # symbolic rows outside vLLM's passes: no claim
    dtype, eager = DTYPE_NAMES[x.dtype], _eager(x)
    fused = _fused_rows(op, dtype, rows, width, "eager" if eager else "compiled")
    if fused or not eager:
        reason = layout_reason(x, weight, residual)
        if reason is not None:
            fused = _decline(op, reason)
    if fused and not eager and not torch.compiler.is_compiling():
        # vLLM's lowering pass (compile time): build the kernels now, before any graph capture
        fused_ops.warm_builds(op, dtype, width, fused_ops.default_vec(dtype, width), x.device.index or 0)
    what = "cupy_fused" if fused else "declined (stock)"
    if rows[0] != rows[1]:
        _log_once((op, dtype, width, rows),
                  "cupy_fused: %s %s width=%d rows %d-%d step %d (compile range) -> %s",
                  op, dtype, width, rows[0], rows[1], rows[2], what)
    else:
        _log_once((op, fused, width), "cupy_fused: %s %s width=%d rows=%d -> %s (first such call; "
                  "later ones are not logged)", op, dtype, width, rows[0], what)
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


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def _ir_ops() -> dict:
    try:
        import vllm
        from vllm import ir
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
    from integration import plantedprovider

    ns = plantedprovider.planted_ns()  # the planted control's delay, None for every other arm
    if ns is not None and _on_cpu():
        plantedprovider.register_host(ops, ns)
        return
    supported, reason = platform_support()
    if ns is not None and supported:
        from kernels import rmsnorm

        rmsnorm.plant(ns)
        reason += f"; planted control: every fused call spins {ns} ns"
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
