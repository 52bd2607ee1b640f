"""Fused RMSNorm (CuPy/NVRTC): compile cache, launch plans, and the public torch-facing wrappers.

    rms_norm(x, weight, eps, out=None, variant=None) -> Tensor
    fused_add_rms_norm(x, residual, weight, eps, variant=None) -> None   (in place, vLLM semantics)

Tensors go in and out by pointer (no copies); kernels launch on PyTorch's current CUDA stream, so
calls can be captured in a CUDA graph once each (dtype, shape) was run eagerly first (that compiles).
A call is a dict lookup of its launch plan (kernels.plans: shape, strides, alignment, stream) and one
prebuilt launch (kernels.launch); the checks and the planning run only when a plan is new.
Rounding matches vLLM's CUDA kernels (see rmsnorm_common.cuh and kernels/reference.py).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import torch

from kernels import launch
from kernels.checks import UnsupportedInput, unsupported_reason
from kernels.plans import BuildKey, LaunchSpec, PlanCache, build_key, launch_shape, plan_spec
from kernels.plantedbounds import build_flag

SOURCE_DIR = Path(__file__).parent
COMMON_SOURCE = "rmsnorm_common.cuh"  # options, element types, roundings and helpers of both bodies
BODY_SOURCES = {False: "rmsnorm.cu", True: "rmsnorm_staged.cu"}  # by BuildKey.staged
NEGATIVE_CONTROLS = {"epsilon": "NEG_DROP_EPS", "tail": "NEG_SKIP_LAST"}
DEFAULT_SMEM_LIMIT = 48 * 1024  # dynamic shared memory a kernel gets without raising its attribute
# Called with (op, dtype, hidden, vec, device) whenever a new launch plan is made (integration.ops
# compiles ahead there every kernel its policy may launch for that alignment).
PLAN_HOOKS: list[Callable[[str, str, int, int, int], object]] = []

_KERNELS: dict[tuple[BuildKey, int], Any] = {}
_SMS: dict[int, int] = {}
_flags: tuple[str, ...] = ()
PLANS = PlanCache()
# PyTorch's current stream of a device as an int, what Inductor's generated code asks per launch
# (torch builds without CUDA lack it; no call gets this far there)
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream",
                      lambda dev: torch.cuda.current_stream(dev).cuda_stream)


def _cupy() -> Any:
    try:
        import cupy
    except ImportError as exc:
        raise RuntimeError(
            f"CuPy is not importable ({exc}); install cupy-cuda13x (CUDA 13) or cupy-cuda12x (CUDA 12)"
        ) from exc
    return cupy


@contextlib.contextmanager
def _built_with(flags: tuple[str, ...]) -> Iterator[None]:
    global _flags
    old, _flags = _flags, flags
    try:
        yield
    finally:
        _flags = old


def negative_control(name: str) -> contextlib.AbstractContextManager[None]:
    """Build and run the deliberately broken kernel `name` ('epsilon' or 'tail') inside the block."""
    if name not in NEGATIVE_CONTROLS:
        raise ValueError(f"negative control {name!r}: choose one of {sorted(NEGATIVE_CONTROLS)}")
    return _built_with((NEGATIVE_CONTROLS[name],))


def planted(ns: int) -> contextlib.AbstractContextManager[None]:
    """Build and run the planted kernel (kernels.plantedbounds: `ns` of GPU delay per call) inside the
    block."""
    return _built_with((build_flag(ns),))


def plant(ns: int) -> None:
    """From now on every kernel this process builds is the planted one (`ns` ns per call): the
    planted arm's vLLM processes (integration/plantedprovider.py)."""
    global _flags
    _flags = (build_flag(ns),)


def kernel_source(staged: bool) -> str:
    """The CUDA source of one build family: the shared header, then the register body (rmsnorm.cu) or
    the staged one (rmsnorm_staged.cu). Joined here, not #included, so that CuPy's compile cache, which
    is keyed on the source text, sees a change to either file."""
    return "".join((SOURCE_DIR / name).read_text() for name in (COMMON_SOURCE, BODY_SOURCES[staged]))


def compiled(key: BuildKey, device: int) -> Any:
    """The CuPy kernel function for `key` on `device`, compiled once (NVRTC), loaded, and cached."""
    fn = _KERNELS.get((key, device))
    if fn is None:
        cp = _cupy()
        with cp.cuda.Device(device):
            module = cp.RawModule(code=kernel_source(key.staged), options=key.options())
            fn = module.get_function("rmsnorm_kernel")
            fn.compile()  # compile and load now, never inside a CUDA-graph capture
        _KERNELS[(key, device)] = fn
    return fn


