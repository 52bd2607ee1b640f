"""The fused kernels of kernels/rmsnorm.py as torch.library ops (torch.library.Library define/impl).

    torch.ops.rmsnorm_fused.rms_norm(x, weight, epsilon) -> Tensor
    torch.ops.rmsnorm_fused.fused_add_rms_norm(x, residual, weight, epsilon) -> ()  (mutates x, residual)

Both are opaque to Dynamo and Inductor (fake implementations give the output metadata), so under
torch.compile the graph holds one call per norm, and CUDA-graph capture records the kernel launch.
They are defined with `torch.library.Library` and a CUDA impl, not `@torch.library.custom_op`,
whose Python wrapper costs about 11 us more per call (../shared/data/h200-launch-floor.json).
kernels/rmsnorm.py launches on PyTorch's current stream. Each call asks the shape policy for the
launch variant of its row count (a cached lookup). vLLM captures its CUDA-graph batch sizes without
an uncaptured run first, so every kernel the policy can pick for up to WARM_ROWS rows is compiled
ahead: when vLLM's lowering pass picks cupy_fused (compile time, see plugin.accepts) and whenever
kernels/rmsnorm.py makes a new launch plan (its PLAN_HOOKS); never inside a capture.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter

import torch
from torch import Tensor

from integration import choice
from kernels.checks import DTYPE_NAMES

logger = logging.getLogger("vllm.plugins.rmsnorm_fused")

WARM_ROWS = 16384  # row counts warmed: vLLM's CUDA-graph sizes and every compile range the launcher sets
CALLS: Counter = Counter()  # (op, answer) -> Python-level calls in this process (not graph replays)
_warmed: set[tuple] = set()
_lock = threading.Lock()
_inconsistent: set[tuple] = set()
_VARIANTS: dict[str, str | None] = {}  # answer -> its launch variant (choice.variant_of), per call
_KERNELS: list = []  # kernels.rmsnorm once imported (an import statement per call costs ~1 us)


def _kernels():
    if not _KERNELS:
        from kernels import rmsnorm

        _KERNELS.append(rmsnorm)
    return _KERNELS[0]


def _variant(answer: str) -> str | None:
    v = _VARIANTS.get(answer, "")
    if v == "":
        v = _VARIANTS[answer] = choice.variant_of(answer)
    return v


def _answer(op: str, x: Tensor, mode: str) -> str:
    hidden = x.shape[-1]
    rows = x.numel() // hidden if hidden else 0
    answer = choice.choose(op, DTYPE_NAMES[x.dtype], max(rows, 1), hidden, mode)
    if answer == "stock":
        key = (op, x.dtype, rows, hidden)
        if key not in _inconsistent:
            _inconsistent.add(key)
            logger.warning("cupy_fused: the policy says stock for %s %s rows=%d hidden=%d, but vLLM "
                           "dispatched this call to cupy_fused; running the fused kernel's own launch "
                           "shape", op, x.dtype, rows, hidden)
        return "fused:auto"
    return answer


def default_vec(dtype: str, hidden: int) -> int:
    """Vector width of contiguous rows at 16-byte aligned addresses (what vLLM's buffers have)."""
    from kernels.shapes import ITEMSIZE, vector_width

    return vector_width(ITEMSIZE[dtype], [hidden], [0])


def warm_builds(op: str, dtype: str, hidden: int, vec: int, device: int) -> int:
    """Compile every kernel the policy may launch for up to WARM_ROWS rows of this op, dtype, hidden
    and vector width (kernels.rmsnorm.warm); returns how many builds that is (0 when done before,
    or while capturing)."""
    key = (op, dtype, hidden, vec, device)
    if key in _warmed or torch.cuda.is_current_stream_capturing():
        return 0
    with _lock:
        if key in _warmed:
            return 0
        t0 = time.perf_counter()
        choices = set()
        for rows in range(1, WARM_ROWS + 1):
            answer = choice.choose(op, dtype, rows, hidden, "compiled")
            if answer != "stock":
                variant = choice.variant_of(answer)
                choices.add((1 if variant else rows, variant))  # only the automatic shape varies with rows
        n = _kernels().warm(op, dtype, hidden, vec, device, choices)
        _warmed.add(key)
    logger.info("cupy_fused: %s %s hidden=%d vec=%d: %d kernel build(s) ready for up to %d rows in %.1f s",
                op, dtype, hidden, vec, n, WARM_ROWS, time.perf_counter() - t0)
    return n


def _on_new_plan(op: str, dtype: str, hidden: int, vec: int, device: int) -> None:
    warm_builds(op, dtype, hidden, vec, device)


def run_rms_norm(x: Tensor, weight: Tensor, epsilon: float, mode: str = "eager") -> Tensor:
    """out = rms_norm(x) * weight with the fused kernel (launch variant from the mode's policy).
    The first call of each new launch plan compiles ahead for later CUDA-graph captures."""
    answer = _answer("rms_norm", x, mode)
    CALLS[("rms_norm", answer)] += 1
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return _kernels().rms_norm(x, weight, epsilon, out=out, variant=_variant(answer))


def run_fused_add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, epsilon: float,
                           mode: str = "eager") -> None:
    """In place: residual <- x + residual; x <- rms_norm(residual) * weight (vLLM semantics)."""
    answer = _answer("fused_add_rms_norm", x, mode)
    CALLS[("fused_add_rms_norm", answer)] += 1
    _kernels().fused_add_rms_norm(x, residual, weight, epsilon, variant=_variant(answer))


def _rms_norm_cuda(x: Tensor, weight: Tensor, epsilon: float) -> Tensor:
    return run_rms_norm(x, weight, epsilon, mode="compiled")


def _fused_add_cuda(x: Tensor, residual: Tensor, weight: Tensor, epsilon: float) -> None:
    run_fused_add_rms_norm(x, residual, weight, epsilon, mode="compiled")


def _rms_norm_fake(x: Tensor, weight: Tensor, epsilon: float) -> Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _fused_add_fake(x: Tensor, residual: Tensor, weight: Tensor, epsilon: float) -> None:
    return None


LIB = torch.library.Library("rmsnorm_fused", "DEF")  # kept alive for the process: it owns the ops
LIB.define("rms_norm(Tensor x, Tensor weight, float epsilon) -> Tensor")
LIB.define("fused_add_rms_norm(Tensor(a!) x, Tensor(b!) residual, Tensor weight, float epsilon) -> ()")
LIB.impl("rms_norm", _rms_norm_cuda, "CUDA")
LIB.impl("fused_add_rms_norm", _fused_add_cuda, "CUDA")
torch.library.register_fake("rmsnorm_fused::rms_norm", _rms_norm_fake, lib=LIB)
torch.library.register_fake("rmsnorm_fused::fused_add_rms_norm", _fused_add_fake, lib=LIB)
_kernels().PLAN_HOOKS.append(_on_new_plan)
