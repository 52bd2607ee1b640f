"""How a compiled kernel is launched: the driver's cuLaunchKernelEx with a prebuilt configuration
(programmatic dependent launch possible), or CuPy's launch where cuda-bindings is missing.

The route is chosen once per process, at the first launch, and said in one log line:
- "driver": `cuda.bindings.driver.cuLaunchKernelEx` on the CuPy-compiled function
  (`RawKernel.kernel.ptr`), one `CUlaunchConfig` built per launch plan with the stream, grid, block
  and, for PDL builds, the programmatic-stream-serialization attribute. Per call only the argument
  values change.
- "cupy": CuPy's RawKernel call on an ExternalStream cached per stream; PDL builds are replaced by
  their plain build (kernels.rmsnorm.BuildKey.pdl is False there).
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any, Callable

logger = logging.getLogger("kernels.rmsnorm")
_P, _L, _I = ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int
# argument types of rmsnorm_kernel (rmsnorm.cu and rmsnorm_staged.cu), in order: out, x, residual with
# two strides each, weight, eps, rows, rows per outer step, hidden
ARG_TYPES = (_P, _L, _L, _P, _L, _L, _P, _L, _L, _P, ctypes.c_float, _I, _I, _I)
Launcher = Callable[[int, int, int, int, float], None]  # (out, x, residual, weight pointers, eps)

_route: list[str] = []  # the chosen route, once
_driver: list[Any] = []
_streams: dict[int, Any] = {}


def route() -> str:
    """'driver' when cuda.bindings.driver is importable, else 'cupy' (chosen once, logged once)."""
    if not _route:
        try:
            from cuda.bindings import driver

            _driver.append(driver)
            _route.append("driver")
            logger.info("kernels.rmsnorm: launching with cuda.bindings.driver.cuLaunchKernelEx "
                        "(programmatic dependent launch available)")
        except ImportError as exc:
            _route.append("cupy")
            logger.warning("kernels.rmsnorm: cuda-bindings not importable (%s): launching with CuPy, "
                           "programmatic dependent launch off (the plain builds run)", exc)
    return _route[0]


def set_route(name: str | None) -> None:
    """Force a route ('driver' or 'cupy'), or None to choose again at the next launch (tests)."""
    _route.clear()
    if name is not None:
        if name == "driver" and not _driver:
            from cuda.bindings import driver

            _driver.append(driver)
        _route.append(name)


def launcher(fn: Any, grid: int, block: int, stream: int, device: int, pdl: bool,
             strides: tuple[int, int, int, int, int, int], rows: int, inner: int, hidden: int,
             smem: int = 0) -> Launcher:
    """A function launching `fn` (a compiled CuPy RawKernel) with everything but the pointers and eps
    fixed: strides = (out, x, residual) outer and inner strides, rows, rows per outer step, hidden,
    dynamic shared memory bytes (the caller has raised the function's limit where it needs to)."""
    o_so, o_si, x_so, x_si, r_so, r_si = strides
    if route() == "driver":
        cu = _driver[0]
        cfg = cu.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid, 1, 1
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block, 1, 1
        cfg.sharedMemBytes = smem
        cfg.hStream = cu.CUstream(stream)
        if pdl:
            attr = cu.CUlaunchAttribute()
            attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            attr.value.programmaticStreamSerializationAllowed = 1
            cfg.attrs = [attr]
            cfg.numAttrs = 1
        else:
            cfg.numAttrs = 0
        func = cu.CUfunction(fn.kernel.ptr)
        launch_ex, ok = cu.cuLaunchKernelEx, cu.CUresult.CUDA_SUCCESS
        # The argument block is built once: a void*[] over one ctypes value per argument; a call sets
        # the four pointers and eps and hands the driver the array's address (cuLaunchKernelEx copies
        # the values at launch; one plan per stream, so calls on it do not interleave).
        vals = [t(v) for t, v in zip(ARG_TYPES, (0, o_so, o_si, 0, x_so, x_si, 0, r_so, r_si, 0, 0.0, rows,
                                                 inner, hidden))]
        block_ptrs = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
        addr = ctypes.addressof(block_ptrs)
        o_v, x_v, r_v, w_v, e_v = vals[0], vals[3], vals[6], vals[9], vals[10]
        use_tuple: list[bool] = []

        def run(o: int, x: int, r: int, w: int, eps: float) -> None:
            o_v.value, x_v.value, r_v.value, w_v.value, e_v.value = o, x, r, w, eps
            if use_tuple:
                (err,) = launch_ex(cfg, func, ((o, o_so, o_si, x, x_so, x_si, r, r_so, r_si, w, eps, rows,
                                                inner, hidden), ARG_TYPES), 0)
            else:
                try:
                    (err,) = launch_ex(cfg, func, addr, 0)
                except TypeError as exc:  # a cuda-bindings that takes no raw address: the tuple form
                    logger.warning("kernels.rmsnorm: cuLaunchKernelEx refused a parameter address (%s); "
                                   "passing argument tuples", exc)
                    use_tuple.append(True)
                    return run(o, x, r, w, eps)
            if err != ok:
                raise RuntimeError(f"cuLaunchKernelEx of rmsnorm_kernel failed: {err}")

        run.keep_alive = (vals, block_ptrs)  # the array points into every value: both live with the launcher

        return run
    import cupy
    import numpy as np

    cstream = _streams.get(stream)
    if cstream is None:
        cstream = _streams[stream] = cupy.cuda.ExternalStream(stream, device)
    so = [np.int64(v) for v in strides]
    tail = (np.int32(rows), np.int32(inner), np.int32(hidden))

    def run_cupy(o: int, x: int, r: int, w: int, eps: float) -> None:
        fn((grid,), (block,), (np.uint64(o), so[0], so[1], np.uint64(x), so[2], so[3], np.uint64(r), so[4],
                               so[5], np.uint64(w), np.float32(eps), *tail), stream=cstream, shared_mem=smem)

    return run_cupy