def sm_count(device: int) -> int:
    """Multiprocessors of `device` (asked once)."""
    n = _SMS.get(device)
    if n is None:
        n = _SMS[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return n


def warm(op: str, dtype: str, hidden: int, vec: int, device: int,
         choices: Iterable[tuple[int, str | None]]) -> int:
    """Compile the kernels that calls of (op, dtype, hidden, vector width) at these (rows, variant)
    would launch (variant None: the shape-based choice at that row count); returns how many distinct
    builds that is. Shapes that cannot run the width are left out (such a call is refused anyway)."""
    sms, pdl_ok = sm_count(device), launch.route() == "driver"
    keys = set()
    for rows, variant in choices:
        try:
            shape = launch_shape(rows, hidden, vec, variant, sms)
        except UnsupportedInput:
            continue
        keys.add(build_key(op, dtype, hidden, vec, shape, pdl_ok, _flags))
    for key in keys:
        compiled(key, device)
    return len(keys)


def _new_plan(spec: LaunchSpec, device: int, stream: int) -> Callable[[int, int, int, int, float], None]:
    """The prebuilt launcher of a spec (a no-op for zero rows); runs PLAN_HOOKS first."""
    for hook in PLAN_HOOKS:
        hook(spec.op, spec.key.dtype, spec.hidden, spec.key.vec, device)
    if spec.rows == 0:
        return lambda o, x, r, w, eps: None
    fn = compiled(spec.key, device)
    with _cupy().cuda.Device(device):
        if spec.smem > DEFAULT_SMEM_LIMIT and fn.max_dynamic_shared_size_bytes < spec.smem:
            fn.max_dynamic_shared_size_bytes = spec.smem  # opt in past the default 48 KiB, once per size
        return launch.launcher(fn, spec.grid, spec.block, stream, device, spec.key.pdl, spec.strides,
                               spec.rows, spec.inner, spec.hidden, spec.smem)


def _plan(key: tuple, op: str, x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None,
          out: torch.Tensor | None, variant: str | None, device: int, stream: int) -> Callable:
    """The launcher cached under `key`, made (checks, planning, build) when the key is new."""
    run = PLANS.get(key)
    if run is None:
        reason = unsupported_reason(x, weight, residual=residual, out=out)
        if reason is not None:
            raise UnsupportedInput(reason)
        spec = plan_spec(op, x, weight, residual, out, variant, sm_count(device),
                         launch.route() == "driver", _flags)
        run = PLANS.put(key, _new_plan(spec, device, stream))
    return run


def _device(x: torch.Tensor, weight: torch.Tensor) -> int:
    """x's CUDA device index; UnsupportedInput naming the problem for anything else."""
    if not isinstance(x, torch.Tensor) or not isinstance(weight, torch.Tensor) or x.get_device() < 0:
        raise UnsupportedInput(unsupported_reason(x, weight) or f"x is on {x.device}, not a CUDA device")
    return x.get_device()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None,
             variant: str | None = None) -> torch.Tensor:
    """y = T(x * rsqrt(mean(x^2) + eps)) * weight over the last dim; writes `out` (allocated if None).

    variant: a launch shape 't<threads per row>r<rows per block>[s][p]' or None for the shape-based choice.
    """
    dev = _device(x, weight)
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    xp, op_, wp = x.data_ptr(), out.data_ptr(), weight.data_ptr()
    stream = _raw_stream(dev)
    key = ("rms_norm", variant, _flags, x.dtype, x.shape, x.stride(), out.dtype, out.shape, out.stride(),
           weight.dtype, weight.shape, weight.stride(), dev, out.get_device(), weight.get_device(),
           (xp | op_ | wp) & 15, stream)
    run = _plan(key, "rms_norm", x, weight, None, out, variant, dev, stream)
    if op_ == xp and x.numel():
        raise UnsupportedInput("out is x: rms_norm writes a separate output "
                               "(use fused_add_rms_norm for in place)")
    run(op_, xp, 0, wp, eps)
    return out


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                       variant: str | None = None) -> None:
    """In place, as vLLM: residual <- T(x + residual); x <- rms_norm(residual) * weight."""
    dev = _device(x, weight)
    xp, rp, wp = x.data_ptr(), residual.data_ptr(), weight.data_ptr()
    stream = _raw_stream(dev)
    key = ("fused_add_rms_norm", variant, _flags, x.dtype, x.shape, x.stride(), residual.dtype,
           residual.shape, residual.stride(), weight.dtype, weight.shape, weight.stride(), dev,
           residual.get_device(), weight.get_device(), (xp | rp | wp) & 15, stream)
    run = _plan(key, "fused_add_rms_norm", x, weight, residual, None, variant, dev, stream)
    if rp == xp and x.numel():
        raise UnsupportedInput("residual is x: the two in-place buffers must be distinct")
    run(0, xp, rp, wp, eps)
