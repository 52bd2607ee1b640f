"""The fused kernels of kernels/rmsnorm.py as torch.library custom ops.

    torch.ops.rmsnorm_fused.rms_norm(x, weight, epsilon) -> Tensor
    torch.ops.rmsnorm_fused.fused_add_rms_norm(x, residual, weight, epsilon) -> ()  (mutates x, residual)

Both are opaque to Dynamo and Inductor (fake implementations give the output metadata), so under
torch.compile the graph holds one call per norm, and CUDA-graph capture records the kernel launch.
kernels/rmsnorm.py launches on PyTorch's current stream. Each call asks the shape policy for the
launch variant of its row count. vLLM captures its CUDA-graph batch sizes without an uncaptured run
first, so every kernel the policy can pick for up to WARM_ROWS rows is compiled ahead: when vLLM's
lowering pass picks cupy_fused (compile time, see plugin.decide) and at the first call for each
(op, dtype, hidden, vector width); never inside a capture.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter

import torch
from torch import Tensor

from integration import choice

logger = logging.getLogger("vllm.plugins.rmsnorm_fused")

WARM_ROWS = 16384  # row counts warmed: vLLM's CUDA-graph sizes and every compile range the launcher sets
CALLS: Counter = Counter()  # (op, answer) -> Python-level calls in this process (not graph replays)
_warmed: set[tuple] = set()
_lock = threading.Lock()
_inconsistent: set[tuple] = set()


def _kernels():
    from kernels import rmsnorm

    return rmsnorm


def _answer(op: str, x: Tensor, mode: str) -> str:
    hidden = x.shape[-1]
    rows = x.numel() // hidden if hidden else 0
    answer = choice.choose(op, choice.DTYPE_NAMES[x.dtype], max(rows, 1), hidden, mode)
    if answer == "stock":
        key = (op, x.dtype, rows, hidden)
        if key not in _inconsistent:
            _inconsistent.add(key)
            logger.warning("cupy_fused: the policy says stock for %s %s rows=%d hidden=%d, but vLLM "
                           "dispatched this call to cupy_fused; running the fused kernel's own launch "
                           "shape", op, x.dtype, rows, hidden)
        return "fused:auto"
    return answer


def warm(op: str, x: Tensor, weight: Tensor, residual: Tensor | None) -> int:
    """Compile, for this call's alignment, every kernel the policy may launch (see warm_builds)."""
    rk = _kernels()
    from kernels.shapes import vector_width

    tensors = [x] + ([residual] if residual is not None else [])
    vec = vector_width(x.element_size(), [rk.row_stride(t) for t in tensors],
                       [t.data_ptr() for t in tensors + [weight]])
    device = x.device.index if x.device.index is not None else torch.cuda.current_device()
    return warm_builds(op, choice.DTYPE_NAMES[x.dtype], x.shape[-1], vec, device)


def default_vec(dtype: str, hidden: int) -> int:
    """Vector width of contiguous rows at 16-byte aligned addresses (what vLLM's buffers have)."""
    from kernels.shapes import ITEMSIZE, vector_width

    return vector_width(ITEMSIZE[dtype], [hidden], [0])


def warm_builds(op: str, dtype: str, hidden: int, vec: int, device: int) -> int:
    """Compile every kernel the policy may launch for up to WARM_ROWS rows of this op, dtype, hidden
    and vector width; returns how many builds that is (0 when done before, or while capturing)."""
    key = (op, dtype, hidden, vec, device)
    if key in _warmed or torch.cuda.is_current_stream_capturing():
        return 0
    rk = _kernels()
    from kernels.shapes import LaunchShape, auto_shape, iters_needed, shape_fits

    with _lock:
        if key in _warmed:
            return 0
        t0 = time.perf_counter()
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        builds = set()
        for rows in range(1, WARM_ROWS + 1):
            answer = choice.choose(op, dtype, rows, hidden, "compiled")
            if answer == "stock":
                continue
            variant = choice.variant_of(answer)
            shape = LaunchShape.parse(variant) if variant else auto_shape(rows, hidden, vec, sms)
            if shape_fits(shape, hidden, vec) is None:
                builds.add(rk.BuildKey(dtype, op == "fused_add_rms_norm", vec, shape.tpr, shape.rpb,
                                       iters_needed(hidden, vec, shape.tpr)))
        for b in builds:
            rk.compiled(b, device)  # cached: a build made earlier costs nothing
        _warmed.add(key)
    logger.info("cupy_fused: %s %s hidden=%d vec=%d: %d kernel build(s) ready for up to %d rows in %.1f s",
                op, dtype, hidden, vec, len(builds), WARM_ROWS, time.perf_counter() - t0)
    return len(builds)


def run_rms_norm(x: Tensor, weight: Tensor, epsilon: float, mode: str = "eager") -> Tensor:
    """out = rms_norm(x) * weight with the fused kernel (launch variant from the mode's policy).
    mode 'compiled' (the custom op's path) also compiles ahead for later CUDA-graph captures."""
    if mode == "compiled":
        warm("rms_norm", x, weight, None)
    answer = _answer("rms_norm", x, mode)
    CALLS[("rms_norm", answer)] += 1
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return _kernels().rms_norm(x, weight, epsilon, out=out, variant=choice.variant_of(answer))


def run_fused_add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, epsilon: float,
                           mode: str = "eager") -> None:
    """In place: residual <- x + residual; x <- rms_norm(residual) * weight (vLLM semantics)."""
    if mode == "compiled":
        warm("fused_add_rms_norm", x, weight, residual)
    answer = _answer("fused_add_rms_norm", x, mode)
    CALLS[("fused_add_rms_norm", answer)] += 1
    _kernels().fused_add_rms_norm(x, residual, weight, epsilon, variant=choice.variant_of(answer))


@torch.library.custom_op("rmsnorm_fused::rms_norm", mutates_args=())
def rms_norm(x: Tensor, weight: Tensor, epsilon: float) -> Tensor:
    """Custom-op form of run_rms_norm (what a torch.compile graph calls)."""
    return run_rms_norm(x, weight, epsilon, mode="compiled")


@rms_norm.register_fake
def _rms_norm_fake(x: Tensor, weight: Tensor, epsilon: float) -> Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@torch.library.custom_op("rmsnorm_fused::fused_add_rms_norm", mutates_args=("x", "residual"))
def fused_add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, epsilon: float) -> None:
    """Custom-op form of run_fused_add_rms_norm (mutates x and residual)."""
    run_fused_add_rms_norm(x, residual, weight, epsilon, mode="compiled")


@fused_add_rms_norm.register_fake
def _fused_add_rms_norm_fake(x: Tensor, residual: Tensor, weight: Tensor, epsilon: float) -> None:
    return None
